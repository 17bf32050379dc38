"""The state of one ``pytest --schedfuzz`` process: its ``Campaign`` (the run both front ends
share: ``campaign.campaign``) and the hooks that print the header, collect the suite, gather what
every process found and print the summary. Registered by ``plugin.pytest_configure`` only under
``--schedfuzz``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .campaign.campaign import Campaign, ConfigError, shards_for
from .campaign.summary import CUT_SHORT_EXIT, Found, short_path, verdict
from .items import ENGINES_KEY, FOUND_KEY, STATS_KEY, SchedfuzzSuite
from .options import from_pytest


def base_dir(config: pytest.Config) -> Path:
    """Where the corpus and the example database live: the ini file's folder when pytest was
    started inside it, else the folder pytest was started in. Never ``config.rootpath``: pytest
    derives it from path-like arguments, so ``--schedfuzz-llama-lib DIR`` would move it above DIR."""
    here = Path(config.invocation_params.dir).resolve()
    if config.inipath is not None:
        project = config.inipath.parent.resolve()
        if here == project or project in here.parents:
            return project
    return here


class SchedfuzzSession:
    """Per-process state of a ``--schedfuzz`` run: the campaign, and the xdist workers it has."""

    def __init__(self, config: pytest.Config) -> None:
        workerinput = getattr(config, "workerinput", None)
        try:
            self.campaign = Campaign(from_pytest(config), base_dir(config), lambda o: o.pytest_flag,
                                     seed=workerinput["schedfuzz_seed"] if workerinput else None)
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        self.config = config
        self.workers = 0  # xdist workers this (controlling) process started

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        from .engine import TargetError

        try:
            return [f"schedfuzz: {line}" for line in self.campaign.header_lines(config.get_verbosity() > 0)]
        except TargetError as e:
            pytest.exit(f"schedfuzz: the engine cannot start: {e}", returncode=pytest.ExitCode.USAGE_ERROR)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:  # pytest-xdist: same seed on every worker
        node.workerinput["schedfuzz_seed"] = self.campaign.config.seed
        self.workers += 1
        self.campaign.shards = shards_for(self.workers)  # as each worker splits the properties

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
        # collected as any collector is (its items counted in "collected N items"), before -k and -m select
        items[:0] = list(session.genitems(SchedfuzzSuite.from_parent(session, name="schedfuzz", nodeid="schedfuzz")))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == STATS_KEY:
                self.campaign.record(stats=value)  # type: ignore[arg-type]
            elif key == FOUND_KEY:
                self.campaign.record(found=(Found(**value),))  # type: ignore[arg-type]
            elif key == ENGINES_KEY:
                self.campaign.record(engines=value)  # type: ignore[arg-type]
        if report.nodeid.startswith("schedfuzz::corpus/"):
            xfail = getattr(report, "wasxfail", None)
            outcome = (("elsewhere" if str(xfail).startswith("known on ") else "known") if xfail is not None
                       else {"passed": "pass", "failed": "fail"}.get(report.outcome, "skip"))
            self.campaign.record(case=(str(report.location[0]), outcome))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.config.option.collectonly:  # nothing ran
            return
        terminalreporter.section("schedfuzz")
        for line in self.campaign.summary_lines(self.config.get_verbosity() > 0):
            terminalreporter.write_line(line)
        written = self.campaign.write_report()
        if written is not None:
            terminalreporter.write_line(f"report: {short_path(str(written))}")

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.campaign.stats.interrupted = max(1, self.campaign.stats.interrupted)  # the verdict says so, never clean

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # a run the budget cut short passed nothing it did not run: its own status (docs/ci.md)
        c = self.campaign
        if exitstatus == pytest.ExitCode.OK and verdict(c.stats, c.found, c.corpus_outcomes) == "cut short":
            session.exitstatus = CUT_SHORT_EXIT

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.campaign.close()
