"""Reruns that tell a finding's cause: the scenario again without what may cause it."""

from __future__ import annotations

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
