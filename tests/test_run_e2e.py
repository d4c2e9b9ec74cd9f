"""`fecomlite run` end to end: real server, real sensors (estimated here), real programs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import run_cli
from stored_events import events_table

from fecomlite.store import Store

FAST = ["--idle", "0.5", "--tail", "0.3", "--gate-max-wait", "2"]


def fecomlite_run(
    home: Path, cwd: Path, script: str, *options: str
) -> subprocess.CompletedProcess[str]:
    """`fecomlite run --home HOME OPTIONS SCRIPT`: what follows the script would be its own."""
    return run_cli(cwd, "run", "--home", str(home), *options, script)


def latest(home: Path) -> tuple[Store, int]:
    store = Store(home / "store.sqlite", create=False)
    return store, max(r["id"] for r in store.runs())


def api_counts(store: Store, run_id: int) -> dict[str, int]:
    rows = events_table(store).db.execute(
        "SELECT s.api, count(*) FROM events e JOIN sites s ON s.id = e.site_id "
        "WHERE e.run_id=? GROUP BY s.api",
        (run_id,),
    )
    return dict(rows.fetchall())


NUMPY_SCRIPT = """
    import numpy as np

    a = np.ones((64, 64))
    for i in range({n}):
        b = np.matmul(a, a)
        if i == {fail_at}:
            raise RuntimeError("halfway")
    print("done", float(np.sum(b)))
"""


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_method_level_run_stores_gates_baseline_calls_and_hyperparameters(home, tmp_path):
    script = write(tmp_path, "prog.py", NUMPY_SCRIPT.format(n=50, fail_at=-1))
    result = fecomlite_run(
        home,
        tmp_path,
        str(script),
        "--api",
        "numpy",
        "--repeat",
        "2",
        "--param",
        "learning_rate=0.1",
        *FAST,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "numpy.matmul" in result.stdout and "estimated" in result.stdout
    store, run_id = latest(home)
    run = store.run(run_id)
    assert run["status"] == "finished" and run["level"] == "method"
    assert run["settings"]["repeat"] == 2 and run["settings"]["api"] == ["numpy"]
    assert run["hyperparams"] == {"learning_rate": "0.1"}
    assert run["idle"], "no idle baseline stored"
    reps = store.repetitions(run_id)
    assert [r["rep"] for r in reps] == [1, 2]
    for rep in reps:
        assert rep["exit_code"] == 0 and rep["tail_end_ns"] > rep["t_end_ns"] > rep["t_start_ns"]
        assert "passed" in rep["gate"] and rep["gate"]["checked"], rep["gate"]
    counts = api_counts(store, run_id)
    assert counts["numpy.matmul"] == 100 and counts["numpy.sum"] == 2
    provenance = {s["domain"]: s["provenance"] for s in store.sensors(run_id)}
    assert provenance["cpu-package"] == "estimated"


def test_a_program_that_fails_keeps_its_measurements_up_to_the_failure(home, tmp_path):
    script = write(tmp_path, "fails.py", NUMPY_SCRIPT.format(n=50, fail_at=19))
    result = fecomlite_run(home, tmp_path, str(script), "--api", "numpy", "--repeat", "2", *FAST)
    assert result.returncode == 1
    assert "RuntimeError: halfway" in result.stderr  # the program's stderr, shown live
    store, run_id = latest(home)
    run = store.run(run_id)
    assert run["status"] == "failed" and run["exit_code"] == 1
    assert len(store.repetitions(run_id)) == 1  # no second repetition after a failure
    assert api_counts(store, run_id) == {"numpy.ones": 1, "numpy.matmul": 20}
    raised = events_table(store).db.execute(
        "SELECT count(*) FROM events WHERE run_id=? AND status=1", (run_id,))
    assert raised.fetchone()[0] == 0  # the program raised, none of its numpy calls did


KERAS_SCRIPT = """
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    from tensorflow import keras

    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).random((512, 16)).astype("float32")
    y = (x.sum(axis=1) > 8).astype("float32")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01), loss="binary_crossentropy")
    model.fit(x, y, epochs=2, batch_size=64, verbose=0)
    print("loss", round(float(model.evaluate(x, y, verbose=0)), 2))
"""


@pytest.mark.slow
def test_keras_method_and_project_level(home, tmp_path):
    script = write(tmp_path, "keras_prog.py", KERAS_SCRIPT)
    method = fecomlite_run(home, tmp_path, str(script), "--repeat", "2", *FAST)
    assert method.returncode == 0, method.stdout + method.stderr
    store, run_id = latest(home)
    run = store.run(run_id)
    assert run["hyperparams"]["epochs"] == 2 and run["hyperparams"]["batch_size"] == 64
    assert run["hyperparams"]["optimizer"] == "Adam"
    assert run["hyperparams"]["learning_rate"] == pytest.approx(0.01)
    assert run["hyperparams"]["parameters"] == 16 * 32 + 32 + 32 + 1
    counts = api_counts(store, run_id)
    assert counts["keras.Sequential.fit"] == 2 and counts["keras.layers.Dense"] == 4

    project = fecomlite_run(
        home, tmp_path, str(script), "--level", "project", "--repeat", "2", *FAST
    )
    assert project.returncode == 0, project.stdout + project.stderr
    store, project_id = latest(home)
    assert store.run(project_id)["level"] == "project"
    assert api_counts(store, project_id) == {"<program>": 2}


@pytest.mark.slow
def test_datasize_run_fits_curves_against_input_bytes(home, tmp_path):
    script = write(tmp_path, "keras_prog.py", KERAS_SCRIPT)
    result = fecomlite_run(
        home,
        tmp_path,
        str(script),
        "--repeat",
        "1",
        "--datasize",
        "keras.Sequential.fit",
        "--fractions",
        "0.25,0.5,1",
        *FAST,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    store = Store(home / "store.sqlite", create=False)
    parent = max(r["id"] for r in store.runs() if r["kind"] == "instrumented")
    datasize = store.result(parent, "datasize")
    assert datasize is not None, (store.run(parent)["status"], result.stdout[-3000:])
    assert datasize["target"] == "keras.Sequential.fit"
    points = sorted(datasize["points"], key=lambda p: p["fraction"])
    assert [p["fraction"] for p in points] == [0.25, 0.5, 1.0]
    sizes = [p["input_bytes"] for p in points]
    assert sizes[0] < sizes[1] < sizes[2] and sizes[2] == 512 * 16 * 4 + 512 * 4
    assert "linear" in datasize["fits"]["seconds"]
    print(json.dumps(datasize["fits"], indent=1))


TORCH_LOADER_SCRIPT = """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    features = torch.randn(1024, 16)
    targets = features.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(features, targets), batch_size=16)
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
"""


@pytest.mark.slow
def test_datasize_cutting_a_dataloader_scales_every_api_it_drives(home, tmp_path):
    """Cutting the TensorDataset cuts the DataLoader's batches: `step` and `backward` get their
    own scaling (calls in proportion, time about so), not only the cut call."""
    script = write(tmp_path, "loader_prog.py", TORCH_LOADER_SCRIPT)
    result = fecomlite_run(
        home, tmp_path, str(script), "--repeat", "2", "--datasize",
        "torch.utils.data.TensorDataset", "--fractions", "0.25,0.5,1", *FAST,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    store = Store(home / "store.sqlite", create=False)
    # the module's home holds the other tests' runs too: this run is the newest top-level one
    parent = max(r["id"] for r in store.runs() if r["kind"] == "instrumented")
    datasize = store.result(parent, "datasize")
    apis = {r["api"]: r for r in datasize["apis"]}
    for api in ("torch.optim.SGD.step", "torch.Tensor.backward"):
        row = apis[api]
        assert row["changes"], api
        calls = {(p["fraction"], p["calls"]) for p in row["points"]}
        assert calls == {(0.25, 16), (0.5, 32), (1.0, 64)}
        assert row["fits"]["calls"]["power"]["exponent"] == pytest.approx(1.0)
        time_fit = row["fits"]["seconds"]["power"]
        low, high = time_fit["exponent_ci95"]
        assert low < time_fit["exponent"] < high
        # more data, more time: on a quiet machine about 1; on a loaded one the scheduler's
        # pauses (tens of ms) dwarf 16 calls of ~0.1 ms and can pull the exponent anywhere
        # above 0 (0.2 at load 10 on 2 CPUs), so only the direction is asserted, or an
        # interval that holds 1
        assert time_fit["exponent"] > 0 or low < 1.0 < high, time_fit
        assert "energy_J" in row["fits"] and "mem_added_B" in row["fits"]
    assert not apis["torch.manual_seed"]["changes"]
    assert datasize["domain"] and datasize["provenance"] in ("measured", "estimated")
    assert "data size: exponent k" in result.stdout and "torch.optim.SGD.step" in result.stdout


def test_a_killed_server_loses_nothing_the_program_measured(home, tmp_path):
    """The program runs on when the server dies; its events wait in a spool for `ingest`."""
    script = write(tmp_path, "slow.py", """
        import time
        import numpy as np

        a = np.ones((8, 8))
        for i in range(40):
            np.matmul(a, a)
            time.sleep(0.05)
        print("finished")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fecomlite.cli", "run", "--home", str(home),
         "--api", "numpy", "--repeat", "1", "--no-gate", "--idle", "0.2", "--tail", "0.2",
         str(script)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 60
    while not list((home / "logs").glob("slow-*/rep-1.log")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the program is running and has posted a batch or two
    server_pid = json.loads((home / "server.json").read_text())["pid"]
    os.kill(server_pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, output
    assert "stopped answering" in output
    log_dir = next((home / "logs").glob("slow-*"))
    assert (log_dir / "rep-1.log").read_text().strip() == "finished"
    spools = list(log_dir.glob("*.spool"))
    assert spools, "the probe spooled nothing after the server died"
    ingest = run_cli(tmp_path, "ingest", "--home", str(home), *map(str, spools))
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr
    store, run_id = latest(home)
    assert api_counts(store, run_id)["numpy.matmul"] == 40  # posted before + spooled after
    assert not any(log_dir.glob("*.spool"))
