"""reuse-sound, reuse-complete and reuse-equivalent: the driver's decision to keep a scheduler
(``sched_new`` with ``reuse``) against ``can_reuse``, and a kept scheduler against a fresh one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from reference.params import can_reuse

from ..model.scenario import Scenario, SchedParams, Step
from ..model.trace import Trace
from .base import ENGINE, FRESH, REFERENCE, Draws, Export, PropertyEntry, Violation


def _schedulers(scenario: Scenario) -> Iterator[tuple[int, Step, SchedParams | None]]:
    """Yield (index, step, params the current scheduler was built with) for sched_new steps."""
    cur: SchedParams | None = None
    for i, s in enumerate(scenario.steps):
        if s.kind == "sched_new":
            assert s.params is not None
            yield i, s, cur
            if not (s.reuse and cur is not None):
                cur = s.params


def _why_not(new: SchedParams, cur: SchedParams) -> str:
    why = []
    if new.parallel != cur.parallel:
        why.append(f"parallel {cur.parallel} -> {new.parallel}")
    if new.op_offload != cur.op_offload:
        why.append(f"op_offload {cur.op_offload} -> {new.op_offload}")
    if new.max_nodes > cur.max_nodes:
        why.append(f"max_nodes {new.max_nodes} > current {cur.max_nodes}")
    return ", ".join(why)


def reuse_sound(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Every reuse happens only when ``can_reuse(new, cur)`` holds."""
    out = []
    for i, s, cur in _schedulers(scenario):
        assert s.params is not None
        if s.reuse and cur is not None and not can_reuse(s.params, cur):
            why = _why_not(s.params, cur)
            out.append(Violation("reuse-sound", i, f"scheduler reused although can_reuse is false: {why}", {"why": why.split(" ")[0]}))
    return out


def reuse_complete(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """No scheduler is rebuilt when ``can_reuse`` held; the dropped buffers are reported."""
    out = []
    for i, s, cur in _schedulers(scenario):
        assert s.params is not None
        if not s.reuse and cur is not None and can_reuse(s.params, cur):
            sizes = next((r.buffer_sizes for r in reversed(trace.records[:i]) if r.buffer_sizes), ())
            dropped = ", ".join(f"{scenario.layout.name(b)} {n / 2**20:.2f} MiB" for b, n in enumerate(sizes)) or "unknown"
            out.append(
                Violation(
                    "reuse-complete", i,
                    f"scheduler rebuilt for max_nodes={s.params.max_nodes} although the current one "
                    f"(max_nodes={cur.max_nodes}) could be reused; dropped compute buffers: {dropped}",
                    {"rebuilt": True},
                )
            )
    return out


def fresh_variant(scenario: Scenario) -> Scenario:
    """The same scenario with every reuse replaced by a fresh ``sched_new`` of the new params."""
    steps = tuple(replace(s, reuse=False) if s.kind == "sched_new" else s for s in scenario.steps)
    return replace(scenario, steps=steps)


def reuse_equivalent(scenario: Scenario, reused: Trace, fresh: Trace) -> list[Violation]:
    """A reused scheduler behaves like a fresh one built with the new parameters on the same
    graphs: same assignment, same splits, no abort; its buffers may only be larger."""
    out: list[Violation] = []
    if reused.abort and not fresh.abort:
        a = reused.abort
        return [Violation("reuse-equivalent", a.step, f"the reused scheduler aborted where a fresh one did not: {a.message}", {"abort": True})]
    reusing = False
    for r, f in zip(reused.records, fresh.records):
        if r.kind == "sched_new":
            reusing = r.reused
            continue
        if not reusing or not r.node_backends:
            continue
        if r.node_backends != f.node_backends:
            k = next(j for j, (x, y) in enumerate(zip(r.node_backends, f.node_backends)) if x != y)
            out.append(Violation("reuse-equivalent", r.index, f"node {r.node_names[k]} on backend {r.node_backends[k]} in the reused scheduler, {f.node_backends[k]} in a fresh one", {"what": "assignment"}))
        elif [(s.backend, s.i_start) for s in r.splits] != [(s.backend, s.i_start) for s in f.splits]:
            out.append(Violation("reuse-equivalent", r.index, f"{r.n_splits} splits in the reused scheduler, {f.n_splits} in a fresh one", {"what": "splits"}))
        elif r.buffer_sizes and f.buffer_sizes and any(a < b for a, b in zip(r.buffer_sizes, f.buffer_sizes)):
            out.append(Violation("reuse-equivalent", r.index, f"reused buffers {list(r.buffer_sizes)} smaller than fresh {list(f.buffer_sizes)}", {"what": "buffers"}))
    return out


# decisions of the driver's reuse policy, read from the scenario: no engine needed; more
# reconfigurations than reuse-equivalent draws, so that no two properties draw the same examples
REUSE_SOUND = PropertyEntry(
    "reuse-sound", "the driver reuses a scheduler only where can_reuse(new, current) holds",
    draws=Draws("workloads", min_reconfigures=2), judge=lambda sc, o: reuse_sound(sc, o.trace, o.prediction), policy=True)
REUSE_COMPLETE = PropertyEntry(
    "reuse-complete", "the driver rebuilds no scheduler where can_reuse held",
    draws=Draws("workloads", min_reconfigures=3), judge=lambda sc, o: reuse_complete(sc, o.trace, o.prediction), policy=True)
# the reference explains its aborts (no-abort signs them), as for every property that runs the engine
REUSE_EQUIVALENT = PropertyEntry(
    "reuse-equivalent", "a reused scheduler behaves like a fresh one with the new parameters",
    needs=frozenset({ENGINE, REFERENCE, FRESH}), draws=Draws("workloads", captured="scenarios"),
    judge=lambda sc, o: reuse_equivalent(sc, o.trace, o.fresh),
    export=Export("fresh", "a scheduler kept across `sched_new` (the steps as given) does differently at the step from a fresh one "
                           "(the same steps with every kept scheduler made anew, a second run)",
                  observable=("assignment", "splits", "buffers", "abort")))
ENTRIES = (REUSE_SOUND, REUSE_COMPLETE, REUSE_EQUIVALENT)
