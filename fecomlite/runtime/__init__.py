"""What runs inside the measured program: the probe that instrumented code imports, its C hot
path, the sized capture, the sender, the batch codec, regions, runtime names and hyperparameters,
compiler support, the calibration replayer, layer hooks and the rank identity.

Imports nothing from fecomlite outside this package (docs/internals.md, "Layers"): the user's
program pays only for what it needs, and everything else may use the formats defined here.
"""
