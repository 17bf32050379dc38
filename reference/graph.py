"""A graph spec as a networkx ``DiGraph`` of tensors, in ggml's own node and leaf order.

Vertices are tensor names, each with its op and ``src[]``; an edge ``src -> dst`` carries the
``slot`` of ``src`` in ``dst->src[]``. ``CGraph`` orders them as ggml does and holds, as index
arrays (nodes first, in graph order), what the scheduler reads from a ``ggml_tensor``: its op,
whether it is a view op, its view source, the backend whose buffer holds it (pre-allocated
weights and caches), the buffer usage, the input/output flags and its ``ggml_nbytes``, so that
the passes can be written as the plain loops of ``ggml-backend.cpp``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from pytest_schedfuzz.model.graph_spec import GraphSpec
from pytest_schedfuzz.model.ops import GGML_OP_NAMES, LEAF_VIEW_OPS, VIEW_OPS
from pytest_schedfuzz.model.shapes import is_contiguous, nbytes


def tensor_graph(spec: GraphSpec) -> nx.DiGraph:
    """The spec's tensors and their ``src`` edges: each vertex carries its op and its ``src[]``
    (what ``ggml_visit_parents_graph`` walks), each edge the slot of ``src`` in ``dst->src[]``.

    >>> from pytest_schedfuzz.model.graph_spec import GraphBuilder
    >>> b = GraphBuilder(); w = b.weight("w", (4, 4), device=0); x = b.input("x", (4, 2))
    >>> g = tensor_graph(b.build(b.op("mul_mat", w, x, name="y")))
    >>> sorted(g.edges(data="slot"))
    [('w', 'y', 0), ('x', 'y', 1)]
    """
    g = nx.DiGraph()
    g.add_nodes_from((t.name, {"op": t.op, "srcs": t.srcs}) for t in spec.tensors)
    g.add_edges_from((src, t.name, {"slot": slot}) for t in spec.tensors for slot, src in enumerate(t.srcs) if src not in (None, t.name))
    return g


def forward_order(g: nx.DiGraph, roots: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``ggml_build_forward_expand`` on each root in turn: (nodes, leafs) in ggml's order.

    Mirrors ``ggml_visit_parents_graph``: a depth-first post-order over ``src[0..]``, left to
    right, where tensors with ``op == NONE`` (``ggml_view_tensor``'s views too) become leafs and
    everything else a node.

    >>> g = nx.DiGraph(); g.add_nodes_from(["a", "b"], op="none", srcs=())
    >>> g.add_node("c", op="add", srcs=("a", "b")); g.add_node("d", op="scale", srcs=("c",))
    >>> forward_order(g, ("d",))
    (['c', 'd'], ['a', 'b'])
    """
    attrs = dict(g.nodes(data=True))
    visited: set[str] = set()
    nodes: list[str] = []
    leafs: list[str] = []
    for root in roots:
        # iterative post-order, so that graphs of thousands of nodes do not hit recursion limits
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            name, i = stack.pop()
            if i == 0:
                if name in visited:
                    continue
                visited.add(name)
            srcs = attrs[name]["srcs"]
            while i < len(srcs) and (srcs[i] is None or srcs[i] in visited):
                i += 1
            if i < len(srcs):
                stack.append((name, i + 1))
                stack.append((srcs[i], 0))
                continue
            (leafs if attrs[name]["op"] == "none" or attrs[name]["op"] in LEAF_VIEW_OPS else nodes).append(name)
    return nodes, leafs


TOPOLOGIES_KEPT = 64  # topologies remembered (``Topology.of``), the least recently used forgotten
_TOPOLOGIES: dict[tuple[tuple[str, ...], tuple[tuple[str, str, tuple[str | None, ...]], ...]], Topology] = {}
TOPOLOGY_COUNTS = {"built": 0, "reused": 0}  # by ``Topology.of`` in this process (``schedfuzz bench``)


@dataclass(frozen=True)
class Topology:
    """What the ops of a graph alone decide: ggml's node and leaf order (``forward_order`` over
    ``tensor_graph``), each tensor's id, op and ``src[]`` ids. Specs that differ only in shapes,
    types, roles or devices share it: llama.cpp's graphs of one model at each batch size, a
    scenario's graphs drawn from one model, a captured graph drawn into many scenarios; so it is
    built once per distinct (roots, each tensor's name, op and ``src[]``), the key of ``of``.
    Its lists are shared by every ``CGraph`` of it and never changed."""

    names: list[str]  # nodes in graph order, then leafs, then tensors outside the graph
    n_nodes: int
    n_leafs: int
    index: dict[str, int]
    op: list[str]
    ggml_op: list[str]  # ggml_op_name of each op
    view_op: list[bool]
    srcs: list[tuple[int, ...]]

    @staticmethod
    def of(spec: GraphSpec) -> Topology:
        """The spec's topology: built, or remembered from a spec with the same key."""
        key = (spec.roots, tuple([(t.name, t.op, t.srcs) for t in spec.tensors]))
        topo = _TOPOLOGIES.pop(key, None)  # put back last: the most recently used
        if topo is None:
            topo = Topology.build(spec)
            TOPOLOGY_COUNTS["built"] += 1
            if len(_TOPOLOGIES) >= TOPOLOGIES_KEPT:
                del _TOPOLOGIES[next(iter(_TOPOLOGIES))]
        else:
            TOPOLOGY_COUNTS["reused"] += 1
        _TOPOLOGIES[key] = topo
        return topo

    @staticmethod
    def build(spec: GraphSpec) -> Topology:
        g = tensor_graph(spec)
        nodes, leafs = forward_order(g, spec.roots)
        names = nodes + leafs
        index = {n: i for i, n in enumerate(names)}
        # tensors outside the graph (not reachable from a root) can still be view sources
        for extra in g.nodes:
            if extra not in index:
                index[extra] = len(names)
                names.append(extra)
        by_name = spec.by_name
        ops = [by_name[name].op for name in names]
        srcs = [tuple(index[s] if s is not None else -1 for s in by_name[name].srcs) for name in names]
        return Topology(names, len(nodes), len(leafs), index, ops, [GGML_OP_NAMES[op] for op in ops], [op in VIEW_OPS for op in ops], srcs)


@dataclass(slots=True)
class Ref:
    """A tensor of the scheduled graph copy as the allocator sees it (never changed once made;
    not frozen: the graph copy makes thousands of them per step, and a frozen dataclass's
    constructor costs several times more; compiled, its fields are read like a struct's).

    ``needs_memory`` is ``!tensor->data && !tensor->view_src``: the tensor is allocated by
    ggml-alloc and checked against the plan by ``ggml_gallocr_needs_realloc``.
    """

    name: str
    needs_memory: bool
    nbytes: int
    # what ggml-alloc reads besides (``reference/alloc.py``)
    op: str = "NONE"  # ggml_op_name: ggml_op_can_inplace
    view_src: str | None = None
    input: bool = False  # GGML_TENSOR_FLAG_INPUT: allocated before the nodes
    output: bool = False  # GGML_TENSOR_FLAG_OUTPUT: never freed nor overwritten in place
    layout: tuple = ()  # (type, ne, nb): ggml_are_same_layout


@dataclass
class CGraph:
    """A ``ggml_cgraph`` as arrays over tensor ids: ids ``0..n_nodes-1`` are the nodes in graph
    order, then the leafs in graph order. ``srcs[i]`` holds ids (``-1`` for NULL). The names, ops
    and srcs are its ``Topology``'s lists."""

    names: list[str]
    n_nodes: int
    n_leafs: int
    op: list[str]
    ggml_op: list[str]  # ggml_op_name of each op
    view_op: list[bool]
    srcs: list[tuple[int, ...]]
    view_src: list[int]  # -1: none
    buffer: list[int]  # backend whose buffer holds the tensor, -1: not pre-allocated
    weights: list[bool]
    input: list[bool]
    output: list[bool]
    nbytes: list[int]
    type: list[str]
    ne0: list[int]
    ne1: list[int]
    contiguous: list[bool]
    layout: list[tuple]
    refs: list[Ref] = field(default_factory=list)  # each tensor as the allocator sees it

    @staticmethod
    def of(spec: GraphSpec) -> CGraph:
        """``build(spec)``, once per spec: a spec is immutable and nothing the scheduler does
        changes its graph, and a spec can be in many scenarios (llama.cpp's captured graphs,
        each drawn into many; a scenario's steps on the same graph)."""
        derived = spec.derived
        cached: CGraph | None = derived.get("reference.CGraph")
        if cached is None:
            cached = derived["reference.CGraph"] = CGraph.build(spec)
        return cached

    @staticmethod
    def build(spec: GraphSpec) -> CGraph:
        """The graph in ggml's order (``Topology.of``), then what the scheduler reads from each
        ``ggml_tensor``, read from the spec and its geometry (one pass over the tensors: with the
        topology, this is most of the reference's work per graph)."""
        topo = Topology.of(spec)
        names, index = topo.names, topo.index
        by_name, geometry = spec.by_name, spec.geometry
        n = len(names)
        # the columns of the topology are shared by every graph of it: nothing changes them
        cg = CGraph(names, topo.n_nodes, topo.n_leafs, topo.op, topo.ggml_op, topo.view_op, topo.srcs, *([] for _ in range(11)))
        for name in names:
            t, x = by_name[name], geometry[name]
            pre = t.role in ("weight", "cache")  # pre-allocated: in a buffer of their device
            cg.view_src.append(index[x.view_src] if x.view_src else -1)
            cg.buffer.append(t.device if pre and t.device is not None else -1)
            cg.weights.append(t.role == "weight")
            cg.input.append(t.role == "input")
            cg.output.append(t.output)
            cg.nbytes.append(nbytes(x))
            cg.type.append(x.type)
            cg.ne0.append(x.ne[0])
            cg.ne1.append(x.ne[1])
            cg.contiguous.append(is_contiguous(x))
            cg.layout.append((x.type, x.ne, x.nb))
        buffer, view_src, ggml_op = cg.buffer, cg.view_src, cg.ggml_op
        for i in range(n):
            v = view_src[i]
            # tensor->data != NULL in a fresh graph: pre-allocated tensors and views of them
            has_data = buffer[i] >= 0 or (v >= 0 and buffer[v] >= 0)
            cg.refs.append(Ref(names[i], not has_data and v < 0, cg.nbytes[i], ggml_op[i], names[v] if v >= 0 else None,
                               cg.input[i], cg.output[i], cg.layout[i]))
        return cg

    @property
    def leaf_ids(self) -> range:
        return range(self.n_nodes, self.n_nodes + self.n_leafs)
