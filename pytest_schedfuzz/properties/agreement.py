"""matches-reference: the engine against the reference, step by step: assignment, splits and their
inputs, graph_size, the graph copy, realloc events, allocation results, buffer types and sizes."""

from __future__ import annotations

from collections.abc import Callable

from ..model.scenario import GRAPH_STEP_KINDS, Scenario
from ..model.trace import RELEASE, ReallocEvent, StepRecord, Trace
from .aborts import unlike_prediction
from .base import ENGINE, REFERENCE, Draws, Export, PropertyEntry, Violation, normalize_reason


def _event_key(e: ReallocEvent) -> tuple[object, ...]:
    return (e.step, e.via, e.backend_ids_changed, e.same_size, normalize_reason(e.reason))


def _event_keys(events: tuple[ReallocEvent, ...], logged: bool) -> list[tuple[object, ...]]:
    """Re-plans as compared: every field where the engine logs them; where it does not (a Release
    build: ``model.trace.RELEASE``), what ggml's realloc callback tells, the scheduler's re-plans
    without ggml-alloc's reason, and none of ggml-alloc's own (single-buffer) re-plans."""
    if logged:
        return [_event_key(e) for e in events]
    return [(e.step, e.backend_ids_changed, e.same_size) for e in events if e.via == "sched"]


def _first_diff(a: tuple[object, ...], b: tuple[object, ...]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _compare_record(r: StepRecord, p: StepRecord, layout_name: Callable[[int], str], logged: bool = True) -> tuple[str, str] | None:
    if r.node_backends and p.node_backends and r.node_backends != p.node_backends:
        k = _first_diff(r.node_backends, p.node_backends)
        name = p.node_names[k] if k < len(p.node_names) else "?"
        eb = r.node_backends[k] if k < len(r.node_backends) else "-"
        pb = p.node_backends[k] if k < len(p.node_backends) else "-"
        return "assignment", f"node #{k} {name}: engine {layout_name(eb) if isinstance(eb, int) and eb >= 0 else eb}, reference {layout_name(pb) if isinstance(pb, int) and pb >= 0 else pb}"
    if r.leaf_backends and p.leaf_backends and r.leaf_backends != p.leaf_backends:
        k = _first_diff(r.leaf_backends, p.leaf_backends)
        return "leaf-assignment", f"leaf #{k} {p.leaf_names[k] if k < len(p.leaf_names) else '?'}: engine {r.leaf_backends[k:k+1]}, reference {p.leaf_backends[k:k+1]}"
    if r.splits and tuple(r.splits) != tuple(p.splits):
        k = _first_diff(tuple(r.splits), tuple(p.splits))
        es = r.splits[k] if k < len(r.splits) else None
        ps = p.splits[k] if k < len(p.splits) else None
        return "splits", f"split #{k}: engine {es}, reference {ps} ({r.n_splits} vs {p.n_splits} splits)"
    if (r.counts is not None or r.graph_size) and r.graph_size != p.graph_size:
        return "graph_size", f"graph_size engine {r.graph_size}, reference {p.graph_size}"
    if r.kind in GRAPH_STEP_KINDS and (r.n_copies, r.n_nodes, r.n_leafs) != (p.n_copies, p.n_nodes, p.n_leafs):
        return "graph-copy", (f"the scheduled graph copy: engine n_copies {r.n_copies}, {r.n_nodes} nodes, {r.n_leafs} leafs; "
                              f"reference n_copies {p.n_copies}, {p.n_nodes} nodes, {p.n_leafs} leafs")
    ek, pk = _event_keys(r.events, logged), _event_keys(p.events, logged)
    if ek != pk:
        return "events", f"realloc events: engine {[e.describe() for e in r.events]}, reference {[e.describe() for e in p.events]}"
    if r.kind in GRAPH_STEP_KINDS and r.ok != p.ok:
        return "allocation", f"engine {'allocated' if r.ok else 'failed to allocate'}, reference predicts {'success' if p.ok else 'a refused buffer'}"
    if r.buffer_types and r.buffer_types != p.buffer_types:
        return "buffer-types", f"the scheduler's compute buffer types: engine {list(r.buffer_types)}, reference {list(p.buffer_types)}"
    if r.buffer_sizes and r.buffer_sizes != p.buffer_sizes:
        k = _first_diff(r.buffer_sizes, p.buffer_sizes)
        return "buffers", (f"{layout_name(k)}'s compute buffer: engine {r.buffer_sizes[k]} bytes, reference {p.buffer_sizes[k] if k < len(p.buffer_sizes) else '-'} "
                           f"(all: engine {list(r.buffer_sizes)}, reference {list(p.buffer_sizes)})")
    return None


def matches_reference(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Assignment, splits, graph_size, the graph copy, realloc events, whether allocation
    succeeded and each backend's compute buffer size equal the reference's prediction."""
    logged = trace.engine.get("realloc_log") != RELEASE
    for r, p in zip(trace.records, prediction.records):
        diff = _compare_record(r, p, scenario.layout.name, logged)
        if diff:
            what, msg = diff
            return [Violation("matches-reference", r.index, f"{scenario.steps[r.index].describe()}: {msg}", {"what": what})]
    ta, pa = trace.abort, prediction.abort
    if ta is not None and pa is None:
        return []  # an abort the reference does not predict is no-abort's finding (every check runs it)
    if (ta is None) != (pa is None):
        step = (ta or pa).step  # type: ignore[union-attr]
        msg = f"engine {'aborted: ' + ta.message if ta else 'did not abort'}; reference {'predicts abort: ' + pa.message if pa else 'predicts no abort'}"
        return [Violation("matches-reference", step, msg, {"what": "abort"})]
    if ta is not None and pa is not None and (unlike := unlike_prediction(ta, pa)):
        what = "abort" if ta.step != pa.step else "abort-message"
        return [Violation("matches-reference", ta.step, f"engine aborted with {ta.message.strip().splitlines()[0][:200]}: {unlike}; "
                          f"reference predicts {pa.message}", {"what": what})]
    if ta is None and len(trace.records) != len(prediction.records):
        return [Violation("matches-reference", min(len(trace.records), len(prediction.records)), "engine and reference ran a different number of steps", {"what": "steps"})]
    return []


# driver workloads too: same-topology growth and re-plans within a reservation happen there;
# and llama.cpp's captured graphs in drawn step sequences (reuse-equivalent and same-values
# too: the values oracle fills a capture's inputs as any graph's)
MATCHES_REFERENCE = PropertyEntry(
    "matches-reference", "ggml's assignment, splits, sizes, events and buffers are the reference's",
    needs=frozenset({ENGINE, REFERENCE}), draws=Draws("both", max_ubatches=8, min_reconfigures=0, captured="scenarios"),
    judge=lambda sc, o: matches_reference(sc, o.trace, o.prediction),
    export=Export("reference", "what ggml does at the step (each node's backend, the number of splits, whether it allocated or re-planned, "
                               "the buffer sizes, as ggml's API tells them) differs from what schedfuzz's reference, a model of ggml's "
                               "passes, predicts (`PRED_*` in repro.c); where it is ggml that is right, the reference is fixed, not ggml",
                  observable=("assignment", "splits", "allocation", "events", "buffers", "abort")))
ENTRIES = (MATCHES_REFERENCE,)
