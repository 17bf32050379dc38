"""How a llama.cpp re-plan is explained and signed (``llama-no-same-size-realloc``'s helpers):
the calls as a signature and a message name them, the call that made the re-plan, ggml's reason
for it in the terms that separate causes (``replan_reason``), and what changed the graph between
the reservation and the re-plan (another kind of graph, another batch class).
"""

from __future__ import annotations

import math
import re

from ..model.llama_calls import SWITCHES, signed_kind
from ..model.llama_trace import SchedCall
from ..model.llama_workload import LlamaWorkload
from .base import reason_kind, role


def call_kind(w: LlamaWorkload, index: int) -> str:
    """The kind of call ``index`` as a signature names it (``init``: the context's constructor,
    ``free``: after the last). A speculative step is a ``decode``: llama.cpp sees only the batches
    it decodes (its message still names the step), and a known cause stays one signature."""
    if index < 0:
        return "init"
    return signed_kind(w.calls[index].kind) if index < len(w.calls) else "free"


def call_name(w: LlamaWorkload, index: int) -> str:
    if index < 0:
        return "llama_init_from_model"
    if index >= len(w.calls):
        return "llama_free"
    return f"call {index} {w.calls[index].describe()}"


def what_grew(plan: SchedCall, now: SchedCall) -> str:
    grew = [f"{k} {list(plan.inputs[k])} -> {list(v)}" for k, v in sorted(now.inputs.items()) if k in plan.inputs and tuple(v) != tuple(plan.inputs[k])]
    return "; ".join(grew) or "no input shape changed"


META_DEVICES = re.compile(r"Meta\([^)]*\)")
# the meta device's "unsupported mul_mat split states: node=%s src0=%s axis=%d ..." names the
# node and its sources as the model named them (``attn_out-0``, or ggml's ``node_7`` where the MTP
# model leaves it unnamed; a per-device copy ``Meta(...)#kqv_out-0#0``): one check in one place
# (its site) is one cause whatever the names
META_TENSORS = re.compile(r"\b(node|src\d+)=\S+")


def replan_trigger(w: LlamaWorkload, after: int, call: int) -> tuple[str, int | None]:
    """The call that re-planned, with the last switch made since ``after`` (the reservation),
    and that switch's index."""
    if call < 0 or call >= len(w.calls):
        return call_name(w, call).split(" ")[0], None
    kind = call_kind(w, call)
    switches = [i for i in range(max(after + 1, 0), call) if w.calls[i].kind in SWITCHES]
    if not switches:
        return kind, None
    last = w.calls[switches[-1]]
    return f"{kind} after {last.kind}({str(last.on).lower()})", switches[-1]


def invalid_reason(s: SchedCall) -> str:
    """ggml's reason for re-plan ``s`` (``reason_kind``), with the op and role (its sources, by
    role) of the node it names where llama.cpp left that node unnamed: ``node_N`` alone would be
    any node of any graph.

    >>> invalid_reason(SchedCall("alloc", 0, realloc_reason="node node_7 is not valid", invalid_node="GET_ROWS(cache_r_l0 (reshaped), out_ids)"))
    'node node_N (GET_ROWS(cache_r_lN (reshaped), out_ids))'
    """
    reason = reason_kind(s.realloc_reason)
    if not (s.invalid_node and "node_N" in reason):
        return reason
    op, _, srcs = s.invalid_node.partition("(")
    return f"{reason} ({op}({', '.join(role(x) for x in srcs[:-1].split(', ') if x)}))"


# re-plan causes that depend on the batch alone (``replan_reason``)
BY_BATCH = ("(op offload)", "(MoE cache lookup)")


def replan_reason(x: SchedCall, r: SchedCall) -> str:
    """Why ggml re-planned at ``x`` after reservation ``r``, in terms that separate causes and
    that every build tells alike (a Release build prints no allocator reason; ggml's realloc
    callback and the harness's counts say the rest). ggml's checks, in ``ggml_backend_sched_alloc_graph``
    and ``ggml_gallocr_needs_realloc`` order: the backend ids changed (``changed``, with what
    moved: op offload, the MoE cache's lookup, no tensor at a common position, or the kind of
    tensor that moved), else another number of nodes (``nodes``) or leafs (``leafs``) than the
    plan's (``r``'s: ``x`` is the first re-plan after it), else a tensor no longer valid (``not
    valid``: which one only a Debug build names, and it is in the message; the call and the
    switch before it, and the topology, sign the cause). Between graphs of
    different topologies ggml compares backend ids by position, so the "tensor that moved" is
    whichever one now sits where the two graphs first differ: not a cause, and left to the message
    (the topology's class signs it instead)."""
    if x.kind == "reserve_size":
        return "reserve_size"
    if x.backend_ids_changed:
        # b11739's MoE cache: its lookup reads a slot map (a host weight the scheduler copies to the device)
        # only in a ubatch small enough for the cache: the cause whichever node the graphs first differ at
        if any(o.startswith("moe_cache.") for o in set(x.offloaded) ^ set(r.offloaded)):
            return "changed (MoE cache lookup)"
        if x.moved.startswith("no node"):
            return "changed (no tensor at a common position)"
        # one cause whichever op moved (the embeddings, an FFN an override keeps on the CPU): the
        # moved node reads a weight in host memory (only op offload puts it on a device), or the
        # same graph copies other host-resident weights
        if x.moved_by_offload or (x.offloaded != r.offloaded and (x.n_nodes, x.n_leafs) == (r.n_nodes, r.n_leafs)):
            return "changed (op offload)"
        if (r.n_nodes, r.n_leafs) != (x.n_nodes, x.n_leafs) or not x.moved:
            return "changed"
        return f"changed ({moved_kind(x.moved)})"
    if x.n_nodes != r.n_nodes:
        return "nodes"
    if x.n_leafs != r.n_leafs:
        return "leafs"
    return "not valid"


def moved_kind(moved: str) -> str:
    """The kind of tensor that moved (``node OP``, ``leaf input``, ``leaf weight``; ``leaf reordered``:
    the same leafs in another order, ``leaf_order.reordered``) from the worker's
    "node NAME (KIND): #0 RPC0[...] -> #2 CPU": neither its name (the model's) nor the devices
    (drawn: the same tensor moves to the CPU or to another device by the layout) are the cause.

    >>> moved_kind("node norm-3 (RMS_NORM): #0 RPC0[127.0.0.1:5] -> #1 RPC0[127.0.0.1:6]")
    'node RMS_NORM'
    """
    m = re.match(r"(node|leaf) .* \(([^()]+)\): #", moved)
    return f"{m.group(1)} {m.group(2)}" if m else moved.split(" ", 1)[0]


# llama.cpp's pooling inputs (``build_inp_mean``, ``build_inp_cls``, which CLS, LAST and RANK
# pooling share): which pooling a context has is not another cause
_POOLING_INPUTS = frozenset({"mean", "cls"})


def graph_kind(r: SchedCall, x: SchedCall) -> str:
    """Input leafs the re-planned graph has and the reservation's has not (``+``), or the other
    way round (``-``): another kind of graph (embeddings, pooling, samplers), not another size.

    >>> graph_kind(SchedCall("reserve", 0, inputs={"inp_tokens": (8,), "mean": (8, 8)}), SchedCall("alloc", 0, inputs={"inp_tokens": (1,)}))
    '-pooling'
    """
    def kind(n: str) -> str:
        return "pooling" if n in _POOLING_INPUTS else role(n)

    added = sorted({kind(n) for n in set(x.inputs) - set(r.inputs)})
    gone = sorted({kind(n) for n in set(r.inputs) - set(x.inputs)})
    return " ".join([f"+{n}" for n in added] + [f"-{n}" for n in gone])


def batch_class(s: SchedCall) -> tuple[str, str]:
    """The classes of batch llama.cpp builds another graph topology for: its outputs (``out_ids``:
    none, some, or all of the ubatch's tokens, where the output rows are not gathered) and its
    tokens (one or many)."""
    n = (s.inputs.get("inp_tokens") or s.inputs.get("inp_pos") or (0,))[0]
    out = s.inputs.get("out_ids")
    outputs = "-" if out is None else "none" if out[0] == 0 else "all" if out[0] == n else "some"
    return outputs, "one" if n == 1 else "many"


def topology_cause(r: SchedCall, x: SchedCall) -> str:
    """What changed the topology between reservation ``r`` and re-plan ``x`` when no switch call
    and no other kind of graph did: the batch's outputs class, else its tokens class
    (``batch_class``), else "sizes" (the sizes alone changed it). Which class it went from and
    to is in the message: a signature per pair split one cause a dozen ways.

    >>> topology_cause(SchedCall("reserve", 0, inputs={"inp_tokens": (8,), "out_ids": (8,)}), SchedCall("alloc", 0, inputs={"inp_tokens": (8,), "out_ids": (0,)}))
    'outputs'
    """
    was, now = batch_class(r), batch_class(x)
    return next((what for what, a, b in zip(("outputs", "tokens"), was, now) if a != b), "sizes")


def outgrown(r: SchedCall, s: SchedCall) -> str:
    """The input leafs of graph ``s`` with more elements than in reservation ``r`` (a mask laid out
    per stream holds as many), or absent from it, by role: what a reservation that does not dominate ``s`` failed to cover,
    in terms every build tells alike (which tensor ggml-alloc then finds invalid only a Debug
    build prints). "no input" where none is: a node inside the graph outgrew it (a MoE
    warmup's routing of every token to every expert).

    >>> outgrown(SchedCall("reserve", 0, inputs={"inp_tokens": (8,), "rs_s_copy": (4,)}), SchedCall("alloc", 0, inputs={"inp_tokens": (2,), "rs_s_copy": (4,)}))
    'no input'
    """
    grown = sorted({role(k) for k, v in s.inputs.items() if k not in r.inputs or math.prod(v) > math.prod(r.inputs[k])})
    return ", ".join(grown) or "no input"
