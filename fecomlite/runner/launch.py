"""How `fecomlite run` starts a distributed program: through PyTorch's own launcher.

`fecomlite run --nproc-per-node N SCRIPT` runs `python -m torch.distributed.run --standalone
--nproc-per-node N SCRIPT` (one node, rendezvous on a free local port); `fecomlite run --
torchrun [OPTIONS] SCRIPT [ARGS]` keeps the launcher and its options as the user wrote them.
Either way the launcher starts the *instrumented* script in every rank, and the server watches
the launcher's process tree (the ranks and their DataLoader workers).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

TORCH_RUN_MODULE = "torch.distributed.run"
LAUNCHER_NAMES = ("torchrun",)


class LaunchError(ValueError):
    """A command line that names a launcher fecomlite cannot run the script of."""


@dataclasses.dataclass
class Launch:
    """The command before the script (`[python]` alone for a plain run), the script, its args."""

    prefix: list[str]
    script: Path
    args: list[str]


def resolve_launch(first: Path, rest: list[str], nproc_per_node: int | None) -> Launch:
    """What `fecomlite run FIRST REST...` runs: FIRST is the script, or a launcher (`torchrun`,
    `python -m torch.distributed.run`) whose options and script follow in REST."""
    if is_launcher(first, rest):
        if nproc_per_node:
            raise LaunchError("--nproc-per-node goes to the launcher you named, not to fecomlite")
        return split_launcher([str(first), *rest])
    if nproc_per_node is None:
        return Launch([sys.executable], first, rest)
    if nproc_per_node < 1:
        raise LaunchError("--nproc-per-node must be at least 1")
    prefix = [sys.executable, "-m", TORCH_RUN_MODULE, "--standalone"]  # a free local port
    prefix += ["--nproc-per-node", str(nproc_per_node)]
    return Launch(prefix, first, rest)


def is_launcher(first: Path, rest: list[str]) -> bool:
    if first.name in LAUNCHER_NAMES:
        return True
    return first.name.startswith("python") and rest[:2] == ["-m", TORCH_RUN_MODULE]


def split_launcher(command: list[str]) -> Launch:
    """Find the script in a launcher's command line with the launcher's own argument parser."""
    from torch.distributed.run import get_args_parser  # only when the user named torchrun

    skip = 3 if command[1:3] == ["-m", TORCH_RUN_MODULE] else 1
    options = command[skip:]
    try:
        parsed = get_args_parser().parse_args(options)
    except SystemExit as exc:
        raise LaunchError(f"the launcher's options do not parse: {' '.join(options)}") from exc
    if parsed.module or parsed.no_python:
        raise LaunchError("--module and --no-python are not supported: name the script file")
    at = skip + len(options) - len(parsed.training_script_args) - 1
    return Launch(command[:at], Path(command[at]), command[at + 1 :])
