"""The checks of one case (``Checks``, a part of ``fuzz.Fuzzer``): a scenario's property on the
engine and the reference (``check``, its findings checked against ggml's own figures), a
llama.cpp workload's (``check_llama``, its captured graphs against the reference), and a saved
case's replay (``replay``), each returning the violations it found.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from reference.graph import CGraph
from reference.predict import predict as reference_predict
from reference.rules import NEWEST, Rules, rules_for

from .. import properties as props
from ..cases.capture import CaptureError, capture, preparer
from ..cases.corpus import Case
from ..cases.verdict import RACE
from ..engine import TargetError, Unsupported
from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import Scenario
from ..model.trace import Trace
from ..profiles import FuzzConfig
from ..properties.captured_reference import llama_matches_reference
from ..properties.llama_logits import cpu_only, logit_pairs
from ..properties.llama_properties import LLAMA_CHECKS, cpu_run_violations, llama_same_logits, out_of_memory, unmade_calls
from ..sim.driver import Driver, Workload
from . import observed
from .causes import causes_told_apart, switches_told_apart
from .engines import Deferred, Engines
from .judging import LlamaJudges, in_cpu_run
from .known import KnownBugs
from .stats import Stats

# ggml 0.15.3's asynchronous race shows in about half the replays on an idle machine, in one of
# six or seven under load: 30 replays miss it about once in 100 then (the verdict says so, ``unshown``)
RACE_TRIES = 30

Predict = Callable[[Scenario], Trace]


class Checks:
    """How one case is checked. A part of ``Fuzzer``, which sets up the engines, the reference
    and the statistics."""

    config: FuzzConfig
    engines: Engines
    stats: Stats
    known: KnownBugs
    predict: Predict
    policy: Callable[..., bool]
    _rules: Rules | None
    rules_note: str | None
    llama_judged: tuple[str, ...]
    judges: LlamaJudges  # which judge a llama.cpp run
    scenario_of: Callable[[Workload | Scenario], Scenario]

    @property
    def rules(self) -> Rules:
        """The reference's rules for the loaded ggml's version (``reference.rules``)."""
        if self._rules is None:
            self._rules, self.rules_note = rules_for(self.engines.ggml_version(llama=False) or NEWEST.version)
        return self._rules

    def unjudged(self, prop: str) -> str | None:
        """Why ``prop`` does not judge this run's ggml (None where it does): matches-reference needs
        the reference's rules for the loaded ggml's version, unless the user gave a reference of
        their own (``--schedfuzz-reference``); another version's rules would judge it."""
        if prop != "matches-reference" or self.config.reference is not None:
            return None
        self.rules  # noqa: B018 -- reads the loaded ggml's version: sets rules_note
        return f"{prop} does not judge this ggml: {self.rules_note}" if self.rules_note else None

    def _reference(self, scenario: Scenario) -> Trace:
        return reference_predict(scenario, rules=self.rules)

    def check_llama(self, prop: str, workload: LlamaWorkload, cpu_run: bool = False, replayed: bool = False) -> list[props.Violation]:
        """Every violation of ``prop`` (``LLAMA_GROUP``: of every property in ``llama_judged``)
        on one run of a workload on llama.cpp. An abort is reported by llama-no-abort only:
        llama.cpp aborts on some configurations at once, and that one bug must not stop the
        search for reallocations. A call the harness could not make is a ``TargetError``, never
        a pass (``unmade_calls``). The CPU-only run llama-same-logits compares with is made where
        a judged property needs it, or ``cpu_run`` asks for it (a replayed case found there)."""
        judging = self.judges.of(self.llama_judged if prop == props.LLAMA_GROUP else (prop,), workload, cpu_run, replayed, self.stats)
        judged, logits, capture = judging.judged, judging.logits, judging.capture
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
        found, reruns = switches_told_apart(workload, found, self.engines.run_llama, frozenset() if replayed else known)  # a replay: in full
        self.stats.llama_switch_reruns += reruns
        # ggml's own check (GGML_SCHED_DEBUG_REALLOC=1) is compiled out of a Release build (NDEBUG): there, without the
        # callback, a same-size decision stays derived, unconfirmed; nor is it made while Hypothesis shrinks one (the shrunk one is)
        confirmable = trace.engine.get("realloc_callback") != "observed" and trace.engine.get("build", "Debug").startswith("Debug")
        if self.judges.shrinking is None and confirmable and any(v.property == "llama-no-same-size-realloc" and v.signature() not in known for v in found):
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
            found += [v for v in cpu_run_violations(workload, trace, cpu_w, cpu) if v.property in judged]
            if "llama-same-logits" in judged:
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
        (``llama_not_captured``, by cause), not judged; so is every workload of a ggml version the
        reference has no rules for (another version's rules would judge it)."""
        rules, note = rules_for(trace.engine.get("ggml_version"))
        found: list[props.Violation] = []
        if note is not None:
            self.judges.no_rules = unjudged = f"ggml {trace.engine.get('ggml_version')}: no reference rules"
            self.stats.llama_not_captured[unjudged] = self.stats.llama_not_captured.get(unjudged, 0) + 1
            return found
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

    # ----------------------------------------------------------------- a saved case

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

    def replay(self, case: Case, strict: bool = False) -> list[props.Violation]:
        """Check one saved case (no Hypothesis). A case with a workload is played again by
        this run's driver, so that it judges the current policy, not the recorded decisions.
        A race (its signature says ``race=``) shows only when the threads interleave so: it is
        played up to ``RACE_TRIES`` times before it counts as not reproduced; a llama.cpp crash, or
        an abort signed by an RPC server's fate (``server=``), is played again on a fresh worker and
        fresh servers, as the campaign confirmed it, before it does. With ``strict``, a llama.cpp
        case the build cannot run raises ``Unsupported`` instead of showing nothing."""
        if case.llama is not None:
            # a case found in llama-same-logits' CPU-only run is replayed with that run
            cpu_run = in_cpu_run(case.signature)
            try:
                found = self.check_llama(case.property, case.llama, cpu_run, replayed=True)
                if ("kind=crash" in case.signature or "server=" in case.signature) and all(v.signature() != case.signature for v in found):
                    # confirmed on a fresh worker (and servers), it may need one: what earlier
                    # workloads left in the worker's memory can hide a crash (a kernel reading a
                    # slice nothing wrote), and a server they left busy moves the phase in which
                    # the client notices a refusal
                    self.engines.llama_target.fresh()
                    found = self.check_llama(case.property, case.llama, cpu_run, replayed=True)
                return found
            except Unsupported:  # a shrunk candidate whose context no longer fits its devices: it shows nothing
                if strict:  # a build that cannot run the case (``tools.history``): no verdict, said by the caller
                    raise
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
