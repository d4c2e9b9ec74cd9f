"""CPU temperatures from hwmon (`/sys/class/hwmon/*/temp*_input`) or thermal zones
(`/sys/class/thermal/thermal_zone*/temp`), both in m°C, read as °C. GPU temperatures are NVML's.

These are the files psutil.sensors_temperatures() reads too, but psutil re-walks the tree on every
call; the sampler keeps each file open instead. Only CPU chips count (coretemp, k10temp,
zenpower, cpu_thermal...): an NVMe or ACPI board sensor says nothing about the CPU. Package-level
inputs (coretemp "Package id N", k10temp "Tdie"/"Tctl") are preferred over per-core ones. Thermal
zones are used only when hwmon has no CPU chip (x86_pkg_temp would repeat coretemp).
"""

from __future__ import annotations

import re
from pathlib import Path

from fecomlite.sensors._files import KernelFile, read_text
from fecomlite.sensors.base import GAUGE, BaseSensor

HWMON_ROOT = "/sys/class/hwmon"
THERMAL_ROOT = "/sys/class/thermal"
NOMINAL_PERIOD_S = 0.5
CPU_CHIPS = {"coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal"}
CPU_ZONES = {"x86_pkg_temp", "cpu_thermal", "cpu-thermal", "soc_thermal", "cpu0-thermal"}
_PACKAGE_LABELS = (r"^Package id \d+$", r"^Tdie$", r"^Tctl$")


class TemperatureSensor(BaseSensor):
    """One temperature input in m°C, read as °C."""

    def __init__(self, path: Path, name: str, device: str = "cpu") -> None:
        super().__init__(
            name=name,
            domain="temperature",
            unit="C",
            kind=GAUGE,
            device=device,
            nominal_period_s=NOMINAL_PERIOD_S,
            watch_period=False,
            description=f"temperature from {path}",
        )
        self._file = KernelFile(path, size=32)

    def _read(self) -> float:
        return self._file.read_int() / 1000.0

    def kernel_files(self) -> list[KernelFile]:
        return [self._file]

    def close(self) -> None:
        self._file.close()


def discover_temperatures(
    hwmon_root: str | Path = HWMON_ROOT, thermal_root: str | Path = THERMAL_ROOT
) -> tuple[list[TemperatureSensor], list[str]]:
    """Readable CPU temperature inputs, and a note when there are none."""
    sensors = _from_hwmon(Path(hwmon_root)) or _from_thermal_zones(Path(thermal_root))
    if sensors:
        return sensors, []
    return [], [
        f"no CPU temperature sensor: no CPU chip under {hwmon_root} and no CPU thermal zone "
        f"under {thermal_root}; the gate checks power and utilisation only"
    ]


def _from_hwmon(root: Path) -> list[TemperatureSensor]:
    sensors: list[TemperatureSensor] = []
    for chip_dir in sorted(root.glob("hwmon*"), key=_number):
        chip = _text(chip_dir / "name")
        if chip not in CPU_CHIPS:
            continue
        inputs = {p: _text(p.with_name(p.name.replace("_input", "_label"))) or p.name[:-6]
                  for p in sorted(chip_dir.glob("temp*_input"), key=_number)}
        for pattern in _PACKAGE_LABELS:
            chosen = {p: label for p, label in inputs.items() if re.match(pattern, label)}
            if chosen:
                break
        else:
            chosen = inputs
        for path, label in chosen.items():
            sensor = _open(path, f"temp:cpu:{chip}:{chip_dir.name}:{label}")
            if sensor:
                sensors.append(sensor)
    return sensors


def _from_thermal_zones(root: Path) -> list[TemperatureSensor]:
    sensors: list[TemperatureSensor] = []
    for zone in sorted(root.glob("thermal_zone*"), key=_number):
        kind = _text(zone / "type")
        if kind in CPU_ZONES:
            sensor = _open(zone / "temp", f"temp:cpu:{kind}:{zone.name}")
            if sensor:
                sensors.append(sensor)
    return sensors


def _open(path: Path, name: str) -> TemperatureSensor | None:
    try:
        sensor = TemperatureSensor(path, name)
        sensor._file.read_int()
    except (OSError, ValueError):  # a sensor that errors now (e.g. ENODATA) is left out
        return None
    return sensor


def _text(path: Path) -> str:
    try:
        return read_text(path)
    except OSError:
        return ""


def _number(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.name))
