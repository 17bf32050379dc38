"""The fuzzing loop shared by the pytest plugin and the ``schedfuzz`` command.

A ``Fuzzer`` owns one engine (a target), the reference, the driver and the statistics. For a
property id it runs Hypothesis over that property's strategy, checks each generated case on
the engine and the reference, and returns the shrunk failing case, if any, as a ``Finding``.
"""

from __future__ import annotations

import importlib
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import FlakyFailure

from reference.predict import predict as reference_predict
from reference.versions import NEWEST, Rules, rules_for

from .. import properties as props
from ..cases.corpus import Case, component_of
from ..engine import Target, TargetError, Unsupported, load_target
from ..model.llama import LlamaWorkload
from ..model.llama_trace import LlamaTrace
from ..model.scenario import Scenario
from ..model.trace import Trace
from ..properties import derived
from ..properties.llama import LLAMA_CHECKS, compares_logits, cpu_only, llama_same_logits, out_of_memory, unmade_calls
from ..sim.driver import Driver, Workload, can_reuse, load_policy
from ..strategies import scenarios, workloads
from ..strategies.llama import FAMILIES, llama_workloads
from .stats import Stats

Predict = Callable[[Scenario], Trace]


@dataclass(frozen=True)
class Profile:
    """How much to fuzz: examples per property (``None``: as many as the time budget allows,
    shared evenly by the properties), graph scale, and whether to stop on time."""

    examples: int | None
    max_rpc: int
    max_steps: int
    budget: float | None  # seconds for the whole run, shared by the properties
    derandomize: bool
    max_layers: int = 4  # llama-like graphs: layers, and extra elementwise ops per layer
    max_extra_ops: int = 0
    blas: bool = False  # layouts with a BLAS backend (skipped where ggml has none)
    max_gpu: int = 1  # GPU-like devices (``strategies.gpus``) per layout
    llama_examples: int | None = 60  # llama.cpp workloads (tiny models: ~10 per second), each judged by every llama property; None: on time
    llama_layers: int = 3
    llama_calls: int = 24
    chunk: int = 25  # examples per Hypothesis run when fuzzing on time (each run a seed of its own)
    keep_going: bool = False  # campaign: go on after a finding, report every distinct signature
    size_oracle: bool = False  # matches-reference also checks ggml's own graph size (``Fuzzer.size_oracle_check``)


PROFILES: dict[str, Profile] = {
    "dev": Profile(examples=15, max_rpc=1, max_steps=5, budget=None, derandomize=False, llama_examples=40),
    # ci: deterministic (seed 0), and spends its budget: examples until each property's share
    # (llama.cpp workloads too: the llama.cpp properties' unit gets one share per property it judges)
    "ci": Profile(examples=None, max_rpc=2, max_steps=6, budget=240.0, derandomize=True, llama_examples=None),
    # up to 32 layers of up to 250 nodes: llama-sized graphs of several thousand nodes
    "nightly": Profile(
        examples=300, max_rpc=3, max_steps=10, budget=None, derandomize=False, max_layers=32, max_extra_ops=200, blas=True, max_gpu=2, keep_going=True, size_oracle=True,
        llama_examples=1000, llama_layers=6, llama_calls=48,
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
    llama_lib: str | None = None  # a llama.cpp build's library folder; default llama-cpp-python's
    policy: str | None = None  # module:callable
    rereserve: bool = True
    reference: str | None = None  # module:callable replacing reference.predict.predict
    keep_going: bool | None = None  # campaign mode; default: the profile's
    size_oracle: bool | None = None  # ggml's own graph size for matches-reference; default: the profile's
    database: Path | None = Path(".schedfuzz/examples")

    def resolved_profile(self) -> Profile:
        if self.profile not in PROFILES:
            raise ValueError(f"--schedfuzz-profile {self.profile!r}: choose one of {', '.join(PROFILES)}")
        return PROFILES[self.profile]

    def uses_size_oracle(self) -> bool:
        return self.size_oracle if self.size_oracle is not None else self.resolved_profile().size_oracle

    def keeps_going(self) -> bool:
        return self.keep_going if self.keep_going is not None else self.resolved_profile().keep_going

    def validate(self) -> None:
        """A ``ValueError`` naming the option (``--schedfuzz-*``) for any value out of range."""
        self.resolved_profile()
        if self.examples is not None and self.examples < 1:
            raise ValueError(f"--schedfuzz-examples {self.examples}: must be at least 1")
        if self.budget is not None and not self.budget > 0:
            raise ValueError(f"--schedfuzz-budget {self.budget:g}: must be a positive number of seconds")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise ValueError(f"--schedfuzz-seed {self.seed}: must be in 0 .. 2**32-1")
        if self.target is not None:
            _load(self.target, "--schedfuzz-target")


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)


def _load(spec: str, what: str) -> Any:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} {spec!r}: write it MODULE:NAME")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        hint = " (is its folder on PYTHONPATH?)" if isinstance(e, ModuleNotFoundError) else ""
        raise ValueError(f"{what} {spec!r}: {e}{hint}") from None


CONFIRM_TIMEOUT_FACTOR = 5  # a timeout's confirmation run waits this many times longer per step


@dataclass(frozen=True)
class Finding:
    property: str
    scenario: Scenario
    violation: props.Violation
    workload: Workload | None = None
    llama: LlamaWorkload | None = None

    def report(self) -> str:
        where = f"component: {component_of(self.property, self.violation.signature())}\n"
        if self.llama is not None:
            calls = "\n".join(f"  {i:2d}: {c.describe()}" for i, c in enumerate(self.llama.calls))
            return f"{self.violation}\n{where}{self.llama.describe()}\ncalls:\n{calls}"
        sc = self.scenario
        steps = "\n".join(f"  {i:2d}: {s.describe()}" for i, s in enumerate(sc.steps))
        graphs = "\n".join(f"  {n}: {g.label or ''} {g.n_ops} ops, {len(g.tensors) - g.n_ops} leafs" for n, g in sc.graphs)
        kinds = ", ".join(b.kind for b in sc.layout.backends)
        return f"{self.violation}\n{where}layout: [{kinds}]\ngraphs:\n{graphs}\nsteps:\n{steps}"

    def to_case(self, fuzzer: Fuzzer) -> Case:
        engine = dict(getattr(fuzzer._target, "engine", None) or {"name": fuzzer.config.target or "ggml"})
        v = self.violation
        if self.llama is not None:
            engine = dict(fuzzer.llama_target.engine) if fuzzer._llama is not None else {"name": "llama.cpp"}
        options = {"rereserve": False} if self.workload is not None and not fuzzer.config.rereserve else {}
        return Case(v.property, v.signature(), self.scenario, v.message, v.step, fuzzer.seed, engine, workload=self.workload, llama=self.llama,
                    options=options)


class ViolationFound(AssertionError):
    def __init__(self, scenario: Scenario | None, violation: props.Violation, workload: Workload | None, llama: LlamaWorkload | None = None) -> None:
        super().__init__(str(violation))
        self.scenario = scenario
        self.violation = violation
        self.workload = workload
        self.llama = llama


class Fuzzer:
    """Engine + reference + driver for one session (one pytest-xdist worker)."""

    def __init__(self, config: FuzzConfig) -> None:
        config.validate()
        self.config = config
        self.profile = config.resolved_profile()
        self.seed = config.seed if config.seed is not None else (0 if self.profile.derandomize else new_seed())
        self.policy = load_policy(config.policy) if config.policy else can_reuse
        self.driver = Driver(self.policy, config.rereserve)
        # a user's reference is theirs to version; the built-in one follows the loaded ggml
        self.predict: Predict = _load(config.reference, "--schedfuzz-reference") if config.reference else self._reference
        if config.target is None:
            from ..ggml.lib import resolve_lib

            resolve_lib(config.lib)  # a LibError (a ValueError) now, not at the first case
        if config.llama_lib is not None:
            from ..llama.target import resolve_lib_dir

            try:
                resolve_lib_dir(config.llama_lib)
            except TargetError as e:
                raise ValueError(f"--schedfuzz-llama-lib {config.llama_lib}: {e}") from None
        self._rules: Rules | None = None
        self.rules_note: str | None = None
        self.stats = Stats()
        self.known_cases: list[Case] = []  # the corpus's expected failures (learn_known_bugs)
        self._known: dict[bool, set[str]] = {}  # llama or not -> signatures expected on its version
        self.campaign_known: set[str] = set()  # signatures found by this campaign (keep-going)
        self.started = time.monotonic()
        self.first_failure: float | None = None  # seconds from the start of fuzz() to the first violation
        self._target: Target | None = None
        self._llama: Any = None
        self._oracle: Any = None  # GgmlTarget under GGML_SCHED_DEBUG_REALLOC=2 (size_oracle_check)
        self.llama_judged: tuple[str, ...] = props.LLAMA_PROPERTY_IDS  # what LLAMA_GROUP judges (the selected ones)
        self.interrupted = False  # Ctrl-C was pressed while fuzzing: the caller saves what fuzz() returned, then stops

    @property
    def llama_target(self) -> Any:
        """The real llama.cpp (``llama.target.LlamaTarget``), started on first use."""
        if self._llama is None:
            from ..llama.target import LlamaTarget

            self._llama = LlamaTarget(lib_dir=self.config.llama_lib)
        return self._llama

    @property
    def target(self) -> Target:
        if self._target is None:
            if self.config.target:
                self._target = load_target(self.config.target)
            else:
                from ..ggml.target import GgmlTarget

                self._target = GgmlTarget(lib=self.config.lib)
        return self._target

    def engine_info(self) -> dict[str, str]:
        """The engine's description (starting it if need be): for the built-in ggml its library
        path, ``ggml_version()`` and bindings check."""
        target = self.target
        start = getattr(target, "start", None)
        return dict(start() if callable(start) else getattr(target, "engine", None) or {"name": self.config.target or "ggml"})

    @property
    def rules(self) -> Rules:
        """The reference's rules for the loaded ggml's version (``reference.versions``)."""
        if self._rules is None:
            self._rules, self.rules_note = rules_for(self.ggml_version(llama=False) or NEWEST.version)
        return self._rules

    def _reference(self, scenario: Scenario) -> Trace:
        return reference_predict(scenario, rules=self.rules)

    def size_oracle_check(self, scenario: Scenario, prediction: Trace) -> list[props.Violation]:
        """ggml's own figures against the reference's: a second engine runs the scenario under
        ``GGML_SCHED_DEBUG_REALLOC=2``, where ggml aborts at its first reallocation through the
        scheduler and prints that step's ``debug_graph_size`` and the node and leaf counts of its
        graph copy. The engine's records derive those from what ggml shows (splits, inputs); this
        observes them, so a scheduler that builds another graph copy cannot hide behind the
        rule both sides share."""
        if self._oracle is None:
            from ..ggml.target import GgmlTarget

            self._oracle = GgmlTarget(lib=self.config.lib, debug_realloc=2)
        abort = self._oracle.run(scenario).abort
        m = re.search(r"graph size = (\d+), nodes = (\d+), leafs = (\d+)", abort.message) if abort else None
        if abort is None or m is None or abort.step >= len(prediction.records):
            return []
        ggml = tuple(int(x) for x in m.groups())
        p = prediction.records[abort.step]
        if ggml == (p.graph_size, p.n_nodes, p.n_leafs):
            return []
        return [props.Violation("matches-reference", abort.step,
                                f"{scenario.steps[abort.step].describe()}: ggml's own figures at its first reallocation: graph size {ggml[0]}, "
                                f"{ggml[1]} nodes, {ggml[2]} leafs; the reference predicts {p.graph_size}, {p.n_nodes}, {p.n_leafs}",
                                {"what": "ggml-graph-size"})]

    def close(self) -> None:
        if self._oracle is not None:
            self._oracle.close()
            self._oracle = None
        if self._target is not None:
            self._target.close()
            self._target = None
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    def out_of_budget(self) -> bool:
        budget = self.config.budget if self.config.budget is not None else self.profile.budget
        return budget is not None and time.monotonic() - self.started > budget

    # ----------------------------------------------------------------- one case

    def run_engine(self, scenario: Scenario) -> Trace:
        """The engine's trace, with the figures ggml does not tell derived (``properties.derived``)."""
        trace = derived.graph_trace(self.target.run(scenario))
        self.stats.add_trace(trace)
        return trace

    def run_llama(self, workload: LlamaWorkload, logits: bool = False) -> LlamaTrace:
        """llama.cpp's trace of ``workload``, its graph sizes derived (``properties.derived``)."""
        return derived.llama_trace(self.llama_target.run(workload, logits))

    def check_llama(self, prop: str, workload: LlamaWorkload) -> list[props.Violation]:
        """Every violation of ``prop`` (``LLAMA_GROUP``: of every property in ``llama_judged``)
        on one run of a workload on llama.cpp. An abort is reported by llama-no-abort only:
        llama.cpp aborts on some configurations at once, and that one bug must not stop the
        search for reallocations. A call the harness could not make is a ``TargetError``, never
        a pass (``unmade_calls``)."""
        judged = self.llama_judged if prop == props.LLAMA_GROUP else (prop,)
        logits = "llama-same-logits" in judged and compares_logits(workload)
        trace = self.llama_confirmed(workload, self.run_llama(workload, logits), logits)
        self.stats.add_llama(workload, trace)
        refused = out_of_memory(workload, trace)
        if refused:
            self.stats.llama_out_of_memory += 1
            raise Unsupported(f"llama.cpp could not make the context on devices this full: {refused}")
        unmade = unmade_calls(workload, trace)
        if unmade:
            raise TargetError("harness error (not llama.cpp): " + "; ".join(unmade) + f"\nworkload: {workload.describe()}")
        found = [v for p in judged if p in LLAMA_CHECKS for v in LLAMA_CHECKS[p](workload, trace)]
        if logits and trace.abort is None:
            cpu = self.run_llama(cpu_only(workload), True)
            self.stats.llama_logits_compared += 1
            self.stats.llama_logit_rows += sum(len(c.logits) for c in trace.calls)
            found += llama_same_logits(workload, trace, cpu)
        return found

    def llama_confirmed(self, workload: LlamaWorkload, trace: LlamaTrace, logits: bool = False) -> LlamaTrace:
        """As ``confirmed``, for llama.cpp: a crash or a timeout counts only if it comes back on
        a fresh worker (the target starts one after every abort), a timeout with five times the
        call timeout; one that does not is counted as unconfirmed and the fresh run is judged."""
        if trace.abort is None or trace.abort.kind not in ("crash", "timeout"):
            return trace
        target = self.llama_target
        usual = target.call_timeout
        if trace.abort.kind == "timeout":
            target.call_timeout = usual * CONFIRM_TIMEOUT_FACTOR
        try:
            again = self.run_llama(workload, logits)
        finally:
            target.call_timeout = usual
        if again.abort is None or again.abort.kind != trace.abort.kind:
            self.stats.unconfirmed += 1
        return again

    def confirmed(self, scenario: Scenario, trace: Trace) -> Trace:
        """A crash (a signal, no assert) or a timeout counts only if it happens again on a fresh
        worker: a worker that ran many scenarios can die of what an earlier one left in its
        memory, and a machine loaded by other work (pytest-xdist) can stall a step past its
        timeout. One that does not come back is counted (``unconfirmed crashes``) and its
        scenario kept in ``.schedfuzz/unconfirmed/`` for a look, and the fresh run's trace is
        judged instead. A timeout is run again with five times the step timeout: a step that
        a loaded machine only slowed finishes then, a hang does not."""
        if trace.abort is None or trace.abort.kind not in ("crash", "timeout") or not hasattr(self.target, "close"):
            return trace
        self.target.close()  # the next run starts a fresh worker and fresh servers
        patient = trace.abort.kind == "timeout" and hasattr(self.target, "step_timeout")
        if patient:
            usual = self.target.step_timeout  # type: ignore[attr-defined]
            self.target.step_timeout = usual * CONFIRM_TIMEOUT_FACTOR  # type: ignore[attr-defined]
        try:
            again = self.run_engine(scenario)
        finally:
            if patient:
                self.target.step_timeout = usual  # type: ignore[attr-defined]
        if again.abort is not None and again.abort.kind == trace.abort.kind:
            return again
        self.stats.unconfirmed += 1
        if self.config.database is not None:
            from ..cases.corpus import save_case

            first = trace.abort.message.strip().splitlines()[0] if trace.abort.message.strip() else "crash"
            try:
                save_case(Path(self.config.database).parent / "unconfirmed",
                          Case("no-abort", f"unconfirmed {trace.abort.kind}", scenario, trace.abort.message[-3000:], trace.abort.step, self.seed,
                               dict(getattr(self.target, "engine", {}) or {}), {"fail": f"did not come back on a fresh worker: {first}"}))
            except OSError:
                pass
        return again

    def check(self, prop: str, scenario: Scenario) -> list[props.Violation]:
        """Every violation of ``prop`` on one case, and of no-abort whenever the engine ran:
        ``prop`` is judged on what its ``needs`` say (``properties.PROPERTIES``). An engine run
        that aborted is not compared with a fresh one (its aborts are the finding)."""
        p = props.PROPERTIES[prop]
        if props.ENGINE not in p.needs:
            return p.judge(scenario, props.Observed())
        trace = self.confirmed(scenario, self.run_engine(scenario))
        prediction = self.predict(scenario) if props.REFERENCE in p.needs else Trace(())
        found = props.no_abort(scenario, trace, prediction)
        if prop != "no-abort" and not (found and props.FRESH in p.needs):
            fresh = self.run_engine(props.fresh_variant(scenario)) if props.FRESH in p.needs else Trace(())
            found += p.judge(scenario, props.Observed(trace, prediction, fresh))
        if prop == "matches-reference" and not found and self.config.uses_size_oracle() and self.config.target is None:
            found += self.size_oracle_check(scenario, prediction)
        return self.causes_told_apart(scenario, prediction, found)

    def causes_told_apart(self, scenario: Scenario, prediction: Trace, found: list[props.Violation]) -> list[props.Violation]:
        """Wrong values, or aborts, in a compute step: run the scenario again without what may
        cause them, and sign what goes away by that cause, so that its varying symptoms make
        one signature and other bugs keep theirs:

        * every device synchronous: a race (``properties.as_race``);
        * no view assigned a backend: a forced view (``properties.as_forced_view``)."""
        def unexplained(v: props.Violation, kinds: tuple[str, ...]) -> bool:
            explained = "race" in v.facts or "forced" in v.facts
            return v.property in kinds and not explained and scenario.steps[min(v.step, len(scenario.steps) - 1)].kind == "compute"

        causes = []
        if any(b.asynchronous for b in scenario.layout.backends):
            causes.append((("same-values", "no-abort"), props.synchronous_variant, props.as_race))
        if props.forced_views(scenario):
            causes.append((("same-values", "no-abort"), props.unforced_views_variant, props.as_forced_view))
        for kinds, variant_of, resign in causes:
            if not any(unexplained(v, kinds) for v in found):
                continue
            variant = variant_of(scenario)
            trace = self.run_engine(variant)
            still = {v.property for v in props.no_abort(variant, trace, prediction) + props.same_values(variant, trace, prediction)}
            found = [resign(v, scenario) if unexplained(v, kinds) and v.property not in still else v for v in found]
        return found

    # ----------------------------------------------------------------- a property

    def gpu_device(self) -> str:
        """``available``, or why the built-in engine's ggml cannot have GPU-like devices."""
        if self.config.target is not None:
            return "available"
        return self.engine_info().get("gpu_device", "available")

    def strategy(self, prop: str) -> st.SearchStrategy[Workload | Scenario | LlamaWorkload]:
        """What draws ``prop``'s examples: server-like workloads (run on llama.cpp) for the llama
        properties, else what the property's registry entry says it ``draws``, sized by the
        profile. Layouts have GPU-like devices only where this ggml can."""
        p = self.profile
        if props.is_llama(prop):
            return llama_workloads(p.llama_layers, min(2, p.max_rpc), p.llama_calls, families=FAMILIES)
        if self.gpu_device() != "available":
            p = replace(p, max_gpu=0)
        d = props.PROPERTIES[prop].draws
        drawn = []
        if d.kind in ("scenarios", "both"):
            drawn.append(scenarios(p.max_rpc, p.max_steps, True, p.max_layers, p.max_extra_ops, p.blas, p.max_gpu))
        if d.kind in ("workloads", "both"):
            drawn.append(workloads(max_ubatches=d.max_ubatches, min_reconfigures=d.min_reconfigures, max_layers=max(2, p.max_layers // 4),
                                   max_extra_ops=p.max_extra_ops, max_gpu=p.max_gpu))
        return drawn[0] if len(drawn) == 1 else st.one_of(*drawn)

    def scenario_of(self, case: Workload | Scenario) -> Scenario:
        return self.driver.scenario(case) if isinstance(case, Workload) else case

    def examples_for(self, prop: str, examples: int | None = None) -> int | None:
        """Examples to run on ``prop``: given, configured, or the profile's (``None``: on time)."""
        if examples or self.config.examples:
            return examples or self.config.examples
        return self.profile.llama_examples if props.is_llama(prop) else self.profile.examples

    def campaign(self, prop: str, shard: int = 0, shards: int = 1, seconds: float | None = None,
                 on_finding: Callable[[Finding], None] = lambda f: None) -> list[Finding]:
        """Keep going after a finding: record it (``on_finding``), count its signature as known,
        and fuzz on (round ``r`` under seeds offset by ``r``), until the property's examples or
        time are spent; every distinct finding, in order."""
        findings: list[Finding] = []
        deadline = time.monotonic() + seconds if seconds is not None else None
        for rnd in range(10_000):
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or self.out_of_budget():
                break
            finding = self.fuzz(prop, shard=shard, shards=shards, seconds=left, round_=rnd)
            if finding is None:
                break
            findings.append(finding)
            self.campaign_known.add(finding.violation.signature())
            on_finding(finding)
            if self.interrupted:
                break
        return findings

    def fuzz(self, prop: str, examples: int | None = None, shard: int = 0, shards: int = 1, seconds: float | None = None,
             round_: int = 0) -> Finding | None:
        """Run Hypothesis on one property; the shrunk failing case, or None. With ``shards``
        (one per pytest-xdist worker) this runs shard ``shard``: its share of the examples,
        under seed ``seed + shard``. With no example count (the ci profile) it runs chunks of
        ``profile.chunk`` examples, chunk ``k`` under seed ``seed + k*shards + shard``, until
        ``seconds`` (this property's share of the budget) or the budget is spent."""
        n = self.examples_for(prop, examples)
        start = time.monotonic()
        self.first_failure = None
        if n is not None:
            return self._fuzz_run(prop, -(-n // shards), self.seed + shard + round_ * 1_000_003, start, None)
        if seconds is None and self.config.budget is None and self.profile.budget is None:
            raise ValueError(f"profile {self.config.profile!r} fuzzes on time and needs a budget")
        deadline = start + seconds if seconds is not None else None
        k = 0
        while not self.out_of_budget() and (deadline is None or time.monotonic() < deadline):
            finding = self._fuzz_run(prop, self.profile.chunk, self.seed + k * shards + shard + round_ * 1_000_003, start, deadline)
            if finding is not None:
                return finding
            k += 1
        return None

    def _fuzz_run(self, prop: str, n: int, seed: int, start: float, deadline: float | None) -> Finding | None:
        db = DirectoryBasedExampleDatabase(str(self.config.database)) if self.config.database else None
        # shrink towards the first failure's signature only, so that a case keeps its finding
        target: list[str] = []

        @hypothesis_seed(seed)
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
        def run(case: Workload | Scenario | LlamaWorkload) -> None:
            try:
                one(case)
            except KeyboardInterrupt:
                self.interrupted = True
                raise

        def one(case: Workload | Scenario | LlamaWorkload) -> None:
            # out of time, skip; but never once a failure is being confirmed and shrunk (a skip
            # would make Hypothesis's replay of it pass: a FlakyFailure)
            if not target and (self.out_of_budget() or (deadline is not None and time.monotonic() > deadline)):
                return
            if self.interrupted:  # Ctrl-C: Hypothesis stopped shrinking and replays; do not run the engine again
                raise KeyboardInterrupt
            self.stats.examples += 1
            scenario = None if isinstance(case, LlamaWorkload) else self.scenario_of(case)
            if scenario is not None:
                self.stats.add_features(scenario)
            try:
                found = self.check(prop, scenario) if scenario is not None else self.check_llama(prop, case)  # type: ignore[arg-type]
            except Unsupported:
                reject()  # the case tests nothing here (counted in the stats where it is the engine's answer): not a pass

            # a known engine bug (an expect-fail case of the corpus) found again is not news
            known_set = self.known(props.is_llama(prop)) | self.campaign_known
            known = [v for v in found if v.signature() in known_set]
            self.stats.known += len(known)
            for v in known:
                self.stats.seen_again[v.signature()] = self.stats.seen_again.get(v.signature(), 0) + 1
            found = [v for v in found if v.signature() not in known_set]
            if found and self.first_failure is None:
                self.first_failure = time.monotonic() - start
            if found and not target:
                print(f"schedfuzz: {prop}: found {found[0].signature()}; shrinking it (Ctrl-C stops and saves the smallest so far)",
                      file=sys.stderr, flush=True)
            if found and (not target or found[0].signature() == target[0]):
                target[:] = [found[0].signature()]
                best[:] = [ViolationFound(scenario, found[0], case if isinstance(case, Workload) else None, case if isinstance(case, LlamaWorkload) else None)]
                raise best[0]

        best: list[ViolationFound] = []  # the smallest failing case so far (Hypothesis shrinks in order)

        def interrupted() -> None:
            # Ctrl-C: stop at once (Hypothesis would stop shrinking, replay the case, and the
            # session go on to the next property); the smallest case so far is still a finding,
            # returned to be saved, and ``self.interrupted`` tells the caller to stop after it
            self.interrupted = True
            if best:
                raise best[0] from None
            raise KeyboardInterrupt

        try:
            try:
                run()
            except FlakyFailure as flaky:  # found once, not again on Hypothesis's replay: still a finding
                found = [x for x in flaky.exceptions if isinstance(x, ViolationFound)]
                if not found:
                    raise
                raise found[0] from None
            except KeyboardInterrupt:
                interrupted()
        except ViolationFound as e:
            self.stats.findings[e.violation.property] = self.stats.findings.get(e.violation.property, 0) + 1
            sig = e.violation.signature()
            self.stats.signatures[sig] = self.stats.signatures.get(sig, 0) + 1
            return Finding(e.violation.property, e.scenario, e.violation, e.workload, e.llama)  # type: ignore[arg-type]
        return None

    def learn_known_bugs(self, directory: Path) -> None:
        """Remember the corpus's expect-fail cases (unreadable files are reported by their own
        corpus items); which of them are known bugs depends on the engine's version. A folder
        learnt twice (the starter corpus is also the run's corpus) counts once."""
        from ..cases.corpus import CaseError, case_files, component, load_case

        for path in case_files(directory):
            if any(c.path is not None and c.path.resolve() == path.resolve() for c in self.known_cases):
                continue
            try:
                case = load_case(path)
            except CaseError:
                continue
            if case.expected_failure is not None:
                self.known_cases.append(case)
                self.stats.components.setdefault(case.signature, component(case))
        self._known.clear()

    def ggml_version(self, llama: bool) -> str | None:
        """The ggml version of the engine that runs llama.cpp workloads or graph scenarios."""
        if llama:
            return self.llama_target.start().get("ggml_version")
        return self.engine_info().get("ggml_version") if self.config.target is None else None

    def known(self, llama: bool) -> set[str]:
        """Signatures of the known engine bugs expected on this engine's version (not reported
        again by fuzzing)."""
        if llama not in self._known:
            cases = [c for c in self.known_cases if (c.llama is not None) == llama]
            version = self.ggml_version(llama) if cases else None
            self._known[llama] = {c.signature for c in cases if c.expected_failure_on(version) is not None}
        return self._known[llama]

    def scenario_for(self, case: Case) -> Scenario:
        """A case's scenario: its workload played by this run's driver (in the re-reservation
        mode the case was found in, where it says), or the one it holds."""
        if case.workload is not None and "rereserve" in case.options:
            return Driver(self.policy, bool(case.options["rereserve"])).scenario(case.workload)
        return self.scenario_of(case.workload if case.workload is not None else case.scenario)

    def screen(self, case: Case) -> list[str] | None:
        """The signatures the reference alone predicts for a case (the engine replaced by its
        prediction), where that says anything: a cheap filter before replaying on the engine."""
        if case.property != "no-same-size-realloc" or case.scenario is None:
            return None
        scenario = self.scenario_for(case)
        p = self.predict(scenario)
        return [v.signature() for v in props.no_same_size_realloc(scenario, p, p)]

    def replay(self, case: Case) -> list[props.Violation]:
        """Check one saved case (no Hypothesis). A case with a workload is played again by
        this run's driver, so that it judges the current policy, not the recorded decisions."""
        if case.llama is not None:
            try:
                return self.check_llama(case.property, case.llama)
            except Unsupported:  # a shrunk candidate whose context no longer fits its devices: it shows nothing
                return []
        return self.check(case.property, self.scenario_for(case))
