"""What a run explored and found: ``Stats`` (the summary every run prints), and the features of
scenarios and llama.cpp workloads its ``explored`` lines count, so that a dead generated dimension shows."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import properties as props
from ..cases.capture import CAPTURED_LABEL
from ..model.devices import DEVICE_KINDS
from ..model.graph_spec import GraphSpec
from ..model.llama_model import RECURRENT_KINDS, ROLLBACK_KINDS
from ..model.llama_trace import CallRecord, LlamaTrace
from ..model.llama_workload import LlamaWorkload, all_experts_bytes
from ..model.ops import GGML_OP_NAMES
from ..model.scenario import Scenario
from ..model.trace import Trace
from ..properties.llama_properties import rebuilds
from .captures import CONTEXTS

Predict = Callable[[Scenario], Trace]


@dataclass
class Stats:
    """The scheduler statistics llama.cpp users know, plus examples and findings."""

    examples: int = 0
    # examples the run was asked for by count (each unit's share: ``Fuzzer._fuzz_chunks``), and those the
    # time budget left unrun: a run that cut any is "cut short", never clean (``summary.verdict``)
    examples_asked: int = 0
    examples_cut: int = 0
    interrupted: int = 0  # processes in which Ctrl-C stopped the run: "interrupted", never clean
    graphs_reused: int = 0
    reallocs_same: int = 0
    reallocs_changed: int = 0
    dep_node_steps: int = 0  # steps whose split_graph made dependency nodes (SizeCounts.n_dep_nodes)
    realloc_observed: int = 0  # the scheduler's same-size decisions read from ggml's realloc callback (the seeds' ggml)
    realloc_derived: int = 0  # ... derived from ggml's graph-size formula (a ggml without the callback)
    realloc_by_gallocr: int = 0  # ggml-alloc re-planning a single buffer by itself: no scheduler decision to report (derived)
    splits: int = 0
    # compute steps whose values were compared with the CPU alone (same-values: ``properties.VALUES``),
    # the tensors compared, and compute steps run without (the other properties: zeros, ``ggml.cpu_values``)
    values_steps: int = 0
    values_tensors: int = 0
    computed_unvalued: int = 0
    # ggml's own figures (``observed``): same-size findings ggml's GGML_SCHED_DEBUG_REALLOC=1 check
    # confirmed; scenarios replayed under =2, of which a re-reservation's figures were compared; disagreements
    ggml_same_size_confirmed: int = 0
    ggml_figures_replays: int = 0
    ggml_figures_compared: int = 0
    ggml_figures_disagree: int = 0
    # the sample's derived same-size decisions checked by ggml's own =1 check: same, changed (both
    # confirmed), missed (derived changed, ggml same: a false negative), false (a false positive)
    ggml_decisions: dict[str, int] = field(default_factory=dict)
    known: int = 0  # violations matching a known engine bug of the corpus
    unconfirmed: int = 0  # failures that did not happen again on a fresh worker (``Engines.confirmed``, ``confirm``)
    rpc_servers_lost: dict[str, int] = field(default_factory=dict)  # deaths no workload was charged for (``RpcServers.lost``), by status and last client
    unconfirmed_cases: dict[str, int] = field(default_factory=dict)  # ... kept as cases: their files
    findings: dict[str, int] = field(default_factory=dict)
    property_examples: dict[str, int] = field(default_factory=dict)  # examples run by each property item (llama.cpp: the unit)
    short_items: dict[str, int] = field(default_factory=dict)  # item -> examples it judged, for items below their floor (not passed)
    unjudged: dict[str, int] = field(default_factory=dict)  # "property: why" -> items not run: it does not judge this build (``Checks.unjudged``)
    short_floors: dict[str, int] = field(default_factory=dict)  # ... and its floor (``Profile.min_examples``)
    quiet_ends: dict[str, int] = field(default_factory=dict)  # property -> seconds given on, nothing new found (``campaign.patience``)
    signatures: dict[str, int] = field(default_factory=dict)  # each finding's signature
    seen_again: dict[str, int] = field(default_factory=dict)  # violations matching a known signature, per signature
    components: dict[str, str] = field(default_factory=dict)  # known signature -> where its bug is (``corpus.component``)
    explored: dict[str, int] = field(default_factory=dict)  # examples that had each feature (``features``)
    # the llama.cpp target, counted as llama_perf_context_print does
    llama_workloads: int = 0
    llama_decodes: int = 0
    llama_graphs_reused: int = 0
    llama_reallocs_same: int = 0
    llama_reallocs_changed: int = 0
    llama_scheds_built: int = 0
    llama_sched_reuses: int = 0
    llama_rebuilds_wasted: int = 0  # schedulers rebuilt although can_reuse held (llama-reuse-complete)
    llama_rebuilds_unjudged: int = 0  # ... on a build without can_reuse: counted, not judged
    llama_sched_reserves: int = 0  # llama.cpp's sched_reserve lines seen (reuse is observable only with them)
    llama_realloc_observed: int = 0  # same-size decisions read from ggml's realloc callback
    llama_realloc_derived: int = 0  # ... derived from ggml's graph-size formula (a ggml without the callback)
    llama_realloc_allocator: int = 0  # ... of which the re-plan itself was told by ggml-alloc's interposed calls (a Release build)
    llama_realloc_allocator_agreed: int = 0  # re-plans ggml's callback or log told, and ggml-alloc's interposed calls the same
    llama_counted: int = 0  # reallocations llama.cpp counted itself (the seeds' counters), each checked
    llama_perf_counted: int = 0  # workloads whose llama_perf_context counts reallocations (upstream), checked at the end
    llama_out_of_memory: int = 0  # contexts or adapters llama.cpp could not make on GPU-like devices left little free memory
    llama_out_of_memory_judged: int = 0  # ... of which the scheduler calls made before the failure were judged
    llama_logits_compared: int = 0  # workloads whose logits were compared with a CPU-only run (llama-same-logits)
    llama_logit_rows: int = 0  # ... output rows compared
    llama_cpu_runs_kept: int = 0  # ... against the CPU-only run of an earlier workload of the same model, context and calls
    llama_switch_reruns: int = 0  # workloads run again without a switch a new lost reservation names (``causes.switches_told_apart``)
    llama_neighbours: int = 0  # workloads of a campaign that keeps going drawn next to one that found a cause (``strategies.neighbours``)
    llama_sampled_out: int = 0  # workloads of a campaign on time the costly judges left to their sample (``properties.COSTLY``)
    llama_captured: int = 0  # workloads whose graphs were captured and predicted (llama-matches-reference)
    llama_captured_nodes: int = 0  # ... node assignments compared, over all their steps
    llama_not_captured: dict[str, int] = field(default_factory=dict)  # workloads no graph scenario can say, by cause (not judged)
    captured_ops: dict[str, int] = field(default_factory=dict)  # ggml op -> nodes of captured graphs with it (the op coverage)
    # model family -> sessions (xdist workers) that captured its scenario for the graph properties (``campaign.captures``)
    captured_families: dict[str, int] = field(default_factory=dict)
    captured_missing: dict[str, int] = field(default_factory=dict)  # ... why some (or all) are missing
    captured_examples_ops: dict[str, int] = field(default_factory=dict)  # graph examples on captured graphs, by the ops they have
    llama_decode_rc: dict[str, int] = field(default_factory=dict)
    llama_explored: dict[str, int] = field(default_factory=dict)  # workloads with each feature (``llama_features``)
    llama_decoded: dict[str, int] = field(default_factory=dict)  # ... of which llama_decode succeeded at least once

    def add_llama(self, workload: LlamaWorkload, trace: LlamaTrace) -> None:
        self.llama_workloads += 1
        decoded = any(c.kind == "decode" and c.rc == 0 for c in trace.calls)
        made = {c.index for c in trace.calls if c.rc == 0}
        for f in llama_features(workload) + llama_observed(trace, workload):
            self.llama_explored[f] = self.llama_explored.get(f, 0) + 1
            self.llama_decoded[f] = self.llama_decoded.get(f, 0) + decoded
        for kind in filter(None, str(trace.engine.get("absent_calls", "")).split(",")):  # a dead dimension, with its reason
            self.llama_explored.setdefault(f"call {kind} absent (this build lacks it)", 0)
        for param in filter(None, str(trace.engine.get("absent_params", "")).split(",")):
            self.llama_explored.setdefault(f"{param} absent (this build lacks it)", 0)
        for kind in {c.kind for c in workload.calls}:
            f = f"call {kind}"
            self.llama_explored[f] = self.llama_explored.get(f, 0) + 1
            # a call kind counts as reached where one such call was made and llama.cpp accepted it
            self.llama_decoded[f] = self.llama_decoded.get(f, 0) + any(i in made for i, c in enumerate(workload.calls) if c.kind == kind)
        for c in trace.calls:
            if c.kind == "decode":
                self.llama_decodes += 1
                self.llama_decode_rc[str(c.rc)] = self.llama_decode_rc.get(str(c.rc), 0) + 1
            for s in c.sched:
                self.llama_scheds_built += s.kind == "new"
                self.llama_sched_reserves += s.kind == "sched_reserve"
                if s.realloc:
                    if s.same_size:
                        self.llama_reallocs_same += 1
                    else:
                        self.llama_reallocs_changed += 1
                    self.llama_realloc_observed += s.observed
                    self.llama_realloc_derived += not s.observed
                    self.llama_realloc_allocator += s.allocator
                    self.llama_realloc_allocator_agreed += s.allocator_agreed
                    self.llama_counted += s.llama_n_same is not None
        self.llama_graphs_reused += int(trace.perf.get("n_reused", 0))
        self.llama_perf_counted += "n_reallocs_same" in trace.perf and trace.abort is None
        made = rebuilds(trace)
        self.llama_sched_reuses += sum(r.kept for r in made)
        self.llama_rebuilds_wasted += sum(r.wasted for r in made)
        self.llama_rebuilds_unjudged += sum(r.wasted and r.logged is None for r in made)

    def _by_component(self) -> str:
        counts: dict[str, int] = {}
        for sig, n in self.seen_again.items():
            where = self.components.get(sig, "found by this run")
            counts[where] = counts.get(where, 0) + n
        return f"   ({', '.join(f'{where}: {n}' for where, n in sorted(counts.items()))})" if counts else ""

    def _reuse_note(self) -> str:
        if not self.llama_sched_reserves:
            return "   (llama.cpp's sched_reserve line was never seen: whether it reuses its scheduler was not observable)"
        if not self.llama_sched_reuses:
            return (f"   (this llama.cpp built a new scheduler on each of its {self.llama_sched_reserves} reservations: "
                    "llama-reuse-sound had nothing to check)")
        return ""

    def add_features(self, scenario: Scenario) -> None:
        for f in features(scenario):
            self.explored[f] = self.explored.get(f, 0) + 1
        if any(g.label.startswith(CAPTURED_LABEL) for _, g in scenario.graphs):
            ops = {t.op.upper() if GGML_OP_NAMES[t.op] == "UNARY" else GGML_OP_NAMES[t.op] for _, g in scenario.graphs for t in g.tensors if not t.is_leaf}
            for op in sorted(ops):
                self.captured_examples_ops[op] = self.captured_examples_ops.get(op, 0) + 1

    def add_trace(self, trace: Trace) -> None:
        for r in trace.records:
            self.graphs_reused += r.reused
            if r.kind in ("alloc", "compute"):
                self.splits += r.n_splits
            self.dep_node_steps += r.counts is not None and r.counts.n_dep_nodes > 0
            if r.kind == "compute" and r.ok:
                self.values_steps += r.values_checked > 0
                self.values_tensors += r.values_checked
                self.computed_unvalued += r.values_checked == 0
        for e in trace.events:
            if e.same_size:
                self.reallocs_same += 1
            else:
                self.reallocs_changed += 1
            self.realloc_observed += e.observed
            self.realloc_derived += not e.observed and e.via == "sched"
            self.realloc_by_gallocr += e.via != "sched"

    def merge(self, other: dict[str, Any]) -> None:
        for k in COUNTERS:
            setattr(self, k, getattr(self, k) + int(other.get(k, 0)))
        for key in DICTS:
            mine = getattr(self, key)
            for p, n in other.get(key, {}).items():
                mine[p] = mine.get(p, 0) + n

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in COUNTERS} | {k: dict(getattr(self, k)) for k in DICTS}

    def delta(self, before: dict[str, Any]) -> dict[str, Any]:
        """What was added since ``before`` (an ``as_dict``)."""
        now = self.as_dict()
        out: dict[str, Any] = {k: now[k] - before[k] for k in COUNTERS}
        for key in DICTS:
            out[key] = {p: n - before[key].get(p, 0) for p, n in now[key].items()}
        return out

    def summary_lines(self) -> list[str]:
        lines = [
            f"examples = {self.examples}   (cases run, over all properties, shrinking and replays included; llama.cpp workloads too)",
            f"graphs reused = {self.graphs_reused}",
            f"graph reallocs = {self.reallocs_same} / {self.reallocs_changed}   (same size) / (changed size)",
            f"scheduler realloc decisions observed from ggml's realloc callback = {self.realloc_observed}, derived from ggml's graph-size formula = "
            f"{self.realloc_derived}   (and {self.realloc_by_gallocr} re-plans of ggml-alloc by itself, a single buffer: derived)",
            f"splits = {self.splits}; steps whose graph copy had dependency nodes (a device's add_alloc_dep) = {self.dep_node_steps}",
            f"compute steps whose values were compared with the CPU alone (same-values) = {self.values_steps} ({self.values_tensors} tensors); "
            f"computed without (the other properties, on zeros) = {self.computed_unvalued}",
            f"figures observed from ggml (GGML_SCHED_DEBUG_REALLOC): same-size findings confirmed by its own check (=1) = "
            f"{self.ggml_same_size_confirmed}; scenarios replayed under =2 = {self.ggml_figures_replays}, whose first re-reservation's "
            f"graph size, nodes and leafs were compared with the derived record and the reference = {self.ggml_figures_compared}; "
            f"disagreements = {self.ggml_figures_disagree}; the sample's derived decisions under =1: "
            f"same-size confirmed {self.ggml_decisions.get('same', 0)}, false {self.ggml_decisions.get('false', 0)}; "
            f"none same-size confirmed {self.ggml_decisions.get('changed', 0)}, missed (a false negative) {self.ggml_decisions.get('missed', 0)}",
            f"known upstream bugs seen again = {self.known}" + self._by_component(),
        ]
        if self.rpc_servers_lost:
            lines.append(f"RPC servers found dead that no workload was charged for = {sum(self.rpc_servers_lost.values())}:")
            lines += [f"  {n:4d}  {what}" for what, n in sorted(self.rpc_servers_lost.items())]
        if self.unconfirmed:
            lines.append(f"unconfirmed failures = {self.unconfirmed}   (not shown again on a fresh worker; kept as cases, not findings:)")
            lines += [f"  {path}" for path in sorted(self.unconfirmed_cases)]
        if self.explored:
            lines.append("explored (examples with it): " + ", ".join(f"{k} {n}" for k, n in sorted(self.explored.items())))
        if self.captured_families or self.captured_missing:
            lines.append(f"llama.cpp's graphs for the graph properties: captured scenarios of {', '.join(sorted(self.captured_families)) or 'no model'}"
                         + (f" (missing: {'; '.join(self.captured_missing)})" if self.captured_missing else "")
                         + "; examples on them by op: " + (", ".join(f"{k} {n}" for k, n in sorted(self.captured_examples_ops.items())) or "none"))
        if self.llama_workloads:
            rcs = ", ".join(f"{rc}: {n}" for rc, n in sorted(self.llama_decode_rc.items(), key=lambda kv: kv[0]))
            lines += [
                f"llama.cpp: workloads = {self.llama_workloads}, decodes = {self.llama_decodes} (llama_decode return codes {rcs}); "
                f"contexts or LoRA adapters that did not fit GPU-like devices left little free memory = {self.llama_out_of_memory} "
                f"(judged on the scheduler calls made before the failure: {self.llama_out_of_memory_judged}; not judged, none made: "
                f"{self.llama_out_of_memory - self.llama_out_of_memory_judged})",
                f"llama.cpp: logits compared with the CPU alone (llama-same-logits) = {self.llama_logits_compared} workloads, {self.llama_logit_rows} output rows "
                f"({self.llama_cpu_runs_kept} workloads against the CPU-only run of an earlier one with the same model, context and calls)",
                f"llama.cpp: workloads drawn next to one that found a cause (one dimension drawn again) = {self.llama_neighbours}",
                f"llama.cpp: workloads of a campaign on time left to the sample of the costly judges (1 in {props.SAMPLE}: llama-same-logits, "
                f"llama-matches-reference; judged by the others) = {self.llama_sampled_out}",
                f"llama.cpp: graphs reused = {self.llama_graphs_reused}",
                f"llama.cpp: workloads captured and predicted by the reference (llama-matches-reference) = {self.llama_captured}, "
                f"node assignments compared = {self.llama_captured_nodes}; not captured (not judged): "
                + (", ".join(f"{k} {n}" for k, n in sorted(self.llama_not_captured.items())) or "none"),
                "llama.cpp: ops of the captured graphs (nodes): " + (", ".join(f"{k} {n}" for k, n in sorted(self.captured_ops.items())) or "none"),
                f"llama.cpp: graph reallocs = {self.llama_reallocs_same} / {self.llama_reallocs_changed}   (same size) / (changed size)",
                f"llama.cpp: workloads run again without the switch a new lost reservation names = {self.llama_switch_reruns}",
                f"llama.cpp: schedulers built = {self.llama_scheds_built}, kept across a re-reservation = {self.llama_sched_reuses}"
                + (" (each checked against can_reuse)" if self.llama_sched_reuses else "") + self._reuse_note()
                + f"; rebuilt although can_reuse held = {self.llama_rebuilds_wasted}"
                + (f" ({self.llama_rebuilds_unjudged} on a llama.cpp without can_reuse: its compute buffers re-reserved, not judged by "
                   "llama-reuse-complete)" if self.llama_rebuilds_unjudged else ""),
                f"llama.cpp: realloc decisions observed from ggml's realloc callback = {self.llama_realloc_observed}, "
                f"derived from ggml's graph-size formula = {self.llama_realloc_derived} (of which re-plans told by ggml-alloc's "
                f"interposed calls, a Release build = {self.llama_realloc_allocator}); told by ggml and held against its "
                f"interposed allocator calls = {self.llama_realloc_allocator_agreed}; counted by llama.cpp itself and checked = {self.llama_counted}; "
                f"workloads whose perf data (n_reallocs_same/_diff) was checked = {self.llama_perf_counted}",
                "llama.cpp explored (workloads with it / that decoded; a call kind: / that llama.cpp accepted): "
                + ", ".join(f"{k} {n}/{self.llama_decoded.get(k, 0)}" for k, n in sorted(self.llama_explored.items())),
            ]
        if self.property_examples:
            lines.append("examples per property item: " + ", ".join(f"{p} = {n}" for p, n in sorted(self.property_examples.items()))
                         + ("; below their floor, not passed (judged / floor): "
                            + ", ".join(f"{i} {n}/{self.short_floors.get(i, 0)}" for i, n in sorted(self.short_items.items()))
                            if self.short_items else ""))
        if self.quiet_ends:
            lines.append("time shares given on, nothing new found for a third of them (seconds): "
                         + ", ".join(f"{p} = {n}" for p, n in sorted(self.quiet_ends.items())))
        lines += [f"findings[{p}] = {self.findings.get(p, 0)}" for p in props.PROPERTY_IDS]
        if self.signatures:
            lines.append(f"distinct signatures = {len(self.signatures)}")
            lines += [f"  {sig}" for sig in sorted(self.signatures)]
        if self.seen_again:
            lines.append("known signatures seen again (violations, where the bug is):")
            lines += [f"  {n:6d}  {sig}  [{self.components.get(sig, 'found by this run')}]" for sig, n in sorted(self.seen_again.items(), key=lambda kv: -kv[1])]
        return lines


def features(scenario: Scenario) -> list[str]:
    """What a scenario exercises, for the "explored" statistics line: step kinds and scheduler
    parameters, tensor types, batch sizes, devices, forced assignments."""
    steps = scenario.steps
    kinds = set().union(*(_tensor_features(g) for _, g in scenario.graphs))
    checks = {
        "compute steps": any(s.kind == "compute" for s in steps),
        "parallel": any(s.params is not None and s.params.parallel for s in steps),
        "scheduler reuse": any(s.reuse for s in steps),
        "f16 weights": "f16 weights" in kinds,
        "q8_0 weights": "q8_0 weights" in kinds,
        ">= 32 tokens": ">= 32 tokens" in kinds,
        # each device kind's own (``DeviceKind.explored``): at least so many of the kind
        **{name: sum(b.kind == kind.name for b in scenario.layout.backends) >= n for kind in DEVICE_KINDS.values() for n, name in kind.explored},
        "gpu offload_op": any(b.offload_min_batch for b in scenario.layout.backends),
        "gpu offload_op by ggml-cuda's batch (routed experts)": any(b.cuda_batch for b in scenario.layout.backends),
        # one op reading many tensors in a chain: more than GGML_SCHED_MAX_SPLIT_INPUTS may be copied into one split
        "more than 30 caches and inputs": "more than 30 caches and inputs" in kinds,
        "gpu host buffer": scenario.layout.host_buffer_of is not None,
        "gpu shared buffer type": any(b.shared_buft for b in scenario.layout.backends),
        "gpu max_size (chunks)": any(b.max_size for b in scenario.layout.backends),
        "gpu graph_optimize": any(b.graph_optimize for b in scenario.layout.backends),
        "gpu fusions (add_alloc_dep)": any(b.fuse for b in scenario.layout.backends),
        "gpu asynchronous": any(b.asynchronous for b in scenario.layout.backends),
        "forced assignments": any(g.forced for _, g in scenario.graphs),
        # ggml_backend_sched_set_eval_callback, then a compute: compute_splits computes in pieces
        "eval callback (computed with)": "compute" in [s.kind for s in scenario.steps][_first(scenario, "eval_callback"):],
        # ggml_backend_sched_reserve_size (llama.cpp's memory estimate), then a graph scheduled after it
        "reserve_size (then another step)": _first(scenario, "reserve_size") < len(scenario.steps) - 1,
        "flash attention": "flash attention" in kinds,
        "several graphs": len(scenario.graphs) > 1,
        "llama.cpp's graphs (captured)": any(g.label.startswith(CAPTURED_LABEL) for _, g in scenario.graphs),
        # llama.cpp's own order (``strategies.captured_graphs.captured_workloads``): its reservation before every ubatch
        "llama.cpp's graphs after llama.cpp's reservation (captured)": _after_reservation(scenario),
        # the pool's second size of ubatch and KV cache (``captures.CONTEXTS``)
        f"llama.cpp's graphs of n_ubatch {CONTEXTS[1].n_ubatch}, n_ctx {CONTEXTS[1].n_ctx} (captured)": any(
            g.label.startswith(CAPTURED_LABEL) and f", n_ubatch {CONTEXTS[1].n_ubatch}, " in g.label for _, g in scenario.graphs),
    }
    return [k for k, v in checks.items() if v]


def _tensor_features(g: GraphSpec) -> frozenset[str]:
    """What one graph's tensors exercise (``features``), once per spec (a spec recurs: Hypothesis's
    mutations, the captured pool), kept with what judges derive from it."""
    made: frozenset[str] | None = g.derived.get("features")
    if made is None:
        found, n_read = set(), 0
        for t in g.tensors:
            if t.role == "weight" and t.type in ("f16", "q8_0"):
                found.add(f"{t.type} weights")
            elif t.role == "input" and len(t.ne) > 1 and t.ne[1] >= 32:
                found.add(">= 32 tokens")
            elif t.op == "flash_attn_ext":
                found.add("flash attention")
            n_read += t.role in ("cache", "input")
        if n_read > 30:
            found.add("more than 30 caches and inputs")
        made = g.derived["features"] = frozenset(found)
    return made


def _first(scenario: Scenario, kind: str) -> int:
    """The index of the scenario's first step of ``kind`` (past the last step if none)."""
    return next((i for i, s in enumerate(scenario.steps) if s.kind == kind), len(scenario.steps))


def _after_reservation(scenario: Scenario) -> bool:
    """Captured graphs whose every alloc and compute follows a reservation of a graph llama.cpp
    reserved (``sched_reserve``), since the scheduler was last built."""
    reserved, out = False, False
    for s in scenario.steps:
        if s.kind == "sched_new" and not s.reuse:
            reserved = False
        elif s.kind == "reserve":
            g = scenario.graph(s.graph or "")
            reserved = reserved or (g.label.startswith(CAPTURED_LABEL) and g.label.endswith("-reserve"))
        elif s.kind in ("alloc", "compute"):
            if not reserved:
                return False
            out = True
    return out


# a draft model of its own, as the "explored" rows name it per draft (``DRAFTS``)
_OWN = {"": "no draft", "mtp": "draft mtp on a draft model of its own", "model": "draft model"}


def llama_features(w: LlamaWorkload) -> list[str]:
    """What a llama.cpp workload exercises, for the llama.cpp "explored" line: every dimension
    the generators draw (``strategies.llama_workloads.llama_workloads``), so that a dead one shows."""
    c, dv, m = w.ctx, w.devices, w.model
    out = [
        f"model {m.kind}", f"{dv.n_rpc} RPC", f"flash_attn {c.flash_attn}", f"kv {c.type_k}/{c.type_v}",
        "kv unified" if c.kv_unified else "kv per sequence", "n_seq_max > 1" if c.n_seq_max > 1 else "n_seq_max 1",
        "n_ubatch < n_batch" if c.n_ubatch < c.n_batch else "n_ubatch = n_batch",
    ]
    checks = {
        "partial offload": dv.n_gpu_layers < m.n_layer,
        "tensor_split": bool(dv.tensor_split),
        "tensor_split with a zero share": any(x == 0 for x in dv.tensor_split),
        f"{len(dv.gpus)} GPU-like": bool(dv.gpus),
        "GPU-like asynchronous": any(g.asynchronous for g in dv.gpus),
        "GPU-like host buffer": any(g.host_buffer for g in dv.gpus),
        "GPU-like unsupported ops": any(g.unsupported for g in dv.gpus),
        "GPU-like max_size": any(g.max_size for g in dv.gpus),
        "GPU-like graph_optimize": any(g.graph_optimize for g in dv.gpus),
        "GPU-like offload_op, op_offload on": any(g.offload_min_batch for g in dv.gpus) and c.op_offload,
        "GPU-like little free memory": bool(dv.gpu_free),
        f"split_mode {dv.split_mode}": dv.split_mode != "layer",
        "tensor overrides": bool(dv.overrides),
        "lora adapters": bool(w.loras),
        "op_offload off": not c.op_offload,
        "offload_kqv off": not c.offload_kqv,
        f"embeddings pooling {c.pooling}": c.embeddings,
        f"backend samplers {c.sampler_chain}": c.backend_samplers,
        # b11739's MoE cache: a budget for part of the host experts, or for all of them
        f"moe cache {'>=' if c.moe_cache_size >= all_experts_bytes(m) else '<'} all experts' bytes": c.moe_cache_size > 0,
        "output limits": bool(c.n_outputs_max or c.n_outputs_max_per_seq),
        "multi-sequence batch": any(len(x.parts) > 1 for x in w.calls if x.kind == "decode"),
        "batch > n_ubatch": any(x.n_tokens() > c.n_ubatch for x in w.calls if x.kind == "decode"),
        # llama-server's speculative decoding (llama.speculative): a draft context, or n-gram drafts
        "draft mtp (an MTP context)": w.draft == "mtp",
        "draft mtp, its layer on a device of its own (-ot blk.N.)": w.draft == "mtp" and any(p == f"blk\\.{m.n_layer}\\." for p, _ in dv.overrides),
        # llama-server's --spec-draft-devices/-ngld: the draft context on a model of its own
        f"{_OWN[w.draft]}, on one device (--spec-draft-devices)": bool(w.draft_model and w.draft_model.devices),
        f"{_OWN[w.draft]}, the target's devices (-ngld)": bool(w.draft_model and not w.draft_model.devices),
        "draft model (draft-simple, a context on a draft model)": w.draft == "model",
        "draft model with n_rs_seq > 0": bool(w.draft_model and w.draft_model.n_rs_seq),
        "speculative steps, draft mtp": w.draft == "mtp" and any(x.kind == "spec" for x in w.calls),
        "speculative steps, draft model": w.draft == "model" and any(x.kind == "spec" for x in w.calls),
        "speculative steps, n-gram drafts": not w.draft and any(x.kind == "spec" for x in w.calls),
        "speculative steps rolled back": any(x.kind == "spec" and x.accept < x.n_draft for x in w.calls),
        "checkpoints": any(x.kind == "checkpoint" for x in w.calls),
        # recurrent-state snapshots, where the architecture rolls back by them (llama.cpp clamps n_rs_seq to 0 elsewhere)
        "n_rs_seq > 0": c.n_rs_seq > 0 and m.kind in ROLLBACK_KINDS,
        "last positions dropped on a recurrent model (seq_rm)": m.kind in RECURRENT_KINDS and any(x.kind == "seq_rm" and x.n_drop > 0 for x in w.calls),
    }
    return out + [k for k, v in checks.items() if v]


def llama_observed(trace: LlamaTrace, w: LlamaWorkload | None = None) -> list[str]:
    """What llama.cpp's scheduler was seen doing in a run (as ggml and llama.cpp report it), for
    the same line: pipeline parallelism, its fallback, op offload, flash attention "auto" resolved
    off, the meta device of split mode tensor, the MoE cache made and used, a recurrent state
    rolled back by a snapshot, and (with the workload ``w``) a batch that fits one ubatch which
    llama.cpp computed in several: split per sequence (an equal split)."""
    init = [s for c in trace.calls if c.kind == "init" for s in c.sched if s.kind == "new"]
    calls = [s for _, s in trace.sched_calls()]
    split = w is not None and any(_split_per_sequence(w, c) for c in trace.calls)
    checks = {
        "observed: n_copies > 1": any(s.n_copies > 1 for s in calls),
        "observed: pipeline parallelism dropped (compute buffers did not fit)": len(init) > 1 and init[0].parallel and not init[-1].parallel,
        "observed: op offloaded to a device": any(not x.startswith("moe_cache.") for s in calls for x in s.offloaded),
        "observed: the draft context's scheduler re-planned": any(s.context and s.realloc for s in calls),
        "observed: flash attention auto, off (a device refused it)": trace.flash_attn() == "off",
        # split mode tensor: llama.cpp wraps the devices in a meta device (llama_prepare_model_devices)
        "observed: meta device (split mode tensor)": any("using device Meta(" in x for c in trace.calls if c.kind == "init" for x in c.log),
        # b11739's MoE cache: made (its banks and slot maps), and its lookup reading a slot map on a
        # device, which the scheduler copies through llama.cpp's copy callback (llama_moe_cache::copy)
        "observed: moe cache made": any("MoE cache size = " in x for c in trace.calls if c.kind == "init" for x in c.log),
        "observed: moe cache slot map copied to a device": any(x.startswith("moe_cache.slot_map") for s in calls for x in s.offloaded),
        # llama_memory_seq_rm dropped a recurrent state's last positions (n_rs_seq): llama.cpp's own answer
        "observed: snapshot rollback": any(c.rollback == "snapshot" for c in trace.calls),
        # the draft context's own rollback (a draft model's memory): by its snapshots, or from its checkpoint
        "observed: draft context snapshot rollback": any(c.draft_rollback == "snapshot" for c in trace.calls),
        "observed: draft context checkpoint rollback": any(c.draft_rollback == "checkpoint" for c in trace.calls),
        "observed: ubatch split per sequence": split,
        # the same, told apart by the KV cache it split for: one stream for all sequences, or a stream each
        "observed: ubatch split per sequence, kv unified": split and w is not None and w.ctx.kv_unified,
        "observed: ubatch split per sequence, kv per sequence": split and w is not None and not w.ctx.kv_unified,
    }
    return [k for k, v in checks.items() if v]


def _split_per_sequence(w: LlamaWorkload, record: CallRecord) -> bool:
    """Whether llama.cpp computed a decode of several sequences that fits one ubatch in several
    graphs (the target context's allocations): it split the batch by sequence."""
    if record.kind != "decode" or not 0 <= record.index < len(w.calls):
        return False
    call = w.calls[record.index]
    allocs = sum(1 for s in record.sched if s.kind == "alloc" and not s.context)
    return len(call.parts) > 1 and call.n_tokens() <= w.ctx.n_ubatch and allocs > 1


# what merge, as_dict and delta carry: every counter and every per-key count of Stats
COUNTERS = tuple(f.name for f in fields(Stats) if f.type == "int")
DICTS = tuple(f.name for f in fields(Stats) if f.type == "dict[str, int]")


_SIGHTED: set[tuple[Path, str]] = set()  # (sightings file, signature): what this process has written


def sighted(path: Path | None, prop: str, signatures: list[str]) -> None:
    """Append those of ``signatures`` this process sees for the first time to the sightings file
    ``path`` (one JSON line each, written whole with ``O_APPEND``: the processes of a run share
    the file). A signature found beside another is sighted with it, though it is shrunk later."""
    new = [sig for sig in dict.fromkeys(signatures) if path is not None and (path, sig) not in _SIGHTED]
    if path is None or not new:
        return
    _SIGHTED.update((path, sig) for sig in new)
    now = time.time()
    lines = "".join(json.dumps({"t": now, "property": prop, "signature": sig, "pid": os.getpid()}) + "\n" for sig in new)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)
