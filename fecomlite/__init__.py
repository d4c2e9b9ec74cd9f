"""fecomlite: what each framework API call of a deep-learning project costs in energy and memory."""

from fecomlite.regions import region

__all__ = ["region"]
__version__ = "0.1.0"
