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

from pytest_schedfuzz.model.scenario import GraphSpec
from pytest_schedfuzz.model.shapes import GGML_OP_NAMES, LEAF_VIEW_OPS, VIEW_OPS, is_contiguous, nbytes


def tensor_graph(spec: GraphSpec) -> nx.DiGraph:
    """The spec's tensors and their ``src`` edges: each vertex carries its op and its ``src[]``
    (what ``ggml_visit_parents_graph`` walks), each edge the slot of ``src`` in ``dst->src[]``.

    >>> from pytest_schedfuzz.model.scenario import GraphBuilder
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


@dataclass(frozen=True)
class Ref:
    """A tensor of the scheduled graph copy as the allocator sees it.

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
    order, then the leafs in graph order. ``srcs[i]`` holds ids (``-1`` for NULL)."""

    names: list[str]
    n_nodes: int
    n_leafs: int
    op: list[str]
    ggml_op: list[str]  # ggml_op_name of each op
    view_op: list[bool]
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
    srcs: list[tuple[int, ...]]
    refs: list[Ref] = field(default_factory=list)  # each tensor as the allocator sees it

    @staticmethod
    def build(spec: GraphSpec) -> CGraph:
        """The graph in ggml's order (``forward_order`` over ``tensor_graph``), then what the
        scheduler reads from each ``ggml_tensor``, read from the spec and its geometry."""
        g = tensor_graph(spec)
        nodes, leafs = forward_order(g, spec.roots)
        names = nodes + leafs
        index = {n: i for i, n in enumerate(names)}
        # tensors outside the graph (not reachable from a root) can still be view sources
        for extra in g.nodes:
            if extra not in index:
                index[extra] = len(names)
                names.append(extra)
        by_name, geometry = spec.by_name, spec.geometry
        ts = [by_name[n] for n in names]
        gs = [geometry[n] for n in names]
        pre = [t.role in ("weight", "cache") for t in ts]  # pre-allocated: in a buffer of their device
        cg = CGraph(
            names=names,
            n_nodes=len(nodes),
            n_leafs=len(leafs),
            op=[t.op for t in ts],
            ggml_op=[GGML_OP_NAMES[t.op] for t in ts],
            view_op=[t.op in VIEW_OPS for t in ts],
            view_src=[index[x.view_src] if x.view_src else -1 for x in gs],
            buffer=[t.device if p and t.device is not None else -1 for t, p in zip(ts, pre)],
            weights=[t.role == "weight" for t in ts],
            input=[t.role == "input" for t in ts],
            output=[t.output for t in ts],
            nbytes=[nbytes(x) for x in gs],
            type=[x.type for x in gs],
            ne0=[x.ne[0] for x in gs],
            ne1=[x.ne[1] for x in gs],
            contiguous=[is_contiguous(x) for x in gs],
            layout=[(x.type, x.ne, x.nb) for x in gs],
            srcs=[tuple(index[s] if s is not None else -1 for s in t.srcs) for t in ts],
        )
        cg.refs = [
            Ref(n, not cg.has_data(t) and cg.view_src[t] < 0, cg.nbytes[t], cg.ggml_op[t], names[cg.view_src[t]] if cg.view_src[t] >= 0 else None,
                cg.input[t], cg.output[t], cg.layout[t])
            for t, n in enumerate(names)
        ]
        return cg

    @property
    def leaf_ids(self) -> range:
        return range(self.n_nodes, self.n_nodes + self.n_leafs)

    def has_data(self, t: int) -> bool:
        """``tensor->data != NULL`` in a fresh graph: pre-allocated tensors and views of them."""
        return self.buffer[t] >= 0 or (self.view_src[t] >= 0 and self.buffer[self.view_src[t]] >= 0)
