"""Running a sweep (`fecomlite sweep`): every configuration of the grid measured as its own
project-level run of `fecomlite/model/fc_program.py`, the table stored as the sweep run's result.
What a sweep is, and how its rows are read, is in `fecomlite.model.sweep`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fecomlite.model.cache import cpu_hierarchy
from fecomlite.model.duration import Minimum, Planned
from fecomlite.model.network import ConfigError, NetworkConfig
from fecomlite.model.sweep import (
    CONFIG_KIND,
    FC_PROGRAM,
    FRAMEWORKS,
    SWEEP_FORMAT,
    SWEEP_KIND,
    SWEEP_METHOD,
    SweepGrid,
    default_threads,
    feature_columns,
    gpu_hierarchies,
    measured_columns,
    write_csv,
)
from fecomlite.runner.experiment import prepare_program, run_experiment
from fecomlite.runner.settings import RunSettings
from fecomlite.server.client import ServerClient
from fecomlite.store import Store


@dataclass
class SweepResult:
    sweep_id: int
    status: str  # finished | interrupted
    table: dict[str, Any]
    csv_path: Path


def run_sweep(
    client: ServerClient, grid: SweepGrid, settings: RunSettings, *, home: Path,
    framework: str = "keras",
    method: str = SWEEP_METHOD,
    csv_path: Path | None = None,
    on_config: Callable[[int, int, NetworkConfig], None] = lambda i, n, config: None,
    threads: int | None = None,
    planned: Sequence[Planned] | None = None,
    minimum: Minimum | None = None,
) -> SweepResult:
    """Measure every configuration of `grid`, or the `planned` ones (the grid's, with samples
    scaled up: `fecomlite.model.duration`), each with the framework's `threads` (recorded as the
    hyperparameter `threads` of every run; the settings' level is forced to project, see the
    module docstring); rows whose training lasted under the `minimum` are marked `too_short`.
    Stores and writes the table; returns it."""
    if framework not in FRAMEWORKS:
        raise ConfigError(f"framework must be one of {FRAMEWORKS}, not {framework!r}")
    threads = threads or default_threads()
    configs = [p.config for p in planned] if planned is not None else grid.configurations()
    settings = replace(settings, level="project",
                       params={**settings.params, "threads": str(threads)})
    hierarchy = cpu_hierarchy()
    used = {"grid": grid.to_json(), "framework": framework, "threads": threads,
            "run_settings": settings.to_json()}
    with Store(client.store_path) as store:
        sweep_id = store.create_run(
            kind=SWEEP_KIND, program=str(FC_PROGRAM), level="project", settings=used,
            status="running", t_start_ns=time.monotonic_ns(),
        )
    rows: list[dict[str, Any]] = []
    domains: dict[str, Any] = {}
    status = "finished"
    try:
        for i, config in enumerate(configs):
            on_config(i, len(configs), config)
            argv = ["--config", json.dumps(config.to_json()), "--framework", framework,
                    "--threads", str(threads)]
            program = prepare_program(FC_PROGRAM, argv, settings, home / "work")
            outcome = run_experiment(
                client, program, settings, kind=CONFIG_KIND, parent_id=sweep_id,
                extra={"network": config.to_json(), "framework": framework, "sweep": sweep_id,
                       "threads": threads},
                log_dir=home / "logs" / f"sweep-{sweep_id}" / config.key,
            )
            row = {**feature_columns(config, hierarchy), "framework": framework,
                   "threads": threads, "run_id": outcome.run_id, "status": outcome.status}
            if outcome.status == "finished":
                with Store(client.store_path) as store:
                    measured, found = measured_columns(store, outcome.run_id, method)
                row.update(measured)
                domains.update(found)
                if minimum is not None and "time_s" in row:
                    row["too_short"] = row["time_s"] < minimum.seconds
            rows.append(row)
            if outcome.status == "interrupted":
                status = "interrupted"
                break
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        csv_path = csv_path or home / "sweeps" / f"sweep-{sweep_id}.csv"
        with Store(client.store_path) as store:
            machine = store.run(rows[0]["run_id"])["machine"] if rows else {}
        table = {
            "format": SWEEP_FORMAT, "sweep_id": sweep_id, "framework": framework,
            "attribution_method": method, "grid": grid.to_json(),
            "hierarchy": hierarchy.to_json(), "domains": domains,
            "gpu_hierarchies": gpu_hierarchies(machine),
            "measured_at": "project level, training region (region:train) only",
            "threads": threads,
            "min_training": None if minimum is None else {"seconds": minimum.seconds,
                                                          "reason": minimum.reason},
            "plan": [p.to_json() for p in planned] if planned is not None else None,
            "rows": rows, "csv": str(write_csv(rows, csv_path)),
        }
        with Store(client.store_path) as store:
            store.put_result(sweep_id, "sweep", table)
            store.update_run(sweep_id, status=status, t_end_ns=time.monotonic_ns())
    return SweepResult(sweep_id, status, table, csv_path)
