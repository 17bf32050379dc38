"""Every property, in one fixed order: the entries each family module declares beside its
judges (``ENTRIES``), collected here. Every list of property ids, and every table keyed by them
(``properties.PROPERTIES``, ``properties.llama_properties.LLAMA_CHECKS``, what the exporters show), is a
view of ``REGISTRY``.

The order is the order the properties are fuzzed and reported in; each property draws its
examples in its turn, so changing the order changes the examples a seed gives."""

from __future__ import annotations

from collections.abc import Sequence

from . import aborts, agreement, captured_reference, llama_properties, realloc, reuse, values
from .base import LLAMA_GROUP, PropertyEntry

REGISTRY: tuple[PropertyEntry, ...] = (
    *reuse.ENTRIES,
    *realloc.ENTRIES,
    *agreement.ENTRIES,
    *values.ENTRIES,
    *aborts.ENTRIES,
    *llama_properties.ENTRIES,  # the llama.cpp properties judged on its runs
    *captured_reference.ENTRIES,  # judged on its captured graphs
)
ENTRIES = {p.id: p for p in REGISTRY}
assert len(ENTRIES) == len(REGISTRY), "a property id declared twice"
GRAPH_PROPERTY_IDS = tuple(p.id for p in REGISTRY if not p.llama)
# properties of the real llama.cpp (``llama_properties``): server-like workloads on a llama_context
LLAMA_PROPERTY_IDS = tuple(p.id for p in REGISTRY if p.llama)
PROPERTY_IDS = GRAPH_PROPERTY_IDS + LLAMA_PROPERTY_IDS
POLICY_PROPERTY_IDS = tuple(p.id for p in REGISTRY if p.policy)
EXPORTED_IDS = tuple(p.id for p in REGISTRY if p.exported)


def is_llama(prop: str) -> bool:
    return prop == LLAMA_GROUP or prop in LLAMA_PROPERTY_IDS


def fuzz_units(properties: Sequence[str], policy: bool = False) -> list[tuple[str, int]]:
    """What to fuzz for ``properties``, each with its weight in a shared time budget: every graph
    property alone (a policy property only with a user's ``policy``, else weight 0), and the
    llama.cpp properties as one ``LLAMA_GROUP`` worth as many shares as it judges properties."""
    graph = [(p, 0 if p in POLICY_PROPERTY_IDS and not policy else 1) for p in properties if not is_llama(p)]
    n_llama = sum(1 for p in properties if p in LLAMA_PROPERTY_IDS)
    return graph + ([(LLAMA_GROUP, n_llama)] if n_llama else [])
