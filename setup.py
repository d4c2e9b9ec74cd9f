"""Builds the optional C parts (the probe's hot path, the sampler's tick thread); without a
compiler fecomlite runs in pure Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("fecomlite._fastprobe", ["fecomlite/_fastprobe.c"], optional=True),
        Extension("fecomlite._ticker", ["fecomlite/_ticker.c"], optional=True),
    ]
)
