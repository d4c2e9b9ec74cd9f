"""The plugin's command-line options, read and checked once: a bad value is one clear line
(pytest's usage error), before any test runs."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

GATE_KINDS = ("energy", "memory")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
BASELINE_FOLDER = "pytest-baselines"  # in the fecomlite home


class SettingsError(ValueError):
    """A plugin option's value cannot be used (the message says which and why)."""


@dataclass(frozen=True)
class Settings:
    measure_all: bool  # --fecomlite: every test; else only those marked @pytest.mark.fecomlite
    repeat: int
    save: Path | None
    compare: Path | None
    fail: dict[str, float] = field(default_factory=dict)  # kind -> relative threshold
    json_path: Path | None = None
    markdown_path: Path | None = None


def parse_fail(text: str | None) -> dict[str, float]:
    """`energy:10%,memory:5%` -> {"energy": 0.10, "memory": 0.05}."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        kind, _, value = part.strip().partition(":")
        number = value.strip().removesuffix("%")
        if kind not in GATE_KINDS or not number:
            raise SettingsError(
                f"--fecomlite-fail: {part.strip()!r} is not KIND:PERCENT with KIND one of "
                f"{', '.join(GATE_KINDS)} (e.g. energy:10%,memory:5%)")
        try:
            percent = float(number)
        except ValueError:
            raise SettingsError(
                f"--fecomlite-fail: {value.strip()!r} is not a percentage") from None
        if not percent >= 0:
            raise SettingsError(f"--fecomlite-fail: {value.strip()!r} is negative")
        out[kind] = percent / 100
    return out


def baseline_path(name: str, cwd: Path, env: dict[str, str] | os._Environ[str]) -> Path:
    """Where baseline NAME lives: a path (it has a `/` or ends in `.json`) is a JSON file the
    user keeps (commits, uploads as a CI artifact); a bare name is kept in the fecomlite home
    (`$FECOMLITE_HOME`, else ./.fecomlite) under pytest-baselines/."""
    if "/" in name or os.sep in name or name.endswith(".json"):
        return cwd / name
    if not _NAME.fullmatch(name):
        raise SettingsError(
            f"baseline name {name!r}: use letters, digits, '.', '_' and '-', or a path to a "
            "JSON file")
    home = Path(env.get("FECOMLITE_HOME", ".fecomlite"))
    return (home if home.is_absolute() else cwd / home) / BASELINE_FOLDER / f"{name}.json"


def read_settings(option: object, cwd: Path, env: dict[str, str] | os._Environ[str]) -> Settings:
    """The parsed options (`config.option`)."""
    repeat = getattr(option, "fecomlite_repeat", 1)
    if repeat < 1:
        raise SettingsError(f"--fecomlite-repeat: {repeat} is not a positive count")
    save, compare = getattr(option, "fecomlite_save", None), getattr(option, "fecomlite_compare",
                                                                      None)
    fail = parse_fail(getattr(option, "fecomlite_fail", None))
    if fail and not compare:
        raise SettingsError(
            "--fecomlite-fail needs --fecomlite-compare NAME (what to gate against)")
    json_path, markdown = (getattr(option, f"fecomlite_{k}", None) for k in ("json", "markdown"))
    return Settings(
        measure_all=bool(getattr(option, "fecomlite", False)),
        repeat=repeat,
        save=baseline_path(save, cwd, env) if save else None,
        compare=baseline_path(compare, cwd, env) if compare else None,
        fail=fail,
        json_path=cwd / json_path if json_path else None,
        markdown_path=cwd / markdown if markdown else None,
    )
