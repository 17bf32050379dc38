"""The GPU-like device (``ggml/fake_gpu.c``) and the values oracle, on both built-in ggml
versions: engine/reference agreement over layouts with the device, a reuse across an
op_offload change caught by reuse-equivalent, same-values on real and planted builds."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import planted
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from pytest_schedfuzz.builds.compile import build_ggml_base
from pytest_schedfuzz.builds.installed import base_library
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.corpus import case_files, load_case
from pytest_schedfuzz.ggml.build import build_fake_gpu
from pytest_schedfuzz.ggml.cpu_values import compared as values_compared
from pytest_schedfuzz.ggml.graph_target import GgmlTarget
from pytest_schedfuzz.ggml.lib import library_folder
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.model.trace import Trace
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import (
    forced_views,
    fresh_variant,
    matches_reference,
    no_abort,
    reuse_equivalent,
    same_values,
    synchronous_variant,
    unforced_views_variant,
)
from pytest_schedfuzz.properties.derived import graph_trace
from pytest_schedfuzz.sim.driver import Driver, Reconfigure, Ubatch, Workload
from pytest_schedfuzz.sim.models import ModelShape, llama_graph
from pytest_schedfuzz.strategies import scenarios, workloads
from pytest_schedfuzz.tools.mutants import mutant
from reference.predict import predict
from reference.rules import rules_for

BUILT_IN = ("ggml-0.25.3", "ggml-0.15.3")
CORPUS = Path(__file__).resolve().parents[2] / "corpus"


@pytest.fixture(scope="module", params=BUILT_IN)
def engine(request: pytest.FixtureRequest):
    with GgmlTarget(lib=request.param) as target:
        yield target


def engine_rules(target: GgmlTarget):  # type: ignore[no-untyped-def]
    return rules_for(target.start()["ggml_version"])[0]


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_device_builds_against_each_built_in_ggml(name: str):
    """Compiled against the version's own headers; it loads beside that version's libggml-base
    (which it links by soname) and its config struct is the worker's."""
    from pytest_schedfuzz.ggml.bindings import FakeGpuConfig

    device = build_fake_gpu(str(base_library(library_folder(name))))
    # in a process of its own: two ggml versions must not share one
    code = f"import ctypes; lib = ctypes.CDLL({str(device)!r}); lib.schedfuzz_fake_gpu_config_size.restype = ctypes.c_size_t; print(lib.schedfuzz_fake_gpu_config_size())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == ctypes.sizeof(FakeGpuConfig)


def test_engine_and_reference_agree_on_200_scenarios_with_gpu_like_devices(engine: GgmlTarget):
    """Layouts of up to two GPU-like devices (offload, refused ops, chunked buffers, host
    buffers, shared buffer types, reordering, fusions, asynchronous) beside RPC and the CPU; scenarios
    with compute steps and driver workloads. matches-reference compares each backend's
    compute buffer size too. Every device feature must occur. On ggml 0.15.3
    the devices run synchronously: its scheduler races with asynchronous ones (a known bug,
    fixed in 0.25.3; ``test_0_15_3_races_with_an_asynchronous_device``)."""
    rules = engine_rules(engine)
    old = rules.version.startswith("0.15.")
    # the starter corpus's known bugs of this version (an RPC server crash) are not disagreements
    known = {c.signature for c in map(load_case, case_files(CORPUS)) if c.expected_failure_on(rules.version)}
    seen: Counter[str] = Counter()

    @seed(7)
    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(scenarios(DeviceLimits.of(rpc=1, gpu=2), compute=True), workloads(limits=DeviceLimits.of(rpc=1, gpu=2), max_ubatches=4)))
    def agree(case: Scenario | Workload) -> None:
        scenario = case if isinstance(case, Scenario) else Driver().scenario(case)
        layout = scenario.layout.backends
        if old:
            scenario = synchronous_variant(scenario)
        trace = graph_trace(engine.run(scenario))
        prediction = predict(scenario, rules=rules)
        if trace.abort is not None and any(v.signature() in known for v in no_abort(scenario, trace, prediction)):
            seen["known bugs"] += 1
            return
        wrong = no_abort(scenario, trace, prediction) + same_values(scenario, trace, prediction)
        if wrong and forced_views(scenario):
            variant = unforced_views_variant(scenario)
            right = graph_trace(engine.run(variant))
            if not no_abort(variant, right, prediction) + same_values(variant, right, prediction):
                seen["known bugs"] += 1  # the starter corpus's forced view (test_a_view_forced_to_another_backend_reads_garbage)
                return
        found = wrong + matches_reference(scenario, trace, prediction)
        assert not found, "\n".join(map(str, found)) + f"\n{scenario!r}"
        computes = [r for r in trace.records if r.kind == "compute"]
        seen["scenarios"] += 1
        seen["compute steps"] += len(computes)
        seen["values compared"] += sum(r.values_checked for r in computes)
        for feature in ("offload_min_batch", "max_size", "host_buffer", "shared_buft", "graph_optimize", "asynchronous", "unsupported", "fuse"):
            seen[feature] += any(getattr(b, feature) for b in layout)
        seen["dependency nodes"] += any(r.counts is not None and r.counts.n_dep_nodes for r in trace.records)
        gpus = [i for i, b in enumerate(layout) if b.kind == "gpu"]
        seen["nodes on a gpu"] += any(b in gpus for r in trace.records for b in r.node_backends)
        # compute buffers (which matches-reference compares) bigger than a chunk may be
        seen["chunked buffers"] += any(layout[i].max_size and r.buffer_sizes[i] > layout[i].max_size for r in trace.records
                                       for i in gpus if r.buffer_sizes)
        seen["compute buffer sizes compared"] += sum(len(r.buffer_sizes) for r in trace.records)

    agree()
    print(f"{rules.version}: {dict(seen)}")
    assert seen["scenarios"] + seen["known bugs"] == 200 and seen["known bugs"] < 20, seen
    assert seen["values compared"] > 200 and seen["compute buffer sizes compared"] > 1000
    for feature in ("offload_min_batch", "max_size", "host_buffer", "shared_buft", "graph_optimize", "asynchronous", "unsupported", "nodes on a gpu", "fuse"):
        assert seen[feature] >= 10, seen
    # dependency nodes (a fusing device's add_alloc_dep) exist from 0.25.3 on: there the graph
    # size and the graph copy the reference predicts count them
    assert (seen["dependency nodes"] == 0) if old else (seen["dependency nodes"] >= 10), seen
    assert seen["chunked buffers"] >= 5, seen


def offload_workload() -> Workload:
    """A model kept on the CPU beside a GPU-like device that offloads batches of 8 or more:
    with op_offload the big ubatch's matmuls go to the device, without it they stay."""
    layout = BackendLayout((BackendSpec("gpu", offload_min_batch=8), BackendSpec("cpu")))
    model = ModelShape(layer_devices=(1,), output_device=1, cpu_device=1, kv_size=64)
    on, off = SchedParams(2048, False, True), SchedParams(2048, False, False)
    return Workload(layout, model, 16, (Reconfigure(on), Ubatch(16, 16, 16), Reconfigure(off), Ubatch(16, 16, 32)))


def test_a_policy_ignoring_op_offload_is_caught_by_reuse_equivalent(engine: GgmlTarget):
    """The reused scheduler still offloads (its op_offload is the old one); a fresh one does not:
    reuse-equivalent sees a different assignment on the engine itself."""
    w = offload_workload()
    reused = Driver(policy=planted.ignore_op_offload).scenario(w)
    assert any(s.reuse for s in reused.steps)
    found = reuse_equivalent(reused, graph_trace(engine.run(reused)), graph_trace(engine.run(fresh_variant(reused))))
    assert found and found[0].facts == {"what": "assignment"}, found
    # the real policy rebuilds the scheduler: nothing to find
    honest = Driver().scenario(w)
    assert not any(s.reuse for s in honest.steps)
    assert not reuse_equivalent(honest, graph_trace(engine.run(honest)), graph_trace(engine.run(fresh_variant(honest))))


def square_matmuls() -> Scenario:
    """An input through two square matmuls and a silu: each output has its input's layout, so an
    allocator that computes a matmul in place (over its input) changes the values."""
    b = GraphBuilder()
    x = b.input("x", (32, 8))
    y = b.op("mul_mat", b.weight("w0", (32, 32), device=0), x, name="y")
    z = b.op("mul_mat", b.weight("w1", (32, 32), device=1), b.op("silu", y, name="s"), name="z")
    graph = b.build(z)
    layout = BackendLayout((BackendSpec("gpu"), BackendSpec("cpu")))
    return Scenario(layout, (("g", graph),), (Step("sched_new", params=SchedParams(64, False, True)), Step("reserve", "g"), Step("compute", "g")))


def test_same_values_catches_an_allocator_computing_a_matmul_in_place():
    """ggml-alloc rebuilt to reuse a parent's memory for any op (not only those that can run in
    place): no reallocation event changes, but the values do, and so does the compute buffer,
    which the reference's ggml-alloc (``reference/alloc.py``) predicts."""
    scenario = square_matmuls()
    with GgmlTarget(lib=str(build_ggml_base("ggml-0.25.3", (mutant("alloc-inplace-any-op").patch,)))) as planted_engine:
        trace = graph_trace(planted_engine.run(scenario))
        rules = rules_for(planted_engine.start()["ggml_version"])[0]
    prediction = predict(scenario, rules=rules)
    assert not no_abort(scenario, trace, prediction)
    assert [r.events for r in trace.records] == [r.events for r in prediction.records]
    (smaller,) = matches_reference(scenario, trace, prediction)
    assert smaller.facts == {"what": "buffers"} and "GPU0's compute buffer: engine 1024 bytes, reference 2048" in smaller.message
    (v,) = same_values(scenario, trace, prediction)
    assert v.facts == {"what": "output", "op": "mul_mat"}, v
    assert "differ from the CPU-only result" in v.message


def test_same_values_passes_on_the_real_build(engine: GgmlTarget):
    scenario = square_matmuls()
    trace = graph_trace(engine.run(scenario))
    assert not same_values(scenario, trace, trace)
    assert trace.records[-1].values_checked == 1


def test_only_a_property_that_compares_values_pays_for_them(engine: GgmlTarget) -> None:
    """The values oracle (seeded contents, the CPU-only computation, the comparison) runs only
    where a property compares values (same-values): the other properties' runs compute on zeros
    (rope's factors ones) and observe the same scheduling, reallocations and buffer sizes."""
    m = ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1)
    cases = [square_matmuls(), Scenario(BackendLayout.of("rpc", "cpu"), (("g", llama_graph(m, 4, 16)),),
                                        (Step("sched_new", params=SchedParams(1024, False, True)), Step("compute", "g"), Step("compute", "g")))]
    timings = {"seconds": 0.0, "build_seconds": 0.0}
    for scenario in cases:
        on, off = engine.run(scenario), engine.run(scenario, values=False)
        assert on.abort is None and off.abort is None
        assert [r.values_checked > 0 for r in on.records] == [r.kind == "compute" for r in on.records]
        assert not any(r.values for r in on.records) and not any(r.values_checked for r in off.records)
        assert [replace(r, values_checked=0, **timings) for r in on.records] == [replace(r, **timings) for r in off.records]
    fuzzer = Fuzzer(FuzzConfig(database=None))
    checked: list[tuple[str, int]] = []
    real = fuzzer.engines.run

    def spy(sc: Scenario, meanwhile: object = None, values: bool = True) -> Trace:
        trace = real(sc, meanwhile, values)  # type: ignore[arg-type]
        checked.append((prop, sum(r.values_checked for r in trace.records)))
        return trace

    fuzzer.engines.run = spy  # type: ignore[method-assign]
    try:
        for prop in ("matches-reference", "no-abort", "same-values"):
            assert fuzzer.check(prop, cases[1]) == []
    finally:
        fuzzer.close()
    assert checked == [("matches-reference", 0), ("no-abort", 0), ("same-values", 2 * len(values_compared(cases[1].graph("g"))))]
    # and the summary says so: a values oracle that stopped running would show
    assert (fuzzer.stats.values_steps, fuzzer.stats.computed_unvalued) == (2, 4)
    assert fuzzer.stats.values_tensors == checked[-1][1]


def racy() -> Scenario:
    """An asynchronous device sharing the CPU's buffer type, so that the allocator reuses memory
    across the two backends' splits, with splits that take no input in between."""
    b = GraphBuilder()
    x = b.input("x", (32, 16))
    h = x
    for k in range(4):
        h = b.op("mul_mat", b.weight(f"w{k}", (32, 32), device=k % 2), h, name=f"mm{k}")
        h = b.op("silu", h, name=f"act{k}")
    graph = b.build(h)
    gpu = BackendSpec("gpu", shared_buft=True, unsupported=("UNARY",), asynchronous=True, delay_us=20000)
    layout = BackendLayout((gpu, BackendSpec("cpu")))
    return Scenario(layout, (("g", graph),), (Step("sched_new", params=SchedParams(64, False, True)), Step("compute", "g"), Step("compute", "g")))


# what timing makes of the race: wrong values, or a kernel that aborts or crashes on them
RACE_SIGNATURES = ("same-values[race=asynchronous]", "no-abort[race=asynchronous]")


def race_found(lib: str) -> list[str]:
    """The signatures the fuzzer gives ``racy()`` on ``lib``."""
    fuzzer = Fuzzer(FuzzConfig(lib=lib, database=None))
    try:
        return [v.signature() for v in fuzzer.check("same-values", racy())]
    finally:
        fuzzer.close()


def test_0_15_3_races_with_an_asynchronous_device(engine: GgmlTarget):
    """ggml 0.15.3's compute_splits starts a split without inputs while the previous backend's
    asynchronous work still reads memory the allocator gave to both (one buffer type): wrong
    values, or a kernel assert on them (which one depends on timing), and right values when the
    device runs synchronously. 0.25.3 waits (its "ensure the previous split's async work has
    completed"), and computes them right. The fuzzer signs each symptom by the cause: wrong values
    as same-values[race=asynchronous], a kernel that aborts or crashes on them as no-abort[race=asynchronous] (a rerun never makes a crash a values finding)."""
    scenario = racy()
    old = engine_rules(engine).version.startswith("0.15.")
    trace = graph_trace(engine.run(scenario))
    assert bool(same_values(scenario, trace, Trace(())) + no_abort(scenario, trace, Trace(()))) == old
    assert not same_values(scenario, graph_trace(engine.run(synchronous_variant(scenario))), Trace(()))
    found = race_found(engine.lib_dir or "ggml-0.15.3")
    if old:
        assert len(found) == 1 and found[0] in RACE_SIGNATURES, found
    else:
        assert found == []


def test_same_values_catches_0_25_3_without_its_split_sync():
    (found,) = race_found(str(build_ggml_base("ggml-0.25.3", (mutant("no-split-sync").patch,))))
    assert found in RACE_SIGNATURES


def forced_view(kind: str) -> Scenario:
    """A matmul on ``kind`` (weights there), a view of it assigned to the CPU, and an add of the
    view, which the scheduler keeps on ``kind``: one split, whose inputs are x and the view."""
    b = GraphBuilder()
    y = b.op("mul_mat", b.weight("w", (8, 32), device=0), b.input("x", (8, 4)), name="y")
    v = b.op("view", y, name="v", ne=[32, 4], nb=[128])
    graph = b.build(b.op("add", v, v, name="z"))
    graph = GraphSpec(graph.tensors, graph.roots, (("v", 1),))
    return Scenario(BackendLayout.of(kind, "cpu"), (("g", graph),), (Step("sched_new", params=SchedParams(64, False, True)), Step("compute", "g")))


@pytest.mark.parametrize("kind", ["rpc", "gpu"])
def test_a_view_forced_to_another_backend_reads_garbage(engine: GgmlTarget, kind: str):
    """Both versions copy the CPU-assigned view as an input when its consumer's split starts,
    before its source (a node of that split) is computed; without the assignment the values
    are right. The fuzzer signs it by that cause, whatever tensor shows it."""
    scenario = forced_view(kind)
    trace = graph_trace(engine.run(scenario))
    assert trace.records[-1].splits[0].inputs == ("x", "v")
    (v,) = same_values(scenario, trace, Trace(()))
    assert v.facts == {"what": "output", "op": "add"}
    assert not same_values(scenario, graph_trace(engine.run(unforced_views_variant(scenario))), Trace(()))
    fuzzer = Fuzzer(FuzzConfig(lib=engine.lib_dir or "ggml-0.15.3", database=None))
    try:
        (signed,) = fuzzer.check("same-values", scenario)
    finally:
        fuzzer.close()
    assert signed.signature() == "same-values[forced=view]" and "views v are assigned a backend" in signed.message


@pytest.mark.parametrize("lib", BUILT_IN)
def test_a_crash_after_an_allocation_ggml_could_not_make_is_signed_by_that(lib: str):
    """Whether the refused allocation came in an earlier step (reserve returned false) or, in
    0.15.3, in the crashing step itself (alloc_splits ignores its re-reservation's failure), the
    crash is the starter corpus's: ``ggml_gallocr_reserve_n`` kept a plan whose buffer does not
    exist. ggml's error is in the report."""
    case = load_case(next(CORPUS.glob("no-abort-after-failed-allocation-*-5a2e452570.json")))
    assert case.scenario is not None
    first, *_, last = case.scenario.steps
    scenarios = [case.scenario] + ([replace(case.scenario, steps=(first, last))] if lib == "ggml-0.15.3" else [])
    fuzzer = Fuzzer(FuzzConfig(lib=lib, database=None))
    try:
        for scenario in scenarios:
            (v,) = fuzzer.check("no-abort", scenario)
            assert v.signature() == case.signature and "failed to allocate" in v.message, v
    finally:
        fuzzer.close()
