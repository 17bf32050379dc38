"""A corpus case's replay judged, one way for the plugin's corpus items and ``schedfuzz replay``.

An expect-fail case passes as a known bug only if its replay shows its own signature and no
violation that is not a known bug: another one beside it is reported, never hidden by it (a
workload that lost its reservation re-plans again later, and those later reallocations are the
corpus's other known cases). A guard case (``expect: pass``) shows no violation at all. A new
finding nobody has triaged (``expect: new``) that reproduces fails as ``untriaged``: the finding
is still open, whoever runs it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..properties.base import Violation
from .corpus import Case

OUTCOMES = ("pass", "known", "elsewhere", "fail", "xpass", "unshown", "untriaged")
RACE = "[race="  # a race's signature: it shows only when the threads interleave so


@dataclass(frozen=True)
class Verdict:
    """``pass`` (a guard case holds), ``known`` (the known bug, and only it), ``elsewhere`` (a
    llama.cpp bug known on other builds, shown on this one too: "known on X, seen on Y"), ``fail``
    (a violation that is not the case's known bug), ``xpass`` (the known bug is gone) or
    ``unshown`` (a known race that did not show in its replays: not proof that it is gone) or
    ``untriaged`` (a new finding, not triaged, that reproduces)."""

    outcome: str
    text: str  # in full, for a corpus item's report
    short: str  # one line, for ``schedfuzz replay``

    @property
    def ok(self) -> bool:
        return self.outcome in ("pass", "known", "elsewhere", "unshown")


def judge_replay(case: Case, found: Sequence[Violation], version: str | None, known: Collection[str] = (), build: str | None = None) -> Verdict:
    """The verdict on ``found``, the violations of one replay of ``case`` on ggml ``version``
    (for a llama.cpp case, on llama.cpp ``build``); ``known``: the signatures of the known bugs
    expected there. A bug known on other builds only that shows here is neither a pass nor a
    new failure, nor, where it does not show, a fix (it was never known here)."""
    name = case.path.name if case.path is not None else case.signature
    same = [v for v in found if v.signature() == case.signature]
    others = [v for v in found if v.signature() != case.signature and v.signature() not in known]
    expected = case.expected_failure_on(version, build)
    elsewhere = case.known_elsewhere(build)
    if elsewhere is not None and not others:
        seen = f"known on {', '.join(elsewhere)}, seen on {build}" if same else f"known on {', '.join(elsewhere)}, not shown on {build}"
        return Verdict("elsewhere" if same else "pass", f"{seen}: {name} ({case.signature})", seen)
    if case.untriaged:
        if same and not others:
            return Verdict("untriaged", f"{name}: the new finding {case.signature} reproduces on {build or f'ggml {version}'}; nobody has "
                                        f"triaged it: fix it, or make it a known bug (schedfuzz known {name} --because \"...\")",
                           "reproduces (a new finding, not triaged)")
        if not found:
            return Verdict("pass", f"{name}: the new finding {case.signature} does not reproduce on {build or f'ggml {version}'}",
                           "does not reproduce (a new finding, not triaged)")
    if expected is not None:
        if same and not others:
            return Verdict("known", f"known engine bug on ggml {version} ({expected}): {same[0]}", "still fails (known bug)")
        if same:
            beside = "\n".join(f"{v.signature()}: {v}" for v in others)
            return Verdict("fail", f"{name}: beside its known bug {case.signature} on ggml {version}, the replay shows "
                                   f"{len(others)} other violation(s), not known:\n{beside}", f"FAIL: beside the known bug: {others[0]}")
        if not found and RACE in case.signature:
            return Verdict("unshown", f"{name}: the known race {case.signature} did not show in its replays on this machine's load "
                                      "(a race that does not show is not a race fixed)", "not shown (a race: not counted as fixed)")
        got = f"now: {found[0]}" if found else "no violation any more"
        return Verdict("xpass", f"[XPASS(strict)] {name} is expected to fail on ggml {version} with {case.signature} ({expected}); {got}",
                       f"XPASS: the known bug no longer reproduces; {got}")
    if found:
        scope = f" (a known bug only outside ggml {version}: {case.expect})" if case.expected_failure is not None else ""
        return Verdict("fail", f"{name} ({case.signature}) fails again, on ggml {version}{scope}:\n{found[0]}", f"FAIL: {found[0]}")
    return Verdict("pass", "pass", "pass")
