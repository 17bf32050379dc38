"""ggml's own figures, read where the harness otherwise derives them (``properties.derived``).

A ggml without the realloc callback does not tell a reallocation's graph size, nor the node and
leaf counts of its graph copy; the harness derives them from what ggml shows, with the reference's
formulas. ggml prints them itself when ``GGML_SCHED_DEBUG_REALLOC`` makes it abort in
``ggml_backend_sched_alloc_splits`` (``unexpected graph reallocation (graph size = G, nodes = N,
leafs = L)``): at its first same-size re-reservation with ``=1``, at its first re-reservation
with ``=2``. So in every run:

* a same-size finding on a ggml without the callback is replayed under ``=1`` before it is
  reported: ggml must abort at the same step with the derived figures, and not before
  (``check_same_size_decisions``; for llama.cpp, in the same call with the derived graph size:
  ``confirm_llama_same_size``);
* a graph-size finding, and one scenario in ``SAMPLE_EVERY`` (every one with
  ``--schedfuzz-size-oracle``), are replayed under ``=2``: where ggml first re-reserves, its
  figures are compared with the derived record and with the reference (``compare_first``);
* the same sample is replayed under ``=1`` too, whatever the derived decisions say, so that a
  same-size reallocation the formula calls "changed" is caught, not only one it calls "same".

The replays run with every device synchronous (``properties.synchronous_variant``): the
scheduler's decisions and figures do not depend on when a device computes, and a race must not
stop a replay before the step it reads. A disagreement is a finding
(``matches-reference[what=ggml-same-size|ggml-realloc|derived-graph-size|ggml-graph-size]``); a
replay that cannot run is a harness error.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from .. import properties as props
from ..engine import TargetError
from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import Scenario
from ..model.trace import ReallocEvent, Trace

Run = Callable[[Scenario], Trace]
SAMPLE_EVERY = 10
FIGURES = re.compile(r"unexpected graph reallocation \(graph size = (\d+), nodes = (\d+), leafs = (\d+)\)")
# the findings whose figure is derived where ggml has no realloc callback
SIZE_FINDINGS = ("no-same-size-realloc[", "matches-reference[what=graph_size]", "matches-reference[what=graph-copy]")


def sampled(scenario: Scenario, every: int = SAMPLE_EVERY) -> bool:
    """Whether ``scenario`` is in the run's sample: one in ``every``, chosen by its content, so that
    a replay of the same case is sampled again. The content is its layout, its steps and each
    graph's size and roots: writing every tensor out (``Scenario.dumps``) cost a graph step as
    much as its ggml calls."""
    if every <= 1:
        return True
    sketch = [scenario.layout.to_json(), [s.to_json() for s in scenario.steps], [[n, len(g.tensors), *g.roots] for n, g in scenario.graphs]]
    return zlib.crc32(json.dumps(sketch).encode()) % every == 0


def first_rereservation(trace: Trace, same_size: bool = False) -> ReallocEvent | None:
    """The first re-reservation of ``ggml_backend_sched_alloc_splits`` (``via`` sched), or the
    first same-size one: where ``GGML_SCHED_DEBUG_REALLOC`` (=2, =1) makes ggml abort."""
    return next((e for e in trace.events if e.via == "sched" and (e.same_size or not same_size)), None)


@dataclass(frozen=True)
class Figures:
    """What ggml printed when ``GGML_SCHED_DEBUG_REALLOC`` stopped it: the step, or None where it
    ran every step, and its graph size, nodes and leafs."""

    step: int | None
    graph_size: int = 0
    n_nodes: int = 0
    n_leafs: int = 0

    def text(self) -> str:
        return f"graph size {self.graph_size}, {self.n_nodes} nodes, {self.n_leafs} leafs"


def read_figures(level: int, scenario: Scenario, trace: Trace, run: Run) -> Figures:
    """``scenario`` run under ``GGML_SCHED_DEBUG_REALLOC=level``; a ``TargetError`` (a harness
    error) when it ends otherwise than by running every step (or up to the abort the engine's
    ``trace`` ends with, the same) or by ggml's realloc check."""
    abort = run(props.synchronous_variant(scenario)).abort
    if abort is None:
        return Figures(None)
    m = FIGURES.search(abort.message)
    if m is None and trace.abort is not None and (trace.abort.step, trace.abort.kind) == (abort.step, abort.kind):
        return Figures(None)
    if m is None:
        first = abort.message.strip().splitlines()[0] if abort.message.strip() else abort.kind
        raise TargetError(f"harness error: the replay under GGML_SCHED_DEBUG_REALLOC={level} that reads ggml's own figures could not run: "
                          f"a {abort.kind} at step {abort.step}: {first}")
    return Figures(abort.step, *(int(x) for x in m.groups()))


def check_same_size_decisions(scenario: Scenario, trace: Trace, run_level1: Run) -> tuple[list[props.Violation], str]:
    """ggml's own check (``=1``) against the derived same/changed decisions, in both directions:
    it must abort at the trace's first derived same-size re-reservation with the derived figures,
    and must not abort earlier (a re-reservation derived "changed" that ggml finds same-size: a
    false negative of the formula). Returns the violations and which decision was checked:
    ``same`` (a derived same-size one), ``changed`` (none derived before the end), or
    ``missed``/``false`` where ggml disagrees."""
    ggml = read_figures(1, scenario, trace, run_level1)
    e = first_rereservation(trace, same_size=True)
    if e is not None and ggml.step == e.step:
        r = trace.records[e.step]
        if ggml == Figures(e.step, r.graph_size, r.n_nodes, r.n_leafs):
            return [], "same"
    if e is None and ggml.step is None:
        return [], "changed"
    if ggml.step is not None and (e is None or ggml.step < e.step):
        derived = next((x for x in trace.events if x.step == ggml.step and x.via == "sched"), None)
        said = (f"the harness derives a changed size there (graph size {derived.graph_size}, prev {derived.prev_graph_size}, "
                f"backend_ids_changed = {int(derived.backend_ids_changed)})" if derived is not None else "the engine's records show no re-reservation there")
        return [props.Violation("matches-reference", ggml.step, f"{scenario.steps[ggml.step].describe()}: ggml's own check (GGML_SCHED_DEBUG_REALLOC=1) "
                                f"stops at a same-size reallocation ({ggml.text()}); {said}", {"what": "derived-changed"})], "missed"
    assert e is not None
    r = trace.records[e.step]
    said = "ran every step" if ggml.step is None else f"aborted at step {ggml.step} with {ggml.text()}"
    return [props.Violation("matches-reference", e.step,
                            f"{scenario.steps[e.step].describe()}: the harness derives a same-size reallocation here "
                            f"({Figures(e.step, r.graph_size, r.n_nodes, r.n_leafs).text()}, prev graph size {e.prev_graph_size}); "
                            f"ggml's own check (GGML_SCHED_DEBUG_REALLOC=1) {said}", {"what": "ggml-same-size"})], "false"


def compare_first(scenario: Scenario, trace: Trace, prediction: Trace, run_level2: Run) -> tuple[list[props.Violation], bool]:
    """ggml's figures (``=2``) at its first re-reservation against the derived record and the
    reference's; ``True`` when a step's figures were compared."""
    ggml = read_figures(2, scenario, trace, run_level2)
    e = first_rereservation(trace)
    if trace.abort is not None and e is None and (ggml.step is None or ggml.step >= trace.abort.step):
        return [], False  # the engine's run ended before ggml first re-reserved: nothing to compare
    if ggml.step is None and e is None:
        return [], False
    if e is None or ggml.step != e.step:
        where = "nowhere" if e is None else f"first at step {e.step}"
        said = "ran every step" if ggml.step is None else f"first re-reserved at step {ggml.step}"
        step = ggml.step if ggml.step is not None else (e.step if e is not None else 0)
        return [props.Violation("matches-reference", step, f"the engine's records show ggml_backend_sched_alloc_splits re-reserving {where}; "
                                f"under GGML_SCHED_DEBUG_REALLOC=2 ggml {said}", {"what": "ggml-realloc"})], False
    out = []
    head = f"{scenario.steps[e.step].describe()}: ggml's own figures at its first re-reservation: {ggml.text()}"
    if e.step < len(prediction.records):
        p = prediction.records[e.step]
        if (p.graph_size, p.n_nodes, p.n_leafs) != (ggml.graph_size, ggml.n_nodes, ggml.n_leafs):
            out.append(props.Violation("matches-reference", e.step, f"{head}; the reference predicts graph size {p.graph_size}, {p.n_nodes} nodes, "
                                       f"{p.n_leafs} leafs", {"what": "ggml-graph-size"}))
    r = trace.records[e.step]
    if (r.graph_size, r.n_nodes, r.n_leafs) != (ggml.graph_size, ggml.n_nodes, ggml.n_leafs):
        out.append(props.Violation("matches-reference", e.step, f"{head}; the harness derives graph size {r.graph_size}, {r.n_nodes} nodes, "
                                   f"{r.n_leafs} leafs from what ggml showed (properties.derived)", {"what": "derived-graph-size"}))
    return out, True


def confirm_llama_same_size(workload: LlamaWorkload, trace: LlamaTrace, run_level1: Callable[[LlamaWorkload], LlamaTrace]) -> list[props.Violation]:
    """ggml's own check (``=1``) on llama.cpp: the workload must abort in the call of the trace's
    first same-size reallocation, with its derived graph size; a replay that ends otherwise than
    in ggml's check (or in the engine's own abort) is a harness error."""
    # ggml's check is in ggml_backend_sched_alloc_splits: allocs, never a reserve
    first = next(((call, s) for call, s in trace.sched_calls() if s.kind == "alloc" and s.realloc and s.same_size), None)
    if first is None:
        return []
    call, s = first
    abort = run_level1(workload).abort
    m = FIGURES.search(abort.message) if abort is not None else None
    if abort is not None and m is None and not (trace.abort is not None and (trace.abort.call, trace.abort.kind) == (abort.call, abort.kind)):
        first_line = abort.message.strip().splitlines()[0] if abort.message.strip() else abort.kind
        raise TargetError(f"harness error: the replay under GGML_SCHED_DEBUG_REALLOC=1 that confirms a same-size reallocation could not run: "
                          f"a {abort.kind} in call {abort.call}: {first_line}")
    if abort is not None and m is not None and abort.call == call and int(m.group(1)) == s.graph_size:
        return []
    said = "ran every call" if m is None or abort is None else f"aborted in call {abort.call} with graph size {m.group(1)}"
    return [props.Violation("llama-no-same-size-realloc", call,
                            f"the harness derives a same-size reallocation in call {call} (graph size {s.graph_size}, prev {s.prev_graph_size}); "
                            f"ggml's own check (GGML_SCHED_DEBUG_REALLOC=1) {said}", {"what": "ggml-same-size"})]
