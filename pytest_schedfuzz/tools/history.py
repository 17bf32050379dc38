"""A finding's upstream history: on which llama.cpp builds a case reproduces (``Builds.judge``),
the build that brought it or fixed it (``bisect``), and the known bugs against a list of builds
(``matrix``). A build is a published one by name (``llama.cpp-b11548``, fetched on first use:
``llama.published``), a built-in, or a folder of a user's build.

A build either judges a case or cannot, as ``git bisect skip`` has it: it cannot start (its
libraries, declarations or observation refused, with the reason), or it cannot run the case (a
device, a call or a context parameter it lacks). A case reproduces where its signature shows
in one of ``runs`` replays, each on the same worker but a crash's on a fresh one
(``Checks.replay``); it does not where none of them shows it. A build whose crash stacks are
shorter (a Release build inlines static functions) may sign the same abort without its C stack
and ``site``: the signatures then compare without them (``across_builds``), and the judgement
says so (``exact`` false).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..builds.names import is_published
from ..campaign.fuzz import Fuzzer
from ..cases.corpus import STARTER_CORPUS, Case
from ..engine import TargetError, Unsupported
from ..llama.published import build_facts, number, published_names
from ..profiles import FuzzConfig
from ..properties import without_c_stack

HAS, HAS_NOT, CANNOT = "reproduces", "does not", "cannot judge"
FOLDER = re.compile(r"/[^\s:,;()]+/|llama\.cpp-b\d+-[0-9a-f]{16}")  # a path's folders, left out of a matrix's notes


@dataclass(frozen=True)
class Judged:
    """What one build said of one case."""

    build: str
    verdict: str  # HAS, HAS_NOT or CANNOT
    detail: str  # the replay that showed it, how many did not, or why the build cannot judge
    exact: bool = True  # HAS: the very signature; false: the same but for the C stack and its site (``across_builds``)

    def line(self) -> str:
        return f"{describe(self.build)}: {self.verdict} ({self.detail})"


def across_builds(signature: str) -> str:
    """A signature without what a build's crash stack decides: the C stack's frames and the
    ``site`` of an abort (a Release build's stack may lack the static function a Debug build's
    names).

    >>> across_builds("p[kind=abort,message=ggml.c: GGML_ASSERT(x) failed,phase=llama.cpp,site=ggml_mul_mat]")
    'p[kind=abort,message=ggml.c: GGML_ASSERT(x) failed,phase=llama.cpp]'
    """
    return re.sub(r",site=[^,\]]+", "", without_c_stack(signature))


def describe(build: str) -> str:
    """A build as a maintainer places it: a published one with its commit and the date its wheel
    was packed, where the package gives them; else its name or folder."""
    try:
        facts = build_facts(build, fetch=True) if is_published(build) else None
    except TargetError:  # it could not be fetched: the judgement says why
        facts = None
    return facts.describe() if facts is not None else build


def builds_between(first: str, last: str) -> list[str]:
    """The published builds from ``first`` to ``last`` (names, both included), the oldest first."""
    lo, hi = sorted((number(first), number(last)))
    found = [b for b in published_names() if lo <= number(b) <= hi]
    if not found:
        raise TargetError(f"no published llama.cpp build from b{lo} to b{hi}")
    return found


class Builds:
    """The engines of each build a command judges cases on, started on first use and kept until
    ``close``, with the reason a build cannot judge where it cannot start."""

    def __init__(self, runs: int, log: Callable[[str], None] = lambda _: None, known: Sequence[Path] = ()) -> None:
        self.runs = max(1, runs)
        self.log = log
        self.known = (STARTER_CORPUS, *known)  # the known bugs a replay is judged with (``commands.replaying_fuzzer``)
        self.fuzzers: dict[str, Fuzzer | str] = {}

    def fuzzer(self, build: str) -> Fuzzer | str:
        """``build``'s engines, or why it cannot judge (it could not be had or refused to start)."""
        if build not in self.fuzzers:
            self.log(f"starting {build}")
            try:
                fuzzer = Fuzzer(FuzzConfig(llama_lib=build, database=None))
                fuzzer.engines.llama_target.start()
                for folder in self.known:
                    fuzzer.known.learn(Path(folder))
                self.fuzzers[build] = fuzzer
            except (TargetError, ValueError) as e:
                self.fuzzers[build] = " ".join(str(e).split())[:400]
        return self.fuzzers[build]

    def info(self, build: str) -> dict[str, str]:
        """What ``build``'s worker said of itself at its start (empty where it could not start)."""
        fuzzer = self.fuzzer(build)
        return {} if isinstance(fuzzer, str) else fuzzer.engines.llama_target.start()

    def judge(self, case: Case, build: str) -> Judged:
        """Whether ``case``'s signature shows on ``build`` (see the module's docstring)."""
        fuzzer = self.fuzzer(build)
        if isinstance(fuzzer, str):
            return Judged(build, CANNOT, fuzzer)
        try:
            for k in range(self.runs):
                found = [v.signature() for v in fuzzer.replay(case, strict=True)]
                if case.signature in found:
                    return Judged(build, HAS, f"replay {k + 1} of {self.runs} showed it")
                alike = [sig for sig in found if across_builds(sig) == across_builds(case.signature)]
                if alike:
                    return Judged(build, HAS, f"replay {k + 1} of {self.runs} showed it, signed {alike[0]}", exact=False)
        except Unsupported as e:
            return Judged(build, CANNOT, " ".join(str(e).split())[:400])
        except TargetError as e:
            return Judged(build, CANNOT, f"it could not run the case: {' '.join(str(e).split())[:400]}")
        return Judged(build, HAS_NOT, f"none of {self.runs} replays showed it")

    def close(self) -> None:
        for fuzzer in self.fuzzers.values():
            if not isinstance(fuzzer, str):
                fuzzer.close()


@dataclass(frozen=True)
class Bisected:
    """A bisection's judgements (the builds' order) and its conclusion in a sentence."""

    judged: tuple[Judged, ...]
    conclusion: str


def bisect(builds: Sequence[str], judge: Callable[[str], Judged]) -> Bisected:
    """Where a case's presence changes along ``builds`` (the oldest first): the newest and the
    oldest build that can judge it first, then a binary search between two judged builds that
    disagree, stepping over the builds that cannot judge. Both ends alike: every build between is
    judged, so that "present in every judged build" is a fact, not an assumption."""
    verdicts: dict[int, Judged] = {}

    def at(i: int) -> str:
        if i not in verdicts:
            verdicts[i] = judge(builds[i])
        return verdicts[i].verdict

    def done(conclusion: str) -> Bisected:
        return Bisected(tuple(verdicts[i] for i in sorted(verdicts)), conclusion)

    newest = next((i for i in reversed(range(len(builds))) if at(i) != CANNOT), None)
    if newest is None:
        return done("no build could judge it")
    oldest = next((i for i in range(newest) if at(i) != CANNOT), None)
    if oldest is None:
        return done(f"only {describe(builds[newest])} could judge it: it {verdicts[newest].verdict.replace('does not', 'does not reproduce')}")
    if at(oldest) == at(newest):
        for i in range(oldest + 1, newest):
            at(i)
        judged = [i for i in verdicts if verdicts[i].verdict != CANNOT]
        if all(verdicts[i].verdict == verdicts[newest].verdict for i in judged):
            which = "present in" if verdicts[newest].verdict == HAS else "absent from"
            before = f"; the oldest judged, {describe(builds[oldest])}, is the first that can run the case (the one before it: " \
                     f"{verdicts[oldest - 1].detail})" if oldest > 0 else ""
            return done(f"{which} every judged build ({len(judged)} judged, {len(verdicts) - len(judged)} could not judge it){before}")
        have = ", ".join(builds[i] for i in sorted(judged) if verdicts[i].verdict == HAS)
        return done(f"present in some judged builds only, not in order (a flaky case, or brought and fixed more than once): {have}")
    good, bad = oldest, newest  # judged, with different verdicts
    while untried := [i for i in range(good + 1, bad) if i not in verdicts]:
        mid = min(untried, key=lambda i: (abs(2 * i - good - bad), i))
        if at(mid) == CANNOT:
            continue
        good, bad = (mid, bad) if verdicts[mid].verdict == verdicts[good].verdict else (good, mid)
    between = [builds[i] for i in range(good + 1, bad)]
    skipped = f"; between them, builds that could not judge it: {', '.join(between)}" if between else ""
    if verdicts[bad].verdict == HAS:
        return done(f"first build that has it: {describe(builds[bad])}; the judged build before it, without it: "
                    f"{describe(builds[good])}{skipped}")
    return done(f"last build that has it: {describe(builds[good])}; the first judged build after it, without it: "
                f"{describe(builds[bad])}{skipped}")


def known_bugs(cases: Sequence[Case]) -> list[tuple[str, tuple[Case, ...]]]:
    """The llama.cpp cases of each known bug's signature (by file name), for a matrix: the corpus
    keeps several cases of some signatures, found on other builds or runs, and a build that
    cannot run one (a GPU-like device, a context parameter it lacks) may run another."""
    bugs: dict[str, list[Case]] = {}
    for case in sorted(cases, key=lambda c: str(c.path)):
        if case.llama is not None and isinstance(case.expect, dict):
            bugs.setdefault(case.signature, []).append(case)
    return [(signature, tuple(group)) for signature, group in bugs.items()]


@dataclass(frozen=True)
class Matrix:
    """Known bugs by builds: each cell a ``Judged``; each build's start-up facts."""

    builds: tuple[str, ...]
    info: dict[str, dict[str, str]]
    rows: tuple[tuple[str, tuple[Case, ...], tuple[Judged, ...]], ...]  # signature, its cases, a judgement per build


def matrix(bugs: Sequence[tuple[str, tuple[Case, ...]]], builds: Sequence[str], engines: Builds,
           log: Callable[[str], None] = lambda _: None) -> Matrix:
    """Every known bug judged on every build, a build at a time (its worker started once): by its
    first case the build can judge."""
    cells: dict[tuple[int, str], Judged] = {}
    for build in builds:
        for i, (signature, cases) in enumerate(bugs):
            for case in cases:
                cells[i, build] = engines.judge(case, build)
                if cells[i, build].verdict != CANNOT:
                    break
            log(f"{build}: {signature}: {cells[i, build].verdict}")
    return Matrix(tuple(builds), {b: engines.info(b) for b in builds},
                  tuple((sig, cases, tuple(cells[i, b] for b in builds)) for i, (sig, cases) in enumerate(bugs)))


def render_matrix(m: Matrix, made_by: str) -> str:
    """The matrix as a Markdown page: the builds, then a row per known bug with "yes" where one of
    its cases reproduces, "no" where none does and a numbered note where the build can judge none;
    then, per bug, whether the newest judged build still has it and since which build."""
    notes: dict[str, int] = {}

    def cell(j: Judged) -> str:
        if j.verdict == CANNOT:  # one note per reason, whichever build's folder it names
            why = FOLDER.sub("", j.detail).replace(" in )", ")")
            return f"–[^{notes.setdefault(why, len(notes) + 1)}]"
        return ("yes" if j.exact else "yes*") if j.verdict == HAS else "no"

    short = [b.replace("llama.cpp-", "") for b in m.builds]
    lines = ["| build | llama.cpp commit | packed | ggml | re-plans observed by | RPC devices |", "|---|---|---|---|---|---|"]
    for b in m.builds:
        facts, info = build_facts(b) if is_published(b) else None, m.info.get(b, {})
        observed = ("could not start" if not info else "ggml's realloc callback" if info.get("realloc_callback") == "observed"
                    else "interposed allocator calls" if info.get("allocator_calls") == "observed" else "ggml's debug log")
        rpc = "—" if not info else "no" if info.get("rpc_round_trip", "").startswith("absent") else "yes"
        lines.append(f"| {b} | {facts.commit[:9] if facts else ''} | {facts.packed if facts else ''} | {info.get('ggml_version', '')} | {observed} | {rpc} |")
    lines += ["", "| known bug (signature; its cases in the corpus) | " + " | ".join(short) + " | in the newest judged | oldest with it |",
              "|---|" + "---|" * len(short) + "---|---|"]
    for signature, cases, judged in m.rows:
        seen = [j for j in judged if j.verdict != CANNOT]
        newest = seen[-1].verdict == HAS if seen else None
        since = next((j.build.replace("llama.cpp-", "") for j in seen if j.verdict == HAS), "")
        lines.append(f"| `{signature}`; {len(cases)} | " + " | ".join(cell(j) for j in judged)
                     + f" | {'—' if newest is None else 'yes' if newest else 'no'} | {since} |")
    lines += ["", f"Made by `{made_by}`. yes: the case's signature showed; yes*: the same signature but for the C stack and its "
                  "site, which this build's stacks do not name (a Release build inlines static functions), so that causes told apart "
                  "by their site elsewhere are one here; no: it did not in any replay; –: the build cannot judge the case:", ""]
    lines += [f"[^{n}]: {why}" for why, n in notes.items()]
    return "\n".join(lines) + "\n"
