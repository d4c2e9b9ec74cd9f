"""Builds the probe's optional C hot path; without a compiler fecomlite runs in pure Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("fecomlite._fastprobe", ["fecomlite/_fastprobe.c"], optional=True),
    ]
)
