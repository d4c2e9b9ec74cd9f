"""Writing reports: Jinja2 (autoescape on) renders the page, with the stylesheet and scripts
inlined so the file opens offline from file://; JSON and CSV go beside it.

Everything from the measured program reaches the page either through Jinja's escaping or as JSON
inside <script type="application/json">, where `<`, `>` and `&` are written as \\u escapes so no
user string can close the script element.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from markupsafe import Markup

from fecomlite.analysis import units

if TYPE_CHECKING:
    from fecomlite.report.build import Report
    from fecomlite.report.compare import Comparison

HERE = Path(__file__).parent
FORMATS = ("html", "json", "csv")
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                   "\u2028": "\\u2028", "\u2029": "\\u2029"}


def jsonable(value: Any) -> Any:
    """Plain JSON values: NaN and infinities become null, tuples lists, numpy scalars Python."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return jsonable(value.item())
    return value


def script_json(data: Any) -> Markup:
    """JSON safe to place inside <script type="application/json">."""
    text = json.dumps(jsonable(data), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for char, escape in _SCRIPT_ESCAPES.items():
        text = text.replace(char, escape)
    return Markup(text)


@cache
def _static(name: str) -> str:
    return (HERE / "static" / name).read_text(encoding="utf-8")


def static_assets() -> dict[str, Markup]:
    """The stylesheet and scripts, to inline; they are ours, never the measured program's."""
    return {name.replace(".", "_"): Markup(_static(name))
            for name in ("report.css", "charts.js", "report.js")}


class _TemplateCache(jinja2.FileSystemBytecodeCache):
    """Jinja's bytecode cache, where a cache that cannot be written is skipped, not an error."""

    def dump_bytecode(self, bucket: Any) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _template_cache() -> jinja2.BytecodeCache | None:
    try:
        return _TemplateCache()
    except (RuntimeError, OSError):  # no private temporary folder: compile every time
        return None


@cache
def environment() -> jinja2.Environment:
    """The templates' environment. Compiled templates are kept in Jinja's bytecode cache (a
    folder of the user's own, mode 0700, in the temporary directory; checked against the
    template's source): compiling them again costs ~0.15 s of every report."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        bytecode_cache=_template_cache(),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        J=lambda v: units.scaled(v, "J"),
        W=lambda v: units.scaled(v, "W"),
        seconds=lambda v: units.scaled(v, "s"),
        B=lambda v: units.scaled(v, "B"),
        pct=units.percent,
        sig3=units.sig3,
    )
    return env


def render_page(template: str, context: dict[str, Any], charts: dict[str, Any]) -> str:
    page = environment().get_template(template)
    return page.render(**context, data_json=script_json({"charts": charts}),
                       static=static_assets())


def write_files(out_dir: Path, html: str | None, data: dict[str, Any] | None,
                tables: dict[str, str], json_name: str, formats: Iterable[str]) -> list[Path]:
    """Write index.html, the JSON and the CSV tables (those of `formats`) into `out_dir`."""
    formats = set(formats)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if "html" in formats and html is not None:
        path = out_dir / "index.html"
        path.write_text(html, encoding="utf-8")
        written.append(path)
    if "json" in formats and data is not None:
        path = out_dir / json_name
        path.write_text(json.dumps(jsonable(data), indent=1, ensure_ascii=False,
                                   allow_nan=False) + "\n", encoding="utf-8")
        written.append(path)
    if "csv" in formats:
        for name, text in tables.items():
            path = out_dir / f"{name}.csv"
            path.write_text(text, encoding="utf-8", newline="")
            written.append(path)
    return written


def write_report(report: Report, out_dir: Path, formats: Iterable[str] = FORMATS) -> list[Path]:
    """One run's report: index.html, report.json, apis.csv and sites.csv (those of `formats`)."""
    formats = set(formats)
    html = (render_page("report.html.j2", report.context, report.charts)
            if "html" in formats else None)
    return write_files(out_dir, html, report.json, report.csv, "report.json", formats)


def write_comparison(comparison: Comparison, out_dir: Path,
                     formats: Iterable[str] = FORMATS) -> list[Path]:
    """Two runs compared: index.html, compare.json and compare.csv (those of `formats`)."""
    formats = set(formats)
    html = (render_page("compare.html.j2", comparison.context, comparison.charts)
            if "html" in formats else None)
    return write_files(out_dir, html, comparison.json, comparison.csv, "compare.json", formats)
