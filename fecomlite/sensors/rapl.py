"""RAPL energy counters (Intel, and AMD through the same driver) from the powercap sysfs tree.

Every zone `intel-rapl:N` (a package, or `psys`) and subzone `intel-rapl:N:M` (core, uncore,
dram) has a µJ counter `energy_uj`, updated about every millisecond, that wraps at
`max_energy_range_uj` (minutes at high power). The sensor returns joules that only ever grow: a
decrease between two reads is a wrap and is unwrapped, so the sampler must read each zone at
least once per wrap period — it reads every few milliseconds.

`core` and `uncore` are parts of their package; `psys` covers the whole platform: never add them.

Since CVE-2020-8694 most distributions make `energy_uj` readable by root only. Discovery then
returns no RAPL sensor and a note that names the fix (`PERMISSION_FIX`).
"""

from __future__ import annotations

import re
from pathlib import Path

from fecomlite.sensors._files import KernelFile, read_text
from fecomlite.sensors.base import COUNTER, BaseSensor

DEFAULT_ROOT = "/sys/class/powercap"
PERMISSION_FIX = (
    "sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj (until reboot), "
    "or run fecomlite as root"
)
NOMINAL_PERIOD_S = 0.001
_DOMAINS = {"core": "cpu-core", "uncore": "uncore", "dram": "dram", "psys": "psys"}
_DEVICES = {"dram": "memory", "psys": "machine"}


class RaplSensor(BaseSensor):
    """One RAPL zone's energy counter, in J, unwrapped."""

    def __init__(self, zone_dir: Path, label: str, zone_name: str) -> None:
        is_package = zone_name.startswith("package")
        domain = "cpu-package" if is_package else _DOMAINS.get(zone_name, zone_name)
        super().__init__(
            name=f"rapl:{label}",
            domain=domain,
            unit="J",
            kind=COUNTER,
            device=_DEVICES.get(zone_name, "cpu"),
            nominal_period_s=NOMINAL_PERIOD_S,
            description=f"RAPL energy counter {zone_dir.name} ({zone_name})",
        )
        self.max_range_uj = int(read_text(zone_dir / "max_energy_range_uj"))
        self._file = KernelFile(zone_dir / "energy_uj", size=32)
        self._last_uj: int | None = None
        self._total_uj = 0

    def _read(self) -> float:
        raw = self._file.read_int()
        if self._last_uj is None:
            self._total_uj = raw
        elif raw >= self._last_uj:
            self._total_uj += raw - self._last_uj
        else:  # wrapped at max_energy_range_uj since the last read
            self._total_uj += raw + self.max_range_uj - self._last_uj
        self._last_uj = raw
        return self._total_uj * 1e-6

    def kernel_files(self) -> list[KernelFile]:
        return [self._file]

    def close(self) -> None:
        self._file.close()


def discover_rapl(root: str | Path = DEFAULT_ROOT) -> tuple[list[RaplSensor], list[str]]:
    """Every readable RAPL zone under `root`, and notes on what is missing or denied."""
    root = Path(root)
    if not root.is_dir():
        return [], [f"no RAPL: {root} absent"]
    zones = sorted(root.glob("intel-rapl:*"), key=_zone_key)
    if not zones:
        return [], [f"no RAPL: no intel-rapl zones under {root}"]
    names = {z.name: _zone_name(z) for z in zones}
    sensors: list[RaplSensor] = []
    notes: list[str] = []
    denied: list[str] = []
    for zone in zones:
        name = names[zone.name]
        if name is None:
            notes.append(f"RAPL zone {zone.name} skipped: no readable name")
            continue
        parent = zone.name.rsplit(":", 1)[0]
        label = f"{names.get(parent)}:{name}" if parent in names else name
        try:
            sensor = RaplSensor(zone, label, name)
            sensor._file.read_int()  # a readable file can still refuse the read
        except PermissionError:
            denied.append(zone.name)
            continue
        except (OSError, ValueError) as exc:
            notes.append(f"RAPL zone {zone.name} skipped: {type(exc).__name__}: {exc}")
            continue
        sensors.append(sensor)
    if denied:
        notes.append(
            f"RAPL present but permission denied reading energy_uj of {', '.join(denied)}; "
            f"fix: {PERMISSION_FIX}"
        )
    return sensors, notes


def _zone_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.name))


def _zone_name(zone: Path) -> str | None:
    try:
        return read_text(zone / "name")
    except OSError:
        return None
