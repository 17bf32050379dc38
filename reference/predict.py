"""Run a whole scenario through the reference scheduler: the ``Prediction`` of every step."""

from __future__ import annotations

import gc
from dataclasses import replace

from pytest_schedfuzz.model.scenario import Scenario, Step
from pytest_schedfuzz.model.trace import Abort, ReallocEvent, StepRecord, Trace

from .graph import CGraph
from .rules import NEWEST, Rules
from .sched import SchedAbort, Scheduler, SplitResult

Prediction = Trace


def _record(i: int, step: Step, sched: Scheduler, result: SplitResult, events: list[ReallocEvent], names: list[str], n_nodes: int, ok: bool) -> StepRecord:
    copy = result.copy
    return StepRecord(
        index=i,
        kind=step.kind,
        node_names=tuple(names[:n_nodes]),
        node_backends=result.node_backends,
        leaf_names=tuple(names[n_nodes : n_nodes + len(result.leaf_backends)]),
        leaf_backends=result.leaf_backends,
        splits=result.splits,
        n_copies=sched.n_copies,
        graph_size=result.graph_size,
        n_nodes=len(copy.nodes),
        n_leafs=len(copy.leafs),
        buffer_sizes=sched.buffer_sizes(),
        events=tuple(events),
        ok=ok,
    )


def predict(scenario: Scenario, scheduler: type[Scheduler] = Scheduler, rules: Rules = NEWEST) -> Prediction:
    """What ggml's scheduler (of the version ``rules`` describes) must do for each step of
    ``scenario`` (see ``_predict``).

    Python's cyclic garbage collector is paused meanwhile: the model allocates many small
    acyclic objects, and every collection scans all live ones, which made the cost per node
    grow with the graph (1.4x from 1k to 8k nodes; 1.1x without collections).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _predict(scenario, scheduler, rules)
    finally:
        if was_enabled:
            gc.enable()


def _predict(scenario: Scenario, scheduler: type[Scheduler], rules: Rules) -> Prediction:
    """What ggml's scheduler must do for each step of ``scenario``, as a ``Trace``.

    Steps mirror the calls a ``llama_context`` makes: ``reserve``, ``alloc`` and ``split``
    (``ggml_backend_sched_split_graph`` alone, as llama.cpp probes where ops go) reset the
    scheduler and apply the graph's forced assignments first; ``compute`` allocates like
    ``alloc``; ``reserve_size`` (``ggml_backend_sched_reserve_size``, llama.cpp's memory estimate)
    resets again itself, so the forced assignments are gone when it splits, and records the sizes
    it measured; a ``sched_new`` with ``reuse`` keeps the current scheduler (and its params).
    A predicted abort ends the prediction, as it ends the engine. ``scheduler`` lets a test
    plant a fault in one pass (a subclass overriding it).
    """
    sched: Scheduler | None = None
    records: list[StepRecord] = []
    for i, step in enumerate(scenario.steps):
        try:
            if step.kind == "sched_new":
                assert step.params is not None
                if not (step.reuse and sched is not None):
                    sched = scheduler(scenario.layout, step.params, rules)
                # ggml_backend_sched_new: sched->bufts[b] = bufts ? bufts[b] : the backend's default
                records.append(StepRecord(i, step.kind, n_copies=sched.n_copies, buffer_sizes=sched.buffer_sizes(), reused=step.reuse,
                                          buffer_types=tuple(sched.backends.bufts)))
                continue
            assert sched is not None, "the first step must be sched_new"
            if step.kind == "reset":
                sched.reset()
                records.append(StepRecord(i, step.kind, n_copies=sched.n_copies, buffer_sizes=sched.buffer_sizes()))
                continue
            if step.kind == "eval_callback":
                # ggml_backend_sched_set_eval_callback: only ggml_backend_sched_compute_splits reads it,
                # to compute a split in pieces; no plan changes
                records.append(StepRecord(i, step.kind, n_copies=sched.n_copies, buffer_sizes=sched.buffer_sizes()))
                continue
            spec = scenario.graph(step.graph or "")
            sched.reset()
            for name, backend in spec.forced:
                sched.set_tensor_backend(name, backend)
            g = CGraph.of(spec)
            if step.kind == "reserve":
                (result, ok), events = sched.reserve(g), []
            elif step.kind == "split":
                result, events, ok = sched.split_graph(g), [], True
            elif step.kind == "reserve_size":
                result, measured = sched.reserve_size(g)
                records.append(replace(_record(i, step, sched, result, [], g.names, g.n_nodes, True), buffer_sizes=measured))
                continue
            else:
                result, events, ok = sched.alloc_graph(g, i)
            records.append(_record(i, step, sched, result, events, g.names, g.n_nodes, ok))
        except SchedAbort as e:
            return Trace(tuple(records), Abort(i, e.kind, str(e)), {"name": "reference", "ggml_version": rules.version})
    return Trace(tuple(records), None, {"name": "reference", "ggml_version": rules.version})
