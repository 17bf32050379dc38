"""The fuzzing loop shared by the pytest plugin and the ``schedfuzz`` command.

A ``Fuzzer`` holds the engines under test (``engines.Engines``), the reference, the driver, the
known bugs (``known.KnownBugs``) and the statistics. For a property id it runs Hypothesis over
that property's strategy, checks each generated case on the engine and the reference (signing
causes by reruns, ``causes``), and returns the shrunk failing case, if any, as a ``Finding``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import FlakyFailure

from reference.graph import CGraph
from reference.predict import predict as reference_predict
from reference.versions import NEWEST, Rules, rules_for

from .. import properties as props
from ..cases.capture import CaptureError, capture, preparer
from ..cases.corpus import Case, component_of
from ..cases.verdict import RACE
from ..engine import TargetError, Unsupported, gc_paused
from ..model.llama import MAX_GPU, OPTIONAL_PARAMS, LlamaWorkload
from ..model.llama_trace import LlamaTrace
from ..model.scenario import Scenario
from ..model.trace import Trace
from ..properties.captured import llama_matches_reference
from ..properties.llama import (LLAMA_CHECKS, compares_logits, cpu_only, cpu_run_violations, llama_same_logits, logit_pairs, out_of_memory,
                                unmade_calls)
from ..sim.driver import Driver, Workload, can_reuse, load_policy
from ..strategies import scenarios, workloads
from ..strategies.captured import captured_scenarios, captured_workloads
from ..strategies.llama import FAMILIES, llama_workloads
from . import observed
from .captures import captured_pool
from .causes import causes_told_apart, switches_told_apart
from .engines import Deferred, Engines
from .known import KnownBugs
from .profiles import FuzzConfig, load_spec, new_seed
from .stats import Stats

# ggml 0.15.3's asynchronous race shows in about half the replays on an idle machine, in one of
# six or seven under load: 30 replays miss it about once in 100 then (the verdict says so, ``unshown``)
RACE_TRIES = 30

Predict = Callable[[Scenario], Trace]


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
        engines = fuzzer.engines
        engine = dict(getattr(engines._target, "engine", None) or {"name": fuzzer.config.target or "ggml"})
        v = self.violation
        if self.llama is not None:
            engine = dict(engines.llama_target.engine) if engines._llama is not None else {"name": "llama.cpp"}
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
        self.predict: Predict = load_spec(config.reference, "--schedfuzz-reference") if config.reference else self._reference
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
        self.engines = Engines(config, self.stats, self.seed)
        self.known = KnownBugs(self.stats, self.engines.ggml_version)
        self.started = time.monotonic()
        self.first_failure: float | None = None  # seconds from the start of fuzz() to the first violation
        self.llama_judged: tuple[str, ...] = props.LLAMA_PROPERTY_IDS  # what LLAMA_GROUP judges (the selected ones)
        self.interrupted = False  # Ctrl-C was pressed while fuzzing: the caller saves what fuzz() returned, then stops
        self._captured: tuple[Scenario, ...] | None = None  # llama.cpp's graphs (``captured_pool``), made on first use
        # whether check_llama confirms a new same-size finding with ggml's own check: not while
        # Hypothesis shrinks one (each candidate would cost a second llama.cpp run; the shrunk one is confirmed)
        self.confirm_llama = True

    @property
    def rules(self) -> Rules:
        """The reference's rules for the loaded ggml's version (``reference.versions``)."""
        if self._rules is None:
            self._rules, self.rules_note = rules_for(self.engines.ggml_version(llama=False) or NEWEST.version)
        return self._rules

    def _reference(self, scenario: Scenario) -> Trace:
        return reference_predict(scenario, rules=self.rules)

    def close(self) -> None:
        """Stop every engine (workers, RPC servers); a Ctrl-C meanwhile is noted in
        ``interrupted``, not raised halfway, so that nothing is left running."""
        with self.ctrl_c_noted():
            self.engines.close()

    def out_of_budget(self) -> bool:
        budget = self.config.budget if self.config.budget is not None else self.profile.budget
        return budget is not None and time.monotonic() - self.started > budget

    # ----------------------------------------------------------------- one case

    def check_llama(self, prop: str, workload: LlamaWorkload) -> list[props.Violation]:
        """Every violation of ``prop`` (``LLAMA_GROUP``: of every property in ``llama_judged``)
        on one run of a workload on llama.cpp. An abort is reported by llama-no-abort only:
        llama.cpp aborts on some configurations at once, and that one bug must not stop the
        search for reallocations. A call the harness could not make is a ``TargetError``, never
        a pass (``unmade_calls``)."""
        judged = self.llama_judged if prop == props.LLAMA_GROUP else (prop,)
        logits = "llama-same-logits" in judged and compares_logits(workload)
        capture = "llama-matches-reference" in judged
        # the captured graphs are made into specs and the reference's graphs as they come, while
        # llama.cpp goes on with the workload
        prepare = preparer(workload, CGraph.of if not self.config.reference else lambda spec: None) if capture else None
        trace = self.engines.llama_confirmed(workload, self.engines.run_llama(workload, logits, capture, on_graph=prepare), logits, capture, prepare)
        self.stats.add_llama(workload, trace)
        refused = out_of_memory(workload, trace)
        if refused:
            # rightly refused on devices this full; the scheduler calls llama.cpp made before it
            # failed are judged all the same (one of them may be the cause); none made: not judged
            self.stats.llama_out_of_memory += 1
            if not trace.sched_calls():
                raise Unsupported(f"llama.cpp could not make the context or load an adapter on devices this full: {refused}")
            self.stats.llama_out_of_memory_judged += 1
            logits = False
        unmade = [] if refused else unmade_calls(workload, trace)
        if unmade:
            raise TargetError("harness error (not llama.cpp): " + "; ".join(unmade) + f"\nworkload: {workload.describe()}")
        found = [v for p in judged if p in LLAMA_CHECKS for v in LLAMA_CHECKS[p](workload, trace)]
        known = self.known.signatures(True)
        found, reruns = switches_told_apart(workload, found, self.engines.run_llama, known)
        self.stats.llama_switch_reruns += reruns
        if self.confirm_llama and trace.engine.get("realloc_callback") != "observed" and any(v.property == "llama-no-same-size-realloc" and v.signature() not in known for v in found):
            # a new same-size finding is reported once ggml's own check confirms it (``observed``)
            extra = observed.confirm_llama_same_size(workload, trace, lambda w: self.engines.llama_debug_realloc().run(w))
            self.stats.ggml_same_size_confirmed += not extra
            if extra:
                self.stats.ggml_figures_disagree += 1
                found = extra + [v for v in found if v.property != "llama-no-same-size-realloc"]
        # llama-matches-reference judges the captured graphs while llama.cpp runs the workload
        # again on the CPU alone (llama-same-logits), where it does
        reference = Deferred(lambda: self.against_reference(workload, trace)) if capture else None
        if logits and trace.abort is None:
            cpu_w = cpu_only(workload, trace)
            cpu = self.engines.cpu_run(cpu_w, meanwhile=reference)
            found += reference.result() if reference is not None else []
            unmade = unmade_calls(cpu_w, cpu)
            if unmade:
                raise TargetError("harness error (not llama.cpp): the CPU-only run: " + "; ".join(unmade) + f"\nworkload: {cpu_w.describe()}")
            found += cpu_run_violations(workload, trace, cpu_w, cpu)
            rows = sum(1 for _ in logit_pairs(trace, cpu))  # compared, not attempted
            self.stats.llama_logits_compared += rows > 0
            self.stats.llama_logit_rows += rows
            found += llama_same_logits(workload, trace, cpu)
        elif reference is not None:
            found += reference.result()
        return found

    def against_reference(self, workload: LlamaWorkload, trace: LlamaTrace) -> list[props.Violation]:
        """llama-matches-reference: the workload's graphs, captured, predicted by the reference with
        the rules of llama.cpp's ggml. A workload whose graphs no scenario can say is counted
        (``llama_not_captured``, by cause), not judged."""
        rules, _ = rules_for(trace.engine.get("ggml_version"))
        found: list[props.Violation] = []
        for context in (0, 1) if workload.draft else (0,):  # the draft context's graphs are a scenario of their own
            try:
                captured = capture(workload, trace, context)
            except CaptureError as e:
                self.stats.llama_not_captured[e.kind] = self.stats.llama_not_captured.get(e.kind, 0) + 1
                continue
            self.stats.llama_captured += 1
            self.stats.llama_captured_nodes += sum(len(s.node_backends) for s in captured.steps)
            for op, n in captured.ops.items():
                self.stats.captured_ops[op] = self.stats.captured_ops.get(op, 0) + n
            found += llama_matches_reference(workload, captured, self.reference_for(rules)(captured.scenario))
            if found:
                break
        return found

    def reference_for(self, rules: Rules) -> Predict:
        """The reference of ``rules``' version (a user's ``--schedfuzz-reference`` replaces it)."""
        if self.config.reference:
            return self.predict
        return lambda scenario: reference_predict(scenario, rules=rules)

    def check(self, prop: str, scenario: Scenario) -> list[props.Violation]:
        """Every violation of ``prop`` on one case, and of no-abort whenever the engine ran:
        ``prop`` is judged on what its ``needs`` say (``properties.PROPERTIES``). An engine run
        that aborted is not compared with a fresh one (its aborts are the finding)."""
        p = props.PROPERTIES[prop]
        if props.ENGINE not in p.needs:
            return p.judge(scenario, props.Observed())
        values = props.VALUES in p.needs  # every run of this check alike: the values only where judged

        def run(sc: Scenario, meanwhile: Deferred | None = None) -> Trace:
            return self.engines.run(sc, meanwhile, values)

        reference = Deferred(lambda: self.predict(scenario)) if props.REFERENCE in p.needs else None
        trace = self.engines.confirmed(scenario, run(scenario, reference), run)
        prediction = reference.result() if reference is not None else Trace(())
        found = props.no_abort(scenario, trace, prediction)
        if prop != "no-abort" and not (found and props.FRESH in p.needs):
            fresh = run(props.fresh_variant(scenario)) if props.FRESH in p.needs else Trace(())
            found += p.judge(scenario, props.Observed(trace, prediction, fresh))
        if self.config.target is None:
            found = self.with_ggml_figures(scenario, trace, prediction, found)
        return causes_told_apart(scenario, prediction, found, run)

    def with_ggml_figures(self, scenario: Scenario, trace: Trace, prediction: Trace, found: list[props.Violation]) -> list[props.Violation]:
        """``found`` checked against ggml's own figures (``observed``): a new same-size finding is
        reported only once ggml's own check (``GGML_SCHED_DEBUG_REALLOC=1``) confirms it (on a
        ggml without the realloc callback, which then says it itself); a new graph-size finding and
        the run's sample are compared with ggml's figures under ``=2``. A disagreement comes first."""
        known = self.known.signatures(False)
        new = [v for v in found if v.signature() not in known]
        callback = trace.engine.get("realloc_callback") == "observed"  # as the llama.cpp check reads it
        sample = observed.sampled(scenario, 1 if self.config.uses_size_oracle() else observed.SAMPLE_EVERY)
        to_confirm = any(v.property == "no-same-size-realloc" for v in new)
        if not callback and (sample or to_confirm):
            # the derived same/changed decisions against ggml's own check: a new same-size finding is
            # reported only once ggml confirms it, and the sample checks the decisions both ways
            extra, checked = observed.check_same_size_decisions(scenario, trace, partial(self.engines.debug_realloc(1).run, values=False))
            self.stats.ggml_decisions[checked] = self.stats.ggml_decisions.get(checked, 0) + 1
            self.stats.ggml_same_size_confirmed += to_confirm and checked == "same"
            if extra:
                self.stats.ggml_figures_disagree += 1
                found = extra + [v for v in found if v.property != "no-same-size-realloc"]
        size_finding = any(v.property == "matches-reference" and v.facts.get("what") in ("graph_size", "graph-copy") for v in new)
        if size_finding or sample:
            extra, compared = observed.compare_first(scenario, trace, prediction, partial(self.engines.debug_realloc(2).run, values=False))
            self.stats.ggml_figures_replays += 1
            self.stats.ggml_figures_compared += compared
            self.stats.ggml_figures_disagree += bool(extra)
            found = extra + found
        return found

    # ----------------------------------------------------------------- a property

    def strategy(self, prop: str) -> st.SearchStrategy[Workload | Scenario | LlamaWorkload]:
        """What draws ``prop``'s examples: server-like workloads (run on llama.cpp) for the llama
        properties, else what the property's registry entry says it ``draws``, sized by the
        profile. Layouts have GPU-like devices only where this ggml can."""
        p = self.profile
        if props.is_llama(prop):
            info = self.engines.llama_target.start()
            gpus = MAX_GPU if info.get("gpu_device", "available") == "available" else 0
            # call kinds and context parameters this build lacks (the engine's word; one that does not say has none of the parameters)
            absent = frozenset(k for k in info.get("absent_calls", "").split(",") if k) | \
                frozenset(k for k in info.get("absent_params", ",".join(OPTIONAL_PARAMS)).split(",") if k)
            return llama_workloads(p.llama_layers, min(2, p.max_rpc), p.llama_calls, max_gpu=gpus, families=FAMILIES, absent=absent)
        if self.engines.gpu_device() != "available":
            p = replace(p, max_gpu=0)
        d = props.PROPERTIES[prop].draws
        drawn: list[st.SearchStrategy[Workload | Scenario | LlamaWorkload]] = []
        if d.captured and self.captured_pool():
            pool = self.captured_pool()
            drawn.append(captured_scenarios(pool, p.max_gpu, p.max_steps, self.policy) if d.captured == "scenarios"
                         else captured_workloads(pool, p.max_gpu, d.max_ubatches, self.policy))
        if d.kind in ("scenarios", "both"):
            drawn.append(scenarios(p.max_rpc, p.max_steps, True, p.max_layers, p.max_extra_ops, p.blas, p.max_gpu))
        if d.kind in ("workloads", "both"):
            drawn.append(workloads(max_ubatches=d.max_ubatches, min_reconfigures=d.min_reconfigures, max_layers=max(2, p.max_layers // 4),
                                   max_extra_ops=p.max_extra_ops, max_gpu=p.max_gpu))
        return drawn[0] if len(drawn) == 1 else st.one_of(*drawn)

    def captured_pool(self) -> tuple[Scenario, ...]:
        """llama.cpp's graphs, captured once per session (``captures``); empty, with the reason in
        the statistics, where llama.cpp cannot run, this engine is not ggml, or its ggml is not the
        version llama.cpp's graphs were built by (ops differ between versions: 0.15.3's ``ggml_clamp``
        returns a view, 0.25.3's a new tensor)."""
        if self._captured is None:
            try:
                versions = (self.engines.ggml_version(False), self.engines.ggml_version(True)) if self.config.target is None else None
            except TargetError as e:
                versions, why = None, f"llama.cpp cannot run: {str(e).splitlines()[0]}"
            else:
                why = "the engine under test is not ggml" if versions is None else ""
            if versions is not None and versions[0] != versions[1]:
                versions, why = None, f"llama.cpp's graphs are ggml {versions[1]}'s, the engine is ggml {versions[0]}"
            if versions is None:
                self._captured = ()
            else:
                families, why = captured_pool(lambda w: self.engines.run_llama(w, capture=True))
                self._captured = tuple(families.values())
                for name in families:  # "dense, n_ubatch 8, n_ctx 128": scenarios per model family
                    kind = name.split(",")[0]
                    self.stats.captured_families[kind] = self.stats.captured_families.get(kind, 0) + 1
            if why:
                self.stats.captured_missing[why[:300]] = 1
        return self._captured

    def scenario_of(self, case: Workload | Scenario) -> Scenario:
        return self.driver.scenario(case) if isinstance(case, Workload) else case

    def examples_for(self, prop: str, examples: int | None = None) -> int | None:
        """Examples to run on ``prop``: given, configured, or the profile's (``None``: on time)."""
        if examples or self.config.examples:
            return examples or self.config.examples
        if self.profile.examples is None and prop in props.POLICY_PROPERTY_IDS and not self.config.policy:
            return self.profile.chunk  # cheap rule checks of the built-in policy, with no share of the budget
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
            self.known.campaign.add(finding.violation.signature())
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

    @contextmanager
    def ctrl_c_noted(self) -> Iterator[None]:
        """A first Ctrl-C is noted in ``self.interrupted`` and raised by the next example (``one``),
        not where the signal lands: a KeyboardInterrupt raised in a garbage-collector callback or
        a ``__del__`` (Hypothesis's, mid-shrink) is printed ("Exception ignored in …") and lost. A
        second Ctrl-C raises at once, for a step that does not return. Outside a Hypothesis run
        (saving a case, closing the engines: ``close``, the CLI) the caller reads ``interrupted``."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def pressed(signum: int, frame: object) -> None:
            if self.interrupted:
                raise KeyboardInterrupt
            self.interrupted = True

        before = signal.signal(signal.SIGINT, pressed)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)

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
                with gc_paused():
                    check_example(case)
            except KeyboardInterrupt:
                self.interrupted = True
                raise

        def check_example(case: Workload | Scenario | LlamaWorkload) -> None:
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
                self.confirm_llama = not target
                found = self.check(prop, scenario) if scenario is not None else self.check_llama(prop, case)  # type: ignore[arg-type]
            except Unsupported:
                reject()  # the case tests nothing here (counted in the stats where it is the engine's answer): not a pass

            # a known engine bug (an expect-fail case of the corpus) found again is not news
            known_set = self.known.signatures(props.is_llama(prop))
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
                with self.ctrl_c_noted():
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
            self.confirm_llama = True
            violation = e.violation
            if e.llama is not None and violation.property == "llama-no-same-size-realloc":
                # the shrunk case, confirmed by ggml's own check before it is reported
                again = [v for v in self.check_llama(prop, e.llama) if v.property == "llama-no-same-size-realloc"]
                violation = next((v for v in again if v.signature() == violation.signature()), again[0] if again else violation)
            return Finding(violation.property, e.scenario, violation, e.workload, e.llama)  # type: ignore[arg-type]
        return None

    def scenario_for(self, case: Case) -> Scenario:
        """A case's scenario: its workload played by this run's driver (in the re-reservation
        mode the case was found in, where it says), or the one it holds."""
        if case.workload is not None and "rereserve" in case.options:
            return Driver(self.policy, bool(case.options["rereserve"])).scenario(case.workload)
        return self.scenario_of(case.workload if case.workload is not None else case.scenario)

    def reference_signatures(self, case: Case) -> list[str] | None:
        """The signatures the reference alone predicts for a case (the engine replaced by its
        prediction), where that says anything: a cheap filter before replaying on the engine."""
        if case.property != "no-same-size-realloc" or case.scenario is None:
            return None
        scenario = self.scenario_for(case)
        p = self.predict(scenario)
        return [v.signature() for v in props.no_same_size_realloc(scenario, p, p)]

    def replay(self, case: Case) -> list[props.Violation]:
        """Check one saved case (no Hypothesis). A case with a workload is played again by
        this run's driver, so that it judges the current policy, not the recorded decisions.
        A race (its signature says ``race=``) shows only when the threads interleave so: it is
        played up to ``RACE_TRIES`` times before it counts as not reproduced; a llama.cpp crash is
        played again on a fresh worker, as the campaign confirmed it, before it does."""
        if case.llama is not None:
            try:
                found = self.check_llama(case.property, case.llama)
                if "kind=crash" in case.signature and all(v.signature() != case.signature for v in found):
                    # a crash the campaign confirmed on a fresh worker may need one: what earlier
                    # workloads left in the worker's memory can hide it (a kernel reading a slice
                    # nothing wrote)
                    self.engines.llama_target.fresh()
                    found = self.check_llama(case.property, case.llama)
                return found
            except Unsupported:  # a shrunk candidate whose context no longer fits its devices: it shows nothing
                return []
        return self.check_until_shown(case, self.scenario_for(case))

    def check_until_shown(self, case: Case, scenario: Scenario) -> list[props.Violation]:
        """``check`` of ``case``'s property on ``scenario``; a race case's up to ``RACE_TRIES``
        times, until its signature shows."""
        for _ in range(RACE_TRIES if RACE in case.signature else 1):
            found = self.check(case.property, scenario)
            if any(v.signature() == case.signature for v in found):
                break
        return found
