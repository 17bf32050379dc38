"""The fuzzing loop shared by the pytest plugin and the ``schedfuzz`` command.

A ``Fuzzer`` owns one engine (a target), the reference, the driver and the statistics. For a
property id it runs Hypothesis over that property's strategy, checks each generated case on
the engine and the reference, and returns the shrunk failing case, if any, as a ``Finding``.
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from reference.predict import predict as reference_predict

from . import properties as props
from .corpus import Case
from .driver import Driver, Workload, can_reuse, load_policy
from .scenario import Scenario
from .strategies import scenarios, workloads
from .targets import Target, Unsupported, load_target
from .trace import Trace

Predict = Callable[[Scenario], Trace]


@dataclass(frozen=True)
class Profile:
    """How much to fuzz: examples per property, graph scale, and whether to stop on time."""

    examples: int
    max_rpc: int
    max_steps: int
    budget: float | None  # seconds for the whole run, shared by the properties
    derandomize: bool
    max_layers: int = 4  # llama-like graphs: layers, and extra elementwise ops per layer
    max_extra_ops: int = 0
    blas: bool = False  # layouts with a BLAS backend (skipped where ggml has none)


PROFILES: dict[str, Profile] = {
    "dev": Profile(examples=15, max_rpc=1, max_steps=5, budget=None, derandomize=False),
    "ci": Profile(examples=25, max_rpc=2, max_steps=6, budget=240.0, derandomize=True),
    # up to 32 layers of up to 250 nodes: llama-sized graphs of several thousand nodes
    "nightly": Profile(
        examples=300, max_rpc=3, max_steps=10, budget=None, derandomize=False, max_layers=32, max_extra_ops=200, blas=True
    ),
}


@dataclass(frozen=True)
class FuzzConfig:
    profile: str = "dev"
    examples: int | None = None
    seed: int | None = None
    budget: float | None = None
    target: str | None = None  # module:factory; default the built-in ggml engine
    lib: str | None = None
    policy: str | None = None  # module:callable
    rereserve: bool = True
    reference: str | None = None  # module:callable replacing reference.predict.predict
    database: Path | None = Path(".schedfuzz/examples")

    def resolved_profile(self) -> Profile:
        if self.profile not in PROFILES:
            raise ValueError(f"--schedfuzz-profile {self.profile!r}: choose one of {', '.join(PROFILES)}")
        return PROFILES[self.profile]


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)


def _load(spec: str, what: str) -> Any:
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{what} {spec!r}: {e}") from None


@dataclass
class Stats:
    """The scheduler statistics llama.cpp users know, plus examples and findings."""

    examples: int = 0
    graphs_reused: int = 0
    reallocs_same: int = 0
    reallocs_changed: int = 0
    splits: int = 0
    known: int = 0  # violations matching a known engine bug of the corpus
    findings: dict[str, int] = field(default_factory=dict)

    def add_trace(self, trace: Trace) -> None:
        for r in trace.records:
            self.graphs_reused += r.reused
            if r.kind in ("alloc", "compute"):
                self.splits += r.n_splits
        for e in trace.events:
            if e.same_size:
                self.reallocs_same += 1
            else:
                self.reallocs_changed += 1

    def merge(self, other: dict[str, Any]) -> None:
        for k in ("examples", "graphs_reused", "reallocs_same", "reallocs_changed", "splits", "known"):
            setattr(self, k, getattr(self, k) + int(other.get(k, 0)))
        for p, n in other.get("findings", {}).items():
            self.findings[p] = self.findings.get(p, 0) + n

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("examples", "graphs_reused", "reallocs_same", "reallocs_changed", "splits", "known")} | {
            "findings": dict(self.findings)
        }

    def summary_lines(self) -> list[str]:
        lines = [
            f"examples = {self.examples}",
            f"graphs reused = {self.graphs_reused}",
            f"graph reallocs = {self.reallocs_same} / {self.reallocs_changed}   (same size) / (changed size)",
            f"splits = {self.splits}",
            f"known engine bugs seen again = {self.known}",
        ]
        lines += [f"findings[{p}] = {self.findings.get(p, 0)}" for p in props.PROPERTY_IDS]
        return lines


DRIVER_PROPERTIES = ("reuse-sound", "reuse-complete", "reuse-equivalent", "no-same-size-realloc")


@dataclass(frozen=True)
class Finding:
    property: str
    scenario: Scenario
    violation: props.Violation
    workload: Workload | None = None

    def report(self) -> str:
        sc = self.scenario
        steps = "\n".join(f"  {i:2d}: {s.describe()}" for i, s in enumerate(sc.steps))
        graphs = "\n".join(f"  {n}: {g.label or ''} {g.n_ops} ops, {len(g.tensors) - g.n_ops} leafs" for n, g in sc.graphs)
        kinds = ", ".join(b.kind for b in sc.layout.backends)
        return f"{self.violation}\nlayout: [{kinds}]\ngraphs:\n{graphs}\nsteps:\n{steps}"

    def to_case(self, fuzzer: Fuzzer) -> Case:
        engine = dict(getattr(fuzzer._target, "engine", None) or {"name": fuzzer.config.target or "ggml"})
        v = self.violation
        return Case(v.property, v.signature(), self.scenario, v.message, v.step, fuzzer.seed, engine, workload=self.workload)


class ViolationFound(AssertionError):
    def __init__(self, scenario: Scenario, violation: props.Violation, workload: Workload | None) -> None:
        super().__init__(str(violation))
        self.scenario = scenario
        self.violation = violation
        self.workload = workload


class Fuzzer:
    """Engine + reference + driver for one session (one pytest-xdist worker)."""

    def __init__(self, config: FuzzConfig) -> None:
        self.config = config
        self.profile = config.resolved_profile()
        self.seed = config.seed if config.seed is not None else (0 if self.profile.derandomize else new_seed())
        self.policy = load_policy(config.policy) if config.policy else can_reuse
        self.driver = Driver(self.policy, config.rereserve)
        self.predict: Predict = _load(config.reference, "--schedfuzz-reference") if config.reference else reference_predict
        self.stats = Stats()
        self.known: set[str] = set()  # signatures of known engine bugs, not reported again
        self.started = time.monotonic()
        self.first_failure: float | None = None  # seconds from the start of fuzz() to the first violation
        self._target: Target | None = None

    @property
    def target(self) -> Target:
        if self._target is None:
            if self.config.target:
                self._target = load_target(self.config.target)
            else:
                from .targets.ggml_target import GgmlTarget

                self._target = GgmlTarget(lib_dir=self.config.lib)
        return self._target

    def close(self) -> None:
        if self._target is not None:
            self._target.close()
            self._target = None

    def out_of_budget(self) -> bool:
        budget = self.config.budget if self.config.budget is not None else self.profile.budget
        return budget is not None and time.monotonic() - self.started > budget

    # ----------------------------------------------------------------- one case

    def run_engine(self, scenario: Scenario) -> Trace:
        trace = self.target.run(scenario)
        self.stats.add_trace(trace)
        return trace

    def check(self, prop: str, scenario: Scenario) -> list[props.Violation]:
        """Every violation of ``prop`` (and of no-abort, whenever the engine ran) on one case."""
        if prop in ("reuse-sound", "reuse-complete"):
            # decisions of the driver's policy: no engine needed to judge them
            return props.CHECKS[prop](scenario, Trace(()), Trace(()))
        trace = self.run_engine(scenario)
        if prop == "reuse-equivalent":
            fresh = self.run_engine(props.fresh_variant(scenario))
            return props.no_abort(scenario, trace, Trace(())) or props.reuse_equivalent(scenario, trace, fresh)
        prediction = self.predict(scenario)
        found = props.no_abort(scenario, trace, prediction)
        if prop != "no-abort":
            found += props.CHECKS[prop](scenario, trace, prediction)
        return found

    # ----------------------------------------------------------------- a property

    def strategy(self, prop: str) -> st.SearchStrategy[Workload | Scenario]:
        """Driver properties fuzz workloads (played by the driver); the others raw scenarios."""
        p = self.profile
        if prop in DRIVER_PROPERTIES:
            max_ubatches = 8 if prop == "no-same-size-realloc" else 4
            reconf = 0 if prop == "no-same-size-realloc" else 1
            return workloads(max_ubatches=max_ubatches, min_reconfigures=reconf, max_layers=max(2, p.max_layers // 4), max_extra_ops=p.max_extra_ops)
        return scenarios(p.max_rpc, p.max_steps, prop == "no-abort", p.max_layers, p.max_extra_ops, p.blas)

    def scenario_of(self, case: Workload | Scenario) -> Scenario:
        return self.driver.scenario(case) if isinstance(case, Workload) else case

    def fuzz(self, prop: str, examples: int | None = None, shard: int = 0, shards: int = 1) -> Finding | None:
        """Run Hypothesis on one property; the shrunk failing case, or None. With ``shards``
        (one per pytest-xdist worker) this runs shard ``shard``: its share of the examples,
        under seed ``seed + shard``."""
        n = examples or self.config.examples or self.profile.examples
        n = -(-n // shards)
        db = DirectoryBasedExampleDatabase(str(self.config.database)) if self.config.database else None
        # shrink towards the first failure's signature only, so that a case keeps its finding
        target: list[str] = []
        start = time.monotonic()
        self.first_failure = None

        @hypothesis_seed(self.seed + shard)
        @settings(
            max_examples=n,
            deadline=None,
            database=db,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
            report_multiple_bugs=False,
        )
        @given(self.strategy(prop))
        def run(case: Workload | Scenario) -> None:
            if self.out_of_budget():
                return
            self.stats.examples += 1
            scenario = self.scenario_of(case)
            try:
                found = self.check(prop, scenario)
            except Unsupported:
                return
            # a known engine bug (an expect-fail case of the corpus) found again is not news
            known = [v for v in found if v.signature() in self.known]
            self.stats.known += len(known)
            found = [v for v in found if v.signature() not in self.known]
            if found and self.first_failure is None:
                self.first_failure = time.monotonic() - start
            if found and (not target or found[0].signature() == target[0]):
                target[:] = [found[0].signature()]
                raise ViolationFound(scenario, found[0], case if isinstance(case, Workload) else None)

        try:
            run()
        except ViolationFound as e:
            self.stats.findings[e.violation.property] = self.stats.findings.get(e.violation.property, 0) + 1
            return Finding(prop, e.scenario, e.violation, e.workload)
        return None

    def learn_known_bugs(self, directory: Path) -> None:
        """Remember the signatures of the corpus's expect-fail cases (unreadable files are
        reported by their own corpus items)."""
        from .corpus import CaseError, case_files, load_case

        for path in case_files(directory):
            try:
                case = load_case(path)
            except CaseError:
                continue
            if case.expected_failure is not None:
                self.known.add(case.signature)

    def scenario_for(self, case: Case) -> Scenario:
        """A case's scenario: its workload played by this run's driver, or the one it holds."""
        return self.scenario_of(case.workload if case.workload is not None else case.scenario)

    def screen(self, case: Case) -> list[str] | None:
        """The signatures the reference alone predicts for a case (the engine replaced by its
        prediction), where that says anything: a cheap filter before replaying on the engine."""
        if case.property != "no-same-size-realloc":
            return None
        scenario = self.scenario_for(case)
        p = self.predict(scenario)
        return [v.signature() for v in props.no_same_size_realloc(scenario, p, p)]

    def replay(self, case: Case) -> list[props.Violation]:
        """Check one saved case (no Hypothesis). A case with a workload is played again by
        this run's driver, so that it judges the current policy, not the recorded decisions."""
        return self.check(case.property, self.scenario_for(case))
