"""The known engine bugs of a run: the corpus's expect-fail cases, and what a campaign found.

A known bug found again is counted, not reported; which cases are known depends on the version of
the ggml that runs them and, for llama.cpp cases, on the build (``Case.expected_failure_on``). A
llama.cpp bug known on other builds only is not silenced: seen here, it is reported as "known on X,
seen on Y" without failing the run (``elsewhere``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..cases.corpus import Case, CaseError, case_files, component, load_case
from ..model.versions import version_key
from .stats import Stats


class KnownBugs:
    """Signatures not to report again, per kind of engine (llama.cpp or the graph engine)."""

    def __init__(self, stats: Stats, version_of: Callable[[bool], str | None], llama_build: Callable[[], str | None] = lambda: None) -> None:
        self.stats = stats
        self.version_of = version_of  # llama or not -> the ggml version that runs those cases
        self.llama_build = llama_build  # the llama.cpp build that runs llama.cpp cases (``LlamaTarget.build``)
        self.cases: list[Case] = []  # the corpus's expected failures (``learn``)
        self.campaign: set[str] = set()  # signatures found by this campaign (keep-going)
        # the corpus's new findings nobody has triaged (``Case.untriaged``), by kind: found again while
        # fuzzing they are seen again, not new (their corpus item fails the run while they reproduce)
        self.untriaged: dict[bool, set[str]] = {False: set(), True: set()}
        self._by_kind: dict[bool, set[str]] = {}
        self._elsewhere: dict[str, tuple[str, ...]] | None = None  # ``elsewhere``'s, made once

    def learn(self, directory: Path) -> None:
        """Remember the corpus's expect-fail cases (unreadable files are reported by their own
        corpus items). A folder learnt twice (the starter corpus is also the run's corpus)
        counts once."""
        learnt = {c.path.resolve() for c in self.cases if c.path is not None}
        for path in case_files(directory):
            if path.resolve() in learnt:
                continue
            try:
                case = load_case(path)
            except CaseError:
                continue
            if case.expected_failure is not None:
                self.cases.append(case)
                self.stats.components.setdefault(case.signature, component(case))
            elif case.untriaged:
                self.untriaged[case.llama is not None].add(case.signature)
                self.stats.components.setdefault(case.signature, f"untriaged: {path.name}")
        self._by_kind.clear()
        self._elsewhere = None

    def expected(self, llama: bool) -> set[str]:
        """Signatures of the known bugs expected on this engine's version."""
        if llama not in self._by_kind:
            cases = [c for c in self.cases if (c.llama is not None) == llama]
            version = self.version_of(llama) if cases else None
            build = self.llama_build() if cases and llama else None
            self._by_kind[llama] = {c.signature for c in cases if c.expected_failure_on(version, build) is not None}
        return self._by_kind[llama]

    def elsewhere(self, llama: bool) -> dict[str, tuple[str, ...]]:
        """Signatures of llama.cpp bugs known on other builds only, with those builds (where the
        same signature is also known here, it is not elsewhere)."""
        if not llama or not any(c.llama is not None for c in self.cases):
            return {}
        if self._elsewhere is not None:
            return self._elsewhere
        build, here = self.llama_build(), self.expected(True)
        out: dict[str, tuple[str, ...]] = {}
        for c in self.cases:
            known = c.known_elsewhere(build) if c.llama is not None and c.signature not in here else None
            if known is not None:
                out[c.signature] = tuple(sorted({*out.get(c.signature, ()), *known}))
        self._elsewhere = out
        return out

    def tolerated(self, llama: bool) -> set[str]:
        """What a replay of a case may show beside its own bug without failing: the bugs known on
        this build, and (llama.cpp) those known on other builds only, which it reports as such."""
        return self.expected(llama) | set(self.elsewhere(llama))

    def signatures(self, llama: bool) -> set[str]:
        """Everything not to report again: the expected bugs, the corpus's untriaged findings and
        the campaign's findings."""
        return self.expected(llama) | self.untriaged[llama] | self.campaign

    def unknown_version_note(self, llama: bool) -> str | None:
        """A line for the header where the ggml version of the engine that runs llama.cpp workloads
        (or graph scenarios) cannot be read: which known bugs are then not expected (those recorded
        for some versions only); None where the version is read or no known bug is of that kind."""
        cases = [c for c in self.cases if (c.llama is not None) == llama]
        version = self.version_of(llama) if cases else None
        if not cases or version_key(version) is not None:
            return None
        bounded = sum(c.expected_failure_on(version) is None for c in cases)
        return (f"{'llama.cpp' if llama else 'the graph engine'}: its ggml version cannot be read ({version or 'none'}): "
                f"{bounded} known bug(s) recorded for some ggml versions only are not expected there, "
                f"{len(cases) - bounded} recorded for every version are")
