"""Static instrumentation: a copy of the user's project with every framework call wrapped."""

from fecomlite.instrument.project import (
    Failure,
    InstrumentError,
    InstrumentResult,
    configured_roots,
    default_out,
    instrument_path,
)

__all__ = [
    "Failure",
    "InstrumentError",
    "InstrumentResult",
    "configured_roots",
    "default_out",
    "instrument_path",
]
