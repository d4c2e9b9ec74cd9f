"""Builds the optional C parts (the probe's hot path, the sampler's tick thread, the streamed
analysis' sweep); without a compiler fecomlite runs in pure Python."""

import sys

from setuptools import Extension, setup

# The probe's hot path is built -O3 whatever the Python's own flags (a debug or -O0 build of
# Python would otherwise make it several times slower); MSVC takes its own defaults.
HOT_PATH_FLAGS = [] if sys.platform == "win32" else ["-O3"]

setup(
    ext_modules=[
        Extension("fecomlite.runtime._fastprobe", ["fecomlite/runtime/_fastprobe.c"],
                  extra_compile_args=HOT_PATH_FLAGS, optional=True),
        Extension("fecomlite.server._ticker", ["fecomlite/server/_ticker.c"], optional=True),
        Extension("fecomlite.analysis._sweep", ["fecomlite/analysis/_sweep.c"], optional=True),
    ]
)
