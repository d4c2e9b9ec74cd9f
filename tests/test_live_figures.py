"""The live view's figures follow the analysis' model (fecomlite.analysis.run_analysis): over a
real server
with a known power profile, the program's above-idle energy = in calls + outside calls, the
tail and the baseline apart, the share domain (cpu-process) counted from 0 W and never added,
and the same program/tail/other figures as `analyse_run` gives for the same run afterwards."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_server_support import FakeSensorForTests, encode_batch, serving

from fecomlite.analysis.run_analysis import analyse_run, domain_role
from fecomlite.sensors.estimate import PROCESS_MODEL
from fecomlite.server import live
from fecomlite.server.monitor import BIN_NS, SETTLE_S
from fecomlite.store import Store

S = 1_000_000_000
SITES = {"t.py:1:0": {"api": "pkg.alpha", "written": "alpha", "file": "t.py", "line": 1},
         "t.py:2:0": {"api": "pkg.beta", "written": "beta", "file": "t.py", "line": 2}}


def _sensors(busy: list[int]) -> list[FakeSensorForTests]:
    """Idle levels, and loud ones during `busy` (ns; empty until the test sets it)."""
    def level(quiet: float, loud: float):
        return lambda _: loud if busy and busy[0] <= time.monotonic_ns() < busy[1] else quiet

    return [
        FakeSensorForTests("fake:package", value=level(10.0, 110.0)),
        FakeSensorForTests("fake:dram", domain="dram", value=level(2.0, 4.0)),
        # the program's share, read above idle already: its 5 W between busy spells is the
        # program's own, never an idle level to subtract
        FakeSensorForTests("fake:process", domain="cpu-process", value=level(5.0, 85.0),
                           provenance="estimated", model=PROCESS_MODEL),
    ]


def _start(server: Any, client: Any, rep: list[int]) -> tuple[int, str]:
    """A run with its idle baseline, then its repetition `rep` (set here: a second on the steps'
    grid, just after the baseline, however long that took) started on time, and a viewer
    watching (the monitor follows the run); (run, token)."""
    run, token = client.create_run("t.py", [], "method", {"repeat": 1},
                                   manifest={"sites": SITES})
    client.idle(run, 0.6)
    rep[:] = [(time.monotonic_ns() // BIN_NS + 2) * BIN_NS, 0]
    rep[1] = rep[0] + S
    time.sleep(max(0.0, (rep[0] - time.monotonic_ns()) / 1e9))
    server.service.rep_start(run, 1, rep[0], None)
    server.service.monitor.refresh()
    return run, token


def test_live_figures_are_the_analysis_figures(tmp_path: Path):
    """Idle 0.6 s; the repetition runs 1 s at 110 W (idle 10 W): alpha its first half, beta a
    quarter, the program's own code the last quarter; a 0.5 s tail at idle follows."""
    rep: list[int] = []
    with serving(tmp_path, _sensors(rep)) as (server, client):
        svc = server.service
        run, token = _start(server, client, rep)
        events = [("t.py:1:0", rep[0], rep[0] + S // 2, 1, 0, -1, -1),
                  ("t.py:2:0", rep[0] + S // 2, rep[0] + 3 * S // 4, 1, 0, -1, -1)]
        assert client.post_batch(run, token, encode_batch(1, 42, events)) == 2
        time.sleep(max(0.0, (rep[1] - time.monotonic_ns()) / 1e9))
        svc.rep_end(run, 1, rep[1], 0)
        svc._db().upsert_repetition(run, 1, tail_end_ns=rep[1] + S // 2)
        time.sleep(max(0.0, (rep[1] + S // 2 - time.monotonic_ns()) / 1e9))
        client.finish_run(run, "finished", 0)
        time.sleep(SETTLE_S + 2 * BIN_NS / 1e9)  # every step of the run settled
        snap = svc.monitor.refresh()
        msg = live.message(svc.monitor, snap, {"seq": 0, "run": None, "started": False})
        store_path = svc.store_path

    domains = {d["domain"]: d for d in msg["figures"]["domains"]}
    package, process = domains["cpu-package"], domains["cpu-process"]
    assert package["program_J"] == pytest.approx(100.0, rel=0.05)
    assert package["in_calls_J"] == pytest.approx(75.0, rel=0.05)
    assert package["outside_calls_J"] == pytest.approx(25.0, rel=0.1)
    assert package["program_J"] == pytest.approx(package["in_calls_J"]
                                                 + package["outside_calls_J"])
    assert package["in_calls_text"].startswith("75") and "of the program's CPU package" in \
        package["in_calls_text"]
    assert process["idle_W"] == 0.0 and process["program_J"] == pytest.approx(85.0, rel=0.05)
    for d in domains.values():  # roles as the analysis defines them
        assert {k: d[k] for k in ("role", "of", "addable")} == {
            k: domain_role(d["domain"])[k] for k in ("role", "of", "addable")}
    every = msg["figures"]["all_domains"]
    assert every["domains"] == ["cpu-package", "dram"]  # the share is never added
    assert every["program_J"] == pytest.approx(package["program_J"]
                                               + domains["dram"]["program_J"])
    top = {a["api"]: a for a in msg["calls"]["top"]}
    alpha = top["pkg.alpha"]
    assert alpha["energy"]["cpu-package"] == pytest.approx(50.0, rel=0.05)
    assert alpha["share"]["cpu-package"] == pytest.approx(
        alpha["energy"]["cpu-package"] / package["program_J"])
    assert alpha["all_domains"]["above_idle_J"] == pytest.approx(
        alpha["energy"]["cpu-package"] + alpha["energy"]["dram"])
    assert alpha["all_domains"]["domains"] == ["cpu-package", "dram"]

    with Store(store_path) as store:
        report = {d["domain"]: d for d in analyse_run(store, run, method="overlap").domains}
    for name, d in domains.items():
        r = report[name]
        assert d["idle_W"] == pytest.approx(r["idle_W"], abs=1e-6), name
        # windows: the same for any method, up to one sensor period at a step of the power
        # (0.02 s at 100 W: 2 J), which the report places by sample and the live view by step
        for key in ("program_J", "tail_J", "other_J"):
            assert d[key] == pytest.approx(r[key], rel=0.05, abs=2.5), (name, key)
        # the split between calls and the program depends on the method: the report's overlap
        # gives calls a sensor interval's energy that the live 0.5 s steps share by time
        assert d["in_calls_J"] == pytest.approx(r["in_calls_J"], rel=0.1, abs=0.5), name


def test_a_call_in_progress_holds_the_energy_of_its_time_so_far(tmp_path: Path):
    """alpha began with the repetition and has not ended: the busy second is its energy, not
    the program's outside calls (a call is stored only when it ends)."""
    busy: list[int] = []
    with serving(tmp_path, _sensors(busy)) as (server, client):
        svc = server.service
        run, token = _start(server, client, busy)
        running = [{"tid": 1, "depth": 1, "calls": [["t.py:1:0", busy[0]]]}]
        client.post_batch(run, token, encode_batch(1, 42, [], open=running))
        time.sleep(max(0.0, (busy[1] + S + SETTLE_S * S - time.monotonic_ns()) / 1e9))
        snap = svc.monitor.refresh()
        msg = live.message(svc.monitor, snap, {"seq": 0, "run": None, "started": False})

    package = next(d for d in msg["figures"]["domains"] if d["domain"] == "cpu-package")
    (alpha,) = msg["calls"]["top"]
    assert (alpha["api"], alpha["calls"]) == ("pkg.alpha", 0)  # not ended: no call counted yet
    assert alpha["energy"]["cpu-package"] == pytest.approx(100.0, rel=0.05)
    assert package["in_calls_J"] == pytest.approx(package["program_J"])
    assert package["outside_calls_J"] == pytest.approx(0.0, abs=0.5)
    (shown,) = msg["calls"]["in_progress"]
    assert shown["api"] == "pkg.alpha" and shown["elapsed_s"] >= 2.0


@pytest.mark.parametrize(("machine", "mine", "busy"), [(80.0, 20.0, True), (25.0, 20.0, False)])
def test_other_processes_on_the_cpus_make_machine_level_figures_unreliable(machine, mine, busy):
    """The live view judges the load now with the analysis' threshold and rule: the CPU package
    and DRAM hold other processes' work, the program's own share does not."""
    load = live._machine_load({"util:cpu": {"now": machine}, "util:process": {"now": mine}})
    assert load["busy"] is busy and load["other_pct"] == pytest.approx(machine - mine)
    assert ("unreliable" in load["text"]) is busy
    assert live.reliable_when("cpu-package", load["busy"]) is not busy
    assert live.reliable_when("dram", load["busy"]) is not busy
    assert live.reliable_when("cpu-process", load["busy"]) is True
