"""no-same-size-realloc: after a sufficient reservation, no reallocation at the same graph size
with the same backend ids (ggml 0.25.3's ``GGML_SCHED_DEBUG_REALLOC`` condition), each explained."""

from __future__ import annotations

from ..model.scenario import Scenario
from ..model.trace import Trace
from ..sim.driver import topology
from .base import ENGINE, REFERENCE, Draws, Export, PropertyEntry, Violation, reason_kind, reasons_agree, told_reason


def _last_claim(scenario: Scenario, step: int) -> int | None:
    """The driver's last reservation for the current scheduler before ``step``."""
    for i in range(step - 1, -1, -1):
        s = scenario.steps[i]
        if s.kind == "reserve":
            return i
        if s.kind == "sched_new" and not s.reuse:
            return None
    return None


def no_same_size_realloc(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """After the driver's reservation for the current configuration, no alloc causes a
    same-size realloc. Each violation is explained by the reference: ``engine`` where the
    reference predicts no event, or another event, at that step or at the engine's re-plan in
    between that lost the reservation (``lost_by`` then names it); ``lost`` where a re-plan
    between the reservation and this step replaced the reserved plan; ``not-dominating`` where
    the reservation's graph did not cover this one. The signature adds, for ``lost``, the step
    kind and reason of the re-plan that lost it and whether that re-plan's graph had the
    reservation's topology (``topology=same``: an assignment change, such as op offload by batch
    size, which no topology-driven re-reservation can catch; ``switch``: another topology, which a
    driver that re-reserves on topology changes must have reserved for), and otherwise the
    invalid tensor."""
    out = []
    predicted = {e.step: e for e in prediction.events}
    for ev in trace.events:
        if not ev.same_size or scenario.steps[ev.step].kind == "reserve":
            continue
        claim = _last_claim(scenario, ev.step)
        if claim is None:
            continue
        graph = scenario.steps[ev.step].graph
        claimed = scenario.steps[claim].graph
        head = f"same-size realloc on {scenario.steps[ev.step].kind}({graph}): nodes = {ev.n_nodes}, splits = {ev.n_splits}, graph_size = {ev.graph_size}; reason: {ev.reason}"
        # the engine's own re-plans in between (what ggml did, not what the reference predicts):
        # one the reference does not predict is the engine's, never the known way of losing a reservation
        replans = [e for e in trace.events if claim < e.step < ev.step]
        p = predicted.get(ev.step)
        q = predicted.get(replans[0].step) if replans else None
        lost_by, topo = "-", None
        if p is None:
            why, kind = "the engine re-planned although the reference says the plan was still valid (engine bug)", "engine"
        elif not reasons_agree(ev.reason, p.reason) or p.same_size != ev.same_size:
            why, kind = f"engine and reference disagree about this step's event (engine bug): the reference predicts {p.describe()}", "engine"
        elif replans and (q is None or not reasons_agree(replans[0].reason, q.reason)):
            k = replans[0].step
            predicts = f"the reference predicts {q.describe()}" if q is not None else "the reference predicts no re-plan there"
            why = (f"the reservation of step {claim} ({claimed}) was lost by step {k}'s re-plan ({replans[0].reason}), where {predicts} "
                   f"(engine bug, in between)")
            kind = "engine"
            lost_by = f"{scenario.steps[k].kind} {reason_kind(told_reason(replans[0].reason, q.reason if q else None))}"
        elif replans:
            k = replans[0].step
            # the same op program with other assignments (op offload by batch size), or another graph
            same = topology(scenario.graph(scenario.steps[k].graph or "")) == topology(scenario.graph(claimed or ""))
            switch, topo = ("an assignment change", "same") if same else ("a topology switch", "switch")
            why = (f"the reservation of step {claim} ({claimed}) was lost: step {k} re-planned for "
                   f"{scenario.steps[k].graph} ({replans[0].reason}), {switch}")
            kind = "lost"
            lost_by = f"{scenario.steps[k].kind} {reason_kind(told_reason(replans[0].reason, q.reason if q else None))}"
        else:
            why = f"the reservation of step {claim} ({claimed}) does not dominate {graph}: {p.reason}"
            kind = "not-dominating"
        # a Release build tells no reason: the reference's for the same re-plan names it (``told_reason``)
        facts = {"explained": kind, "invalid": reason_kind(told_reason(ev.reason, p.reason if p else None)), "lost_by": lost_by}
        if kind == "lost":
            # the re-plan that lost the reservation is the cause; which tensor then shows it
            # invalid depends on the graphs (kept in the message)
            del facts["invalid"]
            facts["topology"] = topo
        out.append(Violation("no-same-size-realloc", ev.step, f"{head} — {why}", facts))
    return out


# many ubatches of one shape, no reconfiguration: the server's steady state, where same-size reallocs hide;
# and llama.cpp's captured graphs in its own order: its reservation, then its ubatches
NO_SAME_SIZE_REALLOC = PropertyEntry(
    "no-same-size-realloc", "no alloc re-plans at an unchanged graph size and backend ids after a sufficient reservation",
    needs=frozenset({ENGINE, REFERENCE}), draws=Draws("workloads", max_ubatches=8, min_reconfigures=0, captured="workloads"),
    judge=lambda sc, o: no_same_size_realloc(sc, o.trace, o.prediction),
    export=Export("realloc", "ggml's own check: the scheduler is made with `GGML_SCHED_DEBUG_REALLOC=1`, which aborts on a "
                             "reallocation with unchanged backend ids and graph size (\"unexpected graph reallocation\")"))
ENTRIES = (NO_SAME_SIZE_REALLOC,)
