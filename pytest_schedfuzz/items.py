"""What ``pytest --schedfuzz`` collects: the corpus's cases (``CaseItem``), replayed first, and
one item per property and xdist shard (``PropertyItem``) that fuzzes it and saves its findings;
the work is the campaign's (``campaign.campaign``), shared with ``schedfuzz run``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .campaign.campaign import Unit
    from .session import SchedfuzzSession

# what a property item sends its controller (pytest-xdist) in its report: the statistics it added, each new finding
STATS_KEY = "schedfuzz_stats"
FOUND_KEY = "schedfuzz_found"
ENGINES_KEY = "schedfuzz_engines"  # what the process that ran an item had started (``Campaign.engines_started``)


def xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers share this session (1 without xdist), from xdist's own
    worker info; not from the environment, which child pytest runs inherit."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput.get("workercount", 1)) if workerinput else 1


class SchedfuzzSuite(pytest.Collector):
    """The built-in property suite: the corpus's cases, then one item per unit the campaign plans
    (a property, or one of its shards under pytest-xdist), collected with no test file."""

    def collect(self) -> Iterator[pytest.Item]:
        from .cases.corpus import case_files

        campaign = _session(self.config).campaign
        # the corpus first: known findings are replayed before new fuzzing
        for path in case_files(campaign.corpus):
            yield CaseItem.from_parent(self, name=f"corpus/{path.stem}", path_=path)
        # every worker collects the same items (xdist requires it): each property's shards
        for unit in campaign.plan(xdist_workers(self.config)):
            yield PropertyItem.from_parent(self, name=unit.name, unit=unit)


class SchedfuzzFailure(Exception):
    """Findings of a property item, each reported in full with where it was saved."""


class CaseItem(pytest.Item):
    """One corpus file, replayed on the engine (``Campaign.replay``)."""

    def __init__(self, *, path_: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.case_path = path_
        self.add_marker("schedfuzz")

    def runtest(self) -> None:
        campaign = _session(self.config).campaign
        replayed = campaign.replay(self.case_path)
        self.user_properties.append((ENGINES_KEY, campaign.engines_started()))
        if replayed.property is not None:
            self.user_properties += [("schedfuzz_property", replayed.property), ("schedfuzz_case", str(self.case_path))]
        if replayed.outcome in ("known", "elsewhere"):  # elsewhere: "known on X, seen on Y"
            pytest.xfail(replayed.text)
        if replayed.outcome == "skip":
            pytest.skip(replayed.text)
        if replayed.outcome == "fail":
            raise CorpusFailure(replayed.text)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        # a known bug (xfail) is its verdict: pytest would format, and throw away, a traceback
        # that parses every frame's source (a tenth of a second per case)
        if isinstance(excinfo.value, (CorpusFailure, pytest.xfail.Exception)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)  # type: ignore[arg-type]

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return self.case_path, None, f"schedfuzz::corpus/{self.case_path.stem}"


class CorpusFailure(Exception):
    pass


class PropertyItem(pytest.Item):
    """One unit of the campaign's plan: fuzzes it, saves its findings (``Campaign.fuzz``)."""

    def __init__(self, *, unit: Unit, **kw: Any) -> None:
        super().__init__(**kw)
        self.unit = unit
        self.add_marker("schedfuzz")

    def runtest(self) -> None:
        campaign = _session(self.config).campaign
        fuzzed = campaign.fuzz(self.unit)
        if fuzzed.unjudged:  # not run: another version's rules would judge this build
            pytest.skip(fuzzed.unjudged)
        for found in fuzzed.found:
            self.user_properties.append(("schedfuzz_property", found.property))
            if found.case is not None:
                self.user_properties.append(("schedfuzz_case", found.case))
            self.user_properties.append((FOUND_KEY, asdict(found)))
        self.user_properties += [(STATS_KEY, fuzzed.stats), (ENGINES_KEY, campaign.engines_started())]
        if campaign.fuzzer.interrupted:  # Ctrl-C: what was found is saved; the session stops here
            print("\n" + "\n\n".join(fuzzed.reports), flush=True)
            raise KeyboardInterrupt
        if fuzzed.reports:
            head = f"{len(fuzzed.reports)} distinct findings:\n\n" if len(fuzzed.reports) > 1 else ""
            raise SchedfuzzFailure(head + "\n\n".join(fuzzed.reports))
        if fuzzed.short is not None:
            # too little was judged for a pass: none (the budget was spent before this item, or its
            # share was 0), or fewer examples than the profile's floor
            pytest.skip(fuzzed.short[2])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, SchedfuzzFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)  # type: ignore[arg-type]

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return "schedfuzz", None, f"schedfuzz::{self.name}"


def _session(config: pytest.Config) -> SchedfuzzSession:
    return config.pluginmanager.get_plugin("schedfuzz-session")  # type: ignore[no-any-return]
