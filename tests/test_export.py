"""`fecomlite export`: a Perfetto/Chrome trace checked against the Trace Event Format, and
OpenMetrics text read back with prometheus-client's own parser."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest
from cli_runner import invoke
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from report_helpers import build_run
from stored_events import events_table

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.store import Store

# The Trace Event Format (Google's "Trace Event Format" document) for the phases written here:
# complete (X), counter (C), instant (i) and metadata (M) events in a JSON object format trace.
_NUM = {"type": "number"}
_ID = {"type": "integer", "minimum": 0}
TRACE_EVENT_SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {
            "type": "array",
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["ph", "name", "ts", "dur", "pid", "tid"],
                        "properties": {
                            "ph": {"const": "X"},
                            "name": {"type": "string"},
                            "ts": _NUM,
                            "dur": {"type": "number", "minimum": 0},
                            "pid": _ID,
                            "tid": _ID,
                            "cat": {"type": "string"},
                            "args": {"type": "object"},
                        },
                    },
                    {
                        "type": "object",
                        "required": ["ph", "name", "ts", "pid", "args"],
                        "properties": {
                            "ph": {"const": "C"},
                            "name": {"type": "string"},
                            "ts": _NUM,
                            "pid": _ID,
                            "tid": _ID,
                            "args": {
                                "type": "object",
                                "minProperties": 1,
                                "additionalProperties": _NUM,
                            },
                        },
                    },
                    {
                        "type": "object",
                        "required": ["ph", "name", "ts", "s"],
                        "properties": {
                            "ph": {"const": "i"},
                            "name": {"type": "string"},
                            "ts": _NUM,
                            "s": {"enum": ["g", "p", "t"]},
                            "pid": _ID,
                            "tid": _ID,
                        },
                    },
                    {
                        "type": "object",
                        "required": ["ph", "name", "pid", "args"],
                        "properties": {
                            "ph": {"const": "M"},
                            "name": {"enum": ["process_name", "thread_name"]},
                            "pid": _ID,
                            "tid": _ID,
                            "args": {"type": "object", "required": ["name"]},
                        },
                    },
                ]
            },
        },
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
    },
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    with Store(folder / "store.sqlite") as store:
        run = build_run(store)
    return folder / "store.sqlite", run


@pytest.fixture(scope="module")
def analysed(stored):
    with Store(stored[0], create=False) as store:
        return analyse_run(store, stored[1])


def export(stored, *options: str) -> str:
    store_path, run = stored
    args = ["export", str(run), "--store", str(store_path), *options, "--out", "-"]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_perfetto_trace_follows_the_trace_event_format(stored):
    data = json.loads(export(stored, "--format", "perfetto"))
    jsonschema.validate(data, TRACE_EVENT_SCHEMA)
    events = data["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    calls = [e for e in events if e["ph"] == "X"]
    assert calls and all((e["pid"], e["tid"]) in named for e in calls)
    with Store(stored[0], create=False) as store:
        rows = events_table(store).db.execute(
            "SELECT s.api, count(*) FROM events e JOIN sites s ON s.id = e.site_id "
            "WHERE e.run_id=? GROUP BY s.api",
            (stored[1],),
        ).fetchall()
        reps = store.repetitions(stored[1])
    counts: dict[str, int] = {}
    for e in calls:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
    assert counts == dict(rows)  # one complete event per call, named by its canonical API
    markers = [e["name"] for e in events if e["ph"] == "i"]
    assert len(markers) == 3 * len(reps) and "rep 1 start" in markers


def test_power_tracks_integrate_to_the_sensors_energy(stored, analysed):
    data = json.loads(export(stored, "--format", "perfetto"))
    for d in analysed.domains:
        name = f"power {d['domain']} (W, {d['provenance']})"
        track = sorted(
            (e["ts"], e["args"]["W"])
            for e in data["traceEvents"]
            if e["ph"] == "C" and e["name"] == name
        )
        assert len(track) > 10, name
        pairs = itertools.pairwise(track)
        joules = sum((t1 - t0) / 1e6 * w for (t0, w), (t1, _) in pairs)
        assert joules == pytest.approx(d["total_J"], rel=1e-6), name
    memory = [e for e in data["traceEvents"] if e["ph"] == "C" and e["name"].startswith("memory")]
    assert memory and all(e["args"]["MiB"] >= 0 for e in memory)


def test_openmetrics_text_parses_and_carries_the_analysis_figures(stored, analysed):
    text = export(stored, "--format", "openmetrics", "--carbon-intensity", "100")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    calls = {s.labels["api"]: s.value for s in families["fecomlite_api_calls"].samples}
    assert calls == {r["api"]: r["calls"] for r in analysed.apis}
    api_energy = families["fecomlite_api_energy_above_idle_joules"]
    assert api_energy.unit == "joules"
    energy = {(s.labels["api"], s.labels["domain"]): s.value for s in api_energy.samples}
    for row in analysed.apis:
        for domain, e in row["energy"].items():
            assert energy[row["api"], domain] == pytest.approx(e["above_idle_J"])
    (co2e,) = families["fecomlite_run_co2e_grams"].samples
    assert "estimated at 100 gCO2e/kWh" in co2e.labels["intensity"] and co2e.value > 0


def test_a_trace_written_to_a_file_is_the_whole_trace_and_a_failed_one_leaves_nothing(
        stored, tmp_path):
    """The trace is written event by event (a day's calls never held at once): the file holds
    what `perfetto.trace` makes whole; an export that cannot be finished leaves no part."""
    from fecomlite.export.perfetto import trace

    store_path, run = stored
    out = tmp_path / "run.trace.json"
    done = invoke(["export", str(run), "--store", str(store_path), "--out", str(out)])
    assert done.exit_code == 0, done.output
    with Store(store_path, create=False) as store:
        assert json.loads(out.read_text()) == json.loads(json.dumps(trace(store, run)))
    assert [p.name for p in tmp_path.iterdir()] == ["run.trace.json"]  # no part file left
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    failed = invoke(["export", str(run), "--store", str(store_path), "--out",
                     str(blocked / "run.trace.json")])
    assert failed.exit_code == 1 and "Traceback" not in failed.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder", "run.trace.json"]
