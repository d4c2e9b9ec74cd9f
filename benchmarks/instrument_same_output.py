"""Whether two checkouts instrument a corpus identically: every output file byte for byte (the
manifest and the kept originals included), and the same failures and notes.

A change meant to make instrumenting faster must not change what it writes. This instruments
each corpus folder with this checkout's fecomlite and with another's (``--against``), each in a
fresh process, and lists every difference. The default corpus is the repository's example
projects and instrumenting fixtures plus two large real code bases that are installed here
(Keras, and ``torch/nn``), read in place (nothing is written under them).

    python benchmarks/instrument_same_output.py --against /path/to/main [FOLDER ...]

Exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE_ROOTS = ("fakeapi", "math", "json")
# One instrumentation, in a fresh process of the checkout under test.
INSTRUMENT = """
import json, sys
from pathlib import Path
from fecomlite.instrument import project
result = project.instrument_path(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
print(json.dumps({"lines": result.lines, "sites": len(result.sites),
                  "failures": [str(f) for f in result.failures], "notes": result.notes}))
"""


def default_corpus() -> list[tuple[Path, tuple[str, ...]]]:
    """The example projects, the instrumenting fixtures (with the roots their tests add), and
    Keras and ``torch/nn`` as installed (NumPy a root too: more of their calls resolve)."""
    found = [(REPO / "projects", ()), (REPO / "tests" / "instrument_cases", FIXTURE_ROOTS)]
    for package, inner in (("keras", ""), ("torch", "nn")):
        spec = importlib.util.find_spec(package)  # located, not imported
        if spec is not None and spec.submodule_search_locations:
            location = Path(next(iter(spec.submodule_search_locations))) / inner
            found.append((location, ("numpy",)))
    return [(path, roots) for path, roots in found if path.is_dir()]


def instrument(
    checkout: Path, folder: Path, out: Path, roots: tuple[str, ...]
) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", INSTRUMENT, str(folder), str(out), *roots],
        env=env, cwd=out.parent, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def tree_differences(left: Path, right: Path) -> list[str]:
    """Files only in one tree, and files whose bytes differ (relative paths)."""
    found: list[str] = []
    todo = [filecmp.dircmp(left, right)]
    while todo:
        compared = todo.pop()
        base = Path(compared.left).relative_to(left)
        found += [
            f"only in one: {base / name}" for name in compared.left_only + compared.right_only
        ]
        _, mismatch, errors = filecmp.cmpfiles(
            compared.left, compared.right, compared.common_files, shallow=False
        )
        found += [f"differs: {base / name}" for name in mismatch + errors]
        todo.extend(compared.subdirs.values())
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="*", help="default: see above")
    parser.add_argument("--api", action="append", default=[], help="a root for FOLDERs")
    parser.add_argument("--against", type=Path, required=True, help="the other checkout")
    args = parser.parse_args()
    corpus = [(path, tuple(args.api)) for path in args.folders] or default_corpus()
    differences = 0
    with tempfile.TemporaryDirectory() as tmp:
        for index, (folder, roots) in enumerate(corpus):
            outs = [Path(tmp) / f"{index}-mine", Path(tmp) / f"{index}-theirs"]
            mine = instrument(REPO, folder.resolve(), outs[0], roots)
            theirs = instrument(args.against.resolve(), folder.resolve(), outs[1], roots)
            found = tree_differences(*outs)
            found += [f"{key}: {mine[key]} here, {theirs[key]} there"
                      for key in ("failures", "notes") if mine[key] != theirs[key]]  # fmt: skip
            differences += len(found)
            print(f"{folder}: {mine['lines']} lines, {mine['sites']} sites, "
                  f"{len(found)} differences")  # fmt: skip
            for line in found[:20]:
                print(f"  {line}")
    print("identical" if not differences else f"{differences} differences")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
