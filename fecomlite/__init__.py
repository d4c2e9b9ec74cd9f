"""fecomlite: what each framework API call of a deep-learning project costs in energy and memory."""

from fecomlite.measure import Measurement, measure
from fecomlite.regions import region

__all__ = ["Measurement", "load_ipython_extension", "measure", "region"]
__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext fecomlite`: the `%%fecomlite` cell magic (fecomlite/notebook_magic.py)."""
    from fecomlite.notebook_magic import load_ipython_extension as load

    load(ipython)
