"""fecomlite: what each framework API call of a deep-learning project costs in energy and memory."""

from fecomlite.measure import Measurement, measure
from fecomlite.regions import region

__all__ = ["Measurement", "measure", "region"]
__version__ = "0.1.0"
