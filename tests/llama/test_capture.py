"""llama.cpp's graphs captured (``cases.capture``): the graph engine schedules them as ggml did
inside llama.cpp, the reference predicts it (llama-matches-reference, which catches a planted
reference fault), and a llama.cpp same-size finding, captured, fails no-same-size-realloc at the
ggml level at the same call with the same reason; ``schedfuzz capture`` writes such a case."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from test_llama_gpu import ASYNC, workload

from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.campaign.stats import features
from pytest_schedfuzz.cases.capture import CaptureError, capture, covered_ops, graph_spec, layout_of, llama_names
from pytest_schedfuzz.cases.corpus import load_case
from pytest_schedfuzz.model.captured import Captured
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.graph_spec import GraphBuilder
from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import ContextParams, Devices, LlamaWorkload
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import PROPERTIES
from pytest_schedfuzz.properties.base import reason_kind
from pytest_schedfuzz.properties.captured_reference import llama_matches_reference
from pytest_schedfuzz.properties.derived import graph_trace
from pytest_schedfuzz.sim.driver import can_reuse
from pytest_schedfuzz.strategies import written_device
from pytest_schedfuzz.strategies.captured_graphs import captured_scenarios, captured_workloads
from reference.predict import predict

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
SCHEDFUZZ = [sys.executable, "-m", "pytest_schedfuzz.cli"]
# the starter corpus's llama.cpp same-size findings, one of each kind: a MoE graph the reservation
# does not dominate (RPC and CPU), op offload on two asynchronous GPU-like devices, Mamba-2's state
# copies on an RPC device, a dense model whose graph grows
SAME_SIZE = ("47d17e5928", "be71aa4ab0", "8915ae6c62", "4e6374f1c3")


@pytest.fixture(scope="module")
def fuzzer() -> Iterator[Fuzzer]:
    f = Fuzzer(FuzzConfig(database=None))
    yield f
    f.close()


def _captured(fuzzer: Fuzzer, workload: LlamaWorkload) -> Captured:
    return capture(workload, fuzzer.engines.run_llama(workload, capture=True))


def _ggml_did_what_llama_saw(fuzzer: Fuzzer, captured: Captured) -> None:
    """The graph engine, given the captured scenario, assigns every node and leaf, splits and
    sizes the buffers as ggml did inside llama.cpp, and re-plans at the same steps."""
    trace = graph_trace(fuzzer.engines.run(captured.scenario))
    assert trace.abort is None, trace.abort
    records = {r.index: r for r in trace.records}
    for s in captured.steps:
        r = records[s.step]
        assert (r.node_backends, r.leaf_backends, r.n_splits, tuple(r.buffer_sizes), bool(r.events)) == \
               (s.node_backends, s.leaf_backends, s.n_splits, s.buffer_sizes, s.realloc), f"step {s.step} (call {s.call})"


@pytest.mark.engine
@pytest.mark.parametrize("digest", SAME_SIZE)
def test_a_captured_same_size_finding_fails_at_the_ggml_level_at_the_same_call(fuzzer: Fuzzer, digest: str) -> None:
    case = load_case(next(CORPUS.glob(f"llama-no-same-size-realloc-*-{digest}.json")))
    assert case.llama is not None
    trace = fuzzer.engines.run_llama(case.llama, capture=True)
    captured = capture(case.llama, trace)
    _ggml_did_what_llama_saw(fuzzer, captured)
    assert llama_matches_reference(case.llama, captured, predict(captured.scenario)) == []
    found = fuzzer.check("no-same-size-realloc", captured.scenario)
    at_call = [v for v in found if any(s.step == v.step and s.call == case.step for s in captured.steps)]
    assert at_call, f"no same-size realloc at call {case.step}: {[str(v) for v in found]}"
    llama_reason = next(s.realloc_reason for c in trace.calls if c.index == case.step for s in c.sched if s.kind == "alloc" and s.realloc)
    ggml_reason = next(e.reason for e in fuzzer.engines.run(captured.scenario).events if e.step == at_call[0].step)
    assert reason_kind(llama_names(ggml_reason)) == reason_kind(llama_reason), (ggml_reason, llama_reason)
    assert fuzzer.check("matches-reference", captured.scenario) == []  # every step, the failing one's too


@pytest.mark.engine
def test_a_call_that_aborts_inside_ggml_is_captured_and_aborts_at_the_ggml_level(fuzzer: Fuzzer) -> None:
    """The starter corpus's abort in ``split_graph`` (a KV cache on a GPU-like device that cannot
    run ROPE, the rope shift forced there): the aborting call's graph is captured as the
    scenario's last step; the reference predicts the abort there (a prediction without it is a
    llama-matches-reference violation), and the graph-level replay aborts there with ggml's message."""
    case = load_case(next(CORPUS.glob("llama-no-abort-*-97dfe7600a.json")))
    assert case.llama is not None
    trace = fuzzer.engines.run_llama(case.llama, capture=True)
    assert trace.abort is not None and trace.abort.call == case.step
    captured = capture(case.llama, trace)
    assert captured.abort is not None and captured.abort[:2] == (len(captured.scenario.steps) - 1, case.step)
    prediction = predict(captured.scenario)
    assert prediction.abort is not None and prediction.abort.step == captured.abort[0]
    assert llama_matches_reference(case.llama, captured, prediction) == []
    missed = llama_matches_reference(case.llama, captured, replace(prediction, abort=None))
    assert [(v.facts, v.step) for v in missed] == [({"what": "abort"}, case.step)] and "ggml aborted inside llama.cpp" in missed[0].message
    found = fuzzer.check("no-abort", captured.scenario)
    assert [v.step for v in found] == [captured.abort[0]], [str(v) for v in found]
    said = trace.abort.message.strip().splitlines()[0].split(": ", 1)[1]  # after ggml's FILE:LINE
    assert said.startswith("pre-allocated tensor (cache_k_l0") and said in found[0].message, (said, found[0].message)


@pytest.mark.engine
def test_a_graph_captured_again_in_a_workload_is_sent_once(fuzzer: Fuzzer) -> None:
    """The worker sends a graph it captured before in the same workload by its id (half of a
    workload's graphs, each ubatch of a size seen): the trace holds the very objects sent first,
    one per distinct graph, and nothing of the protocol."""
    caps = [s.capture for _, s in fuzzer.engines.run_llama(workload(Devices(n_rpc=1)), capture=True).sched_calls() if s.capture is not None]
    distinct = {repr((c["nodes"], c["leafs"], c["forced"])) for c in caps}
    assert len({(id(c["nodes"]), id(c["leafs"]), id(c["forced"])) for c in caps}) == len(distinct) < len(caps)
    assert not any("graph_id" in c or "same_graph" in c for c in caps)
    # each distinct graph has its own key, the digest of its contents, which another run gives it too
    assert len({c["key"] for c in caps}) == len(distinct)
    again = fuzzer.engines.run_llama(workload(Devices(n_rpc=1)), capture=True).sched_calls()
    assert {s.capture["key"] for _, s in again if s.capture is not None} == {c["key"] for c in caps}


def test_graph_records_read_as_the_worker_names_tensors() -> None:
    """``sched_hook.c``'s records made a capture's tensors: sources by index (a leaf's as
    ``l<j>``, one outside the graph as ``?``, a null in between kept, trailing ones dropped), op
    params without trailing zeros (absent when none), a view only with its source and offset, the
    buffer's type and usage only for a tensor in a buffer, names cut at their end."""
    from pytest_schedfuzz.llama.graph_records import NO_TENSOR, OUTSIDE, RECORD, tensors

    def record(name: str, op: str, srcs: list[int], params: list[int], view: int = NO_TENSOR, buffer: int = -1, desc: str = "") -> bytes:
        return RECORD.pack(2, view, buffer, *(srcs + [NO_TENSOR] * (10 - len(srcs))), *(params + [0] * (16 - len(params))),
                           4, 3, 1, 1, 4, 16, 48, 48, 8 if view != NO_TENSOR else 0, name.encode() + b"\0junk", op.encode(),
                           (desc or op).encode(), b"f32")

    raw = (record("mul", "MUL", [1, -2], [])
           + record("act", "UNARY", [0, NO_TENSOR, OUTSIDE], [7, 0, 3, 0], desc="SILU")
           + record("v", "VIEW", [-3], [], view=-3)
           + record("w", "NONE", [], [], buffer=1) + record("x", "NONE", [], []))
    nodes, leafs = tensors(raw, 3, [("CPU", 0), ("RPC0[127.0.0.1:1]", 1)])
    assert nodes[0] == {"name": "mul", "op": "MUL", "desc": "MUL", "type": "f32", "ne": [4, 3, 1, 1], "nb": [4, 16, 48, 48], "flags": 2,
                        "src": ["n1", "l0"]}
    assert nodes[1]["src"] == ["n0", None, "?"] and nodes[1]["op_params"] == [7, 0, 3] and nodes[1]["desc"] == "SILU"
    assert nodes[2]["view_src"] == "l1" and nodes[2]["view_offs"] == 8 and "op_params" not in nodes[2]
    assert leafs[0]["buft"] == "RPC0[127.0.0.1:1]" and leafs[0]["usage"] == 1 and "buft" not in leafs[1] and "view_src" not in leafs[1]
    assert [t["name"] for t in leafs] == ["w", "x"]


@pytest.mark.engine
def test_a_graph_captured_by_an_earlier_workload_is_not_made_again(fuzzer: Fuzzer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent makes a captured graph's tensors from the worker's records once: a later
    workload that captures the same graph (the same key) gets the same objects."""
    import pytest_schedfuzz.llama.graph_records as records

    w = workload(Devices(n_rpc=1))
    first = [s.capture for _, s in fuzzer.engines.run_llama(w, capture=True).sched_calls() if s.capture is not None]
    monkeypatch.setattr(records, "tensors", lambda *a: pytest.fail("a graph captured before was made again"))
    again = [s.capture for _, s in fuzzer.engines.run_llama(w, capture=True).sched_calls() if s.capture is not None]
    assert [c["key"] for c in again] == [c["key"] for c in first]
    assert all(a["nodes"] is b["nodes"] and a["leafs"] is b["leafs"] for a, b in zip(again, first))


@pytest.mark.engine
def test_the_captured_graphs_are_made_into_specs_as_they_come(fuzzer: Fuzzer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``preparer``, handed to the run as ``on_graph``, makes each graph new to the workload
    into a spec and warms the reference with it while llama.cpp goes on with the workload (one
    call each, before the run returns): ``capture`` then makes none itself."""
    import pytest_schedfuzz.cases.capture as capture_module
    from pytest_schedfuzz.cases.capture import preparer

    w = workload(Devices(n_rpc=1))
    monkeypatch.setattr(capture_module, "_RECENT", OrderedDict())  # no spec made by an earlier test
    handed: list[str] = []
    warmed: list[object] = []
    prepare = preparer(w, warmed.append)

    def on_graph(cap: dict) -> None:
        handed.append(cap["key"])
        prepare(cap)

    trace = fuzzer.engines.run_llama(w, capture=True, on_graph=on_graph)
    keys = [s.capture["key"] for _, s in trace.sched_calls() if s.capture is not None]
    assert handed == list(dict.fromkeys(keys)) and len(handed) < len(keys)  # each graph once, in order
    assert len(warmed) == len(handed)
    monkeypatch.setattr(capture_module, "graph_spec", lambda *a: pytest.fail("capture made a spec the run had made"))
    captured = capture(w, trace)
    assert len(captured.scenario.graphs) == len(handed)

    # what goes wrong while preparing is left for capture, which meets it again where it matters:
    # the workload's run is not cut short by it
    monkeypatch.setattr(capture_module, "_RECENT", OrderedDict())
    monkeypatch.setattr(capture_module, "graph_spec", lambda *a: (_ for _ in ()).throw(RuntimeError("a harness bug")))
    again = fuzzer.engines.run_llama(w, capture=True, on_graph=preparer(w, warmed.append))
    assert again.abort is None and len(warmed) == len(handed)
    with pytest.raises(RuntimeError, match="a harness bug"):
        capture(w, again)


@pytest.mark.engine
def test_pipeline_parallelism_on_two_asynchronous_gpu_like_devices_is_captured_whole(fuzzer: Fuzzer) -> None:
    w = workload(Devices(n_rpc=0, gpus=(ASYNC, ASYNC)))
    captured = _captured(fuzzer, w)
    assert any(st.params is not None and st.params.parallel for st in captured.scenario.steps)  # n_copies > 1
    assert [b.kind for b in captured.scenario.layout.backends] == ["gpu", "gpu", "cpu"]
    _ggml_did_what_llama_saw(fuzzer, captured)
    assert llama_matches_reference(w, captured, predict(captured.scenario)) == []


@pytest.mark.engine
def test_llama_matches_reference_catches_a_planted_reference_fault() -> None:
    """The reference without pass 2 (no expansion to neighbours) on a captured MoE graph with
    the model on an RPC device: the first node whose backend it gets wrong is named."""
    case = load_case(next(CORPUS.glob("llama-no-same-size-realloc-*-4d6247404c.json")))
    assert case.llama is not None
    for reference, caught in ((None, False), ("planted:predict_without_pass2", True)):
        f = Fuzzer(FuzzConfig(database=None, reference=reference))
        f.llama_judged = ("llama-matches-reference",)
        try:
            found = f.check_llama("llama-matches-reference", case.llama)
        finally:
            f.close()
        assert bool(found) == caught, [str(v) for v in found]
        assert f.stats.llama_captured == 1 and f.stats.llama_captured_nodes > 100
        summary = "\n".join(f.stats.summary_lines())  # what every run prints: captured workloads, nodes compared, op coverage
        assert "workloads captured and predicted by the reference (llama-matches-reference) = 1" in summary
        assert "ops of the captured graphs (nodes): ADD" in summary and "ROPE" in summary
    assert found[0].facts == {"what": "assignment"} and "the reference puts it on" in found[0].message


def test_a_graph_no_scenario_can_say_is_a_capture_error_naming_the_op() -> None:
    layout = BackendLayout((BackendSpec("cpu"),))
    leaf = {"name": "x", "op": "NONE", "desc": "NONE", "type": "f32", "ne": [4, 1, 1, 1], "nb": [4, 16, 16, 16], "flags": 1, "src": []}
    node = {"name": "y", "op": "IM2COL", "desc": "IM2COL", "type": "f32", "ne": [4, 1, 1, 1], "nb": [4, 16, 16, 16], "flags": 16, "src": ["l0"]}
    with pytest.raises(CaptureError, match="op IM2COL") as e:
        graph_spec({"nodes": [node], "leafs": [leaf]}, ["CPU"], layout, "g")
    assert e.value.kind == "op IM2COL"
    padded = dict(leaf, nb=[4, 32, 32, 32])  # rows further apart than ggml_new_tensor puts them
    with pytest.raises(CaptureError, match="ggml made it f32 ne=\\[4, 1, 1, 1\\] nb=\\[4, 32, 32, 32\\]"):
        graph_spec({"nodes": [dict(node, op="ADD", desc="ADD", src=["l0", "l0"])], "leafs": [padded]}, ["CPU"], layout, "g")
    bad_shape = dict(node, op="ADD", desc="ADD", src=["l0", "l0"], ne=[8, 1, 1, 1])
    with pytest.raises(CaptureError, match="stored shape \\[8\\] but ops give \\[4, 1, 1, 1\\]"):
        graph_spec({"nodes": [bad_shape], "leafs": [leaf]}, ["CPU"], layout, "g")


@pytest.mark.engine
def test_schedfuzz_capture_writes_a_graph_case_that_replays_to_the_finding(tmp_path: Path) -> None:
    source = next(CORPUS.glob("llama-no-same-size-realloc-*-47d17e5928.json"))
    out = tmp_path / "captured.json"
    run = subprocess.run([*SCHEDFUZZ, "capture", str(source), "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "llama-matches-reference: the reference predicts every step" in run.stdout
    case = load_case(out)
    assert case.property == "no-same-size-realloc" and case.signature == "no-same-size-realloc[explained=not-dominating,invalid=node ffn_moe_weights-N,lost_by=-]"
    assert source.name in case.engine["captured_from"]
    replay = subprocess.run([*SCHEDFUZZ, "replay", str(out)], capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0 and "still fails (known bug)" in replay.stdout, replay.stdout[-2000:] + replay.stderr[-2000:]
    graph_case = next(CORPUS.glob("no-same-size-realloc-*.json"))
    refused = subprocess.run([*SCHEDFUZZ, "capture", str(graph_case), "-o", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not a llama.cpp case" in refused.stderr


def test_the_schedulers_backends_become_the_layout_in_its_order() -> None:
    w = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=1, gpus=(BackendSpec("gpu", asynchronous=True),)), ContextParams(), ())
    layout = layout_of(["RPC[127.0.0.1:1]", "GPU0", "CPU"], w)
    assert [b.kind for b in layout.backends] == ["rpc", "gpu", "cpu"] and layout.backends[1].asynchronous
    with pytest.raises(CaptureError, match="GPU1"):
        layout_of(["GPU1", "CPU"], w)
    # split_mode none on main_gpu 1: the scheduler's one device is the scenario's GPU0, and the
    # CPU's compute buffer is in its host buffer type only if llama.cpp put it there
    two = LlamaWorkload(w.model, Devices(n_rpc=0, gpus=(BackendSpec("gpu", host_buffer=True), BackendSpec("gpu", host_buffer=True))), w.ctx, ())
    assert layout_of(["GPU1", "CPU"], two, "GPU1_Host").buft(1) == "GPU0_Host"
    assert layout_of(["GPU0", "GPU1", "CPU"], two, "CPU").host_buffer_of is None
    with pytest.raises(CaptureError, match="CPU's compute buffer is of type 'GPU1_Host'"):
        layout_of(["GPU0", "CPU"], w, "GPU1_Host")


def test_the_docs_list_every_op_a_capture_covers() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "llama.md").read_text()
    assert [op for op in covered_ops() if f"`{op}`" not in page] == []


@pytest.mark.engine
def test_the_graph_properties_fuzz_on_llama_cpps_captured_graphs(fuzzer: Fuzzer) -> None:
    """The session's pool holds one captured scenario per model family; the strategy keeps each
    weight's device, draws devices, forced nodes, parameters and steps anew, and every drawn
    scenario is valid; matches-reference's examples include them."""
    pool = fuzzer.captured_pool()
    assert len(pool) == 9 and fuzzer.stats.captured_missing == {}
    assert fuzzer.stats.captured_families == {"dense": 2, "hybrid": 2, "mamba2": 2, "moe": 2, "moe experts on the CPU": 1}
    # two sizes of ubatch and KV cache per family: the worst-case reservation's tokens and KV cells
    sizes = {(g.geometry["inp_tokens"].ne[0], next(t.ne[1] for t in g.tensors if t.name.startswith("cache_") or t.name.startswith("cache_r")))
             for sc in pool for name, g in sc.graphs if name.endswith("-reserve")}
    assert {n for n, _ in sizes} == {8, 16} and {256, 512} <= {k for _, k in sizes}, sizes
    ops = {t.op for sc in pool for _, g in sc.graphs for t in g.tensors}
    assert {"mul_mat_id", "ssm_scan", "flash_attn_ext", "glu", "set_rows"} <= ops
    seen: set[str] = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(captured_scenarios(pool, DeviceLimits.of(gpu=2), max_steps=6))
    def drawn(sc) -> None:  # type: ignore[no-untyped-def]
        sc.validate()
        base = next(b for b in pool if [n for n, _ in b.graphs] == [n for n, _ in sc.graphs])
        assert sc.layout.n == base.layout.n and sc.layout.backends[-1].kind == "cpu"
        seen.update(b.kind for b in sc.layout.backends)
        seen.update("forced" for (_, g), (_, h) in zip(sc.graphs, base.graphs) if len(g.forced) > len(h.forced))
        # a write into a cache (through its views) is forced onto the cache's device only
        assert all(written_device(g.by_name, n) in (None, b) for _, g in sc.graphs for n, b in g.forced), [g.forced for _, g in sc.graphs]
        seen.update("a cache write forced" for _, g in sc.graphs for n, _ in g.forced if written_device(g.by_name, n) is not None)
        seen.update("kept" for s in sc.steps if s.reuse)
        seen.update(s.kind for s in sc.steps)
        seen.update("n_ubatch 16" for _, g in sc.graphs if ", n_ubatch 16, " in g.label)
        assert _reuses(sc) == _reuses(sc, can_reuse)

    drawn()
    assert {"gpu", "rpc", "forced", "a cache write forced", "kept", "reserve", "alloc", "compute", "split", "n_ubatch 16"} <= seen, seen
    assert {p: prop.draws.captured for p, prop in PROPERTIES.items() if prop.draws.captured} == {
        "matches-reference": "scenarios", "reuse-equivalent": "scenarios", "same-values": "scenarios", "no-same-size-realloc": "workloads"}


@pytest.mark.engine
def test_no_same_size_realloc_fuzzes_llama_cpps_graphs_in_llama_cpps_order(fuzzer: Fuzzer) -> None:
    """Captured workloads (``captured_workloads``): each family's reservation as llama.cpp made
    it, then its decodes' graphs in a drawn order, with re-reservations, nodes forced alike in
    every graph, on drawn devices. In llama.cpp's own order each family's reservation suffices on
    the RPC device it was captured on, and on a GPU-like device without op offload; with op offload
    and a device whose offload_op takes batches of 8 or more, the full ubatch puts the CPU-weight
    matmuls on the device and a smaller one does not: the reservation is lost, and a later ubatch
    re-allocates at the same size (the graph-level form of llama.cpp's op-offload cause, known as
    ``lost_by=compute changed``)."""
    offload = BackendLayout((BackendSpec("gpu", offload_min_batch=8), BackendSpec("cpu")))
    for base in fuzzer.captured_pool():
        label = base.graphs[0][1].label
        as_llama = tuple(Step("compute", s.graph) if s.kind == "alloc" else s for s in base.steps)
        assert fuzzer.check("no-same-size-realloc", replace(base, steps=as_llama)) == [], label
        for op_offload in (False, True):
            params = SchedParams(base.steps[0].params.max_nodes, False, op_offload)  # type: ignore[union-attr]
            sc = Scenario(offload, base.graphs, (Step("sched_new", params=params), *as_llama[1:]))
            found = {v.signature() for v in fuzzer.check("no-same-size-realloc", sc)}
            assert found == ({"no-same-size-realloc[explained=lost,lost_by=compute changed,topology=same]"} if op_offload else set()), (label, found)
    pool = fuzzer.captured_pool()
    seen: set[str] = set()

    @settings(max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(captured_workloads(pool, DeviceLimits.of(gpu=2), max_ubatches=8))
    def drawn(sc: Scenario) -> None:
        sc.validate()
        base = next(b for b in pool if [n for n, _ in b.graphs] == [n for n, _ in sc.graphs])
        reservation = [s for s in base.steps[1:] if s.kind != "alloc"]
        assert "llama.cpp's graphs after llama.cpp's reservation (captured)" in features(sc)
        cb_eval = int(sc.steps[1].kind == "eval_callback")  # cparams.cb_eval, set on the new scheduler
        assert list(sc.steps[1 + cb_eval:1 + cb_eval + len(reservation)]) == reservation  # llama.cpp's reservation, in its order
        assert {s.graph for s in sc.steps if s.kind == "compute"} <= {s.graph for s in base.steps if s.kind == "alloc"}
        # a node forced in one graph is forced alike in every graph that has it
        extra = [dict(g.forced[len(h.forced):]) for (_, g), (_, h) in zip(sc.graphs, base.graphs)]
        assert all(e[n] == f[n] for e in extra for f in extra for n in e.keys() & f.keys()), extra
        seen.update(b.kind for b in sc.layout.backends)
        seen.update("forced" for e in extra if e)
        seen.update("reconfigured" for s in sc.steps[1:] if s.kind == "sched_new")
        seen.update("op offload" for s in sc.steps if s.params is not None and s.params.op_offload)
        seen.update("eval callback" for _ in range(cb_eval))
        assert _reuses(sc) == _reuses(sc, can_reuse)

    drawn()
    assert {"gpu", "rpc", "forced", "reconfigured", "op offload", "eval callback"} <= seen, seen


@pytest.mark.engine
def test_same_values_holds_on_llama_cpps_graphs_and_catches_a_corrupting_device(fuzzer: Fuzzer) -> None:
    """Every captured graph of every family, computed with an asynchronous GPU-like device in the
    RPC device's place, gives what the CPU alone gives from the same leafs (the values oracle
    fills llama.cpp's inputs: token ids, positions, KV and state indices, read directly or through
    views, masks); a device whose MUL_MAT results come back wrong is caught in every graph with an
    output row (the device corrupts a result after its split, so only the logits show it). Only
    the roots no node reads are compared: a capture hands ggml every node, in llama.cpp's order,
    and the allocator reuses the rest."""
    gpu = BackendSpec("gpu", asynchronous=True)
    caught = 0
    for base in fuzzer.captured_pool():
        for corrupt in ("", "MUL_MAT"):
            layout = BackendLayout((replace(gpu, corrupt_op=corrupt), *base.layout.backends[1:]))
            for name, g in base.graphs:
                sc = Scenario(layout, base.graphs, (Step("sched_new", params=SchedParams(2048, False, False)), Step("compute", name)))
                found = [v.signature() for v in fuzzer.check("same-values", sc)]
                outputs = g.geometry["result_output"].ne[1]
                assert found == (["same-values[op=mul_mat,what=output]"] if corrupt and outputs else []), (base.graphs[0][1].label, name, found)
                caught += bool(found)
    assert caught >= 12


def _reuses(sc: Scenario, policy=None) -> list[bool]:  # type: ignore[no-untyped-def]
    """Each re-reservation's decision as drawn, or as ``policy`` takes it against the scheduler in force."""
    out, cur = [], None
    for s in sc.steps:
        if s.kind == "sched_new" and s.params is not None:
            if cur is not None:
                out.append(s.reuse if policy is None else bool(policy(s.params, cur)))
            cur = cur if (s.reuse and cur is not None) else s.params
    return out


def test_a_captured_scenario_keeps_its_scheduler_exactly_when_the_reuse_policy_allows() -> None:
    """As ``llama_context::sched_reserve`` does (``sim.driver.Driver``): a scheduler kept across
    a change of ``parallel`` serves the new graphs with the old copies, which reuse-equivalent
    would report as the engine's fault (the fresh-clone CI's reuse-equivalent[what=buffers])."""
    b = GraphBuilder()
    b.input("x", (8, 4))
    base = Scenario(BackendLayout.of("rpc", "cpu"), (("g", b.build(b.op("scale", "x", name="y", scale=2.0))),), (Step("sched_new", params=SchedParams(1024, False, False)),))
    seen: list[bool] = []

    @settings(max_examples=80, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(captured_scenarios([base], DeviceLimits(), max_steps=8), captured_scenarios([base], DeviceLimits(), max_steps=8, policy=lambda new, cur: True))
    def drawn(sc: Scenario, always: Scenario) -> None:
        assert _reuses(sc) == _reuses(sc, can_reuse)
        assert all(_reuses(always))
        seen.extend(_reuses(sc))

    drawn()
    assert True in seen and False in seen


@pytest.mark.engine
def test_no_captured_graphs_for_an_engine_of_another_ggml_version() -> None:
    """llama.cpp 0.3.36's graphs are ggml 0.25.3's (0.15.3's ``ggml_clamp`` makes a view where
    0.25.3's makes a tensor): on ggml 0.15.3 the pool is empty and the summary says why."""
    f = Fuzzer(FuzzConfig(database=None, lib="ggml-0.15.3"))
    try:
        assert f.captured_pool() == ()
    finally:
        f.close()
    assert "llama.cpp's graphs are ggml 0.25.3's, the engine is ggml 0.15.3" in "\n".join(f.stats.summary_lines())


@pytest.mark.engine
def test_an_rpc_server_failure_inside_llama_cpp_is_left_to_llama_no_abort(fuzzer: Fuzzer) -> None:
    """A remote server's failure is no scheduler's to predict: llama-matches-reference leaves it to
    llama-no-abort (which signs it by how the server failed); a scheduler abort the reference does
    not predict stays its finding."""
    from pytest_schedfuzz.properties.sites import RPC_FAILED

    case = load_case(next(CORPUS.glob("llama-no-abort-*-97dfe7600a.json")))
    assert case.llama is not None
    captured = capture(case.llama, fuzzer.engines.run_llama(case.llama, capture=True))
    assert captured.abort is not None
    step, call, _ = captured.abort
    prediction = replace(predict(captured.scenario), abort=None)
    served = replace(captured, abort=(step, call, f"ggml-rpc.cpp:686: {RPC_FAILED}"))
    assert llama_matches_reference(case.llama, served, prediction) == []
    assert [v.facts for v in llama_matches_reference(case.llama, captured, prediction)] == [{"what": "abort"}]
