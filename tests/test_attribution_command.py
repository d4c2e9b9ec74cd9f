"""`fecomlite attribute` on the recorded traces and on hand-written files, through typer."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from fecomlite.analysis import attribution as at
from fecomlite.analysis.command import attribute_command
from fecomlite.sensors.replay import load_trace

FIXTURES = Path(__file__).resolve().parent / "fixtures"

app = typer.Typer()
app.command("attribute")(attribute_command)
app.command("other")(lambda: None)  # two commands, so `attribute` is a subcommand as in the CLI


def invoke(*args: str):
    return CliRunner().invoke(app, ["attribute", *map(str, args)])


def words(text: str) -> str:
    """The output with rich's line wrapping and error-box borders undone (paths vary in length)."""
    return " ".join(text.translate(str.maketrans("", "", "│╭╮╰╯─")).split())


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_mixed_trace_per_call_rows_and_intensities(tmp_path):
    d = FIXTURES / "h200-nvml-mixed"
    out = tmp_path / "calls_energy.csv"
    result = invoke("--calls", d / "gpu_calls.csv", "--samples", d / "gpu_samples_energy.csv",
                    "-o", out)
    assert result.exit_code == 0, result.output
    assert "energy_mJ (counter)" in words(result.output)
    assert "method intensity" in words(result.output)
    rows = read(out)
    calls = read(d / "gpu_calls.csv")
    assert len(rows) == len(calls)
    assert [r["phase"] for r in rows] == [c["phase"] for c in calls]  # input columns kept
    got = np.array([float(r["energy_J"]) for r in rows])
    t0 = np.array([int(c["t_start_ns"]) for c in calls])
    t1 = np.array([int(c["t_end_ns"]) for c in calls])
    trace = load_trace(d / "gpu_samples_energy.csv", "energy_mJ")
    iv = at.counter_intervals(trace.t_ns, trace.values)
    group = np.unique([c["api"] for c in calls], return_inverse=True)[1]
    expected = at.attribute(iv, t0, t1, idle_W=at.estimate_idle_W(iv, t0, t1), group=group,
                            method="intensity")
    assert got == pytest.approx(expected.energy_J, rel=1e-5, abs=1e-6)
    assert all(r["below_resolution"] == "1" for r in rows)  # sub-millisecond calls
    for api in ("add", "matmul", "relu", "sum"):  # the per-API table with fitted intensities
        assert any(line.lstrip("│ ").startswith(api) and "±" in line
                   for line in result.output.splitlines())


def test_power_samples_pick_instant_power_not_the_moving_average(tmp_path):
    d = FIXTURES / "h200-nvml"
    out = tmp_path / "o.csv"
    result = invoke("--calls", d / "gpu_calls.csv", "--samples", d / "gpu_samples_power.csv",
                    "--kind", "power", "--idle", "125", "--method", "overlap", "-o", out)
    assert result.exit_code == 0, result.output
    assert "power_instant_mW (power)" in words(result.output)
    assert "idle 125.00 W (given)" in words(result.output)
    rows = read(out)
    assert len(rows) == 32 and {r["flop"] for r in rows}  # input columns kept
    long = [r for r in rows if float(r["duration_s"]) > 0.8]
    pj = [float(r["energy_J"]) / int(r["flop"]) * 1e12 for r in long]
    assert all(0.8 < x < 1.0 for x in pj)  # the README's ~0.9 pJ/FLOP


def test_nesting_and_threads_from_a_hand_written_file(tmp_path):
    calls = tmp_path / "calls.csv"
    calls.write_text(
        "api,thread,t_start_ns,t_end_ns\n"
        "epoch,main,0,200000000\n"
        "step,main,50000000,150000000\n"
        "load,worker,0,100000000\n"
    )
    samples = tmp_path / "meter.csv"  # a watt-meter: 50 W idle, 150 W then 250 W
    samples.write_text("t_ns,power_W\n0,50\n100000000,150\n200000000,250\n300000000,50\n")
    out = tmp_path / "o.csv"
    result = invoke("--calls", calls, "--samples", samples, "--idle", "50", "--method",
                    "overlap", "--semantics", "window", "-o", out)
    assert result.exit_code == 0, result.output
    rows = {r["api"]: r for r in read(out)}
    assert (rows["step"]["parent"], rows["step"]["depth"]) == ("0", "1")
    assert rows["load"]["parent"] == "-1"
    # [0,100 ms): 10 J above idle over epoch-self 50 ms, step 50 ms, load 100 ms
    assert float(rows["load"]["energy_J"]) == pytest.approx(5.0)
    # [100,200 ms): 20 J over epoch-self 50 ms and step 50 ms
    assert float(rows["step"]["energy_J"]) == pytest.approx(2.5 + 10.0)
    assert float(rows["epoch"]["energy_J"]) == pytest.approx(2.5 + 10.0 + 12.5)
    assert float(rows["epoch"]["self_energy_J"]) == pytest.approx(12.5)


def test_bad_input_is_refused_with_a_reason(tmp_path):
    d = FIXTURES / "h200-nvml"
    result = invoke("--calls", d / "gpu_calls.csv", "--samples", d / "gpu_samples_energy.csv",
                    "--column", "nope")
    assert result.exit_code != 0 and "no column 'nope'" in words(result.output)
    bad = tmp_path / "calls.csv"
    bad.write_text("api,start,end\nx,1,2\n")
    result = invoke("--calls", bad, "--samples", d / "gpu_samples_energy.csv")
    assert result.exit_code != 0 and "t_end_ns" in words(result.output)
    result = invoke("--calls", d / "gpu_calls.csv", "--samples", d / "gpu_samples_energy.csv",
                    "--method", "guess")
    assert result.exit_code != 0 and "overlap" in words(result.output)


def _samples(path: Path) -> Path:
    rows = ["t_ns,energy_mJ"] + [f"{i * 10_000_000},{i * 500}" for i in range(200)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize(("calls", "said"), [
    ("t_start_ns,t_end_ns\n100,200\nabc,300\n",
     "row 3, column 't_start_ns': expected an integer (ns), got 'abc'"),
    ("t_start_ns,t_end_ns\n100,200,7\n", "row 2: expected 2 fields"),
    ("t_start_ns,t_end_ns\n500000000,350000000\n",
     "row 2: expected 0 <= t_start_ns <= t_end_ns < 2**63, got 500000000..350000000"),
])
def test_malformed_calls_are_named_by_file_row_and_column(tmp_path, calls, said):
    path = tmp_path / "calls.csv"
    path.write_text(calls)
    result = invoke("--calls", path, "--samples", _samples(tmp_path / "s.csv"))
    assert result.exit_code == 2, result.output
    assert said in words(result.output)
    assert "Traceback" not in result.output


def test_a_malformed_sample_is_named(tmp_path):
    samples = _samples(tmp_path / "s.csv")
    samples.write_text(samples.read_text() + "2000000000,inf\n")
    calls = tmp_path / "calls.csv"
    calls.write_text("t_start_ns,t_end_ns\n100,200\n")
    result = invoke("--calls", calls, "--samples", samples)
    assert result.exit_code == 2
    assert "row 202, column 'energy_mJ': expected a finite number, got 'inf'" in words(
        result.output)


def test_user_strings_print_as_themselves(tmp_path):
    """An API named `[/]` (rich's closing tag), a link and an escape sequence are data."""
    calls = tmp_path / "calls.csv"
    calls.write_text("t_start_ns,t_end_ns,api\n100000000,900000000,[/]\n"
                     "1000000000,1500000000,[link=file:///etc/passwd]x\n"
                     "1600000000,1700000000,\x1b]0;owned\x07y\n")
    result = CliRunner().invoke(app, ["attribute", "--calls", str(calls), "--samples",
                                      str(_samples(tmp_path / "s.csv"))], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "[/]" in result.output and "[link=file:///etc/passwd]x" in result.output
    assert "\x1b]0" not in result.output and "\x07" not in result.output
