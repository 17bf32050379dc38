"""Reruns that tell a finding's cause: a variant of the scenario without what may cause it, or
ggml's own figures at the step (``size_oracle_check``)."""

from __future__ import annotations

import re
from collections.abc import Callable

from .. import properties as props
from ..model.scenario import Scenario
from ..model.trace import Trace

Run = Callable[[Scenario], Trace]


def causes_told_apart(scenario: Scenario, prediction: Trace, found: list[props.Violation], run: Run) -> list[props.Violation]:
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
        trace = run(variant)
        still = {v.property for v in props.no_abort(variant, trace, prediction) + props.same_values(variant, trace, prediction)}
        found = [resign(v, scenario) if unexplained(v, kinds) and v.property not in still else v for v in found]
    return found


def size_oracle_check(scenario: Scenario, prediction: Trace, run_oracle: Run) -> list[props.Violation]:
    """ggml's own figures against the reference's: ``run_oracle`` runs the scenario under
    ``GGML_SCHED_DEBUG_REALLOC=2``, where ggml aborts at its first reallocation through the
    scheduler and prints that step's ``debug_graph_size`` and the node and leaf counts of its
    graph copy. The engine's records derive those from what ggml shows (splits, inputs); this
    observes them, so a scheduler that builds another graph copy cannot hide behind the
    rule both sides share."""
    abort = run_oracle(scenario).abort
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
