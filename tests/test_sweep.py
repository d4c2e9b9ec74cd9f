"""Sweep grids from files and options, the table's columns, and a tiny sweep end to end."""

from __future__ import annotations

import csv
import json
import math

import pytest
from test_model_fit import PLANTED

from fecomlite.model.network import ConfigError, NetworkConfig
from fecomlite.model.sweep import (
    CONFIG_KIND,
    SWEEP_KIND,
    TINY_GRID,
    SweepGrid,
    feature_columns,
    grid_from_mapping,
    load_grid,
    parse_list,
    write_csv,
)


def test_configurations_are_the_product_without_repeats():
    grid = SweepGrid(widths=(8, 16), depths=(1, 2), shapes=("rectangle", "funnel"),
                     batch_sizes=(32,), dataset_sizes=(64, 128))
    configs = grid.configurations()
    # a one-layer funnel is a rectangle: 2 widths × 2 sizes of them run once
    assert len(configs) == 2 * 2 * 2 * 2 - 2 * 2
    assert len({c.key for c in configs}) == len(configs)
    assert len({(tuple(c.layer_sizes()), c.dataset_size) for c in configs}) == len(configs)
    assert len(TINY_GRID.configurations()) == 2


def test_grid_files_in_toml_and_json(tmp_path):
    toml = tmp_path / "grid.toml"
    toml.write_text('widths = [8, 32]\ndepths = [2]\nshapes = ["exponential"]\nepochs = 2\n')
    grid = load_grid(toml)
    assert (grid.widths, grid.depths, grid.shapes, grid.epochs) == ((8, 32), (2,), (
        "exponential",), 2)
    assert grid.batch_sizes == SweepGrid().batch_sizes  # the rest keeps its defaults
    as_json = tmp_path / "grid.json"
    as_json.write_text(json.dumps({"widths": [4], "batch-sizes": [16], "dataset_sizes": 64}))
    small = load_grid(as_json, TINY_GRID)
    assert (small.widths, small.batch_sizes, small.dataset_sizes) == ((4,), (16,), (64,))


@pytest.mark.parametrize(("text", "message"), [
    ("widths = [8, 0]", "width must be a positive integer"),
    ('shapes = ["pyramid"]', "unknown shape 'pyramid'"),
    ("colour = 3", "unknown grid key 'colour'"),
    ('widths = ["eight"]', "'eight' is not a whole number"),
    ("widths = []", "widths list is empty"),
    ("widths = [8", "not a valid grid file"),
    ("batch_sizes = [512]\ndataset_sizes = [100]", "smaller than batch size"),
    ("shapes = [3]", "3 is not a name"),
])
def test_bad_grid_files_are_clear_errors(tmp_path, text, message):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_grid(path)


def test_grid_files_that_are_not_tables(tmp_path):
    path = tmp_path / "grid.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a table of lists"):
        load_grid(path)
    with pytest.raises(ConfigError, match="cannot read grid file"):
        load_grid(tmp_path / "missing.toml")


def test_command_line_lists():
    assert parse_list("16, 64,256") == ["16", "64", "256"]
    with pytest.raises(ConfigError, match="comma-separated"):
        parse_list("16,,64")
    grid = grid_from_mapping({"widths": ["16", "64"], "shapes": ["funnel"]})
    assert grid.widths == (16, 64) and grid.shapes == ("funnel",)


def test_feature_columns_and_csv(tmp_path):
    row = feature_columns(NetworkConfig(64, 2, batch_size=32, dataset_size=320), PLANTED)
    assert row["steps"] == 10 and row["hidden_widths"] == "64/64"
    levels = [f"bytes_per_step_{lv}" for lv in PLANTED.level_names]
    assert sum(row[c] for c in levels) == pytest.approx(row["bytes_per_step"])
    assert row["working_set_level"] == PLANTED.level_of(row["max_working_set_bytes"])
    path = write_csv([row, {**row, "key": "other", "energy_J_all": None, "time_s": 1.5}],
                     tmp_path / "out" / "t.csv")
    with open(path, newline="") as f:
        read = list(csv.DictReader(f))
    assert [r["key"] for r in read] == [row["key"], "other"]
    assert read[0]["time_s"] == "" and read[1]["time_s"] == "1.5"
    assert read[1]["energy_J_all"] == ""


@pytest.mark.slow
def test_a_tiny_sweep_end_to_end(tmp_path):
    """Two Keras configurations through the real server, stored, tabled, and refused by a fit
    that would need more configurations than two; each trained with the threads asked for (a
    hyperparameter of its run), and named too short for the sensors (the CI grid's samples are
    fixed, so nothing was scaled)."""
    from test_model_command import cli
    from typer.testing import CliRunner

    from fecomlite.model.sweep import gpu_hierarchies
    from fecomlite.server.client import ServerClient
    from fecomlite.server.state import read_state
    from fecomlite.store import Store

    home = tmp_path / "home"
    out = tmp_path / "tiny.csv"
    runner = CliRunner()
    try:
        done = runner.invoke(cli, [
            "sweep", "--tiny", "--repeat", "1", "--idle", "0.5", "--tail", "0.2", "--no-gate",
            "--home", str(home), "--csv", str(out), "--threads", "1", "--min-training", "30",
        ])
        assert done.exit_code == 0, done.output
        flat = " ".join(done.output.split())
        assert "1 thread;" in flat and "pilot" not in flat
        assert "too short for the sensors (under 30 s, given by --min-training):" in flat
        with Store(home / "store.sqlite") as store:
            runs = store.runs()
            sweep = next(r for r in runs if r["kind"] == SWEEP_KIND)
            children = [r for r in runs if r["parent_id"] == sweep["id"]]
            table = store.result(sweep["id"], "sweep")
        assert sweep["status"] == "finished"
        assert table["gpu_hierarchies"] == gpu_hierarchies(children[0]["machine"])
        assert [c["kind"] for c in children] == [CONFIG_KIND, CONFIG_KIND]
        assert all(c["status"] == "finished" and c["level"] == "project" for c in children), \
            [(c["status"], c["level"]) for c in children]
        assert [c["hyperparams"]["threads"] for c in children] == ["1", "1"]
        assert table["threads"] == 1 and table["min_training"]["seconds"] == 30
        assert table["plan"] is None
        assert [c["settings"]["network"]["width"] for c in children] == [8, 256]
        rows = table["rows"]
        assert [r["run_id"] for r in rows] == [c["id"] for c in children]
        for row, child in zip(rows, children, strict=True):
            log = home / "logs" / f"sweep-{sweep['id']}" / row["key"] / "rep-1.log"
            printed = json.loads(log.read_text().strip().splitlines()[-1])
            assert printed["steps"] == row["steps"] == 512 // 32  # every step ran, and no more
            assert printed["threads"] == row["threads"] == 1
            assert row["too_short"] is True and row["key"] in flat
            rep = store_rep_seconds(home, child["id"])
            assert 0 < row["time_s"] < rep  # the training region only, inside the repetition
            assert (row["energy_J_all"] is not None and row["energy_J_all"] > 0) or (
                row["energy_J_all_below"] >= 0)  # a number above 0, or the bound it is below
            assert row["attribution_method"].startswith(table["attribution_method"])
            assert row["repetitions"] == 1
        domains = table["domains"]
        assert domains and all(d["provenance"] in ("measured", "estimated")
                               for d in domains.values())
        for name, meta in domains.items():
            assert meta["provenance"] in rows[0]["provenance"]
            assert f"energy_J_{name}" in rows[0]
        if domains["cpu-package"]["provenance"] == "estimated":  # the training used the CPU
            assert all((r["energy_J_cpu-process"] or r["energy_J_cpu-process_below"]) > 0
                       for r in rows)
        with open(out, newline="") as f:
            assert [r["key"] for r in csv.DictReader(f)] == [r["key"] for r in rows]
        for by in (["--sweep", str(sweep["id"])], [str(c["id"]) for c in children]):
            # two configurations: the largest model they support (FLOPs alone), the terms
            # left out named, not a refusal
            small = runner.invoke(cli, ["model", "fit", *by, "--home", str(home)],
                                  env={"COLUMNS": "200"})
            assert small.exit_code == 0, small.output
            flat = " ".join(small.output.split())
            assert "left out" in flat and "2 configurations support no more than 1 term:" in flat
    finally:
        state = read_state(home)
        if state is not None:
            ServerClient.from_state(state).shutdown()


def store_rep_seconds(home, run_id: int) -> float:
    from fecomlite.store import Store

    with Store(home / "store.sqlite") as store:
        (rep,) = store.repetitions(run_id)
    return (rep["t_end_ns"] - rep["t_start_ns"]) / 1e9


def recorded_run(store, network: dict | None = None,
                 parent_id: int | None = None, machine: dict | None = None,
                 busy_share: float = 50.0) -> int:
    """A configuration run as the server stores it on a machine without RAPL: 10 s of samples at
    10 Hz, estimated CPU power 3 W idle and 6.5 W while the program's process tree uses half the
    CPUs, during the training region [2 s, 4 s] of a repetition [1 s, 5 s], and the program's own
    share (est:cpu-process: (10 − 3) W × half the CPUs while busy)."""
    import numpy as np

    s = 1_000_000_000
    run_id = store.create_run(kind=CONFIG_KIND, level="project", status="finished",
                              idle={"est:cpu-package": 3.0}, parent_id=parent_id,
                              settings={"network": network} if network else {},
                              machine=machine or {})
    cpu = store.add_sensor(run_id, name="est:cpu-package", domain="cpu-package", unit="W",
                           kind="power", provenance="estimated", model="cpu-util-linear",
                           period_s=0.1)
    util = store.add_sensor(run_id, name="util:process", domain="utilisation", unit="%",
                            kind="gauge", provenance="measured", period_s=0.1)
    times = [i * s // 10 for i in range(1, 101)]
    busy = [2 * s < t <= 4 * s for t in times]
    store.add_samples([(cpu, t, 6.5 if b else 3.0) for t, b in zip(times, busy, strict=True)])
    store.add_samples([(util, t, busy_share if b else 0.0)
                       for t, b in zip(times, busy, strict=True)])
    own = store.add_sensor(run_id, name="est:cpu-process", domain="cpu-process", unit="W",
                           kind="power", provenance="estimated", model="process-cpu-share",
                           period_s=0.1)
    store.add_samples([(own, t, 3.5 if b else 0.0) for t, b in zip(times, busy, strict=True)])
    store.put_result(run_id, "sensors", {"est:cpu-package": {
        "model_params": {"max_w": 10.0, "idle_w": 3.0}}})
    store.upsert_repetition(run_id, 1, t_start_ns=s, t_end_ns=5 * s, tail_end_ns=5 * s)
    store.add_batch(run_id, {"rep": 1, "pid": 7, "sites": ["<program>", "region:train"]}, {
        "site": np.array([0, 1]), "t_start_ns": np.array([s, 2 * s]),
        "t_end_ns": np.array([5 * s, 4 * s]), "tid": np.array([1, 1]),
        "status": np.array([0, 0]), "in_bytes": np.array([-1, -1]),
        "out_bytes": np.array([-1, -1]),
    })
    return run_id


def test_a_runs_training_region_time_and_energy(tmp_path):
    from fecomlite.model.sweep import PROCESS_DOMAIN, measured_columns
    from fecomlite.store import Store

    with Store(tmp_path / "store.sqlite") as store:
        columns, domains = measured_columns(store, recorded_run(store))
    assert columns["time_s"] == pytest.approx(2.0) and columns["repetitions"] == 1
    assert columns["energy_J_cpu-package"] == pytest.approx(3.5 * 2, rel=0.02)
    assert columns["energy_J_all"] == columns["energy_J_cpu-package"]
    assert columns["idle_W_cpu-package"] == 3.0
    # process-cpu-share: (10 − 3) W × half the CPUs × 2 s
    assert columns[f"energy_J_{PROCESS_DOMAIN}"] == pytest.approx(7 * 0.5 * 2, rel=0.02)
    assert columns[f"idle_W_{PROCESS_DOMAIN}"] == 0.0  # above idle by construction
    assert domains[PROCESS_DOMAIN] == {
        "provenance": "estimated", "model": "process-cpu-share", "additive": False,
        "sensor": "est:cpu-process"}
    assert domains["cpu-package"]["additive"] is True
    assert columns["energy_J_all"] == columns["energy_J_cpu-package"]  # never summed with it
    assert "cpu-process: estimated (process-cpu-share)" in columns["provenance"]
    assert "cpu_s" not in columns  # the machine's CPUs unknown: no CPU seconds claimed


def test_the_training_regions_cpu_seconds_and_a_fit_on_them(tmp_path):
    """Half of 4 CPUs for the 2 s region: 4 CPU seconds. A fit of the CPU-time energy takes
    them as its time; the wall time is kept beside them."""
    from fecomlite.model.sweep import measured_columns, on_cpu_time
    from fecomlite.store import Store

    with Store(tmp_path / "store.sqlite") as store:
        columns, _ = measured_columns(store, recorded_run(store, machine={"cpu_logical": 4}))
    assert columns["cpu_s"] == pytest.approx(4.0) and columns["reps_cpu_s"] == [columns["cpu_s"]]
    row = {**columns, "reps_time_s": [2.0]}
    (swapped,) = on_cpu_time([row])
    assert swapped["time_s"] == swapped["reps_time_s"][0] == pytest.approx(4.0)
    assert swapped["wall_time_s"] == pytest.approx(2.0) and row["time_s"] == pytest.approx(2.0)
    assert on_cpu_time([row, {"time_s": 1.0}]) is None  # one row without: wall time for all


def test_a_region_the_cpu_share_did_not_resolve_has_no_cpu_seconds(tmp_path):
    """CPU time comes in 10 ms ticks: a short region can read a share of 0 though the program
    worked. Its CPU seconds are not known (a fit falls back to wall time), never 0."""
    from fecomlite.model.sweep import measured_columns
    from fecomlite.store import Store

    with Store(tmp_path / "store.sqlite") as store:
        columns, _ = measured_columns(store, recorded_run(
            store, machine={"cpu_logical": 4}, busy_share=0.0))
    assert columns["time_s"] == pytest.approx(2.0)
    assert "cpu_s" not in columns and "reps_cpu_s" not in columns


def test_gpu_l2_breakpoints_of_the_machine():
    from fecomlite.model.sweep import gpu_hierarchies

    machine = {"gpus": [{"index": 0, "name": "NVIDIA H200"}, {"index": 1, "name": "Mystery"}]}
    found = gpu_hierarchies(machine)
    assert [h["device"] for h in found] == ["gpu:0", "gpu:1"]
    assert found[0]["levels"][0] == {"name": "L2", "size_bytes": 50 << 20}
    assert [lv["name"] for lv in found[1]["levels"]] == ["VRAM"]
    assert gpu_hierarchies({}) == []


def test_the_default_domain_and_why():
    from fecomlite.model.sweep import default_domain

    measured = {"cpu-package": {"provenance": "measured", "additive": True},
                "dram": {"provenance": "measured", "additive": True}}
    assert default_domain(measured)[0] == "all"
    estimated = {"cpu-package": {"provenance": "estimated", "additive": True},
                 "cpu-process": {"provenance": "estimated", "additive": False}}
    domain, why = default_domain(estimated)
    assert domain == "cpu-process" and "other processes" in why
    assert default_domain({"cpu-package": {"provenance": "estimated", "additive": True}})[0] \
        == "all"


@pytest.mark.slow
def test_the_torch_program_trains_every_step():
    import subprocess
    import sys

    from fecomlite.model.sweep import FC_PROGRAM

    config = NetworkConfig(16, 2, "funnel", batch_size=32, dataset_size=200, epochs=2)
    done = subprocess.run(
        [sys.executable, str(FC_PROGRAM), "--config", json.dumps(config.to_json()),
         "--framework", "torch", "--threads", "1"], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == config.steps == 12
    assert result["framework"] == "torch" and math.isfinite(result["final_loss"])
    assert result["threads"] == 1 and result["training_s"] > 0


@pytest.mark.slow
def test_the_pilot_times_each_configuration_with_the_sweeps_threads():
    from fecomlite.model.duration import pilot

    configs = [NetworkConfig(16, 1, batch_size=32, dataset_size=4096),
               NetworkConfig(512, 2, batch_size=32, dataset_size=4096)]
    per_step = pilot(configs, "torch", threads=1)
    assert set(per_step) == {c.key for c in configs}
    assert all(0 < s < 1 for s in per_step.values())  # seconds a step of tiny networks
    assert per_step[configs[1].key] > per_step[configs[0].key]  # ~600× the FLOPs a step


def busy_run(store, start_s: float, region_s: float, above_W: float, noise_W: float = 0.0,
             seed: int = 0) -> int:
    """A configuration run whose training region [start, start + region] keeps the CPU fully
    busy at `above_W` over a 3 W idle; the averaging power sensor (10 Hz) reads the mean power
    of its last 0.1 s, so samples straddling the region's ends read part of it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    s = 1_000_000_000
    run_id = store.create_run(kind=CONFIG_KIND, level="project", status="finished",
                              idle={"est:cpu-package": 3.0})
    cpu = store.add_sensor(run_id, name="est:cpu-package", domain="cpu-package", unit="W",
                           kind="power", provenance="estimated", model="cpu-util-linear",
                           period_s=0.1)
    end_s = start_s + region_s
    samples = []
    for i in range(1, int((end_s + 2) * 10) + 1):
        t = i / 10
        inside = max(0.0, min(t, end_s) - max(t - 0.1, start_s)) / 0.1
        samples.append((cpu, int(t * s), 3.0 + above_W * inside + noise_W * rng.standard_normal()))
    store.add_samples(samples)
    store.upsert_repetition(run_id, 1, t_start_ns=s // 2, t_end_ns=int((end_s + 1) * s),
                            tail_end_ns=int((end_s + 1) * s))
    store.add_batch(run_id, {"rep": 1, "pid": 7, "sites": ["<program>", "region:train"]}, {
        "site": np.array([0, 1]), "t_start_ns": np.array([s // 2, int(start_s * s)]),
        "t_end_ns": np.array([int((end_s + 1) * s), int(end_s * s)]), "tid": np.array([1, 1]),
        "status": np.array([0, 0]), "in_bytes": np.array([-1, -1]),
        "out_bytes": np.array([-1, -1]),
    })
    return run_id


def test_a_fully_busy_sweep_implies_one_power_whatever_the_region_length(tmp_path):
    """Regions of 0.2 to 3 s, all at 3.5 W above idle: every configuration's energy ÷ time is
    that power (within the sensor's straddling of the ends), the check says ok, and every row
    names the one method the sweep used. A region of one sensor period is said to be
    unresolved, not checked."""
    from fecomlite.model.sweep import SWEEP_METHOD, measured_columns
    from fecomlite.store import Store

    with Store(tmp_path / "store.sqlite") as store:
        short, *rows = [measured_columns(store, busy_run(store, 2.03, region, 3.5))[0]
                        for region in (0.1, 0.21, 0.45, 1.2, 3.0)]
    assert short["power_check_cpu-package"].startswith("not resolved: the region (0.1 s)")
    for row in rows:  # off by at most the sensor's period at the ends, not by a factor 15
        power = row["energy_J_cpu-package"] / row["time_s"]
        assert abs(power - 3.5) <= (0.05 + 0.1 / row["time_s"]) * 3.5, power
        assert row["power_W_cpu-package"] == pytest.approx(3.5, rel=0.25)
        assert row["power_check_cpu-package"] == "ok"
        assert row["sampled_W_cpu-package"] > 0
        assert row["attribution_method"] == SWEEP_METHOD


def test_an_energy_not_above_its_uncertainty_is_a_bound_never_negative(tmp_path):
    """A region with nothing above a noisy idle: no negative energy in the table, an empty
    energy and the bound it is below."""
    from fecomlite.model.sweep import measured_columns, write_csv
    from fecomlite.store import Store

    with Store(tmp_path / "store.sqlite") as store:
        rows = [measured_columns(store, busy_run(store, 2.03, 0.3, 0.0, noise_W=0.3,
                                                  seed=seed))[0] for seed in range(6)]
    bounds = 0
    for row in rows:
        energy, sigma = row["energy_J_cpu-package"], row["energy_J_cpu-package_sigma"]
        if energy is None:
            bounds += 1
            assert row["energy_J_cpu-package_below"] >= 2 * sigma > 0
            assert row["energy_J_all"] is None
        else:  # pure noise may pass 2σ now and then; then it is a positive number above it
            assert energy > 2 * sigma
    assert bounds >= 4
    with open(write_csv(rows, tmp_path / "t.csv"), newline="") as f:
        cells = [(k, v) for row in csv.DictReader(f) for k, v in row.items()
                 if k.startswith(("energy_J_", "power_W_")) and v]
    assert cells and all(float(v) > 0 for k, v in cells if not k.endswith("_std")), cells


def test_an_implied_power_unlike_the_samples_is_flagged():
    from fecomlite.model.sweep import _power_check

    readings = [6.4, 6.5, 6.6] * 4  # 3.5 W above a 3 W idle, over 1.2 s
    assert _power_check(readings, 0.1, "d", 3.45, 0.05, 3.0, 1.2)["power_check_d"] == "ok"
    wrong = _power_check(readings, 0.1, "d", 0.2, 0.05, 3.0, 1.2)["power_check_d"]
    assert wrong == "implied 0.2 W against 3.5 W in the samples"
