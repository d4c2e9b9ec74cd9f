"""Every bad input named: each command's file, number and path options fed the classes of bad
value (read-only, missing, folder, existing file, nan/inf/huge/negative, torn, foreign, empty);
any traceback fails (issue #31). The CLI runs in this process: one interpreter for all cases."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from cli_runner import invoke
from report_helpers import build_run
from test_model_fit import ESTIMATED, PLANTED, grid_configs, synthetic_rows

from fecomlite.model.fit import fit_models
from fecomlite.store import Store

NUMBERS = ("nan", "inf", "-inf", "-1", "0", "99999999999999999999999", "-99999999999999999999999")
CALLS = "t_start_ns,t_end_ns,api\n0,1000000,a\n2000000,3000000,b\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Good inputs beside the bad ones: a store, CSVs, a model, a project; a read-only folder."""
    root = tmp_path_factory.mktemp("fuzz")
    store = root / "store.sqlite"
    with Store(store) as db:
        build_run(db)
    torn = root / "torn.sqlite"
    torn.write_bytes(store.read_bytes()[: store.stat().st_size // 3])
    foreign = root / "foreign.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE notes (body TEXT)")
    db.commit()
    db.close()
    (root / "empty").write_bytes(b"")
    (root / "file.txt").write_text("not what was asked for\n")
    (root / "folder").mkdir()
    (root / "calls.csv").write_text(CALLS)
    (root / "samples.csv").write_text("t_ns,energy_mJ\n0,0\n1500000,5\n3500000,9\n")
    (root / "decreasing.csv").write_text("t_ns,energy_mJ\n0,9\n1500000,5\n3500000,1\n")
    rows = synthetic_rows(np.random.default_rng(20), grid_configs(), noise=0.05)
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED, source={"sweep_id": 1})
    (root / "model.json").write_text(json.dumps(models.to_json()))
    (root / "project").mkdir()
    (root / "project" / "train.py").write_text("import numpy as np\nprint(np.ones(3).sum())\n")
    read_only = root / "read-only"
    read_only.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(read_only)],
        capture_output=True).returncode == 0
    if not mounted:
        read_only.chmod(0o500)  # read-only to anyone but root
    paths = {p.stem if p.suffix != ".txt" else "file": p for p in root.iterdir()}
    yield {**paths, "missing": root / "no" / "such" / "thing", "passwd": Path("/etc/passwd")}
    if mounted:
        subprocess.run(["umount", "-l", str(read_only)], capture_output=True)


def cases(w: dict[str, Path]) -> list[list[str]]:
    """argv lists, each with one bad value."""
    s = str(w["store"])
    ins = ("missing", "folder", "empty", "torn", "foreign", "passwd")
    outs = ("read-only", "file", "folder", "missing")
    out = {name: str(w[name] / "out" if name == "read-only" else w[name]) for name in outs}
    found: list[list[str]] = []
    for name in ins:
        p = str(w[name])
        found += [["report", "1", "--store", p], ["export", "1", "--store", p],
                  ["attribute", "--calls", p, "--samples", str(w["samples"])],
                  ["attribute", "--calls", str(w["calls"]), "--samples", p],
                  ["model", "predict", "--model", p, "--width", "64", "--depth", "2"],
                  ["model", "predict", "--model", str(w["model"]), "--summary", p],
                  ["merge", p], ["store", "check", p], ["instrument", p, "--list"]]
    for name, p in out.items():
        found += [["report", "1", "--store", s, "--format", "json", "-o", p],
                  ["export", "1", "--store", s, "-o", p + ("" if name != "missing" else "/x")],
                  ["attribute", "--calls", str(w["calls"]), "--samples", str(w["samples"]),
                   "-o", p + ("/x.csv" if name == "read-only" else "")],
                  ["instrument", str(w["project"]), "--out", p],
                  ["store", "copy", s, p + ("/copy.sqlite" if name == "read-only" else "")]]
    for n in NUMBERS:
        if n in ("nan", "inf", "-1"):  # these build a whole report: a few values only
            found += [["report", "1", "--store", s, "--carbon-intensity", n, "-o",
                       out["read-only"]],
                      ["report", "1", "--store", s, "--pue", n, "-o", out["read-only"]],
                      ["export", "1", "--store", s, "--pue", n, "-o", "-"]]
        found += [["report", n, "--store", s], ["export", n, "--store", s],
                  ["attribute", "--calls", str(w["calls"]), "--samples", str(w["samples"]),
                   "--idle", n]]
        for option in ("--width", "--batch-size", "--time-s", "--confidence", "--epochs"):
            args = {"--width": "64", "--depth": "2", option: n}
            found.append(["model", "predict", "--model", str(w["model"]),
                          *[x for k, v in args.items() for x in (k, v)]])
    found.append(["attribute", "--calls", str(w["calls"]), "--samples", str(w["decreasing"])])
    return found


def test_no_bad_input_gives_a_traceback(world: dict[str, Path], tmp_path: Path):
    env = {"FECOMLITE_HOME": str(tmp_path / "home")}
    tracebacks = []
    for args in cases(world):
        result = invoke(args, env=env, cwd=tmp_path)
        if "Traceback" in result.output:
            tracebacks.append(f"{' '.join(args)}: {result.output[-300:]}")
    assert tracebacks == [], "\n".join(tracebacks)


NAMED = {  # a bad input -> what its one-line error says
    ("report", "99999999999999999999999"): "no run 99999999999999999999999",
    ("attribute", "decreasing"): "energy counter decreased",
    ("attribute", "--idle", "nan"): "must be a finite power",
    ("export", "-o", "folder"): "cannot write",
    ("report", "-o", "file"): "cannot write",
    ("model", "--batch-size", "0"): "batch_size must be a positive integer",
    ("model", "--time-s", "nan"): "time must be a positive number",
    ("model", "--time-s", "inf"): "time must be a positive number",
    ("model", "--width", "1000000000"): "an extrapolation",
}


def test_bad_inputs_are_named(world: dict[str, Path], tmp_path: Path):
    w, s = world, str(world["store"])
    calls, samples, model = str(w["calls"]), str(w["samples"]), str(w["model"])
    argv = {
        ("report", "99999999999999999999999"): ["report", "99999999999999999999999", "--store", s],
        ("attribute", "decreasing"): ["attribute", "--calls", calls, "--samples",
                                      str(w["decreasing"])],
        ("attribute", "--idle", "nan"): ["attribute", "--calls", calls, "--samples", samples,
                                         "--idle", "nan"],
        ("export", "-o", "folder"): ["export", "1", "--store", s, "-o", str(w["folder"])],
        ("report", "-o", "file"): ["report", "1", "--store", s, "-f", "json", "-o",
                                   str(w["file"])],
    }
    for key in NAMED:
        if key[0] == "model":
            argv[key] = ["model", "predict", "--model", model, "--width", "64", "--depth", "2",
                         *key[1:]]
    for key, said in NAMED.items():
        result = invoke(argv[key], cwd=tmp_path)
        assert said in " ".join(result.output.split()), (key, result.output)
        assert (result.exit_code != 0) == (key[1] != "--width"), (key, result.output)


def test_run_refuses_bad_numbers_before_starting_anything(world: dict[str, Path],
                                                          tmp_path: Path):
    from fecomlite.server.client import live_client

    home, script = tmp_path / "home", str(world["project"] / "train.py")
    try:
        for option, value in (("--idle", "nan"), ("--tail", "inf"), ("--gate-max-wait", "-1"),
                              ("--repeat", "99999999999999999999999"), ("--pue", "nan")):
            result = invoke(["run", "--home", str(home), option, value, script], cwd=tmp_path)
            assert result.exit_code != 0 and "must be" in result.output, (option, result.output)
        assert not (home / "server.json").exists()  # no server was started for any of them
    finally:
        client = live_client(home)
        if client is not None:
            client.shutdown()
