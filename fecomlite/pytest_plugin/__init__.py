"""The pytest plugin (`pytest --fecomlite`): energy and memory per test, baselines, and gates
that compare them with the rules of `fecomlite report A B` (docs/pytest.md).

`hooks` is the module pytest loads (the `pytest11` entry point); it imports the measuring parts
only when a session asks for them, so a suite run without the plugin's options loads nothing
else of fecomlite.
"""
