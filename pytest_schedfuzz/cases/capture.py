"""A llama.cpp workload's graphs as a graph-level scenario: what ``schedfuzz capture`` writes.

``LlamaTarget.run(capture=True)`` reads, at every reserve and alloc, the graph llama.cpp handed
the scheduler (every node and leaf: op, op params, type, shape, strides, sources, view source,
flags, name, buffer type) and, after ``split_graph``, the backend ggml gave each node and leaf
and each backend's compute buffer size. This module turns that into a ``Scenario``:

* the layout: the scheduler's backends in its order (RPC devices, GPU-like devices with the
  workload's settings, the CPU last);
* each distinct graph as a ``GraphSpec``: the leafs (weights and KV cache on the device whose
  buffer type holds them, inputs), then the nodes in ggml's order, each as the op of the graph
  engine that ggml's constructor makes (``ops.CAPTURED``) with llama.cpp's own ``op_params`` words,
  handed to ``ggml_build_forward_expand`` one by one so that the engine's graph has ggml's order;
* the steps in order: ``sched_new`` with its params, each reserve, each alloc, and each
  ``split`` (llama.cpp calling ``ggml_backend_sched_split_graph`` itself: its flash-attention
  probe), each graph with the assignments llama.cpp made (``ggml_backend_sched_set_tensor_backend``);

and keeps, per step, what ggml did inside llama.cpp (``CapturedStep``). Every tensor's shape,
strides and view offset are checked against ggml's: a graph this cannot say exactly is a
``CaptureError`` naming the tensor, never an approximation.
"""

from __future__ import annotations

import functools
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..model import ops
from ..model.captured import Captured, CapturedStep
from ..model.graph_spec import GraphSpec, TensorSpec
from ..model.layout import BackendLayout, BackendSpec
from ..model.llama_trace import LlamaTrace
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import Scenario, SchedParams, Step
from ..model.shapes import TYPES, SpecError

TENSOR_FLAG_INPUT, TENSOR_FLAG_OUTPUT = 1, 2
BUFFER_USAGE_WEIGHTS = 1
MAX_NAME = 63
CAPTURED_LABEL = "llama.cpp: "  # how a captured graph's label starts (the statistics tell captured graphs by it)


class CaptureError(ValueError):
    """A captured graph or workload that no graph scenario can say exactly; ``kind``: the cause
    in a few words (the statistics count workloads by it)."""

    def __init__(self, message: str, kind: str = "other") -> None:
        super().__init__(message)
        self.kind = kind


def _dims(ne: Sequence[int]) -> int:
    """ggml's ``n_dims``: up to the last dimension above 1."""
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return max(n, 1)


def _shape(ne: Sequence[int]) -> tuple[int, ...]:
    """A captured ``ne`` as a spec's shape: its first ``_dims`` dimensions."""
    return tuple(map(int, ne[: _dims(ne)]))


Args = tuple[str | None, ...]
# GGML_OP_UNARY's kinds the graph engine makes (``ggml_op_desc`` names them)
UNARY_OPS = frozenset(op.ggml_desc for op in ops.CAPTURED.values() if op.unary)
GLU_OPS = ("REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK")  # enum ggml_glu_op, in order


@functools.cache
def _n_srcs(op: str, kind: str) -> int:
    """How many src[] the graph engine's constructor of ``kind`` sets (``Op.arity``); more is
    an input this module does not know (e.g. attention sinks), none an op it does not know."""
    ours = {"VIEW": "view", "RESHAPE": "reshape", "GLU": "glu"}.get(op) or (ops.CAPTURED[kind].name if kind in ops.CAPTURED else None)
    return ops.OPS[ours].arity if ours is not None else 0


def covered_ops() -> list[str]:
    """The ggml ops a captured graph may hold (the table of docs/llama.md)."""
    names = [f"UNARY ({k})" if k in UNARY_OPS else k for k in ops.CAPTURED]
    return sorted([*names, "VIEW", "RESHAPE", "CPY (ggml_cast)", *(f"GLU ({g})" for g in GLU_OPS)])


def _unique_names(tensors: Sequence[Mapping[str, Any]]) -> list[str]:
    """llama.cpp names many tensors alike (``Qcur-0`` through reshape and rope): the first keeps
    the name, the next get `` ~2``, `` ~3``... (not ``#``: ggml names input copies ``BACKEND#tensor#copy``)"""
    seen: dict[str, int] = {}
    out = []
    taken = {str(t["name"]) for t in tensors}
    for t in tensors:
        name = str(t["name"]) or "unnamed"
        if name in seen:
            k = seen[name]
            while True:
                k += 1
                cand = f"{name[: MAX_NAME - len(f' ~{k}')]} ~{k}"
                if cand not in taken:
                    break
            seen[name] = k
            taken.add(cand)
            name = cand
        else:
            seen[name] = 1
        out.append(name)
    return out


def llama_names(text: str) -> str:
    """``text`` (a reason, a message) with the tensors named as llama.cpp named them (``_unique_names``' suffixes dropped).

    >>> llama_names("node CPU#Qcur-0 ~2#0 is not valid")
    'node CPU#Qcur-0#0 is not valid'
    """
    return re.sub(r" ~\d+", "", text)


def _device_of(t: Mapping[str, Any], bufts: Sequence[str], layout: BackendLayout) -> int:
    """The backend whose buffer type holds leaf ``t``: the one of that name, or for host memory
    (``CPU``, ``CPU_Mapped``, a GPU's ``_Host``: every backend that takes one takes all) the CPU."""
    buft = str(t["buft"])
    for i in range(layout.n):
        if layout.buffer_buft(i) != "CPU" and bufts[i] == buft:
            return i
    if buft.startswith("CPU") or buft.endswith("_Host"):
        return layout.n - 1
    raise CaptureError(f"leaf {t['name']!r} is in a buffer of type {buft!r}, which no backend of the scheduler has ({', '.join(bufts)})", kind="buffer type")


def layout_of(names: Sequence[str], workload: LlamaWorkload, cpu_buft: str = "CPU") -> BackendLayout:
    """The scheduler's backends (``ggml_backend_name``, in its order) as a layout: ``RPC[...]``
    an RPC device, ``GPU<k>`` the workload's k-th GPU-like device, ``CPU`` the CPU. llama.cpp
    gives the CPU's compute buffer the host buffer type of the model's first device only
    (``cpu_buft``, as captured): the GPU-like device whose it is keeps ``host_buffer``, the others
    lose it (in a scenario it means nothing else). A layout names its devices by position: with
    ``split_mode`` none on ``main_gpu`` 1 the scheduler's only GPU-like device, ``GPU1``, is the
    scenario's ``GPU0`` (names are all that changes)."""
    specs = []
    for name in names:
        if name == "CPU":
            specs.append(BackendSpec("cpu"))
        elif name.startswith("RPC"):
            specs.append(BackendSpec("rpc"))
        elif name.startswith("GPU") and name[3:].isdigit() and int(name[3:]) < len(workload.devices.gpus):
            specs.append(replace(workload.devices.gpus[int(name[3:])], host_buffer=cpu_buft == f"{name}_Host"))
        else:
            raise CaptureError(f"the scheduler has a backend {name!r} that a graph scenario cannot make", kind="backend")
    try:
        layout = BackendLayout(tuple(specs))
    except SpecError as e:
        raise CaptureError(f"the scheduler's backends {list(names)}: {e}", kind="backend") from None
    gpus = [n for n in names if n.startswith("GPU")]
    renamed = {f"{old}_Host": f"GPU{k}_Host" for k, old in enumerate(gpus)}
    if layout.buft(layout.n - 1) != renamed.get(cpu_buft, cpu_buft):
        raise CaptureError(f"the CPU's compute buffer is of type {cpu_buft!r}, which the layout cannot give it", kind="buffer type")
    return layout


def graph_spec(graph: Mapping[str, Any], bufts: Sequence[str], layout: BackendLayout, label: str) -> GraphSpec:
    """One captured graph as a graph spec (leafs, then nodes in ggml's order, every node a root)."""
    leafs, nodes = list(graph["leafs"]), list(graph["nodes"])
    names = _unique_names(leafs + nodes)
    ref = {f"l{i}": names[i] for i in range(len(leafs))} | {f"n{i}": names[len(leafs) + i] for i in range(len(nodes))}
    tensors: list[TensorSpec] = []
    for i, t in enumerate(leafs):
        if t.get("view_src") or t["op"] != "NONE":
            raise CaptureError(f"leaf {t['name']!r}: a view or an op as a leaf ({t['op']}), which a graph spec has no form for", kind="leaf")
        if t.get("type") not in TYPES:
            raise CaptureError(f"leaf {t['name']!r}: type {t.get('type')} is not one the graph engine makes ({', '.join(TYPES)})", kind="type")
        ne = _shape(t["ne"])
        if int(t["flags"]) & TENSOR_FLAG_INPUT:
            tensors.append(TensorSpec(names[i], type=t["type"], ne=ne, role="input"))
        elif t.get("buft"):
            role = "weight" if int(t.get("usage", 0)) == BUFFER_USAGE_WEIGHTS else "cache"
            tensors.append(TensorSpec(names[i], type=t["type"], ne=ne, role=role, device=_device_of(t, bufts, layout)))
        else:
            raise CaptureError(f"leaf {t['name']!r}: neither an input nor in a buffer (a constant llama.cpp did not mark), no role for it", kind="leaf")
    cap_of = dict(zip(names, leafs + nodes))
    for k, t in enumerate(nodes):
        tensors.append(_node(t, names[len(leafs) + k], ref, cap_of))
    forced = []
    for t, backend in graph.get("forced", ()):
        if t not in ref or not 0 <= int(backend) < layout.n:
            raise CaptureError(f"graph {label}: llama.cpp assigned {t} to backend {backend}, which the capture cannot name", kind="forced")
        forced.append((ref[t], int(backend)))
    spec = GraphSpec(tuple(tensors), roots=_roots(nodes, names, len(leafs)), forced=tuple(forced), label=label)
    try:
        spec.validate(layout.n)
    except SpecError as e:
        raise CaptureError(f"graph {label}: {e}", kind="shape") from None
    _check_geometry(spec, leafs + nodes, names, ref)
    return spec


_RECENT: OrderedDict[tuple[str, tuple[str, ...], BackendLayout], GraphSpec] = OrderedDict()
RECENT_SPECS = 64  # about a third of a llama.cpp campaign's captured graphs repeat a recent one (a mutated workload's)


def _recent_spec(key: str, graph: Mapping[str, Any], bufts: Sequence[str], layout: BackendLayout, label: str) -> GraphSpec:
    """``graph_spec`` of a graph captured again (``key``: the worker's digest of its contents),
    from the last ``RECENT_SPECS`` made: made, validated and ordered by the reference once."""
    k = (key, tuple(bufts), layout)
    spec = _RECENT.get(k)
    if spec is None:
        spec = _RECENT[k] = graph_spec(graph, bufts, layout, label)
        if len(_RECENT) > RECENT_SPECS:
            _RECENT.popitem(last=False)
    else:
        _RECENT.move_to_end(k)
    return spec.relabeled(label)


def _roots(nodes: Sequence[Mapping[str, Any]], names: Sequence[str], n_leafs: int) -> tuple[str, ...]:
    """What to hand ``ggml_build_forward_expand``, in order, for ggml's node and leaf order: every
    node in its order, and before each the leafs up to the last one it reads, in theirs (ggml
    appends leafs as its depth-first walk meets them: ``Qcur = mul_mat(wq, attn_norm(x))`` meets
    ``wq`` before ``attn_norm``'s weight; and llama.cpp expands some inputs no node reads)."""
    roots: list[str] = []
    added = 0
    for k, t in enumerate(nodes):
        last = max((int(r[1:]) for r in t["src"] if r is not None and r.startswith("l")), default=-1)
        roots += names[added: last + 1]
        added = max(added, last + 1)
        roots.append(names[n_leafs + k])
    return tuple(roots + list(names[added:n_leafs]))


def _node(t: Mapping[str, Any], name: str, ref: Mapping[str, str], cap_of: Mapping[str, Mapping[str, Any]]) -> TensorSpec:
    """One node as the graph engine's op; ``cap_of``: every captured tensor by its (unique) name."""
    op = str(t["op"])
    srcs = tuple(map(ref.get, t["src"]))  # None stays None: ``ref`` has no None
    if srcs.count(None) != t["src"].count(None):
        raise CaptureError(f"node {t['name']!r}: a source outside the graph", kind="source")
    if op in ("UNARY", "GLU"):
        kind = str(t["desc"])
    else:
        kind = op
    if len(srcs) > _n_srcs(op, kind) or (op == "UNARY" and kind not in UNARY_OPS):
        raise CaptureError(f"node {t['name']!r}: op {kind} with {len(srcs)} sources is not one the graph engine makes "
                           f"(covered: {', '.join(covered_ops())})", kind=f"op {kind}")
    if op == "CPY" and len(t["src"]) == 2 and ref.get(str(t["src"][1])) == name:  # ggml_cast: src[1] is itself
        srcs, kind = srcs[:1], "CAST"
    words = tuple(map(int, t.get("op_params", ())))
    extra: dict[str, Any] = {"op_params": words} if words else {}
    if kind == "CAST":
        ours, args, params = "cast", srcs, {"type": str(t["type"])}
    elif op in ("VIEW", "RESHAPE"):
        ours, args, params = _view_args(t, srcs, cap_of)
    elif op == "GLU":
        if kind not in GLU_OPS:
            raise CaptureError(f"node {t['name']!r}: GLU op {kind} is not one the graph engine makes", kind=f"op {kind}")
        ours, args, params = "glu", (srcs[0], srcs[1] if len(srcs) > 1 else None), {"glu": GLU_OPS.index(kind), "swapped": bool(ops.word(t, 1))}
    else:
        if kind not in ops.CAPTURED:
            raise CaptureError(f"node {t['name']!r}: op {kind} is not one the graph engine makes (covered: {', '.join(covered_ops())})", kind=f"op {kind}")
        entry = ops.CAPTURED[kind]
        ours, args, params = entry.name, entry.args_of(srcs), entry.params_of(t)
        if ours == "cont" and list(t["ne"]) != list(cap_of[str(srcs[0])]["ne"]):
            params = {"ne": _shape(t["ne"])}  # ggml_cont_Nd
        if t.get("view_src") and ours not in ops.VIEW_OPS | {"set_rows", "cpy"}:  # ggml_<op>_inplace: the result views src 0
            if ours not in ops.INPLACE:
                raise CaptureError(f"node {t['name']!r}: {kind} viewing {t['view_src']}, an in-place form the graph engine does not make", kind=f"in-place {kind}")
            params = params | {"inplace": True}
    return TensorSpec(name, op=ours, type=str(t["type"]), ne=_shape(t["ne"]), args=args,
                      params=tuple(sorted((params | extra).items())), output=bool(int(t["flags"]) & TENSOR_FLAG_OUTPUT))


def _view_args(t: Mapping[str, Any], srcs: Args, cap_of: Mapping[str, Mapping[str, Any]]) -> tuple[str, Args, dict[str, Any]]:
    """A VIEW or RESHAPE as ``ggml_view_Nd``/``ggml_reshape_Nd`` make it: the fewest dims whose
    default strides give ggml's (a view's strides of dims of size 1 are whatever its caller passed)."""
    ne = [int(x) for x in t["ne"]]
    if t["op"] == "RESHAPE":
        return "reshape", srcs[:1], {"ne": tuple(ne[: _dims(ne)])}
    nb = [int(x) for x in t["nb"]]
    for dims in range(_dims(ne), 5):
        default = nb[:dims]
        while len(default) < 4:
            default.append(default[-1] * ne[len(default) - 1])
        if default == nb:
            break
    # ggml_view_impl takes the offset from the source's data; ggml stores it from the root's
    src = cap_of[str(srcs[0])]
    offset = int(t.get("view_offs", 0)) - (int(src.get("view_offs", 0)) if src.get("view_src") else 0)
    return "view", srcs[:1], {"ne": tuple(ne[:dims]), "nb": tuple(nb[1:dims]), "offset": offset}


def _check_geometry(spec: GraphSpec, captured: Sequence[Mapping[str, Any]], names: Sequence[str], ref: Mapping[str, str]) -> None:
    """Every tensor's shape, strides, view source and offset as the graph engine will make them,
    against ggml's: a difference is a capture that cannot be trusted."""
    geo = spec.geometry
    for name, t in zip(names, captured):
        g = geo[name]
        want_src = ref.get(str(t.get("view_src"))) if t.get("view_src") else None
        if list(g.ne) != [int(x) for x in t["ne"]] or list(g.nb) != [int(x) for x in t["nb"]] or g.type != t["type"]:
            raise CaptureError(f"tensor {name!r} ({t['op']}): the graph engine would make it {g.type} ne={list(g.ne)} nb={list(g.nb)}, "
                               f"ggml made it {t['type']} ne={t['ne']} nb={t['nb']}", kind="shape")
        if want_src is not None and (g.view_src != want_src or g.view_offs != int(t.get("view_offs", 0))):
            raise CaptureError(f"tensor {name!r} ({t['op']}): a view of {g.view_src} at {g.view_offs} here, "
                               f"of {want_src} at {t.get('view_offs')} in ggml", kind="view")


def preparer(workload: LlamaWorkload, warm: Callable[[GraphSpec], object]) -> Callable[[Mapping[str, Any]], None]:
    """What ``LlamaTarget.run(on_graph=)`` calls with each graph ``workload`` captures, as it
    arrives: its graph spec made (``_recent_spec``) and ``warm`` called with it (the reference
    builds its graph), while llama.cpp goes on with the workload, so that ``capture`` finds them
    made. A graph that cannot be made is left for ``capture``, which meets it again if it gets
    there (a call before it may end the capture) and says why, or fails with the same error."""
    def prepare(cap: Mapping[str, Any]) -> None:
        try:
            here = layout_of([str(x) for x in cap["backend_names"]], workload, str(cap["bufts"][-1]))
            warm(_recent_spec(str(cap["key"]), cap, cap["bufts"], here, CAPTURED_LABEL))
        except Exception:  # noqa: BLE001 -- made again, and raised, by capture() where it matters
            pass
    return prepare


def capture(workload: LlamaWorkload, trace: LlamaTrace, context: int = 0) -> Captured:
    """The scenario of a captured run (``LlamaTarget.run(workload, capture=True)``) and what ggml
    did at each of its reserves and allocs inside llama.cpp: of the target context's schedulers,
    or (``context`` 1) of the draft context's, each a scenario of its own."""
    calls = trace.sched_calls() + ([(trace.abort.call, s) for s in trace.abort.sched] if trace.abort is not None else [])
    calls = [(call, s) for call, s in calls if s.context == context]
    if trace.abort is not None and not any(s.capture for _, s in calls):
        raise CaptureError(f"the workload ended ({trace.abort.kind} in call {trace.abort.call}) before any graph was captured", kind="abort before a graph")
    layout: BackendLayout | None = None
    graphs: dict[str, str] = {}  # graph key (the worker's digest of its contents) -> its name
    specs: list[tuple[str, GraphSpec]] = []
    steps: list[Step] = []
    seen: list[CapturedStep] = []
    op_counts: dict[str, int] = {}
    live: int | None = None
    aborted: tuple[int, int, str] | None = None
    for call, s in calls:
        if s.kind == "new":
            live = s.sched
            steps.append(Step("sched_new", params=SchedParams(s.max_nodes, s.parallel, s.op_offload)))
            continue
        if s.kind == "reserve_size":
            raise CaptureError(f"call {call}: llama.cpp called ggml_backend_sched_reserve_size, which a graph scenario has no step for", kind="reserve_size")
        if s.kind not in ("reserve", "alloc", "split"):
            continue  # free (the next sched_new replaces it), and the seeds' llama.cpp's own records
        if not s.ok and not s.aborted:
            # the device's free memory refused a compute buffer (llama.cpp's gpu_free; its pipeline
            # parallelism fallback): a scenario's device has its whole memory, the reference none
            raise CaptureError(f"call {call}: a {s.kind} llama.cpp's scheduler could not allocate (the device's free memory), "
                               "which a scenario does not model", kind="failed allocation")
        if s.sched != live or s.capture is None:
            raise CaptureError(f"call {call}: a {s.kind} on scheduler {s.sched}, not the one built last ({live}), or not captured", kind="scheduler")
        cap = s.capture
        names = [str(x) for x in cap["backend_names"]]
        here = layout_of(names, workload, str(cap["bufts"][-1]))
        if layout is None:
            layout = here
        elif here != layout:
            raise CaptureError(f"call {call}: the scheduler's backends changed ({names}); a scenario has one layout", kind="backend")
        key = str(cap["key"])
        if key not in graphs:
            name = f"g{len(specs)}-c{call}-{s.kind}"
            specs.append((name, _recent_spec(key, cap, cap["bufts"], here, f"{CAPTURED_LABEL}{name}")))
            graphs[key] = name
            for t in cap["nodes"]:
                k = str(t["desc"]) if t["op"] in ("UNARY", "GLU") else str(t["op"])
                op_counts[k] = op_counts.get(k, 0) + 1
        steps.append(Step(s.kind, graphs[key]))
        if s.aborted:  # ggml aborted in this call: nothing of it was observed but the abort
            assert trace.abort is not None
            aborted = (len(steps) - 1, call, trace.abort.message)
            break
        seen.append(CapturedStep(len(steps) - 1, call, s.kind, tuple(cap["assigned"]["nodes"]), tuple(cap["assigned"]["leafs"]), s.n_splits,
                                 tuple(cap["buffer_sizes"]), s.realloc))
    if layout is None:
        raise CaptureError("no reserve or alloc was captured", kind="nothing captured")
    scenario = Scenario(layout, tuple(specs), tuple(steps))
    scenario.validate()
    return Captured(scenario, tuple(seen), op_counts, aborted)
