"""What ``pytest --schedfuzz`` collects: the corpus's cases (``CaseItem``), replayed first, and
one item per property and xdist shard (``PropertyItem``) that fuzzes it and saves its findings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .properties import fuzz_units

if TYPE_CHECKING:
    from .session import SchedfuzzSession

STATS_KEY = "schedfuzz_stats"


def xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers share this session (1 without xdist), from xdist's own
    worker info; not from the environment, which child pytest runs inherit."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput.get("workercount", 1)) if workerinput else 1


class SchedfuzzSuite(pytest.Collector):
    """The built-in property suite: one item per property, collected with no test file."""

    def collect(self) -> Iterator[pytest.Item]:
        from .cases.corpus import case_files

        session = _session(self.config)
        # the corpus first: known findings are replayed before new fuzzing
        for path in case_files(session.corpus):
            yield CaseItem.from_parent(self, name=f"corpus/{path.stem}", path_=path)
        # under pytest-xdist each property is split into one shard per worker, so that the
        # workers share the fuzzing evenly (every worker collects the same items)
        workers = xdist_workers(self.config)
        shards = 1 if workers == 1 else 4 * workers  # several per worker: they balance better
        units = fuzz_units(session.properties, policy=session.fuzz_config.policy is not None)
        session.pending = sum(w for _, w in units) * shards // workers
        for prop, weight in units:
            for k in range(shards):
                name = prop if shards == 1 else f"{prop}[{k}]"
                yield PropertyItem.from_parent(self, name=name, prop=prop, shard=k, shards=shards, weight=weight)


class SchedfuzzFailure(Exception):
    """Findings of a property item, each reported in full with where it was saved."""


class CaseItem(pytest.Item):
    """One corpus file, replayed on the engine: ``expect: pass`` must hold no violation of its
    property; ``expect: {fail: ...}`` is a strict expected failure with the same signature."""

    def __init__(self, *, path_: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.case_path = path_
        self.add_marker("schedfuzz")

    def runtest(self) -> None:
        from .cases.corpus import CaseError, load_case
        from .cases.verdict import judge_replay

        session = _session(self.config)
        try:
            case = load_case(self.case_path)
        except CaseError as e:
            raise CorpusFailure(f"bad corpus file: {e}") from None
        self.user_properties += [("schedfuzz_property", case.property), ("schedfuzz_case", str(self.case_path))]
        version = session.fuzzer.engines.ggml_version(case.llama is not None)
        if case.llama is not None:
            off = case.off_build(version, session.fuzzer.engines.llama_target.start().get("gpu_device", "available"))
            if off:
                pytest.skip(off)
        found = session.fuzzer.replay(case)
        verdict = judge_replay(case, found, version, session.fuzzer.known.expected(case.llama is not None))
        if verdict.outcome == "known":
            pytest.xfail(verdict.text)
        if verdict.outcome == "unshown":
            pytest.skip(verdict.text)
        if not verdict.ok:
            raise CorpusFailure(verdict.text)

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
    def __init__(self, *, prop: str, shard: int = 0, shards: int = 1, weight: int = 1, **kw: Any) -> None:
        super().__init__(**kw)
        self.prop = prop
        self.weight = weight
        self.shard, self.shards = shard, shards
        self.add_marker("schedfuzz")

    def runtest(self) -> None:
        session = _session(self.config)
        fuzzer = session.fuzzer
        before = fuzzer.stats.as_dict()
        reports: list[str] = []

        def save(finding: Any) -> None:
            self.user_properties.append(("schedfuzz_property", finding.violation.property))
            try:
                path = fuzzer.save_finding(session.corpus, finding)
            except OSError as e:  # the finding is still reported, in full
                reports.append(f"{finding.report()}\nNOT SAVED: cannot write to {session.corpus}: {e.strerror or e}")
                return
            self.user_properties.append(("schedfuzz_case", str(path)))
            reports.append(f"{finding.report()}\nsaved to {path}")

        seconds = session.time_share(self.weight)
        done, short = False, None
        try:
            if session.fuzz_config.keeps_going():
                fuzzer.campaign(self.prop, shard=self.shard, shards=self.shards, seconds=seconds, on_finding=save)
            else:
                finding = fuzzer.fuzz(self.prop, shard=self.shard, shards=self.shards, seconds=seconds)
                if finding is not None:
                    save(finding)
            done = True
        finally:
            ran = fuzzer.stats.examples - before["examples"]
            fuzzer.stats.property_examples[self.prop] = fuzzer.stats.property_examples.get(self.prop, 0) + ran
            if done and not reports and not fuzzer.interrupted:
                short = self.shortfall(ran, before, seconds)
            if short is not None:
                fuzzer.stats.short_items[self.name], fuzzer.stats.short_floors[self.name] = short[:2]
            self.user_properties.append((STATS_KEY, fuzzer.stats.delta(before)))
        if fuzzer.interrupted:  # Ctrl-C: what was found is saved; the session stops here
            print("\n" + "\n\n".join(reports), flush=True)
            raise KeyboardInterrupt
        if reports:
            head = f"{len(reports)} distinct findings:\n\n" if len(reports) > 1 else ""
            raise SchedfuzzFailure(head + "\n\n".join(reports))
        if short is not None:
            # too little was judged for a pass: none (the budget was spent before this item, or its
            # share was 0), or fewer examples than the profile's floor
            pytest.skip(short[2])

    def shortfall(self, ran: int, before: dict[str, Any], seconds: float | None) -> tuple[int, int, str] | None:
        """``(judged, floor, reason)`` where this item judged fewer examples than its floor: the
        profile's ``min_examples``, or the examples it was asked for where fewer (a count over
        ``shards``). ``ran`` examples were run since the stats were ``before``; ``seconds``: its
        share of the time budget."""
        fuzzer = _session(self.config).fuzzer
        asked = fuzzer.examples_for(self.prop)
        floor = fuzzer.profile.min_examples
        if asked is not None:
            floor = min(floor, -(-asked // self.shards))
        # llama.cpp workloads rejected, not judged: a context that did not fit and made no scheduler call
        added = fuzzer.stats.delta(before)
        rejected = added["llama_out_of_memory"] - added["llama_out_of_memory_judged"]
        judged = max(0, ran - rejected)
        if judged >= floor:
            return None
        why: list[str] = []
        if fuzzer.out_of_budget():
            why.append("the time budget was spent " + ("before it" if not ran else "while it ran"))
        elif seconds is not None and asked is None:
            why.append(f"its share of the time budget ({seconds:.1f} s) " + ("ran out" if ran else "was too small for one example"))
        hint = " (raise --schedfuzz-budget, or select fewer properties)" if why else ""
        if rejected:
            why.append(f"{rejected} of its llama.cpp workloads were rejected (a context or adapter that did not fit "
                       "devices this full, no scheduler call made: not judged)")
        if not why:
            why.append("Hypothesis stopped early (too many examples rejected, or none left to generate)")
        ran_text = "ran no example" if not ran else f"judged {judged} of {ran} examples" if rejected else f"ran {ran} examples"
        floor_text = f"fewer than its floor of {floor} ({fuzzer.config.profile} profile)"
        return judged, floor, f"{self.name} {ran_text}, {floor_text}: {'; '.join(why)}{hint}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, SchedfuzzFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)  # type: ignore[arg-type]

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return "schedfuzz", None, f"schedfuzz::{self.name}"


def _session(config: pytest.Config) -> SchedfuzzSession:
    return config.pluginmanager.get_plugin("schedfuzz-session")  # type: ignore[no-any-return]
