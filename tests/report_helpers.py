"""Run stores for the report tests, built from the real H200 NVML traces in tests/fixtures.

The GPU energy counter, the GPU memory gauge and the calls are the recorded ones; the process
RSS and an `estimated` CPU package series are derived from the calls (labelled as estimated, as
the real CPU model would be), so the report has a measured and an estimated domain side by side.
Repetition k replays the trace shifted by k × (trace length + a pause).
"""

from __future__ import annotations

import csv
import json
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
from stored_events import plain_calls

from fecomlite.report.timeline import busy_per_bin
from fecomlite.store import Store

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NVML = FIXTURES / "h200-nvml"
MIXED = FIXTURES / "h200-nvml-mixed"
PAUSE_NS = 2_000_000_000
TAIL_NS = 1_500_000_000
CPU_IDLE_W, CPU_BUSY_W = 18.0, 42.0
IDLE_GPU_W = 124.0

# fixture API -> (site key, canonical API, what the user wrote, source line)
SITES = {
    "matmul_bf16_2048": ("bench.py:14:8", "torch.matmul", "torch.matmul",
                         "y = torch.matmul(a2048, b2048)"),
    "matmul_bf16_4096": ("bench.py:18:8", "torch.matmul", "th.matmul",
                         "y = th.matmul(a4096, b4096)"),
    "matmul_bf16_8192": ("bench.py:22:12", "torch.Tensor.matmul", "a8192.matmul",
                         "y = a8192.matmul(b8192)"),
    "matmul": ("loop.py:30:8", "torch.matmul", "torch.matmul", "h = torch.matmul(x, w)"),
    "add": ("loop.py:31:8", "torch.add", "torch.add", "h = torch.add(h, bias)"),
    "relu": ("loop.py:32:8", "torch.nn.functional.relu", "F.relu", "h = F.relu(h)"),
    "sum": ("loop.py:33:8", "torch.sum", "torch.sum", "loss = torch.sum(h)"),
}


def read_csv(path: Path) -> dict[str, np.ndarray]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        try:
            out[key] = np.array([int(v) for v in values], dtype=np.int64)
        except ValueError:
            out[key] = np.array(values)
    return out


def build_run(
    store: Store,
    trace: Path = NVML,
    *,
    reps: int = 2,
    program: str = "bench.py",
    sites: dict[str, tuple[str, str, str, str]] | None = None,
    level: str = "method",
    energy_scale: float = 1.0,
) -> int:
    """A finished run replaying `trace` `reps` times; returns its id.

    energy_scale multiplies the counter's increments (a "slower GPU" for comparison tests).
    """
    sites = sites or SITES
    calls = read_csv(trace / "gpu_calls.csv")
    energy = read_csv(trace / "gpu_samples_energy.csv")
    power = read_csv(trace / "gpu_samples_power.csv")
    t_first = int(min(energy["t_ns"][0], calls["t_start_ns"].min()))
    t_last = int(max(energy["t_ns"][-1], calls["t_end_ns"].max()))
    length = t_last - t_first + PAUSE_NS
    run_id = store.create_run(
        program=program, argv=[program, "--epochs", "2"], level=level, status="finished",
        exit_code=0, created_unix=time.time(),
        settings={"repeat": reps, "level": level, "sync_used": "on", "tail_s": 1.5},
        hyperparams={"optimizer": "Adam", "learning_rate": 0.001, "batch_size": 64},
        machine={"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "cpu_logical": 2,
                 "memory_bytes": 8 * 2**30, "hostname": "test-host", "python": "3.11",
                 "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 143771369472}]},
        idle={"nvml:0:energy": 124.0, "est:cpu-package": CPU_IDLE_W},
        t_start_ns=t_first, t_end_ns=t_first + reps * length,
    )
    ids = {
        "energy": store.add_sensor(run_id, name="nvml:0:energy", domain="gpu:0", unit="J",
                                   kind="counter", provenance="measured", period_s=0.1),
        "cpu": store.add_sensor(run_id, name="est:cpu-package", domain="cpu-package", unit="W",
                                kind="power", provenance="estimated", model="cpu-util-linear",
                                period_s=0.1),
        "rss": store.add_sensor(run_id, name="proc:rss", domain="process-memory", unit="B",
                                kind="gauge", provenance="measured", period_s=0.05),
        "gpumem": store.add_sensor(run_id, name="nvml:0:memory_used", domain="gpu-memory",
                                   unit="B", kind="gauge", provenance="measured", period_s=0.1),
    }
    store.put_result(run_id, "idle_baseline", {
        "seconds": 3.0, "sensors": {
            "nvml:0:energy": {"mean_w": 124.0, "std_w": 0.06, "n": 30, "provenance": "measured"},
            "est:cpu-package": {"mean_w": CPU_IDLE_W, "std_w": 0.4, "n": 30,
                                "provenance": "estimated", "model": "cpu-util-linear"}}})
    manifest = {key: {"file": key.split(":")[0], "line": int(key.split(":")[1]),
                      "col": int(key.split(":")[2]), "api": api, "written": written,
                      "kind": "function", "function": "main", "source": source}
                for key, api, written, source in sites.values()}
    keys = [sites[name][0] for name in calls["api"]]
    site_id = store.site_ids(run_id, set(keys), manifest)
    sid = np.array([site_id[k] for k in keys], dtype=np.int64)
    steps = np.diff(energy["energy_mJ"]) / 1000.0 * energy_scale
    counter0 = 0.0
    for rep in range(reps):
        shift = rep * length
        t_calls0, t_calls1 = calls["t_start_ns"] + shift, calls["t_end_ns"] + shift
        counter = counter0 + np.concatenate(([0.0], np.cumsum(steps)))
        t_counter = energy["t_ns"] + shift
        if rep + 1 < reps:  # the pause before the next repetition: idle, read every 100 ms
            pause = np.arange(t_counter[-1] + 100_000_000, t_first + shift + length,
                              100_000_000, dtype=np.int64)
            idle = counter[-1] + IDLE_GPU_W * (pause - t_counter[-1]) / 1e9
            t_counter, counter = np.concatenate((t_counter, pause)), np.concatenate((counter, idle))
        counter0 = float(counter[-1])
        rows: list[tuple[int, int, float]] = list(zip(
            [ids["energy"]] * counter.size, t_counter.tolist(), counter.tolist(), strict=True))
        rows += list(zip([ids["gpumem"]] * power["t_ns"].size, (power["t_ns"] + shift).tolist(),
                         power["mem_used_B"].astype(float).tolist(), strict=True))
        grid = np.arange(t_first + shift, t_last + shift + TAIL_NS, 100_000_000, dtype=np.int64)
        busy = _busy_share(grid, t_calls0, t_calls1)
        rows += list(zip([ids["cpu"]] * grid.size, grid.tolist(),
                         (CPU_IDLE_W + (CPU_BUSY_W - CPU_IDLE_W) * busy).tolist(), strict=True))
        rss = 400e6 + 50e6 * busy + 1e6 * np.arange(grid.size) / grid.size
        rows += list(zip([ids["rss"]] * grid.size, grid.tolist(), rss.tolist(), strict=True))
        store.add_samples(rows)
        store.add_events(run_id, rep + 1, 1234, plain_calls(sid, t_calls0, t_calls1))
        end = int(t_calls1.max())
        store.upsert_repetition(
            run_id, rep + 1, t_start_ns=int(t_calls0.min()) - 500_000_000, t_end_ns=end,
            tail_end_ns=min(end + TAIL_NS, int(energy["t_ns"][-1] + shift)), exit_code=0,
            gate=_gate(rep),
        )
    return run_id


def _busy_share(grid: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Share of each 100 ms window [grid[i] - 100 ms, grid[i]] covered by calls."""
    edges = np.concatenate(([grid[0] - 100_000_000], grid))
    return busy_per_bin(t0, t1, edges)


def _gate(rep: int) -> dict[str, Any]:
    passed = rep != 1
    return {
        "passed": passed, "gated": True, "waited_s": 1.5 if passed else 120.0,
        "checked": [
            {"sensor": "nvml:0:energy", "check": "power_cv", "value": 0.004 if passed else 0.02,
             "limit": 0.01, "passed": passed, "pending": False, "n": 20, "needed": 20,
             "provenance": "measured"},
            {"sensor": "est:cpu-package", "check": "power_cv", "value": 0.01, "limit": 0.03,
             "passed": True, "pending": False, "n": 20, "needed": 20,
             "provenance": "estimated"},
        ],
        "reasons": ["no temperature sensor: gated on power and utilisation alone"]
        + (["stable"] if passed else ["nvml:0:energy: power_cv 0.02 over limit 0.01"]),
        "thresholds": {"gpu_power_ratio": 0.01, "max_wait_s": 120.0},
    }


def hostile_sites() -> dict[str, tuple[str, str, str, str]]:
    """Sites whose names, written names and source lines try to break out of the page."""
    evil = "<script>alert(1)</script>"
    return {
        "matmul_bf16_2048": ("ev</script><script>alert(2)</script>.py:14:8", f"torch.{evil}",
                             f"x{evil}", f"y = f('{evil}') # </script>"),
        "matmul_bf16_4096": ("bench.py:18:8", "torch.matmul", "th.matmul & <b>bold</b>",
                             "y = th.matmul(a, b)  # \"quotes\" & 'apostrophes'"),
        "matmul_bf16_8192": ("bench.py:22:12", "torch.Tensor.</script>matmul",
                             "<img src=x onerror=alert(3)>", "<!-- y = a.matmul(b) -->"),
    }


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)


class TableParser(HTMLParser):
    """The figure tables of a report page: per table id, the header columns (data-col) and,
    per body row, each cell's data-v (the raw figure) and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, dict[str, Any]] = {}
        self._table: dict[str, Any] | None = None
        self._section = ""
        self._cell: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and "figures" in (a.get("class") or ""):
            self._table = {"columns": [], "rows": []}
            self.tables[a["id"] or ""] = self._table
        elif self._table is None:
            return
        elif tag in ("thead", "tbody", "tfoot"):  # the footer row is no row of the data
            self._section = tag
        elif tag == "th" and self._section == "thead" and a.get("data-col"):
            self._table["columns"].append(a["data-col"])
        elif tag == "tr" and self._section == "tbody":
            self._table["rows"].append([])
        elif tag == "td" and self._section == "tbody":
            self._cell = {"v": a.get("data-v"), "text": ""}
            self._table["rows"][-1].append(self._cell)

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag == "td":
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell["text"] += data


def html_tables(html: str) -> dict[str, dict[str, Any]]:
    parser = TableParser()
    parser.feed(html)
    return parser.tables
