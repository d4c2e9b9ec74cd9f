"""Run a Jupyter notebook's code cells in order through IPython, as `fecomlite run` needs.

    python -m fecomlite.runner.notebook analysis.ipynb [ARGS]

Each code cell goes to one `InteractiveShell` (IPython's own interpreter, without a terminal or
a kernel), so magics (`%time`, `%%bash`), shell escapes (`!ls`) and top-level `await` behave as
in Jupyter, and the cells share one namespace. The first cell that raises stops the run, with
IPython's traceback and exit status 1, as an exception in a script would. Outputs are printed,
not saved: the notebook file is never changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def code_cells(path: Path) -> list[str]:
    """The source of every non-empty code cell, in order."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        if text.strip():
            out.append(text)
    return out


def run_notebook(path: Path, argv: list[str]) -> int:
    """0 when every cell ran, 1 at the first that raised (its traceback printed)."""
    from IPython.core.interactiveshell import InteractiveShell

    sys.argv = [str(path), *argv]
    shell = InteractiveShell.instance()
    shell.user_ns["__file__"] = str(path)
    for source in code_cells(path):
        result = shell.run_cell(source, store_history=True)
        if not result.success:
            return 1
    return 0


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m fecomlite.runner.notebook NOTEBOOK.ipynb [ARGS]")
    sys.exit(run_notebook(Path(sys.argv[1]), sys.argv[2:]))


if __name__ == "__main__":
    main()
