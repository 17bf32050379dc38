"""A failure becomes a finding only once it comes back (DESIGN §14: a finding is a reproduced
signature).

The fuzzer's shrunk case is replayed on a fresh worker and fresh RPC servers (``Engines.fresh``):
what a worker's earlier examples left in its memory, or a server an earlier workload killed,
cannot make the verdict. The first replay that shows the same signature confirms a failure that
reproduces every time at the cost of one run; where it does not, the case is replayed up to
``runs`` times in all (``--schedfuzz-confirm-runs``, ``FuzzConfig.confirm_runs``) and is a finding when any replay shows the same signature, reported as
"reproduced k of n" (a read of memory nobody wrote, a race). A failure no replay shows again,
or one Hypothesis itself could not replay (its ``FlakyFailure``), is unconfirmed: kept as a case
in ``.schedfuzz/unconfirmed/`` with every run's message, counted in the summary, never a finding.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import properties as props
from ..cases.corpus import Case, component_of
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import Scenario
from ..sim.driver import Workload
from .engines import Engines
from .judging import in_cpu_run

if TYPE_CHECKING:
    from .fuzz import Fuzzer

SAME = "the same signature"
FLAKY = "Hypothesis's own replay of the example did not fail again (a FlakyFailure); not replayed on a fresh worker"
INTERRUPTED = "the run was interrupted (Ctrl-C) before its replay on a fresh worker"


@dataclass(frozen=True)
class Finding:
    """A confirmed failure: the shrunk case, its violation and how its replays showed it again."""

    property: str
    scenario: Scenario
    violation: props.Violation
    workload: Workload | None = None
    llama: LlamaWorkload | None = None
    confirmation: str = ""  # how its replays on fresh workers showed it again (``Confirmation.describe``)

    def report(self) -> str:
        where = f"component: {component_of(self.property, self.violation.signature())}\n" + (f"{self.confirmation}\n" if self.confirmation else "")
        if self.llama is not None:
            calls = "\n".join(f"  {i:2d}: {c.describe()}" for i, c in enumerate(self.llama.calls))
            return f"{self.violation}\n{where}{self.llama.describe()}\ncalls:\n{calls}"
        sc = self.scenario
        steps = "\n".join(f"  {i:2d}: {s.describe()}" for i, s in enumerate(sc.steps))
        graphs = "\n".join(f"  {n}: {g.label or ''} {g.n_ops} ops, {len(g.tensors) - g.n_ops} leafs" for n, g in sc.graphs)
        kinds = ", ".join(b.kind for b in sc.layout.backends)
        return f"{self.violation}\n{where}layout: [{kinds}]\ngraphs:\n{graphs}\nsteps:\n{steps}"

    def to_case(self, fuzzer: Fuzzer) -> Case:
        engines = fuzzer.engines
        engine = dict(getattr(engines._target, "engine", None) or {"name": fuzzer.config.target or "ggml"})
        v = self.violation
        if self.llama is not None:
            engine = dict(engines.llama_target.engine) if engines._llama is not None else {"name": "llama.cpp"}
        options = {"rereserve": False} if self.workload is not None and not fuzzer.config.rereserve else {}
        return Case(v.property, v.signature(), self.scenario, v.message, v.step, fuzzer.seed, engine, expect="new", workload=self.workload,
                    llama=self.llama, options=options)


class ViolationFound(AssertionError):
    """Raised by an example that failed (a new signature): Hypothesis shrinks it."""

    def __init__(self, scenario: Scenario | None, violation: props.Violation, workload: Workload | None, llama: LlamaWorkload | None = None) -> None:
        super().__init__(str(violation))
        self.scenario = scenario
        self.violation = violation
        self.workload = workload
        self.llama = llama


@dataclass(frozen=True)
class Confirmation:
    """The replays of one failure's shrunk case on fresh workers: each one's outcome, ``SAME``
    or what it showed instead (another signature and its message, or that it passed)."""

    runs: tuple[str, ...]
    not_replayed: str = ""  # why there were no replays (Hypothesis's FlakyFailure, a Ctrl-C)

    @property
    def reproduced(self) -> int:
        return sum(r == SAME for r in self.runs)

    @property
    def confirmed(self) -> bool:
        return self.reproduced > 0

    def describe(self) -> str:
        if self.runs == (SAME,):
            return "confirmed: the same signature on a fresh worker and fresh RPC servers"
        if not self.runs:
            return f"unconfirmed: {self.not_replayed or 'not replayed'}"
        return (f"{'confirmed' if self.confirmed else 'unconfirmed'}: reproduced {self.reproduced} of {len(self.runs)} replays "
                "on fresh workers and fresh RPC servers")


def confirm(engines: Engines, violation: props.Violation, check: Callable[[], list[props.Violation]], runs: int) -> Confirmation:
    """Replay a failure (``check``: its property judged on its shrunk case) on fresh engines until
    one replay shows ``violation``'s signature, at most ``runs`` times."""
    sig = violation.signature()
    outcomes: list[str] = []
    for _ in range(max(1, runs)):
        engines.fresh()
        found = check()
        if any(v.signature() == sig for v in found):
            outcomes.append(SAME)
            if len(outcomes) == 1:
                break  # it comes back at once: one replay is enough
            continue
        outcomes.append(f"{found[0].signature()}: {found[0]}" if found else "passed")
    return Confirmation(tuple(outcomes))


def keep_unconfirmed(engines: Engines, violation: props.Violation, confirmation: Confirmation, scenario: Scenario | None,
                     workload: Workload | None, llama: LlamaWorkload | None) -> Path | None:
    """An unconfirmed failure, kept (``Engines.keep_unconfirmed``) with every run's message: the
    first run's, then each replay's."""
    replays = "\n".join(f"  replay {i + 1}: {r}" for i, r in enumerate(confirmation.runs)) or "  none"
    target = engines.llama_target if llama is not None else engines.target
    return engines.keep_unconfirmed(Case(violation.property, violation.signature(), scenario,
                                         f"{violation.message}\n\n{confirmation.describe()}:\n{replays}"[-6000:], violation.step, engines.seed,
                                         dict(getattr(target, "engine", {}) or {}), {"fail": confirmation.describe()},
                                         workload=workload, llama=llama))


def confirmed_finding(fuzzer: Fuzzer, prop: str, e: ViolationFound) -> Finding | None:
    """The finding of a shrunk failure once its replays confirm it; None for one they do not
    (kept, ``keep_unconfirmed``), and for one another host of a shared campaign confirmed first
    (seen again there: a claim is made once a failure is confirmed, not before)."""
    violation = e.violation
    if e.llama is not None and violation.property == "llama-no-same-size-realloc":
        # the shrunk case, confirmed by ggml's own check before it is reported
        again = fuzzer.check_llama(violation.property, e.llama, in_cpu_run(violation.signature()))
        violation = next((v for v in again if v.signature() == violation.signature()), again[0] if again else violation)
    if fuzzer.interrupted:  # Ctrl-C: nothing runs again
        confirmation = Confirmation((), INTERRUPTED)
    else:
        llama = e.llama
        # a llama.cpp failure is replayed as its case will be: its property judged alone (``Checks.replay``)
        check = (lambda: fuzzer.check(prop, e.scenario)) if llama is None else (lambda: fuzzer.check_llama(violation.property, llama, in_cpu_run(violation.signature())))  # type: ignore[arg-type]
        confirmation = confirm(fuzzer.engines, violation, check, fuzzer.config.confirm_runs)
    sig, stats = violation.signature(), fuzzer.stats
    if not confirmation.confirmed:
        kept = keep_unconfirmed(fuzzer.engines, violation, confirmation, e.scenario, e.workload, e.llama)
        print(f"schedfuzz: {prop}: {sig}: {confirmation.describe()}; not a finding"
              + (f": kept in {kept}" if kept is not None else ""), file=sys.stderr, flush=True)
        return None
    if fuzzer.shared is not None and fuzzer.shared.claim(prop, sig) is not None:
        stats.seen_again[sig] = stats.seen_again.get(sig, 0) + 1
        return None
    stats.findings[violation.property] = stats.findings.get(violation.property, 0) + 1
    stats.signatures[sig] = stats.signatures.get(sig, 0) + 1
    return Finding(violation.property, e.scenario, violation, e.workload, e.llama, confirmation.describe())
