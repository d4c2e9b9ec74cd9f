"""What `fecomlite run` does around the user's program: settings, the instrumented copy, the
experiment (baseline, gate, repetitions, tails), data-size and calibration runs, launchers,
ingest of spools and MLflow logging. Runs in the CLI's process and talks to the server.
"""
