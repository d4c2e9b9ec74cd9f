"""The pytest entry point (`pytest11`): the options, the `fecomlite` marker, and, when a session
asks for measurement, the plugin object that measures tests, merges pytest-xdist workers' rows
on the controller, compares with a baseline and gates.

Without `--fecomlite` only tests marked `@pytest.mark.fecomlite` are measured; a suite with
neither loads nothing of fecomlite's measuring code and prints nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

MARKER = "fecomlite"
WORKER_KEY = "fecomlite_rows"
INSTRUMENTED = pytest.StashKey[Any]()  # (the import hook, the probe's event sink)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fecomlite", "energy and memory per test (fecomlite)")
    group.addoption("--fecomlite", action="store_true",
                    help="measure every test (else only tests marked @pytest.mark.fecomlite)")
    group.addoption("--fecomlite-repeat", type=int, default=1, metavar="N",
                    help="measured calls per test (default 1); 3 or more give energy verdicts")
    group.addoption("--fecomlite-save", metavar="NAME",
                    help="save the figures as baseline NAME (a name: in the fecomlite home; "
                         "a path or *.json: that file; write --fecomlite-save=PATH)")
    group.addoption("--fecomlite-compare", metavar="NAME",
                    help="compare with baseline NAME, with the rules of `fecomlite report A B` "
                         "(write --fecomlite-compare=PATH)")
    group.addoption("--fecomlite-fail", metavar="KIND:PCT,...",
                    help="fail the session when a test got costlier beyond the noise and by "
                         "more than PCT, e.g. energy:10%%,memory:5%%")
    group.addoption("--fecomlite-json", metavar="PATH", help="write the figures as JSON")
    group.addoption("--fecomlite-markdown", metavar="PATH",
                    help="write a Markdown summary (for a CI job summary or a PR comment)")


def asked(option: Any) -> bool:
    """Whether the command line asks for measurement (then the project is instrumented)."""
    return bool(option.fecomlite) or any(getattr(option, f"fecomlite_{k}", None) for k in (
        "save", "compare", "json", "markdown"))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    """Instrument the project before the first conftest imports any of it."""
    if not asked(early_config.known_args_namespace):
        return
    from fecomlite.pytest_plugin.instrumentation import start

    early_config.stash[INSTRUMENTED] = start(early_config, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    instrumented = config.stash.get(INSTRUMENTED, None)
    if instrumented is not None:
        from fecomlite.pytest_plugin.instrumentation import stop

        stop(*instrumented)
        del config.stash[INSTRUMENTED]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: measure this test's energy and memory (fecomlite's plugin)")
    from fecomlite.pytest_plugin.settings import SettingsError, read_settings

    try:
        settings = read_settings(config.option, Path(config.invocation_params.dir), os.environ)
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(Measuring(config, settings), "fecomlite-measuring")


class Measuring:
    """The session's measurement; inert for tests it does not measure."""

    def __init__(self, config: pytest.Config, settings: Any) -> None:
        self.config = config
        self.settings = settings
        self.recorder: Any = None  # made on the first measured test
        self.rows: dict[str, dict[str, Any]] = {}  # the workers' rows, on an xdist controller
        self.lines: list[str] = []
        self.baseline: dict[str, dict[str, Any]] | None = None
        self.worker = hasattr(config, "workerinput")
        if settings.compare is not None and not self.worker:
            from fecomlite.pytest_plugin.baseline import BaselineError, load

            try:
                self.baseline = load(settings.compare)
            except BaselineError as exc:
                raise pytest.UsageError(str(exc)) from None

    def wanted(self, item: pytest.Item) -> bool:
        return self.settings.measure_all or item.get_closest_marker(MARKER) is not None

    def _recorder(self) -> Any:
        if self.recorder is None:
            from fecomlite.pytest_plugin.recorder import Recorder

            hook, sink = self.config.stash.get(INSTRUMENTED, (None, None))
            self.recorder = Recorder(sink, hook.sites if hook is not None else None)
        return self.recorder

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        if not self.wanted(item):
            return (yield)
        recorder = self._recorder()
        measuring = recorder.begin(item.nodeid)
        try:
            result = yield
        finally:
            recorder.end(measuring)
        self._repeat(item, recorder)
        return result

    def _repeat(self, item: pytest.Item, recorder: Any) -> None:
        """The extra measured calls (same fixtures); one that raises, fails or skips is left
        out and stops them, with a note: the test's outcome is its first call's."""
        from _pytest.outcomes import OutcomeException

        for n in range(2, self.settings.repeat + 1):
            measuring = recorder.begin(item.nodeid)
            try:
                item.runtest()
            except (Exception, OutcomeException) as exc:
                recorder.end(measuring, keep=False)
                recorder.note(item.nodeid, f"repetition {n} raised {type(exc).__name__}: "
                                           "later repetitions skipped")
                return
            recorder.end(measuring)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and self.recorder is not None:
            self.recorder.finished(report.nodeid, report.outcome)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: a worker's rows (each worker measured its own tests)."""
        text = getattr(node, "workeroutput", {}).get(WORKER_KEY)
        if text:
            self.rows.update(json.loads(text))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        own = self.recorder.close() if self.recorder is not None else {}
        if self.worker:
            self.config.workeroutput[WORKER_KEY] = json.dumps(own)  # type: ignore[attr-defined]
            return
        self.rows.update(own)
        if not self.rows and self.baseline is None:
            return
        from fecomlite.pytest_plugin.finish import finish

        failed, self.lines = finish(self.rows, self.baseline, self.settings,
                                    instrumented=any(r["instrumented"] for r in self.rows.values()))
        if failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lines:
            terminalreporter.write_sep("-", "fecomlite: energy and memory per test")
            for line in self.lines:
                terminalreporter.write_line(line)
