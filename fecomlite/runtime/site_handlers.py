"""Which sites always take the probe's slow path, and what their handlers do there: the
data-size cut, the hyperparameter readers and the calibration replayer's keeper. Kept apart from
`capture` (which they use) so that the capture imports none of them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fecomlite.runtime.capture import (
    ChainedHandler,
    DataSizeHandler,
    Handler,
    KeepCallHandler,
    safely,
)
from fecomlite.runtime.names import set_roots

Record = Callable[[str, int, int, bool], None]


def special_handlers(
    manifest_path: str, datasize: str, sink: Any, record: Record, calibrate: str = ""
) -> dict[str, Handler]:
    """The sites that always take the slow path, from the manifest, the data-size setting and
    the sites to calibrate (`FECOMLITE_CALIBRATE`, a JSON list of site keys); `record` is the
    probe's, for the replays' own events."""
    if not manifest_path:
        return {}
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        sites = manifest.get("sites", {})
    except (OSError, ValueError, AttributeError):
        return {}
    set_roots(manifest.get("api_roots"))
    from fecomlite.runtime.hyperparams import Hyperparams, hyperparameter_handler

    hyperparams = Hyperparams(sink)
    target, _, fraction = datasize.rpartition("=")
    replayer = safely(_replayer, calibrate, sites, record) if calibrate else None
    handlers: dict[str, Handler] = {}
    for key, site in sites.items():
        chain: list[Handler] = []
        if target and (key == target or site.get("api") == target):
            chain.append(DataSizeHandler(float(fraction)))
        reader = hyperparameter_handler(key, site, hyperparams)
        if reader is not None:
            chain.append(reader)
        if replayer is not None and key in replayer.sites:
            chain.append(KeepCallHandler(key, replayer))
        if chain:
            handlers[key] = chain[0] if len(chain) == 1 else ChainedHandler(chain)
    return handlers


def _replayer(calibrate: str, sites: dict[str, Any], record: Record) -> Any:
    """The calibration replayer, imported only in a calibration repetition."""
    from fecomlite.runtime.calibration_replay import Replayer

    return Replayer.from_environment(calibrate, sites, record)
