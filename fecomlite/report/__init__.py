"""`fecomlite report`: the per-API energy and memory report (HTML, JSON, CSV) and comparisons.

build.py gathers what a run's report shows from `fecomlite.analysis.run_analysis.RunAnalysis`;
timeline.py
downsamples its samples and calls for the page; tables.py defines the table columns; compare.py
sets two runs side by side; render.py writes the files; command.py is the CLI command. The
charts (static/charts.js, `FecomCharts`) are shared with the live view.
"""
