"""The properties: pure functions from what was observed of a scenario to violations.

Each violation carries a stable property id, the step where it broke, a one-line message in
the scheduler's own terms, and the facts that make up its failure signature. Each property is
one entry (``PropertyEntry``: id, docs text, needs, draws, judge, export), declared in its
family's module beside its judge; ``registry.REGISTRY`` collects them in a fixed order and
every list of ids is a view of it. ``PROPERTIES`` gives every graph property one interface: ``judge(scenario, observed)``, where ``observed``
holds what its ``needs`` asked for (the engine's trace, the reference's prediction, the
engine's run with fresh schedulers). Every property that runs the engine also reports the
run's aborts as ``no-abort`` violations: a crash is a finding whatever was being checked.
"""

from __future__ import annotations

from .aborts import at_site, no_abort, with_c_stack, without_c_stack
from .agreement import matches_reference
from .base import (
    CAPTURED,
    COSTLY,
    CPU_ONLY,
    ENGINE,
    FRESH,
    LLAMA_GROUP,
    REFERENCE,
    SAMPLE,
    VALUES,
    Draws,
    Export,
    Observed,
    Property,
    PropertyEntry,
    Violation,
    normalize_reason,
    reason_kind,
    role,
)
from .realloc import no_same_size_realloc
from .registry import (
    ENTRIES,
    EXPORTED_IDS,
    GRAPH_PROPERTY_IDS,
    LLAMA_PROPERTY_IDS,
    POLICY_PROPERTY_IDS,
    PROPERTY_IDS,
    REGISTRY,
    fuzz_units,
    is_llama,
)
from .reuse import fresh_variant, reuse_complete, reuse_equivalent, reuse_sound
from .values import as_forced_view, as_race, forced_views, same_values, synchronous_variant, unforced_views_variant


def _graph_property(entry: PropertyEntry) -> Property:
    assert entry.draws is not None and entry.judge is not None, f"{entry.id}: a graph property is drawn and judged"
    return Property(entry.id, entry.needs, entry.draws, entry.judge)


# the graph properties, in the registry's order: each entry's needs, draws and judge
PROPERTIES: dict[str, Property] = {p.id: _graph_property(p) for p in REGISTRY if not p.llama}


__all__ = [
    "CAPTURED", "COSTLY", "CPU_ONLY", "ENGINE", "ENTRIES", "EXPORTED_IDS", "FRESH", "GRAPH_PROPERTY_IDS", "LLAMA_GROUP", "LLAMA_PROPERTY_IDS", "POLICY_PROPERTY_IDS", "PROPERTIES", "PROPERTY_IDS", "REFERENCE", "REGISTRY", "SAMPLE", "VALUES", "Draws",
    "Export", "Observed", "Property", "PropertyEntry", "Violation", "as_forced_view", "as_race", "at_site", "forced_views", "fresh_variant", "fuzz_units", "is_llama",
    "matches_reference", "no_abort", "no_same_size_realloc", "normalize_reason", "reason_kind", "reuse_complete", "reuse_equivalent",
    "reuse_sound", "role", "same_values", "synchronous_variant", "unforced_views_variant", "with_c_stack", "without_c_stack",
]
