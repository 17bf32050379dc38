"""Figures ggml keeps but does not tell, derived from what an engine observed: the one place the
harness computes them (``docs/design.md`` §12). The engines report raw counts only
(``model.trace.SizeCounts``: what each ``ggml_backend_sched_split_graph`` was given and made);
this module turns them into

* ``debug_graph_size`` (``Rules.graph_size``), which ggml's ``GGML_SCHED_DEBUG_REALLOC`` check
  compares, and from which, on a ggml without the realloc callback, a reallocation is judged
  same-size;
* the graph inputs ggml collects with ``n_copies > 1`` (``Rules.all_input_leafs_are_graph_inputs``);
* the node and leaf counts of the scheduler's graph copy, as in ggml's realloc message.

Each is confirmed against ggml where ggml tells it: ``tests/oracle/test_versions.py`` and
``tests/llama/test_llama.py`` compare them with the numbers ggml prints when
``GGML_SCHED_DEBUG_REALLOC`` aborts, and ``llama-counters-agree`` with the seeds' realloc callback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reference.rules import Rules, rules_for

from ..model.llama_trace import LlamaTrace
from ..model.trace import SizeCounts, Trace


def rules_of(engine: Mapping[str, str]) -> tuple[Rules, str | None]:
    """The rules of the ggml an engine loaded (its ``ggml_version``), and the reference's note
    when it uses the nearest version it knows."""
    return rules_for(engine.get("ggml_version"))


def graph_inputs(c: SizeCounts, rules: Rules) -> int:
    """``sched->n_graph_inputs``: 0.25.3's pass 6 takes every input leaf, 0.15.3's pass 5 the
    input leafs a non-view node reads; none unless ``n_copies > 1``."""
    if c.n_copies <= 1:
        return 0
    return c.input_leafs if rules.all_input_leafs_are_graph_inputs else c.input_leafs_read


def graph_size(c: SizeCounts | None, rules: Rules) -> int:
    """``sched->debug_graph_size`` after the split_graph ``c`` counts (0: none since
    ``ggml_backend_sched_new``, which callocs the scheduler)."""
    if c is None:
        return 0
    return rules.graph_size(c.n_nodes, c.n_leafs, c.n_splits, c.split_inputs + graph_inputs(c, rules), c.n_copies, c.n_dep_nodes)


def graph_copy(c: SizeCounts, rules: Rules) -> tuple[int, int]:
    """Nodes and leafs of ``sched->graph``: each split input adds two nodes (its source's view and
    its copy), and each dependency node one; with ``n_copies > 1`` the copies of the graph and
    split inputs also become leafs."""
    leafs = c.n_leafs + (c.n_copies * (graph_inputs(c, rules) + c.split_inputs) if c.n_copies > 1 else 0)
    return c.n_nodes + 2 * c.split_inputs + c.n_dep_nodes, leafs


def _noted(engine: Mapping[str, str], rules: Rules, note: str | None) -> dict[str, str]:
    return {**engine, "derived_with": f"ggml {rules.version}'s rules" + (f" ({note})" if note else "")}


def graph_trace(trace: Trace) -> Trace:
    """``trace`` with every step's graph size and graph-copy counts, and its reallocations'
    sizes, derived from the counts the engine observed (records without counts are kept: a
    target of the user's that fills them itself)."""
    rules, note = rules_of(trace.engine)
    records = []
    for r in trace.records:
        if r.counts is None:
            records.append(r)
            continue
        size, prev = graph_size(r.counts, rules), graph_size(r.prev_counts, rules)
        nodes, leafs = graph_copy(r.counts, rules)
        events = tuple(replace(e, graph_size=size, prev_graph_size=prev, n_nodes=nodes) for e in r.events)
        records.append(replace(r, graph_size=size, n_nodes=nodes, n_leafs=leafs, events=events))
    return replace(trace, records=tuple(records), engine=_noted(trace.engine, rules, note))


def llama_trace(trace: LlamaTrace) -> LlamaTrace:
    """``trace`` with every split_graph's graph size (and the previous one's) derived."""
    rules, note = rules_of(trace.engine)
    calls = tuple(
        replace(c, sched=tuple(
            replace(s, graph_size=graph_size(s.counts, rules), prev_graph_size=graph_size(s.prev_counts, rules)) if s.counts else s for s in c.sched
        ))
        for c in trace.calls
    )
    return replace(trace, calls=calls, engine=_noted(trace.engine, rules, note))
