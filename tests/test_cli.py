"""The command line's shape: summaries listed without importing the commands, each command's
help importing only what it needs, and plain flags shown without a value type."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

from fecomlite.cli import COMMANDS, load_command

HEAVY = ("libcst", "scipy", "numpy", "torch", "tensorflow", "pydantic", "fecomlite.server.service")


def modules_after(*argv: str) -> set[str]:
    """The modules a fresh `fecomlite ARGV` has imported when it exits."""
    code = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
        "from fecomlite.cli import app\n"
        f"app({list(argv)!r}, prog_name='fecomlite')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stderr.strip().splitlines()[-1]))


def test_each_listed_summary_is_the_first_line_of_its_commands_help():
    for name, (_, _, summary) in COMMANDS.items():
        command = load_command(name)
        first = inspect.cleandoc(command.help or "").split("\n\n")[0].replace("\n", " ")
        assert first == summary, name


def test_the_top_level_help_imports_no_command():
    loaded = modules_after("--help")
    assert not {m for m in loaded if m.startswith(HEAVY)}
    assert not {m for _, (m, _, _) in COMMANDS.items()} & loaded


@pytest.mark.parametrize(
    "command",
    [*([name] for name in COMMANDS), ["server", "status"], ["server", "stop"], ["model", "fit"]],
    ids=" ".join,
)
def test_a_commands_help_imports_no_heavy_library(command):
    loaded = modules_after(*command, "--help")
    assert not {m for m in loaded if m.startswith(HEAVY)}, command


def test_a_subcommands_help_is_its_own_not_the_groups():
    text = subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", "server", "status", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 0, text.stderr
    assert "List this user's running servers" in text.stdout
    assert "--port" not in text.stdout  # the group's own option belongs to `server --help`


def test_flags_show_no_value_type():
    text = subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert "--quiet" in text and "--gate / --no-gate" in text
    assert "<bool>" not in text


RUN_OPTIONS = ["--home", "h", "--repeat", "2", "--idle", "2.5", "--tail", "-1e-1", "--no-gate",
               "--api", "numpy", "--api", "jax", "--format", "json", "--quiet", "--pue", "1",
               "--project", ".", "s.py", "--epochs", "3"]


def test_option_values_convert_as_typers_own_conversion_without_pydantic(monkeypatch):
    code = (
        "import sys\n"
        "from fecomlite.cli import load_command\n"
        f"ctx = load_command('run').make_context('run', {RUN_OPTIONS!r})\n"
        "print(repr(sorted(ctx.params.items())), 'pydantic' in sys.modules)\n"
    )
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, check=True).stdout.strip()
    import fecomlite.cli

    monkeypatch.setattr(fecomlite.cli, "_without_pydantic", lambda command: None)
    typers = load_command("run").make_context("run", list(RUN_OPTIONS))
    assert plain == f"{sorted(typers.params.items())!r} False"


@pytest.mark.parametrize("option", [["--repeat", "abc"], ["--repeat", "1.5"], ["--idle", "x1"],
                                    ["--format", "JSON"]])
def test_a_value_the_plain_conversion_cannot_read_gets_typers_own_error(option):
    from cli_runner import invoke

    result = invoke(["run", *option, "s.py"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Invalid value for '{option[0]}'" in result.stderr
