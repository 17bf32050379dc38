"""What each backend kind answers to the scheduler's questions.

Mirrors the device interfaces of ggml 0.15.3: ``ggml_backend_cpu_device_supports_op`` /
``_supports_buft`` (``ggml-cpu.cpp``), ``ggml_backend_rpc_device_supports_op`` /
``_supports_buft`` (``ggml-rpc.cpp``: every op, only its own buffer type) and
``ggml_backend_blas_device_supports_op`` (``ggml-blas.cpp``: large contiguous matmuls with
f32 src1, host buffers) — and of schedfuzz's GPU-like device, ``pytest_schedfuzz/ggml/fake_gpu.c``
(``dev_supports_op``: every op but those it is told to refuse; ``dev_supports_buft``: its own
buffer type, or host ones when it shares the CPU's; ``dev_offload_op``: ``ne[1]`` at least
its threshold; ``fake_gpu_reorder`` and ``fake_gpu_fuse``: its ``graph_optimize``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pytest_schedfuzz.model.layout import BackendLayout

from .alloc import SIZE_MAX, BufferType
from .graph import CGraph

BLAS_MIN_BATCH = 32  # ggml-blas.cpp: min_batch in supports_op


def op_batch_size(ggml_op: str, ne: tuple[int, ...]) -> int:
    """``get_op_batch_size`` (ggml-cuda.cu; ggml-vulkan's is the same): the tokens of a routed
    expert matmul and of a rope are ``ne[2]``; ``GET_ROWS`` is never offloaded; a matmul's batch
    is ``ne[1]``, any other op's its rows (``ggml_nrows``)."""
    if ggml_op == "GET_ROWS":
        return 0
    if ggml_op == "MUL_MAT":
        return ne[1]
    if ggml_op in ("MUL_MAT_ID", "ROPE", "ROPE_BACK"):
        return ne[2]
    return ne[1] * ne[2] * ne[3]


class Backends:
    """The scheduler's view of a layout: ``supports_op``, ``supports_buft``, ``offload_op``."""

    def __init__(self, layout: BackendLayout) -> None:
        self.layout = layout
        self.n = layout.n
        # the scheduler's buffer type per backend (its compute buffer; ``sched->bufts``)...
        self.bufts = [layout.buft(i) for i in range(layout.n)]
        # ...and that of the backend's own buffers (its weights and caches)
        self.buffer_bufts = [layout.buffer_buft(i) for i in range(layout.n)]
        # what each backend's kind tells (``model.devices``): ggml-blas's supports_op, and which
        # buffer types are a gpu's (its alignment and max_size); the ops a gpu is told to refuse
        self.matmul_only = [b.device.matmul_only for b in layout.backends]
        self.refused = [b.unsupported for b in layout.backends]
        self.fake_gpu = [b.device.fake_gpu for b in layout.backends]
        self._supports_buft: dict[tuple[int, str], bool] = {}

    def supports_op(self, b: int, g: CGraph, t: int) -> bool:
        """``ggml_backend_supports_op(backends[b], t)``."""
        if not self.matmul_only[b]:
            # RPC and the CPU support every op built here (mul_mat's src1 is always f32); a gpu
            # all but those it is told to refuse (no other kind's spec refuses any)
            return g.ggml_op[t] not in self.refused[b]
        # blas: contiguous matmuls with f32 src1 whose ne0, ne1 and ne10 reach min_batch
        op = g.op[t]
        if op != "mul_mat":
            return op in ("none", "view", "reshape", "permute", "transpose")
        a, bb = g.srcs[t][0], g.srcs[t][1]
        return (
            g.contiguous[a]
            and g.contiguous[bb]
            and g.type[bb] == "f32"
            and min(g.ne0[t], g.ne1[t], g.ne0[bb]) >= BLAS_MIN_BATCH
        )

    def supports_buft(self, b: int, buft: str) -> bool:
        """``ggml_backend_supports_buft``: RPC and a gpu only their own; CPU, BLAS and a gpu that
        shares the CPU's buffer type every host buffer type. (Asked for every tensor of every
        pass: answered once per pair.)"""
        key = (b, buft)
        ok = self._supports_buft.get(key)
        if ok is None:
            own = self.buffer_bufts[b]
            ok = self._supports_buft[key] = buft == own if not self.layout.is_host_buft(own) else self.layout.is_host_buft(buft)
        return ok

    def offload_op(self, b: int, g: CGraph, t: int) -> bool:
        """``ggml_backend_offload_op``: a gpu's threshold on ``ne[1]``, or with ``cuda_batch`` on
        the batch as ggml-cuda's ``get_op_batch_size`` measures it; no other backend offloads."""
        spec = self.layout.backends[b]
        if spec.offload_min_batch is None:
            return False
        return (op_batch_size(g.ggml_op[t], g.layout[t][1]) if spec.cuda_batch else g.ne1[t]) >= spec.offload_min_batch

    def buffer_type(self, b: int) -> BufferType:
        """What ggml-alloc asks of backend ``b``'s compute buffer type (``sched->bufts[b]``):
        the CPU's (and an RPC server's CPU's) align to 32 bytes with no limit; a gpu's own and
        host buffer types align to its ``alignment``, and its own refuses over ``max_size``
        (``buft_alloc_buffer`` in ``fake_gpu.c``)."""
        name = self.bufts[b]
        gpu = next((i for i in range(self.n) if self.fake_gpu[i] and name in (self.buffer_bufts[i], f"{self.layout.name(i)}_Host")), None)
        if gpu is None or name == "CPU":
            return BufferType(name)
        spec = self.layout.backends[gpu]
        own = name == self.buffer_bufts[gpu]
        limit = spec.max_size if own and spec.max_size else None
        return BufferType(name, spec.alignment, limit if limit is not None else SIZE_MAX, limit)

    def is_host(self, b: int) -> bool:
        return self.layout.is_host(b)

    def reorders(self, b: int) -> bool:
        """Whether backend ``b`` has a ``graph_optimize`` that reorders (a gpu asked to)."""
        return self.layout.backends[b].graph_optimize

    def fuses(self, b: int) -> bool:
        """Whether backend ``b``'s ``graph_optimize`` fuses and keeps the fusions' inputs alive
        (a gpu asked to; only where ggml passes ``add_alloc_dep``, ``Rules.alloc_deps``)."""
        return self.layout.backends[b].fuse


def fake_gpu_reorder(nodes: list[int], root: Callable[[int], int], srcs_of: Callable[[int], list[int]]) -> list[int]:
    """``fake_gpu_reorder`` (``fake_gpu.c``): a stable sort of a split's ``nodes`` by depth, where
    a node's depth is one more than the deepest earlier node it depends on (0 if none), and it
    depends on node ``j`` when it shares ``j``'s storage (``root``: the view source, else itself)
    or one of its ``srcs_of`` does.

    The C code compares each node with every earlier one; here each storage keeps the depth of
    the deepest earlier node on it, which gives the same depths in one pass.

    >>> fake_gpu_reorder([0, 1, 2, 3], lambda t: t, {0: [], 1: [0], 2: [], 3: [2]}.__getitem__)
    [0, 2, 1, 3]
    """
    depth: dict[int, int] = {}
    deepest: dict[int, int] = {}  # storage root -> the depth of the deepest node so far on it
    for i in nodes:
        own = root(i)
        d = max((deepest[r] + 1 for r in {own, *(root(s) for s in srcs_of(i))} if r in deepest), default=0)
        depth[i] = d
        deepest[own] = max(deepest.get(own, 0), d)
    return sorted(nodes, key=depth.__getitem__)


GGML_MAX_SRC = 10


def fake_gpu_fuse(nodes: list[int], srcs_of: Callable[[int], list[str | None]], name: Callable[[int], str]) -> dict[int, list[str]]:
    """``fake_gpu_fuse`` (``fake_gpu.c``): in the split's (optimized) ``nodes``, a node the next
    node reads (``srcs_of``: the names of its srcs, as the scheduler left them) is fused with it,
    and the pair's srcs (but the first node) are kept alive until the second
    (``add_alloc_dep(src, second)``, each once, in src order); the next pair starts after it.
    Returns the kept tensors by the node they are kept until.

    >>> srcs = {0: ["w", "x"], 1: ["a", "w"], 2: ["b"], 3: ["c"]}
    >>> fake_gpu_fuse([0, 1, 2, 3], srcs.__getitem__, "abcd".__getitem__)
    {1: ['w', 'x'], 3: ['b']}
    """
    deps: dict[int, list[str]] = {}
    k = 0
    while k + 1 < len(nodes):
        first, second = nodes[k], nodes[k + 1]
        if name(first) not in srcs_of(second):
            k += 1
            continue
        seen: list[str] = []
        for node in (first, second):
            for src in srcs_of(node):
                if src is not None and src not in seen:
                    seen.append(src)
                    deps.setdefault(second, []).append(src)
            seen.append(name(node))
        k += 2
    return deps


def dep_nodes(kept: Mapping[int, Sequence[object]]) -> int:
    """The dependency nodes ``ggml_backend_sched_split_graph`` makes of the tensors kept until
    each node: one per ``GGML_MAX_SRC`` of them."""
    return sum((len(v) + GGML_MAX_SRC - 1) // GGML_MAX_SRC for v in kept.values())
