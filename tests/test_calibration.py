"""Calibration replays: the allow-list, the in-process replayer, and `run_calibration` end to end
on a real measurement server (a numpy program; a PyTorch one marked slow)."""

from __future__ import annotations

import atexit
import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from stored_events import events_table

from fecomlite.analysis.calibration import fit_groups
from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.runner.calibration import choose_sites, replay_sites, run_calibration
from fecomlite.runner.experiment import prepare_program, run_experiment
from fecomlite.runner.settings import RunSettings
from fecomlite.runtime.calibration_replay import PREFIX, Replayer, runtime_refusal, verdict
from fecomlite.server.client import ensure_server
from fecomlite.store import Store

# -- the allow-list ---------------------------------------------------------------------------


@pytest.mark.parametrize(("api", "kind"), [
    ("numpy.matmul", "function"),
    ("numpy.linalg.svd", "function"),
    ("torch.matmul", "function"),
    ("torch.nn.functional.conv2d", "function"),
    ("torch.linalg.solve", "function"),
    ("tensorflow.matmul", "function"),
    ("tensorflow.nn.softmax", "function"),
    ("tensorflow.reduce_sum", "function"),
    ("tensorflow.math.exp", "function"),
    ("keras.layers.Dense.__call__", "method"),
    ("keras.Sequential.__call__", "method"),
    ("torch.nn.Conv2d.__call__", "method"),
    ("torch.sin/sum", "method"),
    ("torch.Tensor.sum", "method"),
])
def test_side_effect_free_math_and_layer_calls_are_allowed(api: str, kind: str):
    allowed, reason = verdict(api, kind)
    assert allowed, reason


@pytest.mark.parametrize(("api", "kind", "why"), [
    ("keras.Sequential.fit", "method", "training"),
    ("keras.Model.train_on_batch", "method", "training"),
    ("torch.optim.SGD.step", "method", "optimizer"),
    ("torch.optim.Adam.zero_grad", "method", "optimizer"),
    ("torch.nn.CrossEntropyLoss.__call__/backward", "method", "gradients"),
    ("torch.Tensor.backward", "method", "gradients"),
    ("torch.randn", "function", "random"),
    ("numpy.random.default_rng().standard_normal", "method", "random"),
    ("tensorflow.nn.dropout", "function", "random"),
    ("numpy.save", "function", "input/output"),
    ("torch.save", "function", "input/output"),
    ("tensorflow.print", "function", "input/output"),
    ("torch.zeros/add_", "method", "in place"),
    ("torch.nn.functional.relu_", "function", "in place"),
    ("tensorflow.Variable.assign", "method", "in place"),
    ("torch.nn.Module.train", "method", "in place"),
    ("keras.metrics.Mean.__call__", "method", "metric"),
    ("keras.Sequential.predict", "method", "callbacks"),
    ("torch.utils.data.DataLoader", "constructor", "builds an object"),
    ("tensorflow.data.Dataset.from_tensor_slices/batch", "method", "data pipeline"),
    ("torch.jit.ScriptFunction.__call__", "compiled", "compiled"),
    ("numpy.linspace", "function", "not on the allow-list"),
    ("torch.sin/item", "method", "not on the allow-list"),
])
def test_calls_with_side_effects_are_refused_with_a_reason(api: str, kind: str, why: str):
    allowed, reason = verdict(api, kind)
    assert not allowed
    assert why in reason


def test_arguments_that_write_or_the_wrong_owner_refuse_an_allowed_api():
    a = np.ones((3, 3))
    out = np.empty((3, 3))
    assert runtime_refusal("numpy.add", "function", np.add, (a, a), {}) is None
    assert "out" in runtime_refusal("numpy.add", "function", np.add, (a, a), {"out": out})
    assert "out" in runtime_refusal("numpy.add", "function", np.add, (a, a, out), {})
    assert "out" in runtime_refusal("numpy.dot", "function", np.dot, (a, a, out), {})
    assert runtime_refusal("numpy.dot", "function", np.dot, (a, a), {"out": None}) is None
    assert runtime_refusal("numpy.ones().sum", "method", a.sum, (), {}) is None
    assert "tensor" in runtime_refusal("numpy.ones().sum", "method", [1].count, (1,), {})


# -- choosing sites ---------------------------------------------------------------------------


def _row(key: str, api: str, kind: str, joules: float, seconds: float = 0.1,
         provenance: str = "measured") -> dict:
    return {"key": key, "api": api, "kind": kind, "written": api, "calls": 3,
            "total_time_s": seconds,
            "energy": {"gpu:0": {"above_idle_J": joules, "provenance": provenance},
                       "cpu-core": {"above_idle_J": 100.0, "provenance": "measured"}}}


def test_the_costliest_allowed_sites_are_chosen_and_every_refused_one_is_listed():
    rows = [
        _row("a.py:1:0", "torch.matmul", "function", 5.0),
        _row("a.py:2:0", "torch.optim.SGD.step", "method", 9.0),
        _row("a.py:3:0", "torch.relu", "function", 1.0),
        _row("a.py:4:0", "torch.sum", "function", 3.0),
        _row("a.py:5:0", "torch.mm", "function", float("nan"), seconds=2.0),  # no energy figure
        _row("a.py:6:0", "torch.bmm", "function", 99.0, provenance="estimated"),  # not ranked
        _row("calibrate:a.py:1:0", "calibrate:torch.matmul", "calibration", 50.0),
        _row("region:epoch", "region:epoch", "region", 40.0),
    ]
    chosen, skipped, others = choose_sites(rows, top=2)
    assert [r["key"] for r in chosen] == ["a.py:1:0", "a.py:4:0"]
    assert [(s["site"], "optimizer" in s["reason"]) for s in skipped] == [("a.py:2:0", True)]
    assert others == 3  # torch.relu, torch.mm and torch.bmm rank below the top 2
    entries = replay_sites({r["key"]: r for r in rows})
    assert entries["calibrate:a.py:1:0"]["api"] == "calibrate:torch.matmul"
    assert entries["calibrate:a.py:1:0"]["kind"] == "calibration"
    assert "calibrate:calibrate:a.py:1:0" not in entries


def test_a_replay_shares_its_apis_intensity_group():
    names, index = fit_groups(["calibrate:torch.mm", "torch.matmul", "torch.mm"])
    assert names == ["torch.matmul", "torch.mm"]
    assert index == [1, 0, 1]


# -- the replayer, in process -----------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, int, bool]] = []

    def __call__(self, site: str, t0: int, t1: int, raised: bool) -> None:
        self.events.append((site, t0, t1, raised))

    def of(self, site: str) -> list[tuple[str, int, int, bool]]:
        return [e for e in self.events if e[0] == PREFIX + site]


@pytest.fixture
def make_replayer():
    """Replayers whose exit hooks (registered by `keep`) are taken back: no replays at pytest's
    exit."""
    made: list[Replayer] = []

    def make(sites: dict[str, tuple[str, str]], seconds: float, record: Recorder) -> Replayer:
        replayer = Replayer({k: {"api": a, "kind": kind} for k, (a, kind) in sites.items()},
                            seconds=seconds, gap_s=0.0, record=record)
        made.append(replayer)
        return replayer

    yield make
    for replayer in made:
        atexit.unregister(replayer.run_at_exit)


def test_replays_run_back_to_back_for_the_time_asked_and_print_nothing(capfd, make_replayer):
    record = Recorder()
    printed = []

    def chatty_sum(x):  # stands for an allowed API that happens to print
        printed.append(1)
        print("replayed!")
        sys.stderr.write("warning\n")
        return np.sum(x)

    calls = []

    def save(x):
        calls.append(x)

    raising = iter(range(3))

    def flaky(x):
        next(raising)  # StopIteration on the fourth call
        return x

    replayer = make_replayer({
        "a.py:1:0": ("numpy.matmul", "function"), "a.py:2:0": ("numpy.sum", "function"),
        "a.py:3:0": ("numpy.save", "function"), "a.py:4:0": ("numpy.abs", "function"),
        "a.py:5:0": ("numpy.exp", "function"),
    }, seconds=0.3, record=record)
    a = np.ones((64, 64))
    replayer.keep("a.py:1:0", np.matmul, (a, a), {})
    replayer.keep("a.py:2:0", chatty_sum, (a,), {})
    replayer.keep("a.py:3:0", save, (a,), {})
    replayer.keep("a.py:4:0", flaky, (a,), {})
    report = replayer.run()

    assert capfd.readouterr() == ("", "")
    for site in ("a.py:1:0", "a.py:2:0"):
        events = record.of(site)
        assert len(events) == report[site]["calls"] > 1
        assert (events[-1][2] - events[0][1]) / 1e9 >= 0.3
        assert all(t1 >= t0 and not raised for _, t0, t1, raised in events)
        assert all(b[1] >= a[2] for a, b in zip(events, events[1:], strict=False))  # in turn
    assert len(printed) == report["a.py:2:0"]["calls"]
    assert calls == [] and "input/output" in report["a.py:3:0"]["skipped"]
    assert report["a.py:4:0"]["stopped"] == "raised StopIteration after 3 replays"
    assert [e[3] for e in record.of("a.py:4:0")] == [False, False, False, True]
    assert "returned" in report["a.py:5:0"]["skipped"]  # never called: nothing to replay
    assert record.of("a.py:5:0") == record.of("a.py:3:0") == []


def test_a_replay_uses_the_last_call_that_returned(make_replayer):
    record = Recorder()
    seen = []
    replayer = make_replayer({"a.py:1:0": ("numpy.sum", "function")}, seconds=0.05, record=record)
    replayer.keep("a.py:1:0", lambda x: seen.append(x), (1,), {})
    replayer.keep("a.py:1:0", lambda x: seen.append(x), (2,), {})
    replayer.run()
    assert seen and set(seen) == {2}


def test_the_probe_hands_listed_sites_to_the_replayer_and_replays_at_exit(tmp_path: Path):
    """No server: the probe spools. The replays come after the program's events, calls nested
    in a replay are replays too, and the program prints what it prints without calibration."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np
        import fecomlite.runtime.probe as __fecomlite__
        def forward(x):  # a module's own code, instrumented: one wrapped call inside
            return __fecomlite__.call("prog.py:4:11", np.tanh, x)
        a = np.ones((50, 50))
        for _ in range(3):
            b = __fecomlite__.call("prog.py:7:8", np.matmul, a, a)
            c = __fecomlite__.call("prog.py:8:8", forward, b)
        __fecomlite__.call("prog.py:9:0", print, "sum", float(c.sum()))
    """))
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"sites": {
        "prog.py:4:11": {"api": "numpy.tanh", "kind": "function"},
        "prog.py:7:8": {"api": "numpy.matmul", "kind": "function"},
        "prog.py:8:8": {"api": "torch.nn.Module.__call__", "kind": "method"},
        "prog.py:9:0": {"api": "builtins.print", "kind": "function"}}}))
    base = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin",
            "FECOMLITE_MANIFEST": str(manifest)}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env={**base, "FECOMLITE_SPOOL": str(tmp_path / "plain.spool")},
                           timeout=60)
    spool = tmp_path / "calibrated.spool"
    report = tmp_path / "report.json"
    calibrated = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60,
        env={**base, "FECOMLITE_SPOOL": str(spool),
             "FECOMLITE_CALIBRATE": json.dumps(["prog.py:7:8", "prog.py:8:8", "prog.py:9:0"]),
             "FECOMLITE_CALIBRATE_S": "0.2", "FECOMLITE_CALIBRATE_GAP_S": "0",
             "FECOMLITE_CALIBRATE_REPORT": str(report)})
    assert plain.returncode == calibrated.returncode == 0, calibrated.stderr
    assert (calibrated.stdout, calibrated.stderr) == (plain.stdout, plain.stderr) != ("", "")
    from fecomlite.runtime import batch_codec

    rows = []
    with open(spool, "rb") as f:
        for body in batch_codec.read_records(f):
            header, cols = batch_codec.decode(body)
            rows += [(header["sites"][s], t0, t1) for s, t0, t1 in
                     zip(cols["site"], cols["t_start_ns"], cols["t_end_ns"], strict=True)]
    program = [r for r in rows if not r[0].startswith(PREFIX)]
    replays = [r for r in rows if r[0].startswith(PREFIX)]
    assert sorted(r[0] for r in program).count("prog.py:4:11") == 3  # only the program's own
    by_site = {site: [r for r in replays if r[0] == site] for site in {r[0] for r in replays}}
    assert set(by_site) == {"calibrate:prog.py:7:8", "calibrate:prog.py:8:8",
                            "calibrate:prog.py:4:11"}  # print: I/O, never replayed
    assert min(r[1] for r in replays) >= max(r[2] for r in program)
    for site in ("calibrate:prog.py:7:8", "calibrate:prog.py:8:8"):
        assert (by_site[site][-1][2] - by_site[site][0][1]) / 1e9 >= 0.2
    outer = np.array(sorted(r[1:] for r in by_site["calibrate:prog.py:8:8"]))
    inner = np.array(sorted(r[1:] for r in by_site["calibrate:prog.py:4:11"]))
    assert len(inner) == len(outer)  # one nested call in each replay of forward...
    assert (outer[:, 0] <= inner[:, 0]).all() and (inner[:, 1] <= outer[:, 1]).all()  # inside
    done = json.loads(report.read_text())
    assert done["prog.py:7:8"]["calls"] == len(by_site["calibrate:prog.py:7:8"])
    assert done["prog.py:9:0"]["skipped"] == "input/output"


# -- what the analysis makes of replays ------------------------------------------------------

MS = 1_000_000
IDLE_W = 100.0
TRUE_W = {"torch.matmul": 500.0, "torch.sum": 200.0}  # above idle, while each runs alone
SITE_API = {"a.py:1:0": "torch.matmul", "a.py:2:0": "torch.sum"}


def _training_loop(start: int) -> list[tuple[str, int, int]]:
    """3 s in which every 100 ms interval holds 60 ms of matmul, 30 ms of sum, 10 ms of nothing:
    the same mix everywhere, so these intervals alone cannot tell the two APIs apart."""
    events = []
    for k in range(30):
        t = start + k * 100 * MS
        events += [("a.py:1:0", t + i * 10 * MS, t + (i + 1) * 10 * MS) for i in range(6)]
        events += [("a.py:2:0", t + i * 10 * MS, t + (i + 1) * 10 * MS) for i in range(6, 9)]
    return events


def _replays(start: int) -> list[tuple[str, int, int]]:
    """1.5 s of each site alone, 5 ms calls back to back, 0.5 s apart."""
    events = []
    for j, site in enumerate(SITE_API):
        t = start + j * 2000 * MS
        events += [(PREFIX + site, t + i * 5 * MS, t + (i + 1) * 5 * MS) for i in range(300)]
    return events


def _energy_counter(events: list[tuple[str, int, int]], end: int) -> tuple[list[int], list[float]]:
    """A GPU energy counter read every 100 ms from the true powers, with a little noise."""
    rng = np.random.default_rng(8)
    grid = np.arange(0, end + 100 * MS, 100 * MS)
    above = np.zeros(grid.size - 1)
    for site, a, b in events:
        power = TRUE_W[SITE_API[site.removeprefix(PREFIX)]]
        k = a // (100 * MS)  # every call lies inside one interval
        above[k] += power * (b - a) / 1e9
    per_interval = IDLE_W * 0.1 + above + rng.normal(0.0, 0.05, above.size)
    return grid.tolist(), np.concatenate(([0.0], np.cumsum(per_interval))).tolist()


def _store_batch(store: Store, run_id: int, rep: int, events: list[tuple[str, int, int]],
                 manifest: dict) -> None:
    names = sorted({e[0] for e in events})
    n = len(events)
    store.add_batch(run_id, {"sites": names, "rep": rep, "pid": 1}, {
        "site": np.array([names.index(e[0]) for e in events]),
        "t_start_ns": np.array([e[1] for e in events]),
        "t_end_ns": np.array([e[2] for e in events]),
        "tid": np.full(n, 1, np.uint64), "status": np.zeros(n, np.uint8),
        "in_bytes": np.full(n, -1), "out_bytes": np.full(n, -1),
    }, manifest)


def test_replays_let_the_fit_tell_apart_apis_that_always_run_together(tmp_path: Path):
    program = {key: {"file": "a.py", "line": i + 1, "api": api, "kind": "function"}
               for i, (key, api) in enumerate(SITE_API.items())}
    manifest = {**program, **replay_sites(program)}
    reps = {1: _training_loop(1000 * MS), 2: _training_loop(5000 * MS),
            3: _replays(9000 * MS)}
    end = 13_000 * MS
    with Store(tmp_path / "store.sqlite") as store:
        run_id = store.create_run(program="a.py", idle={"nvml:0:energy": IDLE_W})
        sensor = store.add_sensor(run_id, name="nvml:0:energy", domain="gpu:0", unit="J",
                                  kind="counter", provenance="measured", model=None,
                                  period_s=0.1)
        t, v = _energy_counter([e for events in reps.values() for e in events], end)
        store.add_samples([(sensor, ti, vi) for ti, vi in zip(t, v, strict=True)])
        for rep, events in reps.items():
            first, last = events[0][1], events[-1][2]
            store.upsert_repetition(run_id, rep, t_start_ns=first - 500 * MS,
                                    t_end_ns=last + 100 * MS, tail_end_ns=last + 500 * MS,
                                    exit_code=0, extra={"calibration": rep == 3})
            _store_batch(store, run_id, rep, events, manifest)
        analysis = analyse_run(store, run_id)
    fit = analysis.intensities["gpu:0"]
    assert fit["method"] == "intensity", fit["reason"]
    for api, true_w in TRUE_W.items():
        got = fit["apis"][api]
        assert abs(got["intensity_W"] - true_w) < max(3 * got["sigma_W"], 0.02 * true_w), got
    apis = {r["api"]: r["energy"]["gpu:0"]["above_idle_J"] for r in analysis.apis}
    program_truth = {"torch.matmul": 500.0 * 0.06 * 60, "torch.sum": 200.0 * 0.03 * 60}
    for api, truth in program_truth.items():
        assert apis[api] == pytest.approx(truth, rel=0.03)  # overlap alone: -20 % and +100 %
        assert apis[PREFIX + api] == pytest.approx(TRUE_W[api] * 1.5, rel=0.03)


# -- end to end, with the measurement server --------------------------------------------------

NUMPY_PROGRAM = """\
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    a = np.linspace(0.0, 1.0, 300 * 300)
    a.shape = (300, 300)
    acc = np.zeros((300, 300))
    noise = np.random.default_rng(0).standard_normal(4)
    total = 0.0
    for _ in range(40):
        b = np.matmul(a, a)
        np.add(acc, b, out=acc)
        total += float(np.sum(b))
    np.save(Path(sys.argv[1]) / "acc.npy", acc)
    print(f"total {total:.6e} acc {acc[7, 7]:.6e} noise {noise[0]:.4f}")


main()
"""

FAST = RunSettings(repeat=1, idle_s=0.2, tail_s=0.2, gate=False, pause_s=(0.0, 0.0))


def _calibrated_run(tmp_path: Path, source: str, settings: RunSettings, top: int,
                    seconds: float) -> tuple[int, Path, Path]:
    """(run id, store path, the run's log folder); the program's argument: a folder for files."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "prog.py").write_text(source)
    run_out = tmp_path / "run-out"
    run_out.mkdir()
    home = tmp_path / "home"
    program = prepare_program(project / "prog.py", [str(run_out)], settings, home / "work")
    client = ensure_server(home)
    try:
        log_dir = home / "logs"
        outcome = run_experiment(
            client, program, settings, log_dir=log_dir,
            after=functools.partial(run_calibration, top=top, seconds=seconds, gap_s=0.3),
        )
    finally:
        client.shutdown()
    assert outcome.status == "finished", [p.read_text() for p in outcome.logs]
    assert len(outcome.repetitions) == settings.repeat + 1
    return outcome.run_id, client.store_path, log_dir


def _replay_spans(store: Store, run_id: int) -> dict[str, tuple[str, str, int, int, float]]:
    rows = events_table(store).db.execute(
        "SELECT s.key, s.api, s.kind, min(e.rep), max(e.rep), count(*), "
        "(max(e.t_end_ns) - min(e.t_start_ns)) / 1e9 FROM events e "
        "JOIN sites s ON s.id = e.site_id WHERE e.run_id=? AND s.key LIKE 'calibrate:%' "
        "GROUP BY s.key", (run_id,)).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def test_calibrate_replays_only_allowed_calls_and_leaves_the_output_alone(tmp_path: Path):
    (tmp_path / "plain-out").mkdir()
    plain = subprocess.run([sys.executable, "-c", NUMPY_PROGRAM, str(tmp_path / "plain-out")],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    settings = RunSettings(**{**FAST.__dict__, "api": ["numpy"]})
    run_id, store_path, logs = _calibrated_run(tmp_path, NUMPY_PROGRAM, settings, top=3,
                                               seconds=1.0)
    assert (logs / "rep-1.log").read_text() == (logs / "rep-2.log").read_text() == plain
    assert np.array_equal(np.load(tmp_path / "run-out" / "acc.npy"),
                          np.load(tmp_path / "plain-out" / "acc.npy"))
    with Store(store_path) as store:
        result = store.result(run_id, "calibration")
        assert result["rep"] == 2
        assert store.repetitions(run_id)[1]["extra"]["calibration"] is True
        replayed = {r["api"]: r for r in result["replayed"]}
        skipped = {r["api"]: r["reason"] for r in result["skipped"]}
        assert set(replayed) == {"numpy.matmul", "numpy.sum"}  # the top 3 allowed: all of them
        assert "out" in skipped["numpy.add"]  # allowed by name, refused for its `out=`
        assert skipped["numpy.save"] == "input/output"
        assert "random" in skipped["numpy.random.default_rng"]
        spans = _replay_spans(store, run_id)
        assert set(spans) == {r["replay_site"] for r in result["replayed"]}
        for entry in result["replayed"]:
            api, kind, rep_min, rep_max, count, span = spans[entry["replay_site"]]
            assert (api, kind, rep_min, rep_max) == (PREFIX + entry["api"], "calibration", 2, 2)
            assert count == entry["calls"] and span >= 1.0
        last_own = events_table(store).db.execute(
            "SELECT max(e.t_end_ns) FROM events e JOIN sites s ON s.id=e.site_id "
            "WHERE e.run_id=? AND e.rep=2 AND s.key NOT LIKE 'calibrate:%'", (run_id,)
        ).fetchone()[0]
        first_replay = events_table(store).db.execute(
            "SELECT min(e.t_start_ns) FROM events e JOIN sites s ON s.id=e.site_id "
            "WHERE e.run_id=? AND s.key LIKE 'calibrate:%'", (run_id,)).fetchone()[0]
        assert first_replay > last_own  # in isolation, after the program's own calls

        analysis = analyse_run(store, run_id)
    apis = {r["api"]: r for r in analysis.apis}
    assert apis["numpy.matmul"]["calls"] == 80  # 40 a repetition: replays are not in it
    assert apis[PREFIX + "numpy.matmul"]["calls"] == replayed["numpy.matmul"]["calls"]

    from fecomlite.report.build import build_report
    from fecomlite.report.render import write_report

    with Store(store_path) as store:
        report = build_report(store, run_id, analysis=analysis)
    replays = report.context["replays"]
    assert {(r["api"], r["site"]) for r in replays["rows"]} == {
        (e["api"], e["site"]) for e in result["replayed"]}
    assert {s["api"] for s in replays["skipped"]} >= {"numpy.add", "numpy.save"}
    write_report(report, tmp_path / "report", formats=("html",))
    html = (tmp_path / "report" / "index.html").read_text()
    assert 'id="calibration"' in html and "input/output" in html


TORCH_PROGRAM = """\
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same sums in the same order in every repetition
    x = torch.linspace(-1.0, 1.0, 256 * 64).reshape(256, 64)
    y = torch.sin(x).sum(dim=1, keepdim=True)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(100):  # the second costliest site, above a one-off first call's set-up
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        for _ in range(300):  # clearly the costliest site, whatever a first call's set-up costs
            pred = model(x)
    print(f"loss {loss.item():.6f} pred {float(pred.abs().sum()):.4f}")


main()
"""


@pytest.mark.slow
def test_calibrate_on_a_torch_training_loop(tmp_path: Path):
    """The two forward passes cost the most: the one in the training loop is refused (training
    mode), the one in eval mode is replayed; the optimizer and backward are never candidates."""
    run_id, store_path, logs = _calibrated_run(tmp_path, TORCH_PROGRAM, FAST, top=2,
                                               seconds=1.0)
    output = (logs / "rep-1.log").read_text()
    assert output.startswith("loss ") and (logs / "rep-2.log").read_text() == output
    with Store(store_path) as store:
        result = store.result(run_id, "calibration")
        spans = _replay_spans(store, run_id)
    replayed = {r["site"]: r["api"] for r in result["replayed"]}
    skipped = {r["site"]: r["reason"] for r in result["skipped"]}
    assert replayed == {"prog.py:20:19": "torch.nn.Sequential.__call__"}  # model(x), in eval
    assert "training mode" in skipped["prog.py:14:38"]  # model(x) in the training loop
    assert "optimizer" in skipped["prog.py:16:8"]  # optimizer.step
    assert "gradients" in skipped["prog.py:15:8"]  # loss.backward
    assert set(spans) == {"calibrate:prog.py:20:19"}
    assert spans["calibrate:prog.py:20:19"][-1] >= 1.0


@pytest.mark.slow
def test_torch_modules_replay_only_in_eval_mode_and_without_gradients(make_replayer):
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    x = torch.randn(8, 4)
    api = "torch.nn.Sequential.__call__"
    assert "training mode" in runtime_refusal(api, "method", model, (x,), {})
    model.eval()
    model[1].train()  # one module inside still in training mode
    assert "training mode" in runtime_refusal(api, "method", model, (x,), {})
    model.eval()
    assert runtime_refusal(api, "method", model, (x,), {}) is None

    relu, dropout = "torch.nn.functional.relu", "torch.nn.functional.dropout"
    F = nn.functional
    assert "in place" in runtime_refusal(relu, "function", F.relu, (x,), {"inplace": True})
    assert "in place" in runtime_refusal(relu, "function", F.relu, (x, True), {})
    assert "training" in runtime_refusal(dropout, "function", F.dropout, (x,), {})
    assert runtime_refusal(dropout, "function", F.dropout, (x, 0.5, False), {}) is None

    state = {k: v.clone() for k, v in model.state_dict().items()}
    grad_enabled = []

    def forward_hook(module, args, output):
        grad_enabled.append(torch.is_grad_enabled())

    model.register_forward_hook(forward_hook)
    record = Recorder()
    replayer = make_replayer({"m.py:1:0": (api, "method")}, seconds=0.1, record=record)
    replayer.keep("m.py:1:0", model, (x,), {})
    calls = replayer.run()["m.py:1:0"]["calls"]
    assert calls == len(record.events) > 1
    assert grad_enabled and not any(grad_enabled)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert replayer.run() is replayer.report and len(record.events) == calls  # once only
    model.train()
    again = make_replayer({"m.py:1:0": (api, "method")}, seconds=0.1, record=record)
    again.keep("m.py:1:0", model, (x,), {})  # called in training mode...
    model.eval()  # ...in eval mode by the time of the replay: still not replayed
    assert "training mode" in again.run()["m.py:1:0"]["skipped"]


@pytest.mark.slow
def test_keras_layers_replay_with_training_false():
    import keras

    from fecomlite.runtime.calibration_replay import inference_arguments

    layer = keras.layers.Dropout(0.9)
    x = np.ones((4, 64), dtype="float32")
    args, kwargs = inference_arguments(layer, (x,), {"training": True})
    assert kwargs["training"] is False
    assert np.array_equal(np.asarray(layer(*args, **kwargs)), x)  # inference: no dropout
    relu = keras.layers.ReLU()
    assert inference_arguments(relu, (x,), {}) == ((x,), {})  # its call takes no `training`
    assert runtime_refusal("keras.layers.Dropout.__call__", "method", layer, args, kwargs) is None
    lstm = keras.layers.LSTM(2, stateful=True)
    assert "stateful" in runtime_refusal("keras.layers.LSTM.__call__", "method", lstm,
                                         (np.ones((1, 3, 2), "float32"),), {})

