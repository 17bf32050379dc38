"""The llama_context model: reservations, reuse decisions, the pipeline-parallel fallback."""

from __future__ import annotations

from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.layout import BackendLayout
from pytest_schedfuzz.model.scenario import SchedParams
from pytest_schedfuzz.model.trace import Trace
from pytest_schedfuzz.properties import reuse_sound
from pytest_schedfuzz.sim.driver import Driver, Reconfigure, Ubatch, Workload, topology
from pytest_schedfuzz.sim.models import ModelShape

LAYOUT = BackendLayout.of("rpc", "cpu")
MODEL = ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1)


def workload(*events: Ubatch | Reconfigure) -> Workload:
    return Workload(LAYOUT, MODEL, 16, events)


def kinds(w: Workload, driver: Driver = Driver()) -> list[str]:
    return [s.describe() for s in driver.scenario(w).steps]


def test_sched_reserve_reserves_pp_tg_pp():
    steps = kinds(workload(Reconfigure(SchedParams(2048))))
    assert steps == [
        "sched_new(max_nodes=2048, parallel=False, op_offload=True)",
        "reserve(T16-out16-kv256)", "reserve(T1-out1-kv256)", "reserve(T16-out16-kv256)",
    ]


def test_out_of_memory_retries_without_pipeline_parallelism():
    w = workload(Reconfigure(SchedParams(2048, parallel=True), out_of_memory=True))
    steps = kinds(w)
    assert steps[:3] == [
        "sched_new(max_nodes=2048, parallel=True, op_offload=True)",
        "reserve(T16-out16-kv256)",
        "sched_new(max_nodes=2048, parallel=False, op_offload=True)",  # a new scheduler
    ]
    # a policy that ignores `parallel` reuses the pipeline-parallel scheduler there: unsound
    sloppy = Driver(lambda new, cur: new.max_nodes <= cur.max_nodes)
    sc = sloppy.scenario(w)
    assert sc.steps[2].reuse
    (v,) = reuse_sound(sc, Trace(()), Trace(()))
    assert v.step == 2 and "parallel True -> False" in v.message


def test_rereserve_reserves_the_worst_case_of_a_new_topology():
    w = workload(Reconfigure(SchedParams(2048)), Ubatch(4, 1, 32), Ubatch(4, 4, 32), Ubatch(8, 8, 40))
    with_rr = kinds(w)
    without = kinds(w, Driver(rereserve=False))
    # the ubatch with fewer outputs has another topology: its worst case (all but one output)
    assert with_rr[4:6] == ["reserve(T16-out15-kv256)", "compute(T4-out1-kv32)"]
    # back to all outputs: the pp worst case again; the next ubatch shares its topology
    assert with_rr[6:] == ["reserve(T16-out16-kv256)", "compute(T4-out4-kv32)", "compute(T8-out8-kv40)"]
    assert without[4:] == ["compute(T4-out1-kv32)", "compute(T4-out4-kv32)", "compute(T8-out8-kv40)"]


def test_topology_ignores_shapes_only():
    sc = Driver().scenario(workload(Reconfigure(SchedParams(2048)), Ubatch(4, 4, 32), Ubatch(4, 1, 32)))
    g = sc.graph_map
    assert topology(g["T4-out4-kv32"]) == topology(g["T16-out16-kv256"])
    assert topology(g["T4-out1-kv32"]) != topology(g["T4-out4-kv32"])


def test_workload_json_round_trip():
    w = workload(Reconfigure(SchedParams(2048, parallel=True), out_of_memory=True), Ubatch(3, 1, 9))
    assert Workload.from_json(w.to_json()) == w


def test_a_built_spec_carries_the_geometry_a_fresh_inference_gives():
    """``GraphBuilder.build`` hands its spec the shapes it inferred op by op (so they are not
    inferred twice per example): they must be what ``GraphSpec.geometry`` infers from scratch."""
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    from pytest_schedfuzz.model.graph_spec import GraphSpec
    from pytest_schedfuzz.strategies import scenarios, workloads

    @seed(5)
    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=(Phase.generate,))
    @given(st.one_of(scenarios(DeviceLimits.of(rpc=2, gpu=2), 6, True, 4, 50), workloads(max_ubatches=6, limits=DeviceLimits.of(rpc=1, gpu=2)).map(Driver().scenario)))
    def same(scenario) -> None:  # type: ignore[no-untyped-def]
        for _, g in scenario.graphs:
            assert GraphSpec(g.tensors, g.roots, g.forced, g.label).geometry == g.geometry

    same()
