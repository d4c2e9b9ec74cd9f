"""Test helpers: fake sysfs trees in a temp dir, and a real permission denial for root.

The trees copy the layout and file formats of the kernel's powercap, hwmon and thermal classes
(values in µJ and m°C, one number per file), so the sensors read them exactly as they read /sys.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def write_value(path: Path, value: int) -> None:
    """Rewrite a one-number file in place (the inode stays, as a sysfs attribute's does)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{value}\n".encode(), 0)
    finally:
        os.close(fd)


def make_rapl_zone(
    root: Path, zone: str, name: str, energy_uj: int, max_uj: int = 262143328850
) -> Path:
    """`root/intel-rapl:<zone>` with name, energy_uj and max_energy_range_uj."""
    d = root / f"intel-rapl:{zone}"
    d.mkdir(parents=True)
    (d / "name").write_text(name + "\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    write_value(d / "energy_uj", energy_uj)
    return d


def make_hwmon(root: Path, index: int, chip: str, temps_mc: dict[str, int]) -> Path:
    """`root/hwmon<index>` for `chip`, one tempN_input (m°C) and tempN_label per entry."""
    d = root / f"hwmon{index}"
    d.mkdir(parents=True)
    (d / "name").write_text(chip + "\n")
    for n, (label, mc) in enumerate(temps_mc.items(), start=1):
        (d / f"temp{n}_label").write_text(label + "\n")
        write_value(d / f"temp{n}_input", mc)
    return d


def make_thermal_zone(root: Path, index: int, kind: str, temp_mc: int) -> Path:
    d = root / f"thermal_zone{index}"
    d.mkdir(parents=True)
    (d / "type").write_text(kind + "\n")
    write_value(d / "temp", temp_mc)
    return d


_CAP_VERSION_3 = 0x20080522
_CAP_DAC_OVERRIDE = 1
_CAP_DAC_READ_SEARCH = 2


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


@contextmanager
def file_permissions_enforced() -> Iterator[None]:
    """Make file modes bind in this thread, even for root.

    Root reads a mode-000 file because of CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH. Capabilities
    are per thread on Linux: this drops the two from the calling thread's effective set (they stay
    permitted, so they come back on exit). The kernel then answers EACCES, a real permission
    denial. Skips the test where capabilities cannot be changed.
    """
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), data) != 0:
        pytest.skip("capget failed: cannot drop CAP_DAC_OVERRIDE here")
    saved = data[0].effective
    data[0].effective &= ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH))
    if libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), data) != 0:
        pytest.skip("capset failed: cannot drop CAP_DAC_OVERRIDE here")
    try:
        yield
    finally:
        data[0].effective = saved
        libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), data)
