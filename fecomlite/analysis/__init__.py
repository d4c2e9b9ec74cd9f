"""What happens after a run: energy attributed to calls (`attribution`), the run's figures
(`run_analysis`), calibration fits, data-size scaling, per-device and per-rank figures, CO2e.

Reads the store by name, writes nothing back but results, and knows nothing of the server, the
runner or how figures are shown.
"""
