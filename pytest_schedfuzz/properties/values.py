"""same-values: a compute step's roots, outputs and caches equal the same graph computed on the CPU
alone (the values oracle, ``ggml/cpu_values.py``), and the reruns that sign a difference by its cause."""

from __future__ import annotations

from dataclasses import replace

from ..model.ops import VIEW_OPS
from ..model.scenario import Scenario
from ..model.trace import Trace
from .base import ENGINE, REFERENCE, VALUES, Draws, Export, PropertyEntry, Violation


def synchronous_variant(scenario: Scenario) -> Scenario:
    """The same scenario with every GPU-like device computing synchronously: a difference that
    goes away is a race (a missing synchronisation with an asynchronous backend)."""
    backends = tuple(replace(b, asynchronous=False, delay_us=0) if b.asynchronous else b for b in scenario.layout.backends)
    return replace(scenario, layout=replace(scenario.layout, backends=backends))


def _by_cause(v: Violation, scenario: Scenario, only_while: str, cause: str, facts: dict[str, object]) -> Violation:
    """``v`` (wrong values, or an abort) re-signed by a cause a rerun proved: what such a bug
    hits varies from run to run, so the signature keeps the cause, not the tensor, the message
    or, for an abort, whether a GGML_ASSERT or a C assert or signal stopped the kernel. Wrong
    values stay a same-values finding and an abort or a crash a no-abort one: a rerun never
    turns a crash into a values finding."""
    step = scenario.steps[v.step].describe() if v.step < len(scenario.steps) else f"step {v.step}"
    if v.property == "no-abort":
        # the symptom (which kernel check, which signal) varies with timing: the message keeps the cause
        return Violation("no-abort", v.step, f"during {step}: ggml aborts or crashes only while {only_while}: {cause}", facts)
    return Violation("same-values", v.step, f"after {step}: results differ from the CPU-only computation "
                     f"only while {only_while}: {cause}", facts)


def as_race(v: Violation, scenario: Scenario) -> Violation:
    """``v`` re-signed as a race: it needs asynchronous execution."""
    return _by_cause(v, scenario, "a device runs asynchronously", "a missing synchronisation with an asynchronous backend", {"race": "asynchronous"})


def forced_views(scenario: Scenario) -> list[str]:
    """The view tensors a graph of ``scenario`` assigns a backend to (``forced``)."""
    return sorted({name for _, g in scenario.graphs for name, _ in g.forced if g.by_name[name].op in VIEW_OPS})


def unforced_views_variant(scenario: Scenario) -> Scenario:
    """The same scenario without the backend assignments of view tensors."""
    graphs = tuple((n, g.with_forced(tuple(f for f in g.forced if g.by_name[f[0]].op not in VIEW_OPS))) for n, g in scenario.graphs)
    return replace(scenario, graphs=graphs)


def as_forced_view(v: Violation, scenario: Scenario) -> Violation:
    """``v`` re-signed: the results are right once no view is assigned a backend of its own."""
    return _by_cause(v, scenario, f"the views {', '.join(forced_views(scenario))} are assigned a backend (ggml_backend_sched_set_tensor_backend)",
                     "a view put on another backend than its source's is copied as a split input before its source is computed", {"forced": "view"})


def same_values(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Every compute step's roots, outputs and caches hold what the same graph computes on the
    CPU backend alone, from the same leaf contents (``ggml/cpu_values.py``): bitwise, or within
    the BLAS tolerance. The signature names what was wrong (a cache, or an output) and its op."""
    for r in trace.records:
        if r.values:
            name = r.values.split(" ", 1)[0]
            graph = scenario.graph(scenario.steps[r.index].graph or "")
            t = graph.by_name.get(name)
            what = "cache" if t is not None and t.role == "cache" else "output"
            op = t.op if t is not None and not t.is_leaf else "none"
            return [Violation("same-values", r.index, f"after {scenario.steps[r.index].describe()}: {r.values}", {"what": what, "op": op})]
    return []


SAME_VALUES = PropertyEntry(
    "same-values", "every compute step's values are the CPU backend's alone",
    needs=frozenset({ENGINE, REFERENCE, VALUES}), draws=Draws("scenarios", captured="scenarios"),
    judge=lambda sc, o: same_values(sc, o.trace, o.prediction),
    export=Export("values", "a tensor the step must get right differs, byte for byte, from the same graph computed by the CPU backend alone"))
ENTRIES = (SAME_VALUES,)
