"""Hypothesis strategies for scheduler scenarios, small and composable.

``layouts()`` -> ``BackendLayout``; ``graphs(layout)`` -> random op DAGs over every op the
scheduler treats specially; ``models(layout)`` / ``llama_graphs(layout)`` -> llama-like layered
graphs; ``param_sequences()`` -> ``SchedParams`` changes; ``workloads()`` -> driver workloads;
``scenarios()`` -> layouts, graphs and step sequences for comparing engine and reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from ..model.devices import DeviceLimits
from ..model.graph_spec import GraphBuilder, GraphSpec, TensorSpec, leaf_merged, leaf_split, reshaped
from ..model.layout import BackendLayout, BackendSpec
from ..model.ops import VIEW_OPS
from ..model.scenario import Scenario, SchedParams, Step
from ..sim.driver import Reconfigure, Ubatch, Workload
from ..sim.models import ModelShape, llama_graph

DIMS = (8, 16, 32)


class Pool(tuple):  # type: ignore[type-arg]
    """Values a strategy draws from (llama.cpp's captured graphs, the workloads that found a
    cause), whose repr says only how many: Hypothesis writes a strategy's arguments into messages
    it throws away while it shrinks (``CannotInvert``), and writing out every scenario of a pool
    was a large part of the time the shrinker spent on its own."""

    def __repr__(self) -> str:
        return f"<{len(self)} {type(self[0]).__name__ if self else 'value'}s>"


def sampled(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(values)``, one strategy object for equal tuples of the same types:
    Hypothesis validates each strategy object the first time it is drawn from, and keeps
    ``integers``' and ``booleans``' but not ``sampled_from``'s (validating new ones was a tenth
    of the parent's time per llama.cpp workload). The types are part of the key: ``(1, 2)``
    equals ``(1.0, 2.0)`` and ``(True, False)`` equals ``(1, 0)``."""
    return _sampled(tuple(map(type, values)), values)


@lru_cache(maxsize=4096)
def _sampled(types: tuple[type, ...], values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


# ops a gpu may be drawn to refuse (ggml_op_name's names): the scheduler then runs them elsewhere; not
# SET_ROWS and CPY, which write into caches in its own memory (ggml aborts: a real device runs them)
GPU_REFUSABLE = ("UNARY", "ROPE", "SOFT_MAX", "FLASH_ATTN_EXT", "GET_ROWS", "CONCAT", "MUL_MAT_ID", "RMS_NORM", "MUL_MAT")


@st.composite
def gpus(draw: st.DrawFn) -> BackendSpec:
    """A GPU-like device (``ggml/fake_gpu.c``): offloading large batches or not (measured by
    ``ne[1]`` or as ggml-cuda measures them, which offloads routed experts by tokens), refusing a
    few ops, with or without a host buffer type, sharing the CPU's buffer type now and then, a
    maximum buffer size (in bytes, raised by ``fit_max_size`` to the largest tensor), an
    alignment, reordering splits, fusing (keeping the fusions' inputs alive: dependency nodes
    in 0.25.3's graph copy), and asynchronous with a delay."""
    shared = draw(st.integers(0, 4)) == 4  # the simplest draw (0) is a device with its own buffer type
    asynchronous = draw(st.booleans())
    offload = draw(sampled((None, 8, 32)))
    return BackendSpec(
        "gpu",
        offload_min_batch=offload,
        cuda_batch=offload is not None and draw(st.booleans()),
        max_size=draw(sampled((None, 16384, 65536, 1 << 20))),
        alignment=draw(sampled((32, 128, 512))),
        unsupported=tuple(draw(st.lists(sampled(GPU_REFUSABLE), max_size=2, unique=True))),
        host_buffer=not shared and draw(st.booleans()),
        shared_buft=shared,
        graph_optimize=draw(st.booleans()),
        asynchronous=asynchronous,
        delay_us=draw(sampled((0, 200, 1000))) if asynchronous else 0,
        fuse=draw(st.booleans()),
    )


def fit_max_size(layout: BackendLayout, specs: list[GraphSpec]) -> BackendLayout:
    """``layout`` with each gpu's ``max_size`` at least the largest tensor of ``specs``: a device
    cannot hold a tensor over its maximum buffer size (ggml refuses the weights, and a compute
    chunk that size fails to allocate), which is a property of the test, not a scheduler bug."""
    biggest = max((g.largest_nbytes for g in specs), default=0)
    return BackendLayout(tuple(replace(b, max_size=max(b.max_size, biggest)) if b.max_size else b for b in layout.backends))


@dataclass(frozen=True)
class KindDraw:
    """How ``layouts`` draws the devices of one kind: how many (``count``, given the kind's limit),
    then each one (``device``). A kind's count is drawn as it was when the kind joined, so that a
    seed keeps its draws: GPU-like devices only where the limit allows one, the RPC count even at
    a limit of 0, BLAS as a coin."""

    count: Callable[[st.DrawFn, int], int]
    device: Callable[[st.DrawFn], BackendSpec]


# the strategies' half of ``model.devices.DEVICE_KINDS`` (every kind but the host), in the order a
# layout holds them and ``layouts`` draws them: a new kind is an entry here and one there
LAYOUT_DRAWS: dict[str, KindDraw] = {
    "gpu": KindDraw(lambda draw, n: draw(st.integers(0, n)) if n else 0, lambda draw: draw(gpus())),
    "rpc": KindDraw(lambda draw, n: draw(st.integers(0, n)), lambda draw: BackendSpec("rpc")),  # each its own buffer type
    "blas": KindDraw(lambda draw, n: int(bool(n) and draw(st.booleans())), lambda draw: BackendSpec("blas")),
}


@st.composite
def layouts(draw: st.DrawFn, limits: DeviceLimits = DeviceLimits.of(rpc=2)) -> BackendLayout:
    """Up to ``limits`` devices of each kind (``LAYOUT_DRAWS``), then the CPU."""
    backends = [kind.device(draw) for name, kind in LAYOUT_DRAWS.items() for _ in range(kind.count(draw, limits[name]))]
    return BackendLayout((*backends, BackendSpec("cpu")))


@dataclass
class _Growing:
    """A graph being grown by ``graphs``: its builder, the activations ops can read (``pool``),
    the roots besides the last activation, the batch, and the strategy of a device."""

    b: GraphBuilder
    pool: list[str]
    roots: list[str]
    n_tokens: int
    device: st.SearchStrategy[int]
    cpu: int  # the CPU's index: the last backend


def _mul_mat(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    # q8_0 (blocks of 32) where the row allows it: RPC then asks its server for the size
    types = ("f32", "f16", "q8_0") if d % 32 == 0 else ("f32", "f16")
    w = g.b.weight(f"w{k}", (d, draw(sampled(DIMS))), draw(g.device), draw(st.sampled_from(types)))
    g.pool.append(g.b.op("mul_mat", w, a, name=f"mm{k}"))


def _binary(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    same = [t for t in g.pool if g.b.shape(t) == g.b.shape(a)]
    other = draw(st.sampled_from(same)) if draw(st.booleans()) else g.b.weight(f"w{k}", (d,), draw(g.device))
    g.pool.append(g.b.op(draw(sampled(("add", "mul"))), a, other, name=f"bin{k}"))


def _unary(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    op = draw(sampled(("silu", "scale", "rms_norm")))
    g.pool.append(g.b.op(op, a, name=f"{op}{k}", **({"scale": 0.5} if op == "scale" else {"eps": 1e-6} if op == "rms_norm" else {})))


def _transpose(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    t = g.b.op("cont", g.b.op("transpose", a, name=f"tr{k}"), name=f"trc{k}")
    g.pool.append(g.b.op("cont", g.b.op("permute", t, name=f"pm{k}", axes=[1, 0, 2, 3]), name=f"pmc{k}"))


def _concat(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    other = draw(st.sampled_from(g.pool))
    g.pool.append(g.b.op("concat", a, other, name=f"cat{k}", dim=0))


def _get_rows(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    table = g.b.weight(f"tok{k}", (d, 64), draw(g.device))
    g.pool.append(g.b.op("get_rows", table, g.b.input(f"ids{k}", (g.n_tokens,), "i32"), name=f"rows{k}"))


def _soft_max(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    mask = g.b.input(f"mask{k}", (d, g.n_tokens)) if draw(st.booleans()) else None
    g.pool.append(g.b.op("soft_max_ext", a, mask, name=f"sm{k}", scale=1.0))


def _set_rows(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    cache = g.b.cache(f"cache{k}", (d, 64), draw(g.device))  # room for every batch size drawn
    g.roots.append(g.b.op("set_rows", cache, a, g.b.input(f"kvi{k}", (g.n_tokens,), "i64"), name=f"store{k}"))
    g.pool.append(g.b.op("view", cache, name=f"kv{k}", ne=[d, g.n_tokens], nb=[d * 4]))


def _rope(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    r = g.b.op("reshape", a, name=f"r3{k}", ne=[d, 1, g.n_tokens])
    freqs = g.b.weight(f"freqs{k}", (d // 2,), draw(g.device)) if draw(st.booleans()) else None
    r = g.b.op("rope", r, g.b.input(f"pos{k}", (g.n_tokens,), "i32"), freqs, name=f"rope{k}", n_dims=d)
    g.pool.append(g.b.op("reshape", r, name=f"r2{k}", ne=[d, g.n_tokens]))


def _flash_attn(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    b = g.b
    q = b.op("permute", b.op("reshape", a, name=f"q3{k}", ne=[d, 1, g.n_tokens]), name=f"q{k}", axes=[0, 2, 1, 3])
    kv_dev = draw(g.device)
    kc = b.cache(f"kc{k}", (d, 16), kv_dev)
    vc = b.cache(f"vc{k}", (d, 16), kv_dev)
    kk = b.op("view", kc, name=f"kview{k}", ne=[d, 16, 1], nb=[d * 4, d * 64])
    vv = b.op("view", vc, name=f"vview{k}", ne=[d, 16, 1], nb=[d * 4, d * 64])
    mask = b.input(f"fmask{k}", (16, g.n_tokens), "f16") if draw(st.booleans()) else None
    att = b.op("flash_attn_ext", q, kk, vv, mask, name=f"fa{k}", scale=1.0)
    g.pool.append(b.op("reshape", att, name=f"fa2{k}", ne=[d, g.n_tokens]))


def _mul_mat_id(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    b = g.b
    n_exp, n_used, d_out = 4, 2, draw(sampled(DIMS))
    # half the time in host memory, as -ncmoe and -ot exps=CPU keep them: offloaded, only the used ones are copied
    experts = b.weight(f"exps{k}", (d, d_out, n_exp), g.cpu if draw(st.booleans()) else draw(g.device))
    ids = b.input(f"eids{k}", (n_used, g.n_tokens), "i32")
    out = b.op("mul_mat_id", experts, b.op("reshape", a, name=f"moe_in{k}", ne=[d, 1, g.n_tokens]), ids, name=f"moe{k}")
    first = b.op("view", out, name=f"moe_v{k}", ne=[d_out, g.n_tokens], nb=[d_out * 4 * n_used])
    g.pool.append(b.op("cont", first, name=f"moe_c{k}"))


def _cpy(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    """A copy into a pre-allocated buffer (a root, like the KV stores) or into an input."""
    dst = g.b.cache(f"dst{k}", (d, g.n_tokens), draw(g.device)) if draw(st.booleans()) else g.b.input(f"dst{k}", (d, g.n_tokens))
    g.roots.append(g.b.op("cpy", a, dst, name=f"cpy{k}"))


def _view_leaf(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    """ggml_view_tensor of a computed tensor is a leaf (op NONE, no src): pass 4 gives it its view
    source's backend, and ggml-alloc does not see it as a child. The source is computed first (an
    earlier root) and kept (an output); an add with a weight on a device of its own reads the view."""
    src = g.b.op("scale", a, name=f"vs{k}", output=True, scale=1.0)
    g.roots.append(src)
    g.pool.append(g.b.op("add", g.b.op("view_tensor", src, name=f"vt{k}"), g.b.weight(f"w{k}", (d,), draw(g.device)), name=f"vta{k}"))


def _fan_in(draw: st.DrawFn, g: _Growing, a: str, d: int, k: int) -> None:
    """A chain summing many tensors, each a cache on a drawn device or an input (as attention
    over many sequences' caches reads them): past 30 (``GGML_SCHED_MAX_SPLIT_INPUTS``) copies into
    one split, 0.15.3 starts a new split and 0.25.3 grows the split's inputs; past 30 inputs under
    pipeline parallelism, 0.25.3 grows the graph's inputs (0.15.3 aborts)."""
    acc = a
    for i in range(draw(st.integers(2, 40))):
        other = g.b.cache(f"fan{k}_{i}", (d, g.n_tokens), draw(g.device)) if draw(st.booleans()) else g.b.input(f"fan{k}_{i}", (d, g.n_tokens))
        acc = g.b.op("add", acc, other, name=f"fanadd{k}_{i}")
    g.pool.append(acc)


# the op kinds ``graphs`` grows a graph with, in the order they are drawn from
_GROW: dict[str, Callable[[st.DrawFn, _Growing, str, int, int], None]] = {
    "mul_mat": _mul_mat, "binary": _binary, "unary": _unary, "transpose": _transpose, "concat": _concat, "get_rows": _get_rows,
    "soft_max": _soft_max, "set_rows": _set_rows, "rope": _rope, "flash_attn": _flash_attn, "mul_mat_id": _mul_mat_id, "cpy": _cpy,
    "view_leaf": _view_leaf, "fan_in": _fan_in,
}


@st.composite
def graphs(draw: st.DrawFn, layout: BackendLayout, max_ops: int = 14) -> GraphSpec:
    """A random DAG of activations ``[d, T]`` grown one op at a time from earlier tensors
    (``_GROW``), with weights, KV-cache stores and views placed on random devices of ``layout``,
    and now and then an op forced onto a device."""
    b = GraphBuilder()
    n_tokens = draw(sampled((1, 2, 4, 8, 32, 40)))  # 32 and more: BLAS's min batch
    device = st.integers(0, layout.n - 1)
    g = _Growing(b, [b.input("x", (draw(sampled(DIMS)), n_tokens))], [], n_tokens, device, layout.n - 1)
    for k in range(draw(st.integers(1, max_ops))):
        a = draw(st.sampled_from(g.pool))
        _GROW[draw(sampled(tuple(_GROW)))](draw, g, a, b.shape(a)[0], k)
    last = g.pool[-1]
    if len(g.pool) == 1:
        last = b.op("scale", last, name="out", scale=1.0)
    ops = [t.name for t in b.tensors if t.op != "none"]
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.integers(0, 3)) == 0:
            name = draw(st.sampled_from(ops))
            # a write into a pre-allocated tensor is forced onto that tensor's device only: forced
            # elsewhere, the CPU writes through an RPC buffer's address (the starter corpus's
            # 01b07046ee), and where that does not crash at once it corrupts the worker's memory
            # and makes later scenarios fail at random
            target = written_device({t.name: t for t in b.tensors}, name)
            b.force(name, target if target is not None else draw(device))
    return b.build(*g.roots, last)


@st.composite
def models(draw: st.DrawFn, layout: BackendLayout, max_layers: int = 4, max_extra_ops: int = 0) -> ModelShape:
    """A llama-like model: layers split over the devices in blocks (``--tensor-split``),
    optionally FFN weights overridden to another device (``-ot``), FA or not, MoE or dense;
    up to ``max_extra_ops`` elementwise ops per layer scale it to thousands of nodes."""
    n_layer = draw(st.integers(1, max_layers))
    cuts = sorted(draw(st.lists(st.integers(0, n_layer), min_size=layout.n - 1, max_size=layout.n - 1)))
    layer_devices = tuple(sum(c <= il for c in cuts) for il in range(n_layer))
    ffn = tuple(draw(st.integers(0, layout.n - 1)) for _ in range(n_layer)) if draw(st.booleans()) else ()
    moe = draw(st.booleans())
    return ModelShape(
        layer_devices=layer_devices,
        output_device=draw(sampled((layer_devices[-1], layout.n - 1))),
        cpu_device=layout.n - 1,
        n_embd=32,
        n_head=4,
        n_head_kv=draw(sampled((1, 2, 4))),
        n_ff=48,
        n_vocab=64,
        kv_size=64,
        flash_attn=draw(st.booleans()),
        n_expert=4 if moe else 0,
        n_expert_used=2,
        ffn_devices=ffn,
        extra_ops=draw(st.integers(0, max_extra_ops)),
    )


@st.composite
def llama_graphs(draw: st.DrawFn, layout: BackendLayout, max_layers: int = 4, max_extra_ops: int = 0) -> GraphSpec:
    m = draw(models(layout, max_layers, max_extra_ops))
    n_tokens = draw(st.one_of(st.integers(1, 16), sampled((32, 48, 64))))
    n_kv = draw(st.integers(min(n_tokens, m.kv_size), m.kv_size))
    return llama_graph(m, n_tokens, n_kv, draw(st.integers(1, n_tokens)))


@st.composite
def param_sequences(draw: st.DrawFn, min_size: int = 1, max_size: int = 4, min_nodes: int = 1024) -> list[SchedParams]:
    """Sequences of scheduler parameters as ``llama_context`` changes them: each after the
    first changes one field (a new max_nodes for a bigger model graph, pipeline parallelism
    switched off after a failed reservation, op offload toggled). ``max_nodes`` is 1, 2, 4 or
    8 times ``min_nodes`` (llama.cpp's ``graph_max_nodes`` for the model)."""
    max_nodes = sampled(tuple(min_nodes * k for k in (1, 2, 4, 8)))
    seq = [SchedParams(draw(max_nodes), draw(st.booleans()), draw(st.booleans()))]
    for _ in range(draw(st.integers(min_size, max_size)) - 1):
        p = seq[-1]
        field = draw(sampled(("max_nodes", "max_nodes", "parallel", "op_offload")))
        if field == "max_nodes":
            seq.append(SchedParams(draw(max_nodes), p.parallel, p.op_offload))
        elif field == "parallel":
            seq.append(SchedParams(p.max_nodes, not p.parallel, p.op_offload))
        else:
            seq.append(SchedParams(p.max_nodes, p.parallel, not p.op_offload))
    return seq


@st.composite
def workloads(
    draw: st.DrawFn,
    layout: BackendLayout | None = None,
    max_ubatches: int = 6,
    min_reconfigures: int = 0,
    max_layers: int = 2,
    max_extra_ops: int = 0,
    limits: DeviceLimits = DeviceLimits.of(rpc=1),
) -> Workload:
    """A first configuration (on a layout within ``limits``, where none is given), then ubatches
    (prompt chunks and single tokens, with all or some outputs) interleaved with at least
    ``min_reconfigures`` reconfigurations."""
    layout = layout or draw(layouts(limits))
    m = draw(models(layout, max_layers, max_extra_ops))
    n_ubatch = draw(sampled((8, 16, 32)))
    layout = fit_max_size(layout, [llama_graph(m, n_ubatch, m.kv_size, n_ubatch)])
    # like llama_context::graph_max_nodes: at least 1024, and room for the largest graph
    need = len(llama_graph(m, n_ubatch, m.kv_size, n_ubatch).tensors)
    min_nodes = max(1024, 1024 * -(-2 * need // 1024))
    first, *rest = draw(param_sequences(min_size=1 + min_reconfigures, max_size=4 + min_reconfigures, min_nodes=min_nodes))

    def reconfigure(p: SchedParams) -> Reconfigure:
        # now and then the pipeline-parallel reservation does not fit: the fallback path
        return Reconfigure(p, p.parallel and draw(st.integers(0, 3)) == 0)

    events: list[Ubatch | Reconfigure] = [reconfigure(first)]
    for _ in range(draw(st.integers(1, max_ubatches))):
        if rest and draw(st.integers(0, 3)) == 0:
            events.append(reconfigure(rest.pop(0)))
            continue
        n_tokens = draw(st.integers(1, n_ubatch))
        n_outputs = draw(sampled((n_tokens, 1, max(1, n_tokens // 2))))
        n_kv = draw(st.integers(n_tokens, m.kv_size))
        events.append(Ubatch(n_tokens, n_outputs, n_kv))
    while sum(isinstance(e, Reconfigure) for e in events) < 1 + min_reconfigures:
        events.insert(draw(st.integers(1, len(events))), reconfigure(rest.pop(0)))
        events.append(Ubatch(1, 1, 1))
    return Workload(layout, m, n_ubatch, tuple(events))


def written_device(by_name: Mapping[str, TensorSpec], name: str) -> int | None:
    """The device of the pre-allocated tensor op ``name`` writes into (set_rows, cpy, an in-place
    op), through the views of it the op writes through (llama.cpp's cache views), if any."""
    t = by_name[name]
    dst = {"set_rows": 0, "cpy": 1}.get(t.op, 0 if t.param("inplace") else None)
    if dst is None or t.args[dst] is None:
        return None
    target = by_name[t.args[dst]]  # type: ignore[index]
    while target.op in VIEW_OPS and target.args[0] is not None:
        target = by_name[target.args[0]]
    return target.device if target.role in ("weight", "cache") else None


@st.composite
def graph_family(draw: st.DrawFn, base: GraphSpec) -> list[GraphSpec]:
    """``base`` and up to two variants of it with the same ops: an input's dimension halved
    (same topology, smaller tensors: ggml finds a node or src "not valid" when the bigger one
    comes after), two same-shaped inputs merged into one (one leaf fewer) or an input read twice
    split in two (one leaf more): ggml re-plans for "different number of leafs"."""
    family = [base]
    inputs = [t.name for t in base.tensors if t.role == "input"]
    for _ in range(draw(st.integers(1, 2))):
        how = draw(sampled(("shape", "fewer leafs", "more leafs")))
        if how == "shape" and inputs:
            variant = reshaped(base, draw(st.sampled_from(inputs)), draw(st.integers(0, 1)))
        else:
            variant = leaf_merged(base) if how == "fewer leafs" else leaf_split(base)
        if variant is not None and variant not in family:
            family.append(variant)
    return family


@st.composite
def scenarios(
    draw: st.DrawFn,
    limits: DeviceLimits = DeviceLimits.of(rpc=2),
    max_steps: int = 6,
    compute: bool = False,
    max_layers: int = 4,
    max_extra_ops: int = 0,
) -> Scenario:
    """A layout within ``limits``, up to three graphs (random or llama-like, or a
    ``graph_family``) and a step sequence over them."""
    layout = draw(layouts(limits))
    specs = draw(st.lists(st.one_of(graphs(layout), llama_graphs(layout, max_layers, max_extra_ops)), min_size=1, max_size=3))
    if draw(st.booleans()):
        specs = draw(graph_family(specs[0]))
    names = [f"g{i}" for i in range(len(specs))]
    biggest = max(len(s.tensors) for s in specs)
    params = st.builds(
        SchedParams, max_nodes=st.integers(2 * biggest + 16, max(4096, 4 * biggest)), parallel=st.booleans(), op_offload=st.booleans()
    )
    kinds = ("reserve", "alloc", "alloc", "reset", "reserve_size") + (("compute", "eval_callback") if compute else ())
    steps = [Step("sched_new", params=draw(params))]
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(sampled(kinds + ("sched_new",)))
        if kind == "sched_new":
            steps.append(Step("sched_new", params=draw(params)))
        elif kind in ("reset", "eval_callback"):
            steps.append(Step(kind))
        else:
            steps.append(Step(kind, draw(st.sampled_from(names))))
    return Scenario(fit_max_size(layout, specs), tuple(zip(names, specs)), tuple(steps))
