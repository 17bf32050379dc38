"""The reference scheduler: ``ggml_backend_sched`` of ggml 0.15.3 and 0.25.3, pass by pass.

Read this side by side with ``ggml-backend.cpp`` (``ggml_backend_sched_split_graph``,
``ggml_backend_sched_alloc_splits``, ``ggml_backend_sched_reserve``,
``ggml_backend_sched_alloc_graph``) and ``ggml-alloc.c`` (``ggml_gallocr_reserve_n``,
``ggml_gallocr_needs_realloc``, ``ggml_gallocr_alloc_graph``). Functions carry the names and
the order of ggml's passes; state carries the names of ``struct ggml_backend_sched``'s fields.

Where the two versions differ, a field of ``rules.Rules`` says which way (the scheduler is
built with the rules of the loaded ggml).

Where ggml compares pointers (buffer types, tensor copies), this model compares identities:
a buffer type is a string from ``BackendLayout.buft``, a tensor copy a ``Ref``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

from mypy_extensions import mypyc_attr

from pytest_schedfuzz.model.layout import BackendLayout
from pytest_schedfuzz.model.trace import ReallocEvent, Split

from .alloc import AllocAbort, Gallocr, NullBufferCrash
from .backends import GGML_MAX_SRC, Backends, dep_nodes, fake_gpu_fuse, fake_gpu_reorder
from .graph import CGraph, Ref
from .params import SchedParams
from .rules import NEWEST, Rules

MAX_COPIES = 4  # GGML_SCHED_MAX_COPIES

# ggml_hash_size: the next primes after powers of two
_PRIMES = (2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537, 131101,
           262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879)


def ggml_hash_size(min_sz: int) -> int:
    """``ggml_hash_size``: the hash set size ``ggml_backend_sched_new`` gets for ``max_nodes``."""
    for p in _PRIMES:
        if p >= min_sz:
            return p
    return min_sz | 1


class SchedAbort(Exception):
    """ggml would abort here (``GGML_ABORT`` / ``GGML_ASSERT``); the message is ggml's."""

    kind: ClassVar[str] = "abort"  # ClassVar: compiled, a plain default would be an instance field


class SchedCrash(SchedAbort):
    """ggml would crash here (a signal, no assert): the message says where and why."""

    kind: ClassVar[str] = "crash"


@dataclass(frozen=True)
class GraphCopy:
    """``sched->graph``: the split graph with input dependencies and copies inserted."""

    nodes: tuple[Ref, ...]
    node_srcs: tuple[tuple[Ref | None, ...], ...]
    node_backend_ids: tuple[int, ...]
    leafs: tuple[Ref, ...]
    leaf_backend_ids: tuple[int, ...]


@dataclass(frozen=True)
class SplitResult:
    """What one ``ggml_backend_sched_split_graph`` call leaves behind."""

    node_backends: tuple[int, ...]
    leaf_backends: tuple[int, ...]
    splits: tuple[Split, ...]
    copy: GraphCopy
    graph_size: int


# compiled (``pytest_schedfuzz.compiled``), still a class a test may subclass to plant a fault in a pass
@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler:
    """One ``ggml_backend_sched`` instance, created by ``ggml_backend_sched_new``, with the
    semantics of the ggml version ``rules`` describes."""

    def __init__(self, layout: BackendLayout, params: SchedParams, rules: Rules = NEWEST) -> None:
        self.rules = rules
        self.backends = Backends(layout)
        self.layout = layout
        self.params = params
        self.n_backends = layout.n
        self.n_copies = MAX_COPIES if params.parallel else 1
        # which of the n_copies copies of every input this graph uses (alloc_graph advances it)
        self.cur_copy = 0
        self.next_copy = 0
        self.op_offload = params.op_offload
        self.hash_size = ggml_hash_size(params.max_nodes)
        # node_backend_ids / prev_node_backend_ids are two calloc'ed arrays swapped at each split
        self.node_backend_ids: list[int] = []
        self.prev_node_backend_ids: list[int] = []
        self.leaf_backend_ids: list[int] = []
        self.prev_leaf_backend_ids: list[int] = []
        self.debug_graph_size = 0
        self.debug_prev_graph_size = 0
        # ggml_gallocr_new_n(sched->bufts): the plan (node_allocs) and the compute buffers
        self.galloc = Gallocr([self.backends.buffer_type(b) for b in range(self.n_backends)], rules.inplace_ops)
        self.user_assignments: dict[str, int] = {}
        self.is_alloc = False
        # (id(graph), user assignments, cur_copy) -> (graph, its split): see split_graph
        self._split_cache: dict[tuple[int, tuple[tuple[str, int], ...], int], tuple[CGraph, SplitResult]] = {}

    # ------------------------------------------------------------------ public API

    def reset(self) -> None:
        """``ggml_backend_sched_reset``: forget assignments (user ones too) and copies."""
        self.user_assignments = {}
        self.is_alloc = False

    def set_tensor_backend(self, name: str, backend: int) -> None:
        """``ggml_backend_sched_set_tensor_backend``."""
        self.user_assignments[name] = backend

    def reserve(self, g: CGraph) -> tuple[SplitResult, bool]:
        """``ggml_backend_sched_reserve``: split, then ``ggml_gallocr_reserve_n``, then reset;
        false (and no reset) when a buffer could not be allocated."""
        self._check_hash_size(g, "measure_graph")
        self.synchronize()
        result = self.split_graph(g)
        if not self.gallocr_reserve_n(result.copy):
            return result, False
        self.reset()
        return result, True

    def reserve_size(self, g: CGraph) -> tuple[SplitResult, tuple[int, ...]]:
        """``ggml_backend_sched_reserve_size``: reset (the user's assignments go too), split, then
        ``ggml_gallocr_reserve_n_size``: the plan of the measured graph, and the sizes its buffers
        would need; a buffer that would have to grow is freed and left NULL (``no_alloc``)."""
        self._check_hash_size(g, "measure_graph")
        self.reset()
        self.synchronize()
        result = self.split_graph(g)
        copy = result.copy
        try:
            sizes = self.galloc.reserve_n_size(copy.nodes, copy.node_srcs, copy.leafs, copy.node_backend_ids, copy.leaf_backend_ids)
        except AllocAbort as e:
            raise SchedAbort(str(e)) from None
        return result, sizes

    def alloc_graph(self, g: CGraph, step: int) -> tuple[SplitResult, list[ReallocEvent], bool]:
        """``ggml_backend_sched_alloc_graph``: split, then ``ggml_backend_sched_alloc_splits``;
        false when that fails (``is_alloc`` stays false)."""
        self._check_hash_size(g, "graph")
        if self.is_alloc:
            raise SchedAbort("GGML_ASSERT(!sched->is_alloc) failed")
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        result = self.split_graph(g)
        events, ok = self.alloc_splits(result, step)
        self.is_alloc = ok
        return result, events, ok

    def buffer_sizes(self) -> tuple[int, ...]:
        """``ggml_backend_sched_get_buffer_size`` of each backend."""
        return tuple(self.galloc.get_buffer_size(b) for b in range(self.n_backends))

    def synchronize(self) -> None:
        """``ggml_backend_sched_synchronize``: a scheduler without an allocated graph goes back to
        copy 0, so that generation always uses the same copy."""
        if not self.is_alloc:
            self.next_copy = 0

    def _check_hash_size(self, g: CGraph, what: str) -> None:
        if self.hash_size < g.n_nodes + g.n_leafs:
            raise SchedAbort(
                f"GGML_ASSERT((int)sched->hash_set.size >= {what}->n_nodes + {what}->n_leafs) failed "
                f"(hash_set.size = {self.hash_size}, n_nodes + n_leafs = {g.n_nodes + g.n_leafs})"
            )

    # ------------------------------------------------------------------ helpers of ggml-backend.cpp

    def backend_from_buffer(self, g: CGraph, ids: list[int], t: int, op: int) -> int:
        """``ggml_backend_sched_backend_from_buffer``: the highest-priority backend that supports
        the buffer type of ``t``'s buffer and the op ``op``; -1 if none or not pre-allocated."""
        vs = g.view_src[t]
        buffer = g.buffer[vs] if vs >= 0 else g.buffer[t]
        if buffer < 0:
            return -1
        buft = self.backends.buffer_bufts[buffer]
        for b in range(self.n_backends):
            if self.backends.supports_buft(b, buft) and self.backends.supports_op(b, g, op):
                return b
        return -1

    def backend_id_from_cur(self, g: CGraph, ids: list[int], t: int) -> int:
        """``ggml_backend_sched_backend_id_from_cur``: pass 1's rules for one tensor."""
        # assign pre-allocated nodes to their backend
        cur = self.backend_from_buffer(g, ids, t, t)
        if cur != -1:
            return cur
        # view_src
        vs = g.view_src[t]
        if vs >= 0:
            cur = self.backend_from_buffer(g, ids, vs, t)
            if cur != -1:
                return cur
        if g.buffer[t] >= 0 or (vs >= 0 and g.buffer[vs] >= 0):
            # since the tensor is pre-allocated, it cannot be moved to another backend
            buffer = g.buffer[vs] if vs >= 0 else g.buffer[t]
            raise SchedAbort(
                f"pre-allocated tensor ({g.names[t]}) in a buffer ({self.layout.name(buffer)}) "
                f"that cannot run the operation ({g.op[t].upper()})"
            )
        # graph input
        if g.input[t]:
            return self.n_backends - 1  # last backend (assumed CPU)
        # operations with weights are preferably run on the same backend as the weights; skip
        # ROPE (its freqs tensor is too small to choose a backend by) and, from 0.25.3 on,
        # FLASH_ATTN_EXT (its sinks tensor)
        if g.op[t] == "rope" or (g.op[t] == "flash_attn_ext" and not self.rules.flash_attn_follows_weights):
            return -1
        for src in g.srcs[t]:
            if src < 0:
                continue
            if g.buffer[src] >= 0 and g.weights[src]:
                src_backend = self.backend_from_buffer(g, ids, src, t)
                # check if a backend with higher prio wants to offload the op
                if self.op_offload and src_backend == self.n_backends - 1 and self.backends.is_host(g.buffer[src]):
                    for b in range(src_backend):
                        if self.backends.supports_op(b, g, t) and self.backends.offload_op(b, g, t):
                            return b
                return src_backend
        return -1

    def buffer_supported(self, g: CGraph, ids: list[int], t: int, b: int) -> bool:
        """``ggml_backend_sched_buffer_supported``: can backend ``b`` read ``t`` where it is?"""
        vs = g.view_src[t]
        buffer = g.buffer[vs] if vs >= 0 else g.buffer[t]
        if buffer >= 0:
            buft: str | None = self.backends.buffer_bufts[buffer]
        else:
            # see if the tensor already has a backend assigned, and use its buffer type
            tid = ids[t]
            if tid == -1 and vs >= 0:
                tid = ids[vs]
            buft = self.backends.bufts[tid] if tid != -1 else None
        return buft is not None and self.backends.supports_buft(b, buft)

    def set_if_supported(self, g: CGraph, ids: list[int], t: int, b: int) -> None:
        """``ggml_backend_sched_set_if_supported``."""
        if self.backends.supports_op(b, g, t):
            ids[t] = b

    # ------------------------------------------------------------------ ggml_backend_sched_split_graph

    def split_graph(self, g: CGraph) -> SplitResult:
        """``ggml_backend_sched_split_graph``: passes 1 to 5, then the graph copy.

        What the passes make depends only on the graph, the user's assignments and the input copy
        in use (the scheduler splits after a reset, as every caller does: ``reserve`` resets, and
        ``alloc_graph`` asserts ``!is_alloc``); the same graph split again in that state (reserve,
        then alloc; each ubatch of a llama.cpp workload) is made once per scheduler. What the
        split changes in the scheduler (the id arrays, ``debug_graph_size``) happens every time.
        """
        key = (id(g), tuple(self.user_assignments.items()), self.cur_copy)
        made = self._split_cache.get(key)
        if made is None or made[0] is not g:
            made = self._split_cache[key] = (g, self._split(g))
        result = made[1]
        self.node_backend_ids, self.prev_node_backend_ids = self.prev_node_backend_ids, self.node_backend_ids
        self.leaf_backend_ids, self.prev_leaf_backend_ids = self.prev_leaf_backend_ids, self.leaf_backend_ids
        _write(self.node_backend_ids, result.copy.node_backend_ids)
        _write(self.leaf_backend_ids, result.copy.leaf_backend_ids)
        self.debug_prev_graph_size = self.debug_graph_size
        self.debug_graph_size = result.graph_size
        return result

    def _split(self, g: CGraph) -> SplitResult:
        # tensor_backend_id(t) for every tensor: -1, or the user's assignment
        ids = [-1] * len(g.names)
        index = {n: i for i, n in enumerate(g.names)}
        for name, b in self.user_assignments.items():
            if name in index:
                ids[index[name]] = b
        self.pass1_assign_from_cur(g, ids)
        self.pass2_expand(g, ids)
        self.pass3_upgrade(g, ids)
        self.pass4_assign_srcs(g, ids)
        splits, node_srcs, graph_inputs = self.pass5_split(g, ids)
        return self.build_graph_copy(g, ids, splits, node_srcs, graph_inputs)

    def pass1_assign_from_cur(self, g: CGraph, ids: list[int]) -> None:
        """Pass 1: assign backends to ops with pre-allocated inputs (leafs, then nodes); do not
        overwrite user assignments."""
        for t in g.leaf_ids:
            if ids[t] == -1:
                ids[t] = self.backend_id_from_cur(g, ids, t)
        for t in range(g.n_nodes):
            if ids[t] == -1:
                ids[t] = self.backend_id_from_cur(g, ids, t)

    def pass2_expand(self, g: CGraph, ids: list[int]) -> None:
        """Pass 2: expand current backend assignments to adjacent nodes, skipping view ops.

        First the non-CPU backends down then up (the CPU, lowest priority, interrupts them), then
        every backend down then up. Unsupported ops stay unassigned for pass 3.
        """
        cpu = self.n_backends - 1
        down = range(g.n_nodes)
        up = range(g.n_nodes - 1, -1, -1)
        for order, skip_cpu in ((down, True), (up, True), (down, False), (up, False)):
            cur = -1
            for t in order:
                if g.view_op[t]:
                    continue
                if ids[t] != -1:
                    cur = -1 if skip_cpu and ids[t] == cpu else ids[t]
                elif cur != -1:
                    self.set_if_supported(g, ids, t, cur)

    def pass3_upgrade(self, g: CGraph, ids: list[int]) -> None:
        """Pass 3: upgrade nodes to higher-priority backends with the same buffer type (when all
        their srcs are readable there); give each still unassigned node the backend that
        supports it with the most supported inputs."""
        bk = self.backends
        for t in range(g.n_nodes):
            if g.view_op[t]:
                continue
            if ids[t] == -1:
                best = -1
                for b in range(self.n_backends):
                    if not bk.supports_op(b, g, t):
                        continue
                    n_supported = 0
                    for src in g.srcs[t]:
                        if src < 0:
                            continue
                        vs = g.view_src[src]
                        assigned = ids[src] != -1 or (vs >= 0 and ids[vs] != -1)
                        if assigned and self.buffer_supported(g, ids, src, b):
                            n_supported += 1
                    if n_supported > best:
                        best = n_supported
                        ids[t] = b
            else:
                cur = ids[t]
                for b in range(cur):
                    if bk.bufts[b] == bk.bufts[cur] and bk.supports_op(b, g, t):
                        if all(src < 0 or self.buffer_supported(g, ids, src, b) for src in g.srcs[t]):
                            ids[t] = b
                            break

    def pass4_assign_srcs(self, g: CGraph, ids: list[int]) -> None:
        """Pass 4: assign backends to remaining srcs from their consumer, and views from their
        view source; a node still unassigned goes to the first backend that supports it."""
        for t in range(g.n_nodes):
            vs = g.view_src[t]
            if vs >= 0 and ids[t] == -1:
                ids[t] = ids[vs]
            for src in g.srcs[t]:
                if src < 0 or ids[src] != -1:
                    continue
                svs = g.view_src[src]
                # views are always on the same backend as the source
                ids[src] = ids[svs] if svs >= 0 else ids[t]
            b = 0
            while b < self.n_backends and ids[t] == -1:
                self.set_if_supported(g, ids, t, b)
                b += 1
            if ids[t] == -1:
                raise SchedAbort("GGML_ASSERT(*cur_backend_id != -1) failed")

    def pass5_split(self, g: CGraph, ids: list[int]) -> tuple[list[Split], dict[int, list[Ref | None]], list[int]]:
        """Pass 5: split the graph where the backend changes, and find the tensors that must be
        copied into each split (``n_copies`` copies of each with ``parallel``).

        A split also ends early when a node of the same backend reads a weight from an
        incompatible buffer (so that offloaded weights' memory can be reused), and, in 0.15.3,
        when the split already has ``GGML_SCHED_MAX_SPLIT_INPUTS`` inputs and the node needs
        another. In 0.15.3 an input src met here becomes a graph input (0.25.3: pass 6).
        Returns the splits, the rewritten srcs of each node, and the graph inputs.
        """
        n_copies = self.n_copies
        limit = self.rules.max_split_inputs
        # tensor_id_copy(t, backend, c) exists: (t, backend) in copies
        copies: dict[tuple[int, int], list[Ref]] = {}
        graph_inputs: list[int] = []
        splits: list[Split] = []
        node_srcs: dict[int, list[Ref | None]] = {}
        i = 0
        while i < g.n_nodes and g.view_op[i]:
            i += 1
        if i == g.n_nodes:
            raise SchedAbort("graph has only view ops: ggml leaves the split's backend uninitialised")
        cur = ids[i]
        i_start, inputs = 0, list[int]()
        for t in range(i, g.n_nodes):
            if g.view_op[t]:
                continue
            node_backend = ids[t]
            if node_backend == -1:
                raise SchedAbort("GGML_ASSERT(node_backend_id != -1) failed")
            need_new_split = False
            if node_backend == cur and inputs:
                for src in g.srcs[t]:
                    if src < 0:
                        continue
                    # a weight on a different and incompatible backend
                    if g.buffer[src] >= 0 and g.weights[src]:
                        if ids[src] != cur and not self.buffer_supported(g, ids, src, cur):
                            need_new_split = True
                            break
                    # 0.15.3: the split has too many inputs (FIXME in ggml: only checked when full)
                    if limit is not None and len(inputs) == limit:
                        if ids[src] != cur and (src, cur) not in copies and not self.buffer_supported(g, ids, src, cur):
                            need_new_split = True
                            break
            if node_backend != cur or need_new_split:
                splits.append(Split(cur, i_start, t, tuple(g.names[x] for x in inputs)))
                cur, i_start, inputs = node_backend, t, []

            srcs: list[Ref | None] = []
            for src in g.srcs[t]:
                if src < 0:
                    srcs.append(None)
                    continue
                src_backend = ids[src]
                if src_backend == -1:
                    raise SchedAbort("GGML_ASSERT(src_backend_id != -1) failed")
                ref = g.refs[src]
                if not self.rules.all_input_leafs_are_graph_inputs and g.input[src] and n_copies > 1 and (src, src_backend) not in copies:
                    copies[(src, src_backend)] = self.graph_input_copies(g, src, src_backend)
                    if limit is not None and len(graph_inputs) >= limit:
                        raise SchedAbort("GGML_ASSERT(n_graph_inputs < GGML_SCHED_MAX_SPLIT_INPUTS) failed")
                    graph_inputs.append(src)
                if src_backend != cur and not self.buffer_supported(g, ids, src, cur):
                    if (src, cur) not in copies:
                        copies[(src, cur)] = [self.copy_ref(g, src, cur, c) for c in range(n_copies)]
                        if limit is not None and len(inputs) >= limit:
                            raise SchedAbort("GGML_ASSERT(n_inputs < GGML_SCHED_MAX_SPLIT_INPUTS) failed")
                        inputs.append(src)
                    ref = copies[(src, cur)][self.cur_copy]
                srcs.append(ref)
            node_srcs[t] = srcs
        splits.append(Split(cur, i_start, g.n_nodes, tuple(g.names[x] for x in inputs)))
        if self.rules.all_input_leafs_are_graph_inputs:
            graph_inputs = self.pass6_graph_inputs(g, ids)
        return splits, node_srcs, graph_inputs

    def pass6_graph_inputs(self, g: CGraph, ids: list[int]) -> list[int]:
        """Pass 6 (0.25.3): with ``n_copies > 1`` every input leaf is a graph input, in leaf
        order, whether or not a node reads it, so that the graph's composition does not depend
        on which inputs are used."""
        if self.n_copies == 1:
            return []
        for t in g.leaf_ids:
            if g.input[t] and ids[t] == -1:
                raise SchedAbort("GGML_ASSERT(leaf_backend_id != -1) failed")
        inputs = [t for t in g.leaf_ids if g.input[t]]
        # fixed graph-input arrays (``max_split_inputs``) assert whichever pass collects the inputs
        limit = self.rules.max_split_inputs
        if limit is not None and len(inputs) > limit:
            raise SchedAbort("GGML_ASSERT(n_graph_inputs < GGML_SCHED_MAX_SPLIT_INPUTS) failed")
        return inputs

    def graph_input_copies(self, g: CGraph, t: int, backend: int) -> list[Ref]:
        """The ``n_copies`` copies of a graph input: copy ``cur_copy`` is the input itself."""
        return [g.refs[t] if c == self.cur_copy else self.copy_ref(g, t, backend, c, flagged=True) for c in range(self.n_copies)]

    def split_order(self, g: CGraph, split: Split, node_srcs: dict[int, list[Ref | None]]) -> list[int]:
        """The split's nodes after ``ggml_backend_graph_optimize`` on its backend (called per split
        just before the graph copy is built): in graph order unless the backend reorders."""
        order = list(range(split.i_start, split.i_end))
        if not self.backends.reorders(split.backend):
            return order

        def srcs_of(t: int) -> list[int]:
            # a src the scheduler replaced by an input copy is no node of this split
            current = node_srcs.get(t)
            return [s for k, s in enumerate(g.srcs[t]) if s >= 0 and (current is None or current[k] is g.refs[s])]

        return fake_gpu_reorder(order, lambda t: g.view_src[t] if g.view_src[t] >= 0 else t, srcs_of)

    def alloc_deps(self, g: CGraph, split: Split, order: list[int], srcs_of: Callable[[int], tuple[Ref | None, ...]]) -> dict[int, list[Ref]]:
        """The tensors the split's backend asks to keep alive until each of its nodes, in
        ``ggml_backend_graph_optimize`` (``add_alloc_dep``, 0.25.3: ``Rules.alloc_deps``)."""
        if not self.rules.alloc_deps or not self.backends.fuses(split.backend):
            return {}
        refs = {r.name: r for t in order for r in srcs_of(t) if r is not None}
        kept = fake_gpu_fuse(order, lambda t: [r.name if r is not None else None for r in srcs_of(t)], lambda t: g.names[t])
        return {t: [refs[n] for n in names] for t, names in kept.items()}

    def copy_ref(self, g: CGraph, t: int, backend: int, c: int, flagged: bool | None = None) -> Ref:
        """``ggml_dup_tensor_layout`` of ``t``, named ``BACKEND#name#c`` like ggml. A graph input's
        copies are flagged input and output, a split input's only with ``n_copies > 1``."""
        flagged = self.n_copies > 1 if flagged is None else flagged
        return Ref(f"{self.layout.name(backend)}#{g.names[t]}#{c}", True, g.nbytes[t], "NONE", None, flagged, flagged, g.layout[t])

    def build_graph_copy(
        self, g: CGraph, ids: list[int], splits: list[Split], node_srcs: dict[int, list[Ref | None]], graph_inputs: list[int]
    ) -> SplitResult:
        """The end of ``ggml_backend_sched_split_graph``: graph_size, and ``sched->graph`` — per split, for each input a dependency view of the source
        (on the source's backend) and the input copy (on the split's backend), then the
        split's nodes; leafs: with ``parallel`` the graph inputs' and the split inputs' copies,
        then the original leafs."""
        def srcs_of(t: int) -> tuple[Ref | None, ...]:
            return tuple(node_srcs[t]) if t in node_srcs else tuple(g.refs[s] if s >= 0 else None for s in g.srcs[t])

        # each split optimized by its backend: its order, and the tensors kept alive until a node
        orders = [self.split_order(g, split, node_srcs) for split in splits]
        kept = [self.alloc_deps(g, split, order, srcs_of) for split, order in zip(splits, orders)]
        n_inputs = len(graph_inputs) + sum(len(split.inputs) for split in splits)
        size = self.rules.graph_size(g.n_nodes, g.n_leafs, len(splits), n_inputs, self.n_copies, sum(dep_nodes(k) for k in kept))

        index = {n: i for i, n in enumerate(g.names)}
        nodes: list[Ref] = []
        srcs: list[tuple[Ref | None, ...]] = []
        node_ids: list[int] = []
        for split, order, keep in zip(splits, orders, kept):
            for name in split.inputs:
                src = index[name]
                nodes.append(Ref(f"{name} (view)", False, g.nbytes[src]))
                srcs.append((g.refs[src],))
                node_ids.append(ids[src])
                nodes.append(self.copy_ref(g, src, split.backend, self.cur_copy))
                srcs.append(())
                node_ids.append(split.backend)
            for t in order:
                nodes.append(g.refs[t])
                srcs.append(srcs_of(t))
                node_ids.append(ids[t])
                # a dependency node: a view of the first kept tensor, with GGML_MAX_SRC of them as srcs
                for k in range(0, len(keep.get(t, ())), GGML_MAX_SRC):
                    chunk = keep[t][k : k + GGML_MAX_SRC]
                    nodes.append(Ref(f"{chunk[0].name} (view)", False, chunk[0].nbytes))
                    srcs.append(tuple(chunk))
                    node_ids.append(split.backend)
        leafs: list[Ref] = []
        leaf_ids: list[int] = []
        if self.n_copies > 1:
            for src in graph_inputs:
                for ref in self.graph_input_copies(g, src, ids[src]):
                    leafs.append(ref)
                    leaf_ids.append(ids[src])
            for split in splits:
                for name in split.inputs:
                    for c in range(self.n_copies):
                        leafs.append(self.copy_ref(g, index[name], split.backend, c))
                        leaf_ids.append(split.backend)
        for t in g.leaf_ids:
            leafs.append(g.refs[t])
            leaf_ids.append(ids[t])

        if graph_inputs:
            # the graph inputs themselves (their copy cur_copy) are flagged output too
            flag = {g.names[t] for t in graph_inputs}
            out = lambda r: replace(r, output=True) if r is not None and r.name in flag else r
            nodes, leafs = [out(r) for r in nodes], [out(r) for r in leafs]
            srcs = [tuple(out(r) for r in rs) for rs in srcs]
        copy = GraphCopy(tuple(nodes), tuple(srcs), tuple(node_ids), tuple(leafs), tuple(leaf_ids))
        return SplitResult(tuple(ids[: g.n_nodes]), tuple(ids[g.n_nodes : g.n_nodes + g.n_leafs]), tuple(splits), copy, size)

    # ------------------------------------------------------------------ ggml_backend_sched_alloc_splits

    def node_ids_changed(self, n: int) -> bool:
        """The first loop of ``backend_ids_changed``: over the graph copy's nodes."""
        return _ids_changed(self.node_backend_ids, self.prev_node_backend_ids, n, self.backends.bufts)

    def leaf_ids_changed(self, n: int) -> bool:
        """The second loop: over its leafs (run when no node changed)."""
        return _ids_changed(self.leaf_backend_ids, self.prev_leaf_backend_ids, n, self.backends.bufts)

    def gallocr_reserve_n(self, copy: GraphCopy) -> bool:
        """``ggml_gallocr_reserve_n(sched->galloc, &sched->graph, node_backend_ids, leaf_backend_ids)``."""
        try:
            return self.galloc.reserve_n(copy.nodes, copy.node_srcs, copy.leafs, copy.node_backend_ids, copy.leaf_backend_ids)
        except AllocAbort as e:
            raise SchedAbort(str(e)) from None

    def gallocr_alloc_graph(self, copy: GraphCopy) -> bool:
        """``ggml_gallocr_alloc_graph(sched->galloc, &sched->graph)``."""
        try:
            return self.galloc.alloc_graph(copy.nodes, copy.node_srcs, copy.leafs)
        except AllocAbort as e:
            raise SchedAbort(str(e)) from None
        except NullBufferCrash as crash:  # another name: compiled, ``e`` keeps the first clause's type
            raise SchedCrash(str(crash)) from None

    def alloc_splits(self, result: SplitResult, step: int) -> tuple[list[ReallocEvent], bool]:
        """``ggml_backend_sched_alloc_splits``: re-reserve when the backend ids changed (to a
        different buffer type) at some position, or when the galloc plan is not valid; then
        allocate. A failed re-reserve returns false in 0.25.3 and is ignored in 0.15.3
        (``Rules.reserve_failure_returned``)."""
        copy = result.copy
        changed = self.node_ids_changed(len(copy.nodes)) or self.leaf_ids_changed(len(copy.leafs))
        event = lambda via, reason: ReallocEvent(
            step, via, changed, len(result.splits), reason, self.debug_graph_size, self.debug_prev_graph_size, len(copy.nodes)
        )
        events: list[ReallocEvent] = []
        if changed:
            events.append(event("sched", "backend ids changed"))
        else:
            ok = self.gallocr_alloc_graph(copy)
            if self.galloc.realloc_reason is not None:
                # ggml_gallocr_alloc_graph re-reserves by itself when it has a single buffer
                events.append(event("gallocr" if self.galloc.n_buffers == 1 else "sched", self.galloc.realloc_reason))
            if ok:
                return events, True
        if not self.gallocr_reserve_n(copy) and self.rules.reserve_failure_returned:
            return events, False
        return events, self.gallocr_alloc_graph(copy)


def _write(arr: list[int], values: tuple[int, ...]) -> None:
    """Overwrite the start of a calloc'ed id array, growing it with zeros as needed."""
    if len(arr) < len(values):
        arr.extend([0] * (len(values) - len(arr)))
    arr[: len(values)] = values


def _ids_changed(cur: list[int], prev: list[int], n: int, bufts: list[str]) -> bool:
    """The ``backend_ids_changed`` loop: an id differs *and* its buffer type differs."""
    for i in range(n):
        a = cur[i] if i < len(cur) else 0
        b = prev[i] if i < len(prev) else 0
        if a != b and bufts[a] != bufts[b]:
            return True
    return False
