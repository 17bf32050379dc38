"""The properties: pure functions from what was observed of a scenario to violations.

Each violation carries a stable property id, the step where it broke, a one-line message in
the scheduler's own terms, and the facts that make up its failure signature. ``PROPERTIES``
gives every graph property one interface: ``judge(scenario, observed)``, where ``observed``
holds what its ``needs`` asked for (the engine's trace, the reference's prediction, the
engine's run with fresh schedulers). Every property that runs the engine also reports the
run's aborts as ``no-abort`` violations: a crash is a finding whatever was being checked.
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.scenario import Scenario
from .aborts import at_site, no_abort, with_c_stack, without_c_stack
from .agreement import matches_reference
from .base import (
    ENGINE,
    ENTRIES,
    EXPORTED_IDS,
    FRESH,
    GRAPH_PROPERTY_IDS,
    LLAMA_GROUP,
    LLAMA_PROPERTY_IDS,
    POLICY_PROPERTY_IDS,
    PROPERTY_IDS,
    REFERENCE,
    REGISTRY,
    VALUES,
    Draws,
    Observed,
    Property,
    PropertyEntry,
    Violation,
    fuzz_units,
    is_llama,
    normalize_reason,
    reason_kind,
    role,
)
from .realloc import no_same_size_realloc
from .reuse import fresh_variant, reuse_complete, reuse_equivalent, reuse_sound
from .values import as_forced_view, as_race, forced_views, same_values, synchronous_variant, unforced_views_variant


def _property(id: str, needs: set[str], draws: Draws, judge: Callable[[Scenario, Observed], list[Violation]]) -> Property:
    return Property(id, frozenset(needs), draws, judge)


PROPERTIES: dict[str, Property] = {p.id: p for p in (
    # decisions of the driver's reuse policy, read from the scenario: no engine needed; more
    # reconfigurations than reuse-equivalent draws, so that no two properties draw the same examples
    _property("reuse-sound", set(), Draws("workloads", min_reconfigures=2), lambda sc, o: reuse_sound(sc, o.trace, o.prediction)),
    _property("reuse-complete", set(), Draws("workloads", min_reconfigures=3), lambda sc, o: reuse_complete(sc, o.trace, o.prediction)),
    # the reference explains its aborts (no-abort signs them), as for every property that runs the engine
    _property("reuse-equivalent", {ENGINE, REFERENCE, FRESH}, Draws("workloads", captured="scenarios"), lambda sc, o: reuse_equivalent(sc, o.trace, o.fresh)),
    # many ubatches of one shape, no reconfiguration: the server's steady state, where same-size reallocs hide;
    # and llama.cpp's captured graphs in its own order: its reservation, then its ubatches
    _property("no-same-size-realloc", {ENGINE, REFERENCE}, Draws("workloads", max_ubatches=8, min_reconfigures=0, captured="workloads"),
              lambda sc, o: no_same_size_realloc(sc, o.trace, o.prediction)),
    # driver workloads too: same-topology growth and re-plans within a reservation happen there;
    # and llama.cpp's captured graphs in drawn step sequences (reuse-equivalent and same-values
    # too: the values oracle fills a capture's inputs as any graph's)
    _property("matches-reference", {ENGINE, REFERENCE}, Draws("both", max_ubatches=8, min_reconfigures=0, captured="scenarios"),
              lambda sc, o: matches_reference(sc, o.trace, o.prediction)),
    _property("same-values", {ENGINE, REFERENCE, VALUES}, Draws("scenarios", captured="scenarios"), lambda sc, o: same_values(sc, o.trace, o.prediction)),
    # every engine property reports aborts; no-abort's own examples are what none of them draws:
    # workloads with many reconfigurations, and raw scenarios
    _property("no-abort", {ENGINE, REFERENCE}, Draws("both", max_ubatches=6, min_reconfigures=2),
              lambda sc, o: no_abort(sc, o.trace, o.prediction)),
)}

assert tuple(PROPERTIES) == GRAPH_PROPERTY_IDS, "a graph property's judgement for each graph entry of REGISTRY, in its order"


__all__ = [
    "ENGINE", "ENTRIES", "EXPORTED_IDS", "FRESH", "GRAPH_PROPERTY_IDS", "LLAMA_GROUP", "LLAMA_PROPERTY_IDS", "POLICY_PROPERTY_IDS", "PROPERTIES", "PROPERTY_IDS", "REFERENCE", "REGISTRY", "VALUES", "Draws",
    "Observed", "Property", "PropertyEntry", "Violation", "as_forced_view", "as_race", "at_site", "forced_views", "fresh_variant", "fuzz_units", "is_llama",
    "matches_reference", "no_abort", "no_same_size_realloc", "normalize_reason", "reason_kind", "reuse_complete", "reuse_equivalent",
    "reuse_sound", "role", "same_values", "synchronous_variant", "unforced_views_variant", "with_c_stack", "without_c_stack",
]
