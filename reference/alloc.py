"""The graph allocator of ``ggml-alloc.c``: ``ggml_gallocr`` over ``ggml_dyn_tallocr``.

Read side by side with ``ggml-alloc.c`` (identical in ggml 0.15.3 and 0.25.3 but for
``ggml_op_can_inplace``, which 0.25.3 extends by ``CLAMP``: ``Rules.inplace_ops``). The
scheduler gives its graph copy and backend ids to ``Gallocr.reserve_n`` and
``Gallocr.alloc_graph``; this module places every tensor ggml-alloc allocates (chunk and
offset, with in-place reuse and frees as ggml does them) and so predicts what the engine
makes observable: each backend's compute buffer size (``ggml_gallocr_get_buffer_size``), and
when a buffer is refused (a device's ``max_size``), the failed reservation and what follows.

Tensors are the graph copy's ``Ref``s, keyed by name (ggml keys its hash set by pointer; the
names of the copy are unique but for the source views of split inputs, which are never a src).

>>> cpu = BufferType("CPU", alignment=32)
>>> a = DynTallocr(cpu.alignment, cpu.max_size)
>>> a.alloc(100), a.alloc(40), a.max_size(0)
((0, 0), (0, 128), 160)
>>> a.free_bytes((0, 0), 100); a.alloc(64)  # the freed block is the best fit
(0, 0)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from .graph import Ref

SIZE_MAX = 2**64 - 1
INT64_MIN = -(2**63)
MAX_FREE_BLOCKS = 256
GGML_VBUFFER_MAX_CHUNKS = 16

# ggml_op_can_inplace (0.15.3; 0.25.3 adds CLAMP: Rules.inplace_ops): ops whose kernels may write over a src
INPLACE_OPS = frozenset({
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG",
    "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "SOFT_MAX", "SOFT_MAX_BACK",
})

Address = tuple[int, int]  # struct buffer_address: (chunk, offset)

# how the reference ends the message of a failure it predicts in placing a tensor: a plan that
# fits its buffers never fails there, so such a failure is always a failed reservation's plan
KEPT_PLAN = "the plan of a reservation that failed to allocate"
# ... or the plan a ``ggml_gallocr_reserve_n_size`` measurement recorded, having freed the buffers it found too small
MEASURED_PLAN = "the plan of a reserve_size measurement, whose buffers that had to grow it freed (no_alloc)"
# where ggml crashes on a NULL buffer, with its callers in ggml-alloc.c: a Release build inlines the
# static ones, and its C stack then starts at a caller (``properties.aborts.unlike_prediction``)
NULL_BUFFER_CRASH_AT = "ggml_vbuffer_tensor_alloc < ggml_gallocr_init_tensor < ggml_gallocr_alloc_graph"


class AllocAbort(Exception):
    """ggml-alloc aborts here (``GGML_ASSERT`` / ``GGML_ABORT``); the message is ggml's."""


class NullBufferCrash(Exception):
    """``ggml_vbuffer_tensor_alloc`` would read a NULL ``vbuffer``: ggml dereferences it."""


@dataclass(frozen=True)
class BufferType:
    """What ggml-alloc asks a ``ggml_backend_buffer_type``: ``get_alignment``,
    ``get_max_size``, and whether ``alloc_buffer`` refuses a size (a device over its limit)."""

    name: str
    alignment: int = 32  # TENSOR_ALIGNMENT (the CPU's, and an RPC server's CPU's)
    max_size: int = SIZE_MAX
    refuses_over: int | None = None  # alloc_buffer returns NULL above this many bytes

    def alloc_buffer(self, size: int) -> int | None:
        """``ggml_backend_buft_alloc_buffer``: the buffer's size, or None when refused (a size
        of 0 gets ggml's dummy buffer)."""
        if size and self.refuses_over is not None and size > self.refuses_over:
            return None
        return size


def aligned_offset(offset: int, alignment: int) -> int:
    """``aligned_offset`` with a NULL base: ``offset`` rounded up to ``alignment``."""
    return offset + (alignment - offset % alignment) % alignment


@dataclass
class Chunk:
    """``struct tallocr_chunk``: free blocks as ``[offset, size]``, sorted by offset."""

    free_blocks: list[list[int]]
    max_size: int = 0


class DynTallocr:
    """``struct ggml_dyn_tallocr``: a best-fit allocator of offsets in up to
    ``GGML_VBUFFER_MAX_CHUNKS`` chunks of at most ``max_chunk_size`` bytes each (bigger only for
    a tensor that does not fit otherwise, and for the last chunk)."""

    def __init__(self, alignment: int, max_buffer_size: int) -> None:
        """``ggml_dyn_tallocr_new``."""
        self.alignment = alignment
        self.max_chunk_size = min(max_buffer_size, SIZE_MAX // 2)
        self.chunks: list[Chunk] = []

    def reset(self) -> None:
        """``ggml_dyn_tallocr_reset``."""
        self.chunks = []

    @staticmethod
    def insert_block(chunk: Chunk, offset: int, size: int) -> None:
        """``ggml_dyn_tallocr_insert_block``: keep the blocks sorted by offset."""
        if len(chunk.free_blocks) >= MAX_FREE_BLOCKS:
            raise AllocAbort('GGML_ASSERT(chunk->n_free_blocks < MAX_FREE_BLOCKS && "out of free blocks") failed')
        pos = 0
        while pos < len(chunk.free_blocks) and chunk.free_blocks[pos][0] < offset:
            pos += 1
        chunk.free_blocks.insert(pos, [offset, size])

    def new_chunk(self, min_size: int) -> int:
        """``ggml_dyn_tallocr_new_chunk``: -1 when all chunks are taken; the last one is
        virtually endless."""
        if len(self.chunks) >= GGML_VBUFFER_MAX_CHUNKS:
            return -1
        size = max(min_size, self.max_chunk_size)
        if len(self.chunks) == GGML_VBUFFER_MAX_CHUNKS - 1:
            size = SIZE_MAX // 2
        self.chunks.append(Chunk([[0, size]]))
        return len(self.chunks) - 1

    def alloc(self, size: int) -> Address:
        """``ggml_dyn_tallocr_alloc``: the best fitting free block but the last of any chunk;
        else the last block of the chunk that reuses its memory best (or grows least); else a
        new chunk."""
        size = aligned_offset(size, self.alignment)
        best_chunk, best_block = -1, -1
        for c, chunk in enumerate(self.chunks):
            best_fit_size = SIZE_MAX
            for i, (_, bsize) in enumerate(chunk.free_blocks[:-1]):
                if bsize >= size and bsize <= best_fit_size:
                    best_chunk, best_block, best_fit_size = c, i, bsize
        if best_block == -1:
            best_reuse = INT64_MIN
            for c, chunk in enumerate(self.chunks):
                if chunk.free_blocks:
                    offset, bsize = chunk.free_blocks[-1]
                    reuse_factor = chunk.max_size - offset - size
                    better_reuse = best_reuse < 0 and reuse_factor > best_reuse
                    better_fit = reuse_factor >= 0 and reuse_factor < best_reuse
                    if bsize >= size and (better_reuse or better_fit):
                        best_chunk, best_block, best_reuse = c, len(chunk.free_blocks) - 1, reuse_factor
        if best_block == -1:
            best_chunk, best_block = self.new_chunk(size), 0
        if best_chunk == -1:
            raise AllocAbort("GGML_ABORT: graph allocation: failed to reserve memory")
        chunk = self.chunks[best_chunk]
        block = chunk.free_blocks[best_block]
        addr = (best_chunk, block[0])
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del chunk.free_blocks[best_block]
        chunk.max_size = max(chunk.max_size, addr[1] + size)
        return addr

    def free_bytes(self, addr: Address, size: int) -> None:
        """``ggml_dyn_tallocr_free_bytes``: merge with the block before or after, else insert."""
        size = aligned_offset(size, self.alignment)
        chunk = self.chunks[addr[0]]
        blocks = chunk.free_blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == addr[1]:
                block[1] += size
                if i < len(blocks) - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if addr[1] + size == block[0]:
                block[0] = addr[1]
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        self.insert_block(chunk, addr[1], size)

    def max_size(self, chunk: int) -> int:
        """``ggml_dyn_tallocr_max_size``."""
        return self.chunks[chunk].max_size if chunk < len(self.chunks) else 0


@dataclass(slots=True)
class HashNode:
    """``struct hash_node`` (zeroed by ``ggml_gallocr_alloc_graph_impl``)."""

    n_children: int = 0
    n_views: int = 0
    buffer_id: int = 0
    addr: Address = (0, 0)
    allocated: bool = False


class TensorAlloc(NamedTuple):
    """``struct tensor_alloc``: where the plan put a tensor (``buffer_id`` -1 and size 0 for
    tensors with data or a view source). A tuple: a plan holds one per node and src."""

    buffer_id: int
    size_max: int
    addr: Address = (-1, -1)


@dataclass
class Plan:
    """``node_allocs`` and ``leaf_allocs``: what ``ggml_gallocr_reserve_n`` recorded per position."""

    dst: list[TensorAlloc] = field(default_factory=list)
    srcs: list[tuple[TensorAlloc | None, ...]] = field(default_factory=list)
    leafs: list[TensorAlloc] = field(default_factory=list)

    @property
    def n_nodes(self) -> int:
        return len(self.dst)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)


NO_ALLOC = TensorAlloc(-1, 0)


def node_valid(talloc: TensorAlloc, t: Ref) -> bool:
    """``ggml_gallocr_node_needs_realloc`` (true means *valid*, despite the name): a tensor ggml-alloc
    allocates fits where the plan put it."""
    if not t.needs_memory:
        return True
    return talloc.buffer_id >= 0 and talloc.size_max >= t.nbytes


class Gallocr:
    """``struct ggml_gallocr`` as ``ggml_gallocr_new_n`` makes it for ``bufts``: buffer types
    used more than once share one allocator and one buffer; ``inplace_ops``: the version's
    ``ggml_op_can_inplace``."""

    def __init__(self, bufts: list[BufferType], inplace_ops: frozenset[str] = INPLACE_OPS) -> None:
        self.bufts = bufts
        self.inplace_ops = inplace_ops
        self.buf_tallocs: list[DynTallocr] = []
        for i, buft in enumerate(bufts):
            same = next((j for j in range(i) if bufts[j] == buft), None)
            self.buf_tallocs.append(self.buf_tallocs[same] if same is not None else DynTallocr(buft.alignment, buft.max_size))
        # each buffer: the sizes of its chunks' backend buffers (a ``vbuffer``), or None
        self.buffers: list[list[int] | None] = [None] * len(bufts)
        self.plan: Plan | None = None
        self.realloc_reason: str | None = None  # what the last alloc_graph's needs_realloc said
        self.unfit = KEPT_PLAN
        self.hash: defaultdict[str, HashNode] = defaultdict(HashNode)  # by tensor name; zeroed on first get
        self.srcs: dict[str, tuple[Ref | None, ...]] = {}

    @property
    def n_buffers(self) -> int:
        return len(self.bufts)

    def hash_get(self, t: Ref) -> HashNode:
        """``ggml_gallocr_hash_get`` (``self.hash[name]`` where only a name is at hand)."""
        return self.hash[t.name]

    def is_own(self, t: Ref) -> bool:
        """``ggml_gallocr_is_own``."""
        return self.hash_get(t).allocated

    def free_extra_space(self, node: Ref, parent: Ref) -> None:
        """``ggml_gallocr_free_extra_space``: give back what the parent had beyond the node's size."""
        p_hn = self.hash_get(parent)
        parent_size, node_size = parent.nbytes, node.nbytes
        if parent_size < node_size:
            raise AllocAbort("GGML_ASSERT(parent_size >= node_size) failed")
        p_alloc = self.buf_tallocs[p_hn.buffer_id]
        parent_size = aligned_offset(parent_size, p_alloc.alignment)
        node_size = aligned_offset(node_size, p_alloc.alignment)
        if parent_size > node_size:
            p_alloc.free_bytes((p_hn.addr[0], p_hn.addr[1] + node_size), parent_size - node_size)

    def allocate_node(self, node: Ref, buffer_id: int) -> None:
        """``ggml_gallocr_allocate_node``: take the memory of a src that an in-place op may
        overwrite (own, not an output, the same layout, this node its only remaining child),
        else allocate. A view parent is never own (views are never allocated here), so ggml's
        branch that reuses a view's source never runs."""
        if buffer_id < 0:
            raise AllocAbort("GGML_ASSERT(buffer_id >= 0) failed")
        # ggml_gallocr_is_allocated: data set elsewhere (a weight, a cache, a view of one) or allocated
        # here (in a fresh graph a tensor has a buffer only when it has data); and views are not allocated
        if node.view_src is not None or not node.needs_memory:
            return
        hn = self.hash[node.name]
        if hn.allocated:
            return
        hn.allocated = True
        if node.op in self.inplace_ops:
            for parent in self.srcs.get(node.name, ()):
                if parent is None or not self.is_own(parent) or parent.output or node.layout != parent.layout:
                    continue
                p_hn = self.hash_get(parent)
                if p_hn.n_children == 1 and p_hn.n_views == 0:
                    hn.buffer_id, hn.addr = p_hn.buffer_id, p_hn.addr
                    p_hn.allocated = False  # avoid freeing the parent
                    self.free_extra_space(node, parent)
                    return
        hn.buffer_id = buffer_id
        hn.addr = self.buf_tallocs[buffer_id].alloc(node.nbytes)

    def free_node(self, node: Ref) -> None:
        """``ggml_gallocr_free_node``: graph outputs are never freed."""
        if node.output:
            return
        hn = self.hash_get(node)
        self.buf_tallocs[hn.buffer_id].free_bytes(hn.addr, node.nbytes)
        hn.allocated = False

    def alloc_graph_impl(self, nodes: tuple[Ref, ...], node_srcs: tuple[tuple[Ref | None, ...], ...],
                         leafs: tuple[Ref, ...], node_ids: tuple[int, ...] | None, leaf_ids: tuple[int, ...] | None) -> None:
        """``ggml_gallocr_alloc_graph_impl``: allocate the leafs, count children and views
        (allocating graph inputs first), then allocate each node and free each parent whose last
        child (and view) it was."""
        self.hash = hash_ = defaultdict[str, HashNode](HashNode)
        self.srcs = dict(zip((n.name for n in nodes), node_srcs))
        tensors = {t.name: t for t in (*leafs, *nodes)}
        allocate = self.allocate_node
        # get_node_buffer_id: 0 without ids
        leaf_ids = leaf_ids if leaf_ids is not None else (0,) * len(leafs)
        node_ids = node_ids if node_ids is not None else (0,) * len(nodes)
        for leaf, b in zip(leafs, leaf_ids):
            allocate(leaf, b)
        for node, srcs, b in zip(nodes, node_srcs, node_ids):
            if node.view_src is not None and node.op != "NONE":
                hash_[node.view_src].n_views += 1
            if node.input:
                allocate(node, b)
            for src in srcs:
                if src is None:
                    continue
                hash_[src.name].n_children += 1
                if src.input:
                    allocate(src, b)
        for node, srcs, b in zip(nodes, node_srcs, node_ids):
            for parent in srcs:
                if parent is not None:
                    allocate(parent, b)
            allocate(node, b)
            for parent in srcs:
                if parent is None:
                    continue
                p_hn = hash_[parent.name]
                p_hn.n_children -= 1
                if p_hn.n_children == 0 and p_hn.n_views == 0:
                    if parent.view_src is not None:
                        view_src = hash_[parent.view_src]
                        view_src.n_views -= 1
                        if view_src.n_views == 0 and view_src.n_children == 0 and view_src.allocated:
                            self.free_node(tensors[parent.view_src])
                    elif p_hn.allocated:
                        self.free_node(parent)

    def _talloc(self, t: Ref) -> TensorAlloc:
        if t.view_src is not None or not t.needs_memory:
            return NO_ALLOC
        hn = self.hash[t.name]
        return TensorAlloc(hn.buffer_id, t.nbytes, hn.addr)

    def reserve_n(self, nodes: tuple[Ref, ...], node_srcs: tuple[tuple[Ref | None, ...], ...], leafs: tuple[Ref, ...],
                  node_ids: tuple[int, ...] | None, leaf_ids: tuple[int, ...] | None, no_alloc: bool = False) -> bool:
        """``ggml_gallocr_reserve_n_impl``: place the graph, record the plan, then grow each buffer
        whose chunks grew (buffers never shrink). False, with the plan kept, when a buffer type
        refuses a chunk: that buffer is then NULL. With ``no_alloc`` (``reserve_n_size``) a buffer
        that would have to grow is freed and left NULL."""
        for talloc in self.buf_tallocs:
            talloc.reset()
        self.alloc_graph_impl(nodes, node_srcs, leafs, node_ids, leaf_ids)
        # every src is a node or a leaf of the graph: each tensor's record is made once
        records = {t.name: self._talloc(t) for t in (*leafs, *nodes)}
        self.plan = Plan(
            [records[n.name] for n in nodes],
            [tuple([records[s.name] if s is not None else None for s in srcs]) for srcs in node_srcs],
            [records[leaf.name] for leaf in leafs],
        )
        self.unfit = MEASURED_PLAN if no_alloc else KEPT_PLAN  # why this plan may not fit its buffers
        for i in range(self.n_buffers):
            same = next((j for j in range(i) if self.buf_tallocs[j] is self.buf_tallocs[i]), None)
            if same is not None:
                self.buffers[i] = self.buffers[same]
            talloc, cur = self.buf_tallocs[i], self.buffers[i]
            new_sizes = [talloc.max_size(c) for c in range(len(talloc.chunks))]
            realloc = cur is None or any(new > (cur[c] if c < len(cur) else 0) for c, new in enumerate(new_sizes))
            if realloc and no_alloc:
                self.buffers[i] = None  # ggml_vbuffer_free, then NULL
            elif realloc:
                chunks = [self.bufts[i].alloc_buffer(size) for size in new_sizes]  # ggml_vbuffer_alloc
                if any(c is None for c in chunks):
                    self.buffers[i] = None
                    return False
                self.buffers[i] = chunks  # type: ignore[assignment]
        return True

    def reserve_n_size(self, nodes: tuple[Ref, ...], node_srcs: tuple[tuple[Ref | None, ...], ...], leafs: tuple[Ref, ...],
                       node_ids: tuple[int, ...] | None, leaf_ids: tuple[int, ...] | None) -> tuple[int, ...]:
        """``ggml_gallocr_reserve_n_size``: ``reserve_n`` with ``no_alloc``, then each buffer's
        size as the sum of its allocator's chunks (a buffer type used twice counts twice)."""
        if not self.reserve_n(nodes, node_srcs, leafs, node_ids, leaf_ids, no_alloc=True):
            raise AllocAbort("GGML_ASSERT(ggml_gallocr_reserve_n_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids, /*no_alloc =*/ true)) failed")
        return tuple(sum(talloc.max_size(c) for c in range(len(talloc.chunks))) for talloc in self.buf_tallocs)

    def needs_realloc(self, nodes: tuple[Ref, ...], node_srcs: tuple[tuple[Ref | None, ...], ...], leafs: tuple[Ref, ...]) -> str | None:
        """``ggml_gallocr_needs_realloc``: ggml's reason the plan does not fit, or None if it does."""
        plan = self.plan
        if plan is None or plan.n_nodes != len(nodes):
            return "different number of nodes"
        if plan.n_leafs != len(leafs):
            return "different number of leafs"
        for node, srcs, dst, planned in zip(nodes, node_srcs, plan.dst, plan.srcs):
            if not node_valid(dst, node):
                return f"node {node.name} is not valid"
            for j, src in enumerate(srcs):
                # (a tensor ggml-alloc does not allocate is always valid: no call for it)
                if src is not None and src.needs_memory and not node_valid((planned[j] if j < len(planned) else None) or NO_ALLOC, src):
                    return f"src {j} ({src.name}) of node {node.name} is not valid"
        return None

    def alloc_graph(self, nodes: tuple[Ref, ...], node_srcs: tuple[tuple[Ref | None, ...], ...], leafs: tuple[Ref, ...]) -> bool:
        """``ggml_gallocr_alloc_graph``: when the plan does not fit, a single buffer re-reserves
        by itself, several cannot (False). Then every tensor the plan places is put in its
        buffer (``init_tensor``), which fails when that buffer is not the plan's."""
        self.realloc_reason = self.needs_realloc(nodes, node_srcs, leafs)
        if self.realloc_reason is not None and (self.n_buffers != 1 or not self.reserve_n(nodes, node_srcs, leafs, None, None)):
            return False
        assert self.plan is not None
        # a tensor's data is set by its first init; ggml_gallocr_init_tensor skips it afterwards
        done: set[str] = set()
        for leaf, talloc in zip(leafs, self.plan.leafs):
            if leaf.needs_memory and talloc.buffer_id >= 0 and leaf.name not in done:
                self.init_tensor(leaf, talloc)
                done.add(leaf.name)
        for node, srcs, dst, planned in zip(nodes, node_srcs, self.plan.dst, self.plan.srcs):
            for src, src_alloc in zip(srcs, planned):
                if src is not None and src_alloc is not None and src.needs_memory and src_alloc.buffer_id >= 0 and src.name not in done:
                    self.init_tensor(src, src_alloc)
                    done.add(src.name)
            if node.needs_memory and dst.buffer_id >= 0 and node.name not in done:
                self.init_tensor(node, dst)
                done.add(node.name)
        return True

    def init_tensor(self, t: Ref, talloc: TensorAlloc) -> None:
        """``ggml_gallocr_init_tensor`` of a tensor ggml-alloc allocates: ``ggml_vbuffer_tensor_alloc``
        into the chunk the plan chose. After a reservation that failed, the plan is the new one
        but the buffers are not: NULL (the refused one), or older and smaller (those after it)."""
        buf = self.buffers[talloc.buffer_id]
        if buf is None:
            raise NullBufferCrash(
                f"SIGSEGV in {NULL_BUFFER_CRASH_AT}: the {self.bufts[talloc.buffer_id].name} buffer planned to hold "
                f"{t.name} is NULL: {self.unfit}")
        chunk, offset = talloc.addr
        if chunk >= len(buf):  # ggml_backend_buffer_get_base(NULL chunk)
            raise AllocAbort(f"GGML_ASSERT(buffer) failed ({t.name}: chunk {chunk} of the {self.bufts[talloc.buffer_id].name} buffer "
                             f"does not exist): {self.unfit}")
        if offset + t.nbytes > buf[chunk]:  # ggml_backend_tensor_alloc
            raise AllocAbort(
                "GGML_ASSERT(ggml_backend_buffer_is_meta(buffer) || (char *) addr + ggml_backend_buffer_get_alloc_size(buffer, tensor) <= "
                f"(char *) ggml_backend_buffer_get_base(buffer) + ggml_backend_buffer_get_size(buffer)) failed ({t.name} planned at "
                f"{offset}..{offset + t.nbytes} of the {self.bufts[talloc.buffer_id].name} buffer's chunk {chunk} of {buf[chunk]} bytes): "
                f"{self.unfit}")

    def get_buffer_size(self, buffer_id: int) -> int:
        """``ggml_gallocr_get_buffer_size``: a buffer shared with an earlier id counts 0."""
        buf = self.buffers[buffer_id]
        if buf is None or any(self.buffers[i] is buf for i in range(buffer_id)):
            return 0
        return sum(buf)
