"""The Python API for users' own code: `fecomlite.measure()`, its in-process sampler, and the
`%%fecomlite` notebook magic. `fecomlite/__init__.py` re-exports what users call."""
