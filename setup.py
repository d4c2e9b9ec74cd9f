"""Builds the optional C parts (the probe's hot path, the sampler's tick thread); without a
compiler fecomlite runs in pure Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("fecomlite.runtime._fastprobe", ["fecomlite/runtime/_fastprobe.c"],
                  optional=True),
        Extension("fecomlite.server._ticker", ["fecomlite/server/_ticker.c"], optional=True),
    ]
)
