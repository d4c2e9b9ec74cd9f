"""The session's end on the controller (or the only process): save the baseline, compare with
the one asked for, write the JSON and Markdown files, and say whether the gate failed. A file
that cannot be written is one line in the summary and fails the session (a CI job must not pass
believing a baseline was kept)."""

from __future__ import annotations

from typing import Any

from fecomlite.pytest_plugin import output, verdicts
from fecomlite.pytest_plugin.baseline import BaselineError, save, write_json
from fecomlite.pytest_plugin.settings import BASELINE_FOLDER, Settings


def finish(rows: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]] | None,
           settings: Settings, instrumented: bool) -> tuple[bool, list[str]]:
    """(whether the session fails, the summary's lines)."""
    comparison = (verdicts.compare(baseline, rows, settings.fail)
                  if baseline is not None else None)
    name = str(settings.compare) if settings.compare else None
    lines = output.terminal_lines(rows, comparison, instrumented, name)
    errors = []
    try:
        if settings.save is not None:
            save(settings.save, rows, in_home=settings.save.parent.name == BASELINE_FOLDER)
            lines.append(f"baseline saved: {settings.save} ({len(rows)} tests)")
        if settings.json_path is not None:
            write_json(settings.json_path, output.json_document(rows, comparison, name))
        if settings.markdown_path is not None:
            text = output.markdown(rows, comparison, instrumented, name)
            settings.markdown_path.parent.mkdir(parents=True, exist_ok=True)
            settings.markdown_path.write_text(text, encoding="utf-8")
    except (BaselineError, OSError) as exc:
        errors.append(f"error: {exc}")
    failed = bool(errors) or bool(comparison and comparison["failures"])
    return failed, lines + errors
