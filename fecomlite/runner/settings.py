"""Run settings: documented defaults, then the project's configuration, then the command line.

The project's configuration is `[tool.fecomlite]` in the nearest `pyproject.toml` above the
measured script, or a `fecomlite.toml` there (top-level keys). Every setting used is stored with
the run, so a figure can always be traced to how it was measured.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclasses.dataclass
class RunSettings:
    """Everything that decides how a run is measured (defaults documented in the README)."""

    level: str = "method"  # method: every wrapped call; project: the whole script as one unit
    repeat: int = 3  # repetitions of the program
    api: list[str] = dataclasses.field(default_factory=list)  # extra API roots to wrap
    idle_s: float = 5.0  # idle baseline before the first repetition
    baseline_max_age_s: float = 600.0  # reuse a baseline this recent when a 1 s check agrees
    tail_s: float = 2.0  # at most this much sampling after each repetition (tail energy)
    pause_s: tuple[float, float] = (0.5, 1.5)  # randomised pause between repetitions
    gate: bool = True  # wait for stable temperature and power before each repetition
    gate_max_wait_s: float = 120.0
    gate_window: int = 20  # samples the stability check looks at
    cpu_temp_max_c: float = 55.0
    gpu_temp_max_c: float = 40.0
    cpu_power_cv_max: float = 0.03  # σ/mean of CPU and DRAM power over the window
    gpu_power_cv_max: float = 0.01
    sync: str = "auto"  # GPU synchronisation at probe boundaries: auto | on | off
    params: dict[str, str] = dataclasses.field(default_factory=dict)  # hyperparameters by hand
    # grid gCO2e/kWh for CO2e figures (fecomlite/analysis/carbon.py)
    carbon_intensity: float | None = None
    region: str | None = None  # or a country code from the bundled table of annual averages
    pue: float | None = None  # the data centre's power usage effectiveness (default 1)
    mlflow: bool = False  # log the finished run to MLflow (fecomlite/runner/mlflow_log.py)
    trace_layers: bool = False  # time each framework layer inside calls (fecomlite.runtime.layers)
    # bounded storage: WINDOW[/BUCKET] kept call by call at each end of a repetition, calls
    # between folded into per-site buckets (fecomlite/server/folding.py); None: every call kept
    keep: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["pause_s"] = list(self.pause_s)
        return data


class SettingsError(ValueError):
    """A configuration key or value fecomlite does not know."""


def find_project_config(start: Path) -> tuple[Path | None, dict[str, Any]]:
    """The nearest configuration above `start`: pyproject's [tool.fecomlite] or fecomlite.toml."""
    for folder in [start, *start.parents]:
        own = folder / "fecomlite.toml"
        if own.is_file():
            return own, _load_toml(own)
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            table = _load_toml(pyproject).get("tool", {}).get("fecomlite")
            if table is not None:
                return pyproject, table
    return None, {}


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: {exc}") from exc


def resolve(config: dict[str, Any], overrides: dict[str, Any]) -> RunSettings:
    """Defaults, updated by the project's configuration, updated by command-line overrides."""
    settings = RunSettings()
    fields = {f.name: f for f in dataclasses.fields(RunSettings)}
    for source in (config, {k: v for k, v in overrides.items() if v is not None}):
        for key, value in source.items():
            name = key.replace("-", "_")
            if name not in fields:
                raise SettingsError(f"unknown fecomlite setting {key!r}")
            setattr(settings, name, _coerce(name, value, getattr(settings, name)))
    if settings.level not in ("method", "project"):
        raise SettingsError(f"level must be 'method' or 'project', not {settings.level!r}")
    if settings.sync not in ("auto", "on", "off"):
        raise SettingsError(f"sync must be auto, on or off, not {settings.sync!r}")
    if not 1 <= settings.repeat <= MAX_REPEAT:
        raise SettingsError(f"repeat must be from 1 to {MAX_REPEAT}")
    _check_numbers(settings)
    _check_carbon(settings)
    _check_keep(settings)
    return settings


MAX_REPEAT = 999_999  # repetition numbers stay below a batch header's limit (batch_codec)
_OPTIONAL = {"carbon_intensity": float, "region": str, "pue": float, "keep": str}  # default None


def _check_numbers(settings: RunSettings) -> None:
    """Seconds, thresholds and CO2e figures: finite and not negative (nan, inf fail here, not
    as a server's refusal mid-run)."""
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        for number in value if field.name == "pause_s" else (value,):
            if isinstance(number, float) and not 0 <= number < math.inf:
                raise SettingsError(f"{field.name} must be a finite number ≥ 0, not {number}")


def _check_keep(settings: RunSettings) -> None:
    """A `keep` that cannot be read fails before the run; a good one is stored normalised."""
    from fecomlite.server.folding import KeepError, parse_keep

    if settings.keep in (None, ""):
        settings.keep = None
        return
    try:
        settings.keep = parse_keep(settings.keep).text()
    except KeepError as exc:
        raise SettingsError(str(exc)) from exc


def _check_carbon(settings: RunSettings) -> None:
    """A region the table lacks, or an intensity or PUE that cannot be, fails before the run."""
    from fecomlite.analysis.carbon import CarbonError, from_settings

    try:
        from_settings(dataclasses.asdict(settings))
    except CarbonError as exc:
        raise SettingsError(str(exc)) from exc


def _coerce(name: str, value: Any, default: Any) -> Any:
    if name == "pause_s":
        low, high = (value, value) if isinstance(value, (int, float)) else value
        return (float(low), float(high))
    if name == "api":
        return [value] if isinstance(value, str) else list(value)
    if name == "params":
        return {str(k): str(v) for k, v in dict(value).items()}
    if name in _OPTIONAL:
        return _OPTIONAL[name](value)
    if isinstance(default, bool):
        return bool(value)
    try:
        return type(default)(value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"setting {name}: {value!r} is not a {type(default).__name__}") from exc
