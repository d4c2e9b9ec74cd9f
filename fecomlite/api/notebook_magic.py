"""`%load_ext fecomlite`, then `%%fecomlite [--api PKG ...]` on a cell: the cell runs method by
method (every framework call wrapped, as `fecomlite run` would) and its per-API table is shown
under it.

The cell is instrumented as the last cell of a small notebook whose first cell imports what
the earlier cells bound (`torch`, `tf`, `nn` ...: modules read from the namespace), so
names resolve to the canonical APIs (`torch.matmul`, not a site key). Calls on other objects
of earlier cells (`model(x)`, `optimizer.step()`) are decided when they run (`probe.dcall`),
against the magic's API roots. It runs inside
`fecomlite.measure()` (the in-process sensors, no server); the probe's events stay in this
process for the cell (its sender is set aside, then put back), and each domain's energy is
shared among the calls by the attribution the report uses (overlap, idle estimated from the
cell's own quiet intervals, so figures include idle: estimated). Inside `fecomlite run` the
cell's events go to the run as usual and only the cell's totals are shown.
"""

from __future__ import annotations

import html
import json
import shlex
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.api.measure import Measurement, measure
from fecomlite.api.sampler import _intervals
from fecomlite.instrument.names import DEFAULT_ROOTS, Roots
from fecomlite.runtime.names import adopted, set_roots
from fecomlite.sensors.estimate import ABOVE_IDLE_MODELS

CELL = "cell"


@dataclass
class _CellSink:
    """Stands in for the probe's sender while a measured cell runs: the events stay here."""

    batches: list[tuple[list[str], list[bytes]]] = field(default_factory=list)
    names: dict[str, dict[str, Any]] = field(default_factory=dict)  # site → the callee it ran

    def send(self, drain: Any, final: bool = False) -> None:
        """As `Sender.send` (the probe passes `final` on its own flushes): keeps the batch."""
        names, *columns = drain()
        if names:
            self.batches.append((names, columns))

    def add_shapes(self, site: str, shapes: dict[str, Any]) -> None:
        """Shapes are for the run store; a cell's table does not show them."""

    def add_name(self, site: str, named: dict[str, str] | None) -> None:
        """The public name of the callee the site ran (`runtime.names`), as the store keeps it: a
        site seen running different callees keeps its static name."""
        known = self.names.get(site)
        self.names[site] = (named or {}) if known is None or known == named else {}

    def api_of(self, key: str, site: dict[str, Any]) -> str:
        """The site's API as a run's report names it: the callee that ran, else the static."""
        found = self.names.get(key)
        named = adopted(site, found) if found and site else None
        return named[0] if named else site.get("api", key)

    def events(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(site of each event, t0, t1, thread) over every batch."""
        sites: list[str] = []
        t0, t1, tid = [], [], []
        for names, (index, a, b, thread, *_rest) in self.batches:
            sites += [names[i] for i in np.frombuffer(index, np.int32)]
            t0.append(np.frombuffer(a, np.int64))
            t1.append(np.frombuffer(b, np.int64))
            tid.append(np.frombuffer(thread, np.uint64))
        if not sites:
            empty = np.zeros(0, np.int64)
            return [], empty, empty, empty
        return sites, np.concatenate(t0), np.concatenate(t1), np.concatenate(tid).astype(np.int64)


def preamble(namespace: dict[str, Any], roots: Roots) -> str:
    """Imports that rebind the modules earlier cells bound from the API roots (`torch`, `tf`,
    `nn`), so the instrumenter resolves the cell's names as Python will at run time."""
    lines = [
        f"import {value.__name__} as {name}"
        for name, value in namespace.items()
        if isinstance(value, types.ModuleType)
        and name.isidentifier()
        and not name.startswith("_")
        and roots.leads_to(value.__name__)
    ]
    return "\n".join(lines) + "\n"


def instrument_cell(source: str, namespace: dict[str, Any], roots: Roots) -> tuple[str, dict]:
    """(the instrumented cell, site key → its manifest entry)."""
    cells = [
        {"cell_type": "code", "source": preamble(namespace, roots)},
        {"cell_type": "code", "source": source},
    ]
    from fecomlite.instrument.notebook import instrument_notebook  # libcst: loaded when needed

    rewrite, errors = instrument_notebook(json.dumps({"cells": cells}), CELL, roots)
    if errors:
        raise SyntaxError(str(errors[0]))
    if rewrite.text is None:
        return source, {}
    text = json.loads(rewrite.text)["cells"][1]["source"]
    text = "".join(text) if isinstance(text, list) else text
    return text, {s["key"]: s for s in rewrite.sites if s.get("cell") == 1}


def api_table(m: Measurement, sink: _CellSink, sites: dict[str, dict]) -> list[dict[str, Any]]:
    """Per API: calls, time, and each domain's energy (idle share included) over its calls."""
    keys, t0, t1, tid = sink.events()
    if not keys:
        return []
    api_of = {k: sink.api_of(k, sites.get(k, {})) for k in set(keys)}
    apis = sorted(set(api_of.values()))
    index = {a: i for i, a in enumerate(apis)}
    group = np.array([index[api_of[k]] for k in keys], np.int64)
    rows = [
        {
            "api": a,
            "calls": int((group == i).sum()),
            "time_s": float(((t1 - t0) / 1e9)[group == i].sum()),
            "energy": {},
        }
        for i, a in enumerate(apis)
    ]
    window = m._pending.result()
    for t, v, sensor in window.samples.values():
        if sensor.kind == "gauge" or sensor.domain not in m.domains:
            continue
        iv = _clipped(_intervals(sensor, t, v), window.start_ns, window.end_ns)
        if iv.count == 0:
            continue
        above_idle = sensor.model in ABOVE_IDLE_MODELS  # its readings are above idle already
        idle = 0.0 if above_idle else at.estimate_idle_W(iv, t0, t1)
        res = at.attribute(iv, t0, t1, idle_W=idle, thread=tid, group=group, ngroups=len(apis))
        top = res.depth == 0  # inclusive energy of outermost calls: nothing counted twice
        for i, row in enumerate(rows):
            mine = (group == i) & top
            row["energy"][sensor.domain] = float(res.energy_total_J[mine].sum())
    return rows


def _clipped(iv: at.SensorIntervals, start: int, end: int) -> at.SensorIntervals:
    """The intervals inside [start, end], the cut ones prorated: the calls then share the
    cell's energy, not that of sensor intervals reaching before or after it."""
    edges = np.clip(iv.edges_ns, start, end)
    keep = np.flatnonzero(np.diff(edges) > 0)
    if keep.size == 0:
        return at.SensorIntervals(edges[:1], np.zeros(0), np.zeros(1), iv.quantum_J, iv.period_s)
    lengths = np.diff(iv.edges_ns)[keep]
    energy = iv.energy_J[keep] * np.diff(edges)[keep] / lengths
    new_edges = np.append(edges[keep], edges[keep[-1] + 1])
    sigma = np.append(iv.edge_sigma_ns[keep], iv.edge_sigma_ns[keep[-1] + 1])
    return at.SensorIntervals(new_edges, energy, sigma, iv.quantum_J, iv.period_s)


class CellReport:
    """What the magic shows: the cell's totals and its per-API table (HTML and text)."""

    def __init__(self, m: Measurement, rows: list[dict[str, Any]], note: str = "") -> None:
        self.m, self.rows, self.note = m, rows, note

    def _header(self) -> str:
        m = self.m
        parts = [f"cell: {m.duration_s:.3g} s"]
        parts += [f"{d} {j:.3g} J ({m.provenance[d]})" for d, j in m.energy_J.items()]
        if m.memory_peak_B is not None:
            parts.append(f"peak RSS {m.memory_peak_B / 2**20:.0f} MiB")
        if m.co2e_g is not None:
            parts.append(f"{m.co2e_g:.3g} g CO2e ({m.carbon_intensity.label()})")
        return " · ".join(parts)

    def _domains(self) -> list[str]:
        return sorted({d for r in self.rows for d in r["energy"]})

    def __repr__(self) -> str:
        domains = self._domains()
        lines = [self._header()]
        lines.append("\t".join(["API", "calls", "time_s", *[f"{d}_J" for d in domains]]))
        for r in self.rows:
            cells = [r["api"], str(r["calls"]), f"{r['time_s']:.4g}"]
            cells += [f"{r['energy'].get(d, float('nan')):.4g}" for d in domains]
            lines.append("\t".join(cells))
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        domains = self._domains()
        head = "".join(
            f"<th>{html.escape(d)} J<br><small>{html.escape(self.m.provenance[d])}</small></th>"
            for d in domains
        )
        body = "".join(
            f"<tr><td><code>{html.escape(r['api'])}</code></td><td>{r['calls']}</td>"
            f"<td>{r['time_s']:.4g} s</td>"
            + "".join(f"<td>{r['energy'].get(d, float('nan')):.4g}</td>" for d in domains)
            + "</tr>"
            for r in self.rows
        )
        note = f"<p><small>{html.escape(self.note)}</small></p>" if self.note else ""
        return (
            f"<div class='fecomlite'><p>{html.escape(self._header())}</p><table><thead>"
            f"<tr><th>API</th><th>calls</th><th>time</th>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{note}</div>"
        )


NOTE = (
    "energy per API: each call's share of the cell's energy, idle included (idle estimated "
    "from the cell's quiet intervals)"
)


def fecomlite_magic(line: str, cell: str, shell: Any) -> CellReport:
    """`%%fecomlite [--api PKG ...]`: run the cell method by method and report it; what the
    cell raises propagates (IPython shows it) after the probe is put back."""
    from fecomlite.runtime import probe

    words = shlex.split(line)
    extra = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--api"]
    roots = Roots([*DEFAULT_ROOTS, *extra])
    source, sites = instrument_cell(cell, shell.user_ns, roots)
    in_run = bool(probe._config.url)
    if not in_run:  # the run's manifest set them otherwise
        set_roots(list(roots.names))
        probe.forget_decisions()
    sink = _CellSink()
    saved = probe._sender
    if not in_run:
        probe.flush()  # what earlier cells buffered is not this cell's
        probe._sender = sink
    try:
        code = compile(shell.transform_cell(source), "<%%fecomlite cell>", "exec")
        with measure("cell") as m:
            exec(code, shell.user_ns)  # magics and `!` lines are calls after transform_cell
    finally:
        if not in_run:
            probe.flush()
            probe._sender = saved
    if in_run:
        return CellReport(m, [], "inside `fecomlite run`: the cell's calls went to the run")
    return CellReport(m, api_table(m, sink, sites), NOTE)


def load_ipython_extension(ipython: Any) -> None:
    """Registers `%%fecomlite` (called by `%load_ext fecomlite`)."""
    ipython.register_magic_function(
        lambda line, cell: fecomlite_magic(line, cell, ipython), "cell", "fecomlite"
    )
