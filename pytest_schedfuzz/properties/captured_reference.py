"""llama-matches-reference: what ggml's scheduler did inside llama.cpp, as the reference predicts it.

Each reserve, alloc and split of a workload is captured (``cases.capture``): the graph llama.cpp
built, llama.cpp's own assignments, and what ggml did with it. The reference, given the captured
scenario, must predict the backend of every node and leaf, the number of splits, each backend's
compute buffer size and whether the step re-planned, step by step; the first difference is the
violation, in ggml's terms (the node, the backends, the sizes); where ggml aborted inside
llama.cpp, the reference must predict that abort at that step.
"""

from __future__ import annotations

from ..model.captured import Captured
from ..model.llama_workload import LlamaWorkload
from ..model.trace import Trace
from .base import CAPTURED, PropertyEntry, Violation
from .sites import RPC_FAILED

# judged by the fuzzer (``campaign.checks``): it needs the workload's graphs captured and predicted
LLAMA_MATCHES_REFERENCE = PropertyEntry(
    "llama-matches-reference", "the scheduler inside llama.cpp does what the reference predicts for its captured graphs",
    needs=frozenset({CAPTURED}), llama=True)
ENTRIES = (LLAMA_MATCHES_REFERENCE,)
PROPERTY = LLAMA_MATCHES_REFERENCE.id


def _call(w: LlamaWorkload, call: int) -> str:
    return "llama_init_from_model" if call < 0 or call >= len(w.calls) else f"call {call} ({w.calls[call].describe()})"


def llama_matches_reference(w: LlamaWorkload, captured: Captured, prediction: Trace) -> list[Violation]:
    """The first captured step where the reference's prediction differs from what ggml did."""
    sc = captured.scenario
    name = sc.layout.name
    records = {r.index: r for r in prediction.records}
    for s in captured.steps:
        where = f"{_call(w, s.call)}, {sc.steps[s.step].describe()} (step {s.step} of the captured scenario)"
        if prediction.abort is not None and prediction.abort.step <= s.step:
            return [Violation(PROPERTY, max(s.call, 0), f"{where}: the reference predicts {prediction.abort.kind} "
                              f"({prediction.abort.message.strip()[:300]}) where llama.cpp's scheduler went on", {"what": "abort"})]
        p = records[s.step]
        graph = sc.graph(sc.steps[s.step].graph or "")
        if p.node_backends != s.node_backends:
            k = next(i for i, (a, b) in enumerate(zip(p.node_backends, s.node_backends)) if a != b) if len(p.node_backends) == len(s.node_backends) else 0
            node = p.node_names[k] if k < len(p.node_names) else "?"
            op = graph.by_name[node].op if node in graph.by_name else "?"
            return [Violation(PROPERTY, max(s.call, 0), f"{where}: node #{k} {node} ({op}) ran on {_backend(name, s.node_backends, k)} inside "
                              f"llama.cpp; the reference puts it on {_backend(name, p.node_backends, k)}", {"what": "assignment"})]
        if p.leaf_backends != s.leaf_backends:
            k = next((i for i, (a, b) in enumerate(zip(p.leaf_backends, s.leaf_backends)) if a != b), 0)
            leaf = p.leaf_names[k] if k < len(p.leaf_names) else "?"
            return [Violation(PROPERTY, max(s.call, 0), f"{where}: leaf #{k} {leaf} is on {_backend(name, s.leaf_backends, k)} inside llama.cpp; "
                              f"the reference puts it on {_backend(name, p.leaf_backends, k)}", {"what": "leaf-assignment"})]
        if p.n_splits != s.n_splits:
            return [Violation(PROPERTY, max(s.call, 0), f"{where}: {s.n_splits} splits inside llama.cpp, the reference predicts {p.n_splits}",
                              {"what": "splits"})]
        if tuple(p.buffer_sizes) != s.buffer_sizes:
            k = next(i for i, (a, b) in enumerate(zip(p.buffer_sizes, s.buffer_sizes)) if a != b)
            return [Violation(PROPERTY, max(s.call, 0), f"{where}: {name(k)}'s compute buffer is {s.buffer_sizes[k]} bytes inside llama.cpp, "
                              f"the reference predicts {p.buffer_sizes[k]} (all: {list(s.buffer_sizes)} vs {list(p.buffer_sizes)})", {"what": "buffers"})]
        if bool(p.events) != s.realloc:
            said = "re-planned" if s.realloc else "kept its plan"
            return [Violation(PROPERTY, max(s.call, 0), f"{where}: ggml {said} inside llama.cpp; the reference predicts "
                              + ("; ".join(e.reason for e in p.events) if p.events else "no re-plan"), {"what": "realloc"})]
    if captured.abort is not None:
        step, call, message = captured.abort
        if prediction.abort is None and RPC_FAILED in message:
            return []  # an RPC server failed: no scheduler can predict that; llama-no-abort signs it by how the server failed
        if prediction.abort is None or prediction.abort.step != step:
            where = f"{_call(w, call)}, {sc.steps[step].describe()} (step {step} of the captured scenario)"
            said = "no abort" if prediction.abort is None else f"an abort at step {prediction.abort.step}"
            return [Violation(PROPERTY, max(call, 0), f"{where}: ggml aborted inside llama.cpp ({message.strip()[:300]}); the reference predicts {said}",
                              {"what": "abort"})]
    return []


def _backend(name: object, ids: tuple[int, ...], k: int) -> str:
    if k >= len(ids):
        return "nothing (the graph is shorter)"
    return "no backend" if ids[k] < 0 else f"{name(ids[k])} (#{ids[k]})"  # type: ignore[operator]
