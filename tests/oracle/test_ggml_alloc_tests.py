"""The reference allocator held to ggml's own tests: every case of ggml 0.25.3's
``tests/test-alloc.cpp`` (llama-cpp-python 0.3.36's vendored llama.cpp) runs on the real
``libggml-base`` (``pytest_schedfuzz/ggml/alloc_tests.c``, in a process of its own) and on
``reference/alloc.py``, which must agree exactly: what each call returned, every buffer's chunks
and size, every tensor's (buffer, chunk, offset). Each case also asserts what test-alloc.cpp
asserts (its checks, run in C, and its bounds on the bytes each dummy backend allocated), of ggml
and of the reference alike.

Each case is test-alloc.cpp's, written again with the project's graph model (``GraphBuilder``;
``CGraph`` puts it in ggml's order), its tensors named as ``assign_names`` names them. Those
tensors must be ggml's (op, shape, strides, flags, view source, srcs), so a mistranslated graph
fails before any placement is compared.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_schedfuzz.builds.compile import source_tree
from pytest_schedfuzz.builds.installed import installed_folder
from pytest_schedfuzz.ggml.alloc_tests import AllocTestsCrash, build_alloc_tests, run_alloc_tests
from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
from pytest_schedfuzz.model.scenario import SchedParams
from pytest_schedfuzz.model.trace import Split
from reference import sched
from reference.alloc import SIZE_MAX, BufferType, Gallocr, aligned_offset
from reference.graph import CGraph, Ref
from reference.rules import rules_for

RULES = rules_for("0.25.3")[0]
INPLACE_OPS = RULES.inplace_ops  # ggml_op_can_inplace of 0.25.3 (a test plants a fault here)
Snapshot = dict[str, Any]  # what alloc_tests.c prints after an allocation (its header says what each key holds)
GRAPH_KEYS = ("op", "type", "ne", "nb", "input", "output", "nbytes", "view_src", "view_offs", "srcs")
PLACEMENT_KEYS = ("buffer", "external", "chunk", "offset")


@pytest.fixture(scope="module")
def ggml() -> dict[str, list[Snapshot]]:
    """Every case's snapshots, from one run of the C translation on ggml 0.25.3."""
    return run_alloc_tests(build_alloc_tests(installed_folder("ggml-0.25.3")))


@dataclass(frozen=True)
class Dummy:
    """``dummy_backend_init(max_buffer_size, alignment)``: a buffer type that never refuses. ggml
    tells buffer types apart by pointer, ``BufferType`` by value: each dummy gets a name of its own
    (two of one name would share one allocator and buffer in ``Gallocr``, as one buffer type given
    twice does in ``ggml_gallocr_new_n``; test_buffer_size_zero's two identical dummies do not)."""

    name: str
    max_size: int
    alignment: int = 8

    @property
    def buft(self) -> BufferType:
        return BufferType(self.name, self.alignment, self.max_size)


@dataclass
class Graph:
    """test-alloc.cpp's contexts and helpers over ``GraphBuilder``: tensors named by prefix in the
    order they are made (``assign_names``). ``ggml_mean``, which the model lacks, is built as
    ``sum_rows`` (the same shape) and given op ``MEAN``; inputs in a buffer made outside the
    gallocr (``ggml_backend_alloc_ctx_tensors_from_buft``) are weights of that buffer id, flagged input."""

    b: GraphBuilder = field(default_factory=GraphBuilder)
    counts: dict[str, int] = field(default_factory=dict)
    means: set[str] = field(default_factory=set)
    external: dict[str, list[str]] = field(default_factory=dict)  # a context's prefix -> its tensors

    def _name(self, prefix: str) -> str:
        n = self.counts[prefix] = self.counts.get(prefix, 0) + 1
        return f"{prefix}{n - 1}"

    def input_1d(self, n: int, prefix: str = "x", external: int | None = None) -> str:
        """``make_input_1d``; ``external``: in a buffer of that buffer id, made outside the gallocr."""
        name = self._name(prefix)
        if external is None:
            return self.b.input(name, (n,))
        self.external.setdefault(prefix, []).append(name)
        return self.b.weight(name, (n,), device=external)

    def input_with_size(self, size: int, prefix: str = "x", external: int | None = None) -> str:
        return self.input_1d(size // 4, prefix, external)

    def op(self, op: str, *args: str, **params: Any) -> str:
        return self.b.op(op, *args, name=self._name("x"), **params)

    def pad(self, a: str, p0: int) -> str:
        return self.op("pad", a, pad=[0, p0, 0, 0, 0, 0, 0, 0])  # ggml_pad: ggml_pad_ext(a, 0, p0, 0, 0, 0, 0, 0, 0)

    def mean(self, a: str) -> str:
        name = self.op("sum_rows", a)
        self.means.add(name)
        return name

    def build(self, out: str) -> Built:
        """``ggml_set_output(out); ggml_build_forward_expand(graph, out)``."""
        made = self.b.build(out)
        spec = GraphSpec(tuple(replace(t, output=True) if t.name == out else t for t in made.tensors), made.roots)
        cg = CGraph.build(spec)
        ext = {n for names in self.external.values() for n in names}
        refs = [replace(r, op="MEAN" if r.name in self.means else r.op, input=r.input or r.name in ext) for r in cg.refs]
        return Built(self, spec, cg, refs)


@dataclass
class Built:
    """A graph of ``Graph.build``: its spec, its ``CGraph`` and its tensors as the allocator sees them."""

    graph: Graph
    spec: GraphSpec
    cg: CGraph
    refs: list[Ref]

    def args(self) -> tuple[tuple[Ref, ...], tuple[tuple[Ref | None, ...], ...], tuple[Ref, ...]]:
        """As ``Gallocr`` takes a graph: its nodes, each node's srcs, its leafs."""
        cg, refs = self.cg, self.refs
        srcs = tuple(tuple(refs[s] if s >= 0 else None for s in cg.srcs[t]) for t in range(cg.n_nodes))
        return tuple(refs[: cg.n_nodes]), srcs, tuple(refs[t] for t in cg.leaf_ids)


def galloc_of(*dummies: Dummy) -> Gallocr:
    """``ggml_gallocr_new_n`` of the dummies' buffer types (``ggml_gallocr_new`` of one)."""
    return Gallocr([d.buft for d in dummies], INPLACE_OPS)


def snapshot(g: Built, galloc: Gallocr, results: list[bool], dummies: tuple[Dummy, ...],
             placed: tuple[tuple[Ref, ...], tuple[Ref, ...]] | None = None) -> Snapshot:
    """What the reference predicts ggml's run prints after ``galloc`` allocated ``g`` (or, with
    ``placed``, a scheduler's graph copy of it: its nodes and leafs). Tensors in buffers made
    outside the gallocr are where ``ggml_backend_alloc_ctx_tensors_from_buft`` puts them (one
    buffer per context, as each fits its max size; each tensor after the last, its size padded
    to the alignment: ``ggml_tallocr_alloc``); a view is where its source is, ``view_offs`` on."""
    nodes, _, leafs = g.args() if placed is None else (placed[0], (), placed[1])
    assert galloc.plan is not None
    where: dict[str, tuple[int, bool, int, int]] = {}
    for ref, talloc in [*zip(nodes, galloc.plan.dst), *zip(leafs, galloc.plan.leafs)]:
        if talloc.buffer_id >= 0:
            where[ref.name] = (talloc.buffer_id, False, *talloc.addr)
    external = [0] * len(dummies)
    for names in g.graph.external.values():
        for name in names:
            i = g.cg.names.index(name)
            b = g.cg.buffer[i]
            where[name] = (b, True, 0, external[b])
            external[b] += aligned_offset(g.cg.nbytes[i], dummies[b].alignment)
    tensors = []
    for ref in g.refs:
        geo = g.spec.geometry[ref.name]
        # -1: no buffer, as the C program says it
        b, ext, chunk, offset = where.get(geo.view_src or ref.name, (-1, False, -1, -1 - geo.view_offs))
        tensors.append({"name": ref.name, "op": ref.op, "type": geo.type, "ne": list(geo.ne), "nb": list(geo.nb),
                        "input": ref.input, "output": ref.output, "nbytes": ref.nbytes, "view_src": geo.view_src,
                        "view_offs": geo.view_offs, "srcs": list(g.spec.by_name[ref.name].srcs),
                        "buffer": b, "external": ext, "chunk": chunk, "offset": offset + geo.view_offs})
    buffers = [list(chunks) if chunks is not None else [] for chunks in galloc.buffers]
    return {"results": results, "nodes": g.cg.names[: g.cg.n_nodes], "leafs": [g.cg.names[t] for t in g.cg.leaf_ids],
            "tensors": tensors, "buffers": buffers, "buffer_sizes": [galloc.get_buffer_size(i) for i in range(galloc.n_buffers)],
            "allocated_total": [external[i] + sum(buffers[i]) for i in range(len(dummies))], "external": external,
            "violations": []}


def allocate_graph(g: Graph, out: str, galloc: Gallocr, dummy: Dummy) -> Snapshot:
    """test-alloc.cpp's ``allocate_graph`` (on a given gallocr): ``ggml_gallocr_alloc_graph``."""
    built = g.build(out)
    return snapshot(built, galloc, [galloc.alloc_graph(*built.args())], (dummy,))


def reserve_n_and_alloc(g: Graph, out: str, ids: dict[str, int], *dummies: Dummy) -> Snapshot:
    """``ggml_gallocr_new_n``, ``ggml_gallocr_reserve_n`` with each tensor's buffer id (``ids``, by
    name), then ``ggml_gallocr_alloc_graph``."""
    built, galloc = g.build(out), galloc_of(*dummies)
    nodes, srcs, leafs = built.args()
    reserved = galloc.reserve_n(nodes, srcs, leafs, tuple(ids[n.name] for n in nodes), tuple(ids[n.name] for n in leafs))
    return snapshot(built, galloc, [reserved, galloc.alloc_graph(nodes, srcs, leafs)], dummies)


# ------------------------------------------------------------------ test-alloc.cpp's cases, on the reference


def single(max_size: int, alignment: int = 8) -> tuple[Dummy, Gallocr]:
    dummy = Dummy("backend", max_size, alignment)
    return dummy, galloc_of(dummy)


def max_size_too_many_tensors() -> list[Snapshot]:
    dummy, galloc = single(16)
    g = Graph()
    x = [g.input_with_size(8), g.input_with_size(8), g.input_with_size(8)]
    x.append(g.op("mul", x[0], x[1]))
    x.append(g.op("add", x[1], x[2]))
    x.append(g.op("add", x[3], x[0]))
    x.append(g.op("add", x[4], x[5]))
    return [allocate_graph(g, x[6], galloc, dummy)]


def max_size_tensor_too_large() -> list[Snapshot]:
    dummy, galloc = single(32)
    g = Graph()
    x0, x1 = g.input_with_size(16), g.input_with_size(8)
    return [allocate_graph(g, g.op("concat", x0, x1, dim=0), galloc, dummy)]


def tensor_larger_than_max_size() -> list[Snapshot]:
    dummy, galloc = single(16)
    g = Graph()
    return [allocate_graph(g, g.op("scale", g.input_with_size(24), scale=2.0), galloc, dummy)]


def not_enough_chunks() -> list[Snapshot]:
    dummy, galloc = single(8)
    g = Graph()
    x = [g.input_with_size(8) for _ in range(17)]
    acc = x[0]
    for i in range(16):
        acc = g.op("add", acc, x[i + 1])
    return [allocate_graph(g, acc, galloc, dummy)]


def fill_leftover_space() -> list[Snapshot]:
    dummy, galloc = single(16)
    g = Graph()
    return [allocate_graph(g, g.mean(g.pad(g.input_with_size(8), 2)), galloc, dummy)]


def view_inplace() -> list[Snapshot]:
    dummy, galloc = single(32)
    g = Graph()
    x0 = g.input_1d(4)
    x1 = g.op("reshape", x0, ne=[2, 2])
    x2 = g.op("permute", x1, axes=[1, 0, 2, 3])
    x3 = g.op("view", x2, ne=[2], offset=4)  # ggml_view_1d(x2, 2, 4)
    x4 = g.input_1d(2)
    return [allocate_graph(g, g.op("add", x3, x4), galloc, dummy)]


def reuse_and_free() -> list[Snapshot]:
    dummy, galloc = single(40)
    g = Graph()
    x0, x1, x2 = g.input_with_size(24), g.input_with_size(8), g.input_with_size(8)
    x3 = g.op("add", x1, x2)
    x4 = g.pad(x0, 2)
    x5 = g.op("scale", x4, scale=2.0)
    x6 = g.op("add", x4, x5)
    x7 = g.op("view", x6, ne=[2], offset=8)
    return [allocate_graph(g, g.op("add", x3, x7), galloc, dummy)]


def merge_free_block(max_size: int) -> list[Snapshot]:
    dummy, galloc = single(max_size)
    g = Graph()
    x0, x1, x2 = g.input_with_size(16), g.input_with_size(16), g.input_with_size(16)
    x3, x4, x5 = g.mean(x0), g.mean(x1), g.pad(x2, 2)
    x6 = g.op("add", x3, x4)
    x7 = g.pad(x6, 5)
    return [allocate_graph(g, g.op("add", x5, x7), galloc, dummy)]


def prefer_already_allocated_memory() -> list[Snapshot]:
    dummy, galloc = single(32, alignment=4)
    g = Graph()
    return [allocate_graph(g, g.mean(g.mean(g.input_with_size(24))), galloc, dummy)]


def multiple_buffer_types() -> list[Snapshot]:
    g = Graph()
    a = [g.input_with_size(16, "a", external=0), g.input_with_size(16, "a", external=0)]
    b = [g.input_with_size(24, "b", external=1), g.input_with_size(4, "b", external=1)]
    x0 = g.input_with_size(16)
    x1 = g.op("mul", x0, a[0])
    x2 = g.pad(x1, 2)
    x3 = g.op("mul", x2, b[0])
    x4 = g.mean(x3)
    x5 = g.op("add", x4, b[1])
    x6 = g.pad(x5, 3)
    x7 = g.op("add", x6, a[1])
    x8 = g.op("scale", x7, scale=2.0)
    ids = {"a0": 0, "a1": 0, "b0": 1, "b1": 1, "x0": 0, "x1": 0, "x2": 0, "x3": 1, "x4": 1, "x5": 1, "x6": 1, "x7": 0, "x8": 0}
    return [reserve_n_and_alloc(g, x8, ids, Dummy("backend_a", 32), Dummy("backend_b", SIZE_MAX))]


def buffer_size_zero() -> list[Snapshot]:
    g = Graph()
    x1 = g.op("scale", g.input_with_size(16), scale=2.0)
    return [reserve_n_and_alloc(g, x1, {"x0": 0, "x1": 0}, Dummy("backend_a", SIZE_MAX), Dummy("backend_b", SIZE_MAX))]


def reallocation() -> list[Snapshot]:
    dummy, galloc = single(32, alignment=4)
    g = Graph()
    x0, x1 = g.input_with_size(24), g.input_with_size(16)
    first = allocate_graph(g, g.op("add", g.op("view", x0, ne=[4]), x1), galloc, dummy)
    g = Graph()
    x0, x1 = g.input_with_size(20), g.input_with_size(20)
    return [first, allocate_graph(g, g.op("add", x0, x1), galloc, dummy)]


class KeepsFirstUntilThird(sched.Scheduler):
    """A scheduler whose backend's ``graph_optimize`` is test-alloc.cpp's
    ``test_backend_graph_optimize``: ``add_alloc_dep(nodes[0], nodes[2])`` of its one split."""

    def alloc_deps(self, g: CGraph, split: Split, order: list[int],
                   srcs_of: Callable[[int], tuple[Ref | None, ...]]) -> dict[int, list[Ref]]:
        assert len(order) == 3  # GGML_ASSERT(graph->n_nodes == 3)
        return {order[2]: [g.refs[order[0]]]}


def graph_reuses_allocation(add_alloc_dep: bool) -> list[Snapshot]:
    """The reference scheduler on one backend, the dummy's (the layout's CPU with the dummy's
    buffer type: its ops are all supported, as the dummy supports every op)."""
    g = Graph()
    x = [g.input_with_size(16)]
    for _ in range(3):
        x.append(g.op("scale", x[-1], scale=2.0))
    built, dummy = g.build(x[3]), Dummy("backend", SIZE_MAX)
    cls = KeepsFirstUntilThird if add_alloc_dep else sched.Scheduler
    s = cls(BackendLayout((BackendSpec("cpu"),)), SchedParams(8, parallel=False, op_offload=True), RULES)
    s.galloc = galloc_of(dummy)
    result, _, ok = s.alloc_graph(built.cg, 0)
    return [snapshot(built, s.galloc, [ok], (dummy,), (result.copy.nodes, result.copy.leafs))]


# ------------------------------------------------------------------ what test-alloc.cpp asserts, and the comparison


def total(snapshots: list[Snapshot], backend: int = 0, graph: int = 0) -> int:
    """``backend.context->allocated_total()`` after the case's ``graph``-th allocation."""
    return int(snapshots[graph]["allocated_total"][backend])


def where(snapshots: list[Snapshot], name: str) -> tuple[int, int, int]:
    t = next(t for t in snapshots[0]["tensors"] if t["name"] == name)
    return t["buffer"], t["chunk"], t["offset"]


@dataclass(frozen=True)
class Case:
    """A case of test-alloc.cpp: its graphs on the reference, and its assertion (as written there)
    on what the case allocated."""

    reference: Callable[[], list[Snapshot]]
    asserts: str
    holds: Callable[[list[Snapshot]], bool]


CASES: dict[str, Case] = {
    "test_max_size_too_many_tensors": Case(max_size_too_many_tensors, "allocated_total() <= 16 + 16",
                                           lambda s: total(s) <= 16 + 16),
    "test_max_size_tensor_too_large": Case(max_size_tensor_too_large, "allocated_total() <= 32 + 24",
                                           lambda s: total(s) <= 32 + 24),
    "test_tensor_larger_than_max_size": Case(tensor_larger_than_max_size, "allocated_total() == 24",
                                             lambda s: total(s) == 24),
    "test_not_enough_chunks": Case(not_enough_chunks, "allocated_total() > max_chunks * max_size",
                                   lambda s: total(s) > 16 * 8),
    "test_fill_leftover_space": Case(fill_leftover_space, "allocated_total() <= 12 + 16",
                                     lambda s: total(s) <= 12 + 16),
    "test_view_inplace": Case(view_inplace, "allocated_total() <= 24",
                              lambda s: total(s) <= 24),
    "test_reuse_and_free": Case(reuse_and_free, "allocated_total() <= 40 + 32 + 32",
                                lambda s: total(s) <= 40 + 32 + 32),
    "test_merge_free_block(32)": Case(lambda: merge_free_block(32), "allocated_total() <= 32 + 32 + 24",
                                      lambda s: total(s) <= 32 + 32 + 24),
    "test_merge_free_block(SIZE_MAX)": Case(lambda: merge_free_block(SIZE_MAX), "allocated_total() <= 32 + 32 + 24",
                                            lambda s: total(s) <= 32 + 32 + 24),
    "test_prefer_already_allocated_memory": Case(prefer_already_allocated_memory, "allocated_total() <= 28",
                                                 lambda s: total(s) <= 28),
    "test_multiple_buffer_types": Case(multiple_buffer_types, "a: allocated_total() <= 32 + 32 + 24, b: <= 32 + 24",
                                       lambda s: total(s, 0) <= 32 + 32 + 24 and total(s, 1) <= 32 + 24),
    "test_buffer_size_zero": Case(buffer_size_zero, "backend_a: allocated_total() == 16, backend_b: == 0",
                                  lambda s: total(s, 0) == 16 and total(s, 1) == 0),
    "test_reallocation": Case(reallocation, "allocated_total() == 40 after either graph",
                              lambda s: total(s, 0, 0) == total(s, 0, 1) == 40),
    "graph_reuses_allocation(false)": Case(lambda: graph_reuses_allocation(False), "x[1]->data == x[2]->data",
                                           lambda s: where(s, "x1") == where(s, "x2")),
    "graph_reuses_allocation(true)": Case(lambda: graph_reuses_allocation(True), "x[1]->data != x[2]->data",
                                          lambda s: where(s, "x1") != where(s, "x2")),
}


def compared(k: int, e: Snapshot, p: Snapshot, keys: tuple[str, ...], per_tensor: bool) -> list[str]:
    """The ``keys`` on which snapshot ``p`` of the reference differs from ggml's ``e`` (graph ``k``
    of a case): the snapshots' own, or each tensor's."""
    if per_tensor:
        theirs, mine = ({t["name"]: t for t in s["tensors"]} for s in (e, p))
        pairs = [(f"{name}: ", theirs[name], mine[name]) for name in sorted(theirs)]
    else:
        pairs = [("", e, p)]
    return [f"graph {k}: {at}{key}: ggml {a[key]!r}, the reference {b[key]!r}"
            for at, a, b in pairs for key in keys if a[key] != b[key]]


def differences(engine: list[Snapshot], predicted: list[Snapshot]) -> list[str]:
    """Where the reference's snapshots differ from ggml's: the graphs first (a graph that is not
    ggml's is a mistranslation, and its placements say nothing), then what each call returned,
    the buffers and every tensor's placement."""
    if len(engine) != len(predicted):
        return [f"ggml made {len(engine)} allocations, the reference {len(predicted)}"]
    out: list[str] = []
    for k, (e, p) in enumerate(zip(engine, predicted)):
        names = [sorted(t["name"] for t in s["tensors"]) for s in (e, p)]
        if names[0] != names[1]:
            return out + [f"graph {k}: tensors: ggml {names[0]}, the reference {names[1]}"]
        graph = compared(k, e, p, ("nodes", "leafs"), False) + compared(k, e, p, GRAPH_KEYS, True)
        if graph:
            return out + graph
        out += compared(k, e, p, ("results", "buffers", "buffer_sizes", "allocated_total", "external"), False)
        out += compared(k, e, p, PLACEMENT_KEYS, True)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_the_reference_places_every_tensor_as_ggml_does(case: str, ggml: dict[str, list[Snapshot]]) -> None:
    engine, predicted = ggml[case], CASES[case].reference()
    assert [s["violations"] for s in engine] == [[]] * len(engine), "test-alloc.cpp's checks failed on ggml"
    # test-alloc.cpp asserts each allocation succeeds (GGML_ASSERT(result), res1 && res2), or that all is allocated after it
    assert all(r for s in engine for r in s["results"]), [s["results"] for s in engine]
    totals = [s["allocated_total"] for s in engine]
    assert CASES[case].holds(engine), f"ggml breaks test-alloc.cpp's {CASES[case].asserts}: {totals}"
    assert CASES[case].holds(predicted), f"the reference breaks test-alloc.cpp's {CASES[case].asserts}"
    assert differences(engine, predicted) == []


def test_every_case_of_test_alloc_cpp_is_translated(ggml: dict[str, list[Snapshot]]) -> None:
    """Each ``run(...)`` of test-alloc.cpp's ``main`` is a case here and in the C translation (the
    ``graph_optimize`` test as its two halves), and the C program runs them all."""
    main = (source_tree("llama.cpp-0.3.36") / "tests" / "test-alloc.cpp").read_text().split("int main()")[1]
    names = re.findall(r'run\("([^"]+)"', main)
    halves = ["graph_reuses_allocation(false)", "graph_reuses_allocation(true)"]
    assert [n for n in names if n != "test_graph_optimize_alloc_dep"] + halves == list(CASES) == list(ggml)


@pytest.mark.parametrize("fault, agree", [
    # without in-place reuse, only the graphs without an in-place op (concat, pad, mean) are placed as ggml does
    ("no in-place reuse", {"test_max_size_tensor_too_large", "test_fill_leftover_space", "test_prefer_already_allocated_memory"}),
    # with chunks of any size, only the cases whose max size never binds
    ("no max size", {"test_tensor_larger_than_max_size", "test_view_inplace", "test_merge_free_block(SIZE_MAX)",
                     "test_prefer_already_allocated_memory", "test_buffer_size_zero", "graph_reuses_allocation(false)",
                     "graph_reuses_allocation(true)"}),
])
def test_a_reference_with_a_planted_fault_disagrees(fault: str, agree: set[str], ggml: dict[str, list[Snapshot]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: a reference without in-place reuse (``ggml_op_can_inplace`` empty),
    or whose chunks ignore the buffer type's max size, disagrees with ggml on every case where
    the rule decides a placement."""
    if fault == "no in-place reuse":
        monkeypatch.setattr(f"{__name__}.INPLACE_OPS", frozenset())
    else:
        monkeypatch.setattr(Dummy, "buft", property(lambda d: BufferType(d.name, d.alignment)))
    assert {case for case, c in CASES.items() if not differences(ggml[case], c.reference())} == agree


def test_one_case_runs_alone_and_a_crash_is_reported(tmp_path: Path) -> None:
    """A case can be run by its name alone; a program that aborts (as ggml does on a failed
    ``GGML_ASSERT``) raises ``AllocTestsCrash`` with what it printed, in pytest's process."""
    program = build_alloc_tests(installed_folder("ggml-0.25.3"))
    assert [len(v) for v in run_alloc_tests(program, "test_reallocation").values()] == [2]
    aborts = tmp_path / "aborts"
    aborts.write_text("#!/bin/sh\necho 'ggml-alloc.c:1107: GGML_ASSERT(buffer_id >= 0) failed' >&2\nkill -ABRT $$\n")
    aborts.chmod(0o755)
    with pytest.raises(AllocTestsCrash, match=r"exited with -6 after 0 snapshots:\nggml-alloc.c:1107: GGML_ASSERT"):
        run_alloc_tests(aborts)
