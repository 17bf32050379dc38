"""The reference scheduler, rule by rule, on small graphs worked out by reading ggml's source.

Each test names the rule of ``ggml_backend_sched_split_graph`` / ``ggml-alloc.c`` it checks;
``test_rules_are_load_bearing`` removes each rule from the reference and shows its test fails.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.model.shapes import nbytes
from pytest_schedfuzz.model.trace import StepRecord
from pytest_schedfuzz.sim.models import ModelShape, llama_graph
from reference import graph as reference_graph
from reference.backends import Backends
from reference.graph import CGraph, Topology, forward_order, tensor_graph
from reference.params import can_reuse
from reference.predict import predict
from reference.sched import Scheduler, ggml_hash_size

RPC_CPU = BackendLayout.of("rpc", "cpu")
RPC, CPU = 0, 1


def run(layout: BackendLayout, *steps: tuple[str, GraphSpec | None], params: SchedParams = SchedParams(2048)):
    graphs: dict[str, GraphSpec] = {}
    out = [Step("sched_new", params=params)]
    for kind, spec in steps:
        name = None
        if spec is not None:
            name = next((k for k, v in graphs.items() if v is spec), f"g{len(graphs)}")
            graphs[name] = spec
        out.append(Step(kind, graph=name))
    sc = Scenario(layout, tuple(graphs.items()), tuple(out))
    sc.validate()
    return predict(sc)


def assignment(layout: BackendLayout, spec: GraphSpec, params: SchedParams = SchedParams(2048)) -> dict[str, int]:
    rec = run(layout, ("alloc", spec), params=params).records[1]
    return dict(zip(rec.node_names + rec.leaf_names, rec.node_backends + rec.leaf_backends))


def split_view(rec: StepRecord) -> list[tuple[int, int, int, tuple[str, ...]]]:
    return [(s.backend, s.i_start, s.i_end, s.inputs) for s in rec.splits]


# ----------------------------------------------------------------------------- graph order


def test_node_order_is_ggml_post_order():
    """ggml_visit_parents_graph: depth-first, srcs left to right, leafs apart, shared srcs once."""
    b = GraphBuilder()
    w = b.weight("w", (4, 4), device=0)
    x = b.input("x", (4, 2))
    y = b.op("mul_mat", w, x, name="y")
    z = b.op("silu", y, name="z")
    s = b.op("add", z, y, name="s")
    spec = b.build(s)
    assert forward_order(tensor_graph(spec), spec.roots) == (["y", "z", "s"], ["w", "x"])
    # roots are expanded in turn: an earlier root's subgraph comes first
    spec2 = b.build(z, s)
    assert forward_order(tensor_graph(spec2), spec2.roots)[0] == ["y", "z", "s"]


def test_a_spec_s_graph_is_built_once_and_never_sent_to_the_engine():
    """A spec in many scenarios (a captured llama.cpp graph) is ordered and read once; its
    reference graph stays out of the pickle the engine's worker is sent."""
    spec = _mm(8)
    sc = Scenario(BackendLayout.of("cpu"), (("g", spec),), (Step("sched_new", params=SchedParams(64)), Step("alloc", "g")))
    first = predict(sc)
    assert CGraph.of(spec) is CGraph.of(spec) and predict(sc) == first
    sent = pickle.loads(pickle.dumps(spec))
    assert spec.derived and "_derived" not in sent.__dict__ and sent == spec
    assert CGraph.of(spec.relabeled("another name")) is CGraph.of(spec)


def test_a_copy_with_more_nodes_forced_checks_only_its_forced_assignments(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GraphSpec.with_forced`` (a captured graph drawn with more nodes forced): the copy's
    tensors, shared, are not checked again; its forced assignments are, by name and backend."""
    from pytest_schedfuzz.model.shapes import SpecError

    spec = llama_graph(ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1), 4, 16)
    spec.validate(2)
    checked: list[GraphSpec] = []
    real = GraphSpec._check_tensors
    monkeypatch.setattr(GraphSpec, "_check_tensors", lambda self, n: checked.append(self) or real(self, n))
    node = next(t.name for t in spec.tensors if not t.is_leaf)
    spec.with_forced(((node, 1),)).validate(2)
    assert checked == []
    with pytest.raises(SpecError, match="backend 2, not in the layout"):
        spec.with_forced(((node, 2),)).validate(2)
    with pytest.raises(SpecError, match="unknown tensor 'nothing'"):
        spec.with_forced((("nothing", 0),)).validate(2)
    spec.with_forced(((node, 1),)).validate(3)  # another layout: its tensors' devices are checked for it
    assert len(checked) == 1


def test_specs_of_one_topology_share_its_order_and_keep_their_own_shapes_and_places():
    """``Topology.of``: llama.cpp's graphs of one model at two batch sizes are ordered once, and
    each graph's own columns (sizes, buffers) are its own; another op, another root or another
    source is another topology; the least recently used one is forgotten beyond the limit."""
    m = ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1)
    big, small = llama_graph(m, 32, 64), llama_graph(m, 2, 64)
    assert Topology.of(big) is Topology.of(small)
    a, b = CGraph.build(big), CGraph.build(small)
    assert a.names is b.names and a.srcs is b.srcs and a.nbytes != b.nbytes
    # each as if built alone, from its own tensor graph
    for spec, cg in ((big, a), (small, b)):
        nodes, leafs = forward_order(tensor_graph(spec), spec.roots)
        assert cg.names[: len(nodes) + len(leafs)] == nodes + leafs
        assert cg.nbytes == [nbytes(spec.geometry[n]) for n in cg.names]
        assert cg.buffer == [spec.by_name[n].device if spec.by_name[n].role in ("weight", "cache") else -1 for n in cg.names]

    def mm(op: str, root_first: bool) -> GraphSpec:
        b = GraphBuilder()
        w, x = b.weight("w", (4, 4), device=0), b.input("x", (4, 2))
        y = b.op("mul_mat", w, x, name="y")
        z = b.op(op, y, name="z")
        return b.build(*((y, z) if root_first else (z,)))

    base = Topology.of(mm("silu", False))
    assert Topology.of(mm("silu", False)) is base
    assert Topology.of(mm("scale", False)) is not base and Topology.of(mm("silu", True)) is not base
    for i in range(reference_graph.TOPOLOGIES_KEPT):
        other = GraphBuilder()
        Topology.of(other.build(other.op("silu", other.input(f"x{i}", (4,)), name="y")))
    assert Topology.of(mm("silu", False)) is not base


# ----------------------------------------------------------------------------- pass 1


def _rope_graph(freq_device: int) -> GraphSpec:
    b = GraphBuilder()
    x = b.input("x", (8, 2, 4))
    pos = b.input("pos", (4,), "i32")
    freqs = b.weight("freqs", (4,), device=freq_device)
    r = b.op("rope", x, pos, freqs, name="r", n_dims=8)
    return b.build(r)


def test_pass1_weights_pull_ops_to_their_backend():
    b = GraphBuilder()
    w = b.weight("w", (8, 8), device=RPC)
    x = b.input("x", (8, 4))
    y = b.op("mul_mat", w, x, name="y")
    a = assignment(RPC_CPU, b.build(y))
    assert a == {"y": RPC, "w": RPC, "x": CPU}  # inputs go to the last backend


def test_pass1_preallocated_tensors_stay_on_their_buffer():
    b = GraphBuilder()
    cache = b.cache("cache", (8, 16), device=RPC)
    src = b.input("src", (8, 4))
    idx = b.input("idx", (4,), "i64")
    st = b.op("set_rows", cache, src, idx, name="store")
    a = assignment(RPC_CPU, b.build(st))
    assert a["store"] == RPC  # a view of the cache: its view source's buffer decides


def test_pass1_rope_ignores_its_weight_and_takes_most_supported_inputs():
    """ROPE is skipped by the weights rule; pass 3 then picks the backend with most inputs."""
    a = assignment(RPC_CPU, _rope_graph(RPC))
    assert a["r"] == CPU  # x and pos are readable on the CPU, only freqs on RPC


def test_pass1_op_offload_moves_host_weight_ops_to_an_offloading_backend():
    layout = BackendLayout((BackendSpec("gpu", offload_min_batch=32), BackendSpec("cpu")))
    b = GraphBuilder()
    w = b.weight("w", (8, 8), device=CPU)
    x = b.input("x", (8, 64))
    y = b.op("mul_mat", w, x, name="y")
    spec = b.build(y)
    assert assignment(layout, spec, SchedParams(2048, op_offload=True))["y"] == RPC
    assert assignment(layout, spec, SchedParams(2048, op_offload=False))["y"] == CPU


# ----------------------------------------------------------------------------- pass 2


def _chain() -> GraphSpec:
    """cpu-weight matmul -> silu -> scale -> rpc-weight matmul -> silu."""
    b = GraphBuilder()
    wc = b.weight("wc", (8, 8), device=CPU)
    wr = b.weight("wr", (8, 8), device=RPC)
    x = b.input("x", (8, 4))
    h = b.op("mul_mat", wc, x, name="h")
    h = b.op("silu", h, name="h_silu")
    h = b.op("scale", h, name="h_scale", scale=0.5)
    y = b.op("mul_mat", wr, h, name="y")
    y = b.op("silu", y, name="y_silu")
    return b.build(y)


def test_pass2_expands_gpu_down_and_up_before_cpu():
    a = assignment(RPC_CPU, _chain())
    # down from y, up from y (past the CPU-weight matmul's neighbours): the CPU never expands
    assert a["y_silu"] == RPC
    assert a["h_silu"] == RPC and a["h_scale"] == RPC
    assert a["h"] == CPU


def test_pass2_cpu_expands_when_there_is_no_gpu():
    cpu_only = BackendLayout.of("cpu")
    b = GraphBuilder()
    w = b.weight("w", (8, 8), device=0)
    x = b.input("x", (8, 4))
    y = b.op("silu", b.op("mul_mat", w, x, name="m"), name="s")
    assert assignment(cpu_only, b.build(y)) == {"m": 0, "s": 0, "w": 0, "x": 0}


# ----------------------------------------------------------------------------- pass 3


def test_pass3_upgrades_to_higher_priority_backend_with_same_buffer_type():
    """BLAS and CPU share host memory: a node on the CPU that BLAS supports moves to BLAS,
    even a user assignment (ggml upgrades after honouring it)."""
    layout = BackendLayout.of("blas", "cpu")
    b = GraphBuilder()
    x = b.input("x", (64, 64))
    y = b.input("y", (64, 64))
    m = b.op("mul_mat", x, y, name="m")
    s = b.op("silu", m, name="s")
    b.force("m", 1)
    a = assignment(layout, b.build(s))
    assert a["m"] == 0
    assert a["s"] == 1  # BLAS does not support silu


# ----------------------------------------------------------------------------- pass 4


def test_pass4_views_follow_their_view_source():
    """View ops are skipped by passes 2-3; pass 4 puts them with their view source (here the
    CPU), not on the first backend that supports them (RPC)."""
    b = GraphBuilder()
    w = b.weight("w", (8, 8), device=CPU)
    x = b.input("x", (8, 4))
    y = b.op("mul_mat", w, x, name="y")
    r = b.op("reshape", y, name="y_r", ne=[4, 2, 4])
    p = b.op("permute", r, name="y_p", axes=[0, 2, 1, 3])
    c = b.op("cont", p, name="c")
    a = assignment(RPC_CPU, b.build(c))
    assert a["y_r"] == CPU and a["y_p"] == CPU and a["c"] == CPU


# ----------------------------------------------------------------------------- pass 5


def test_pass5_splits_at_backend_changes_with_input_copies():
    rec = run(RPC_CPU, ("alloc", _chain())).records[1]
    # nodes: h, h_silu, h_scale, y, y_silu — h on the CPU, the rest on RPC
    assert rec.node_names == ("h", "h_silu", "h_scale", "y", "y_silu")
    assert split_view(rec) == [(CPU, 0, 1, ()), (RPC, 1, 5, ("h",))]
    # graph copy: every input adds its dependency view and its copy
    assert rec.n_nodes == 5 + 2 * 1


def test_pass5_new_split_for_weight_on_incompatible_backend():
    """Same backend, but a node reads a weight from another device: a new split starts, so that
    the memory of the previously offloaded weights can be reused."""
    layout = BackendLayout.of("rpc", "rpc", "cpu")
    b = GraphBuilder()
    w0 = b.weight("w0", (8, 8), device=0)
    w1 = b.weight("w1", (8, 8), device=1)
    x = b.input("x", (8, 4))
    h = b.op("mul_mat", w0, x, name="h")
    y = b.op("mul_mat", w1, h, name="y")
    b.force("y", 0)
    rec = run(layout, ("alloc", b.build(y))).records[1]
    assert split_view(rec) == [(0, 0, 1, ("x",)), (0, 1, 2, ("w1",))]


def test_pass5_parallel_makes_n_copies_and_graph_size_counts_them():
    spec = _chain()
    serial = run(RPC_CPU, ("alloc", spec)).records[1]
    par = run(RPC_CPU, ("alloc", spec), params=SchedParams(2048, parallel=True)).records[1]
    assert (serial.n_copies, par.n_copies) == (1, 4)
    # graph_size (0.25.3) = max(n_nodes, n_leafs) + (graph inputs + split inputs) * 2 * n_copies
    assert serial.graph_size == 5 + 1 * 2 * 1
    assert par.graph_size == 5 + 2 * 2 * 4
    # leafs: x (graph input) and h (split input) get 4 copies each before the 3 original leafs
    assert par.n_leafs == 4 + 4 + 3


# ----------------------------------------------------------------------------- allocator


def _mm(n_tokens: int, n_out: int = 8) -> GraphSpec:
    b = GraphBuilder()
    w = b.weight("w", (8, n_out), device=RPC)
    x = b.input("x", (8, n_tokens))
    y = b.op("silu", b.op("mul_mat", w, x, name="m"), name="s")
    return b.build(b.op("add", y, b.input("bias", (n_out, n_tokens)), name="o"))


def test_alloc_after_larger_reservation_does_not_realloc():
    p = run(RPC_CPU, ("reserve", _mm(32)), ("alloc", _mm(4)))
    assert p.records[2].events == ()


def test_alloc_larger_than_reservation_reallocs_naming_the_node():
    p = run(RPC_CPU, ("reserve", _mm(4)), ("alloc", _mm(32)))
    (ev,) = p.records[2].events
    assert ev.via == "sched" and not ev.backend_ids_changed
    # the first position of the graph copy is the dependency view of split 0's input x
    assert ev.reason == "src 0 (x) of node x (view) is not valid"
    assert ev.same_size  # the sizes grew, but graph_size counts only nodes, leafs and splits


def test_backend_ids_changed_only_across_buffer_types():
    """Positions whose backend changes between BLAS and CPU share host memory: not a change."""
    layout = BackendLayout.of("blas", "cpu")

    def g(n: int) -> GraphSpec:
        b = GraphBuilder()
        x = b.input("x", (64, n))
        w = b.weight("w", (64, 64), device=1)
        return b.build(b.op("silu", b.op("mul_mat", w, x, name="m"), name="s"))

    p = run(layout, ("reserve", g(64)), ("alloc", g(8)))
    # m runs on BLAS at 64 tokens and on the CPU at 8: ids differ, buffer types do not
    assert p.records[1].node_backends[0] == 0 and p.records[2].node_backends[0] == 1
    assert p.records[2].events == ()


def test_single_buffer_reallocates_inside_gallocr():
    cpu_only = BackendLayout.of("cpu")

    def g(n: int) -> GraphSpec:
        b = GraphBuilder()
        w = b.weight("w", (8, 8), device=0)
        return b.build(b.op("mul_mat", w, b.input("x", (8, n)), name="m"))

    (ev,) = run(cpu_only, ("reserve", g(2)), ("alloc", g(16))).records[2].events
    assert ev.via == "gallocr"


def test_topology_switch_forgets_the_larger_reservation():
    """reserve(A, 32 tokens) -> alloc(B) -> alloc(A, 2) -> alloc(A, 32): the last alloc
    re-reserves with unchanged graph size and backend ids — the plan was made for A(2)."""
    m = ModelShape(layer_devices=(RPC, RPC, CPU, CPU), output_device=CPU, cpu_device=CPU)
    a32, a2, b = llama_graph(m, 32, 64), llama_graph(m, 2, 64), llama_graph(m, 32, 64, n_outputs=1)
    p = run(RPC_CPU, ("reserve", a32), ("alloc", b), ("alloc", a2), ("alloc", a32))
    assert p.abort is None
    assert p.records[2].events and p.records[3].events  # topology switches: expected
    (last,) = p.records[4].events
    assert last.same_size and not last.backend_ids_changed and last.via == "sched"
    assert last.graph_size == p.records[1].graph_size


# ----------------------------------------------------------------------------- params, aborts


def test_hash_set_too_small_for_graph_aborts():
    p = run(RPC_CPU, ("alloc", _chain()), params=SchedParams(max_nodes=5))
    assert ggml_hash_size(5) == 5
    assert p.abort is not None and "hash_set.size" in p.abort.message


def test_reused_scheduler_keeps_its_own_params():
    sc = Scenario(
        RPC_CPU,
        (("g", _chain()),),
        (Step("sched_new", params=SchedParams(5)), Step("sched_new", params=SchedParams(4096), reuse=True), Step("alloc", "g")),
    )
    assert predict(sc).abort is not None  # reused with max_nodes 5: too small for 8 tensors


@pytest.mark.parametrize(
    ("new", "cur", "ok"),
    [
        (SchedParams(100, False, True), SchedParams(100, False, True), True),
        (SchedParams(99, False, True), SchedParams(100, False, True), True),
        (SchedParams(101, False, True), SchedParams(100, False, True), False),
        (SchedParams(100, True, True), SchedParams(100, False, True), False),
        (SchedParams(100, False, False), SchedParams(100, False, True), False),
    ],
)
def test_can_reuse_as_in_llama_cpp(new: SchedParams, cur: SchedParams, ok: bool):
    assert can_reuse(new, cur) is ok


# ----------------------------------------------------------------------------- the rules bear load

# ----------------------------------------------------------------------------- more rules


def test_backend_ids_changed_reads_the_leafs_too():
    """Same nodes on the same backends, leafs in another order (an RPC weight and a CPU input
    swap places): only the leaf loop of ``backend_ids_changed`` sees the change."""
    def g(first: str) -> GraphSpec:
        b = GraphBuilder()
        w, x = b.weight("w", (8, 2), device=RPC), b.input("x", (8, 2))
        return b.build(b.op("add", *((w, x) if first == "w" else (x, w)), name="y"))

    p = run(RPC_CPU, ("alloc", g("w")), ("alloc", g("x")))
    assert p.records[1].node_backends == p.records[2].node_backends
    (ev,) = p.records[2].events
    assert ev.backend_ids_changed and ev.reason == "backend ids changed"


def test_leaf_count_is_part_of_the_plan():
    """add(x, y) then add(x, x): one node each, one leaf fewer: "different number of leafs"."""
    def g(second: str) -> GraphSpec:
        b = GraphBuilder()
        x = b.input("x", (8, 2))
        return b.build(b.op("add", x, b.input("y", (8, 2)) if second == "y" else x, name="s"))

    (ev,) = run(BackendLayout.of("cpu"), ("alloc", g("y")), ("alloc", g("x"))).records[2].events
    assert ev.reason == "different number of leafs"


def test_a_split_with_29_inputs_and_a_node_needing_2_more_aborts_in_0_15_3():
    """0.15.3 checks the 30-input limit only when the split is already full (its FIXME): a node
    that brings two new inputs to a split of 29 hits GGML_ASSERT(n_inputs < 30)."""
    from reference.rules import RULES

    b = GraphBuilder()
    acc = b.op("mul_mat", b.weight("w", (8, 8), device=RPC), b.input("x0", (8, 1)), name="acc0")
    for k in range(1, 29):
        acc = b.op("add", acc, b.input(f"x{k}", (8, 1)), name=f"acc{k}")
    pair = b.op("add", b.input("xa", (8, 1)), b.input("xb", (8, 1)), name="pair")
    spec = b.build(b.op("add", acc, pair, name="out"))
    sc = Scenario(RPC_CPU, (("g", spec),), (Step("sched_new", params=SchedParams(4096)), Step("alloc", "g")))
    old = predict(sc, rules=RULES["0.15.3"])
    assert old.abort is not None and "GGML_ASSERT(n_inputs < GGML_SCHED_MAX_SPLIT_INPUTS)" in old.abort.message
    assert predict(sc, rules=RULES["0.25.3"]).abort is None


def test_alloc_twice_without_reset_aborts():
    """``ggml_backend_sched_alloc_graph`` asserts the scheduler holds no allocated graph (the
    steps of a scenario reset first, as llama_context does: only a direct caller meets it)."""
    from reference.sched import SchedAbort

    b = GraphBuilder()
    spec = b.build(b.op("scale", b.input("x", (8, 2)), name="y", scale=2.0))
    sched = Scheduler(BackendLayout.of("cpu"), SchedParams(64))
    g = CGraph.build(spec)
    sched.alloc_graph(g, 0)
    with pytest.raises(SchedAbort, match=r"GGML_ASSERT\(!sched->is_alloc\)"):
        sched.alloc_graph(g, 1)


def _without_leaf_count(mp: pytest.MonkeyPatch) -> None:
    from reference.alloc import NO_ALLOC, Gallocr

    original = Gallocr.needs_realloc

    def needs_realloc(self, nodes, srcs, leafs):  # type: ignore[no-untyped-def]
        if self.plan is not None:
            self.plan.leafs = [NO_ALLOC] * len(leafs)
        return original(self, nodes, srcs, leafs)

    mp.setattr(Gallocr, "needs_realloc", needs_realloc)


def _without_split_input_limit(mp: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from reference.rules import RULES

    mp.setitem(RULES, "0.15.3", replace(RULES["0.15.3"], max_split_inputs=10**9))


def _without_is_alloc(mp: pytest.MonkeyPatch) -> None:
    original = Scheduler.alloc_graph

    def alloc_graph(self, g, step):  # type: ignore[no-untyped-def]
        self.is_alloc = False
        return original(self, g, step)

    mp.setattr(Scheduler, "alloc_graph", alloc_graph)


RULE_TESTS: list[tuple[str, Callable[[], None], Callable[[pytest.MonkeyPatch], None]]] = [
    ("pass 2", test_pass2_expands_gpu_down_and_up_before_cpu, lambda mp: mp.setattr(Scheduler, "pass2_expand", lambda s, g, ids: None)),
    ("pass 3", test_pass3_upgrades_to_higher_priority_backend_with_same_buffer_type, lambda mp: mp.setattr(Scheduler, "pass3_upgrade", lambda s, g, ids: None)),
    ("rope rule", test_pass1_rope_ignores_its_weight_and_takes_most_supported_inputs,
     lambda mp: mp.setattr(CGraph, "build", _patched_build(lambda g: g.op.__setitem__(slice(None), [o if o != "rope" else "rope_" for o in g.op])))),
    ("pass 4 views", test_pass4_views_follow_their_view_source, lambda mp: mp.setattr(CGraph, "build", _patched_build(lambda g: g.view_src.__setitem__(slice(None), [-1] * len(g.view_src))))),
    ("weight split", test_pass5_new_split_for_weight_on_incompatible_backend, lambda mp: mp.setattr(CGraph, "build", _patched_build(lambda g: g.weights.__setitem__(slice(None), [False] * len(g.weights))))),
    ("plan validity", test_topology_switch_forgets_the_larger_reservation, lambda mp: mp.setattr("reference.alloc.Gallocr.needs_realloc", lambda self, nodes, srcs, leafs: None)),
    ("leaf loop of backend_ids_changed", test_backend_ids_changed_reads_the_leafs_too, lambda mp: mp.setattr(Scheduler, "leaf_ids_changed", lambda s, n: False)),
    ("leaf count", test_leaf_count_is_part_of_the_plan, _without_leaf_count),
    ("split-input abort", test_a_split_with_29_inputs_and_a_node_needing_2_more_aborts_in_0_15_3, _without_split_input_limit),
    ("is_alloc assert", test_alloc_twice_without_reset_aborts, _without_is_alloc),
    ("op_offload", test_pass1_op_offload_moves_host_weight_ops_to_an_offloading_backend, lambda mp: mp.setattr(Backends, "offload_op", lambda s, b, g, t: False)),
    ("inputs on the last backend", test_pass1_weights_pull_ops_to_their_backend,
     lambda mp: mp.setattr(CGraph, "build", _patched_build(lambda g: g.input.__setitem__(slice(None), [False] * len(g.input))))),
    ("n_copies", test_pass5_parallel_makes_n_copies_and_graph_size_counts_them, lambda mp: mp.setattr("reference.sched.MAX_COPIES", 1)),
    ("same buffer type", test_backend_ids_changed_only_across_buffer_types,
     lambda mp: mp.setattr("reference.sched._ids_changed", lambda cur, prev, n, bufts: any(
         (cur[i] if i < len(cur) else 0) != (prev[i] if i < len(prev) else 0) for i in range(n)))),
    ("allocation sizes", test_alloc_larger_than_reservation_reallocs_naming_the_node, lambda mp: mp.setattr("reference.alloc.node_valid", lambda talloc, t: True)),
]


def _patched_build(mutate: Callable[[CGraph], None]):
    original = CGraph.build

    def build(spec: GraphSpec) -> CGraph:
        g = original(spec)
        mutate(g)
        return g

    return staticmethod(build)


@pytest.mark.parametrize(("rule", "test", "remove"), RULE_TESTS, ids=[r[0] for r in RULE_TESTS])
def test_rules_are_load_bearing(rule: str, test: Callable[[], None], remove: Callable[[pytest.MonkeyPatch], None]):
    test()
    with pytest.MonkeyPatch.context() as mp:
        remove(mp)
        with pytest.raises((Exception, pytest.fail.Exception)):  # an assertion, or pytest.raises' own failure
            test()
