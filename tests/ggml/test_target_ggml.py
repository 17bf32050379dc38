"""The real-engine target: ggml in a worker process, with local RPC servers."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.builds.installed import shared_library
from pytest_schedfuzz.engine import Target, TargetError, Unsupported, load_target
from pytest_schedfuzz.ggml.bindings import GeometryMismatch, check_geometry
from pytest_schedfuzz.ggml.graph_target import GgmlTarget
from pytest_schedfuzz.ggml.lib import child_env, lib_overlay, library_folder, resolve_lib
from pytest_schedfuzz.ggml.rpc_program import RpcProgram
from pytest_schedfuzz.ggml.schedlog import SEP, SchedLog
from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.model.layout import BackendLayout
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.model.shapes import Geometry, new_tensor
from pytest_schedfuzz.process.children import exiting
from pytest_schedfuzz.process.forkserver import ForkServer
from pytest_schedfuzz.process.rpc import RpcServerError, RpcServers, free_port, port_accepts
from pytest_schedfuzz.process.worker import worker_env
from pytest_schedfuzz.properties.derived import graph_trace
from pytest_schedfuzz.sim.models import ModelShape, llama_graph
from reference.rules import rules_for

RPC_CPU = BackendLayout.of("rpc", "cpu")
TWO_LAYERS = ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1)


def sched_new(max_nodes: int = 1024, parallel: bool = False) -> Step:
    return Step("sched_new", params=SchedParams(max_nodes, parallel, True))


def scenario(layout: BackendLayout, graphs: dict[str, GraphSpec], *steps: Step) -> Scenario:
    sc = Scenario(layout, tuple(graphs.items()), steps)
    sc.validate()
    return sc


@pytest.fixture(scope="module")
def target() -> Iterator[GgmlTarget]:
    t = GgmlTarget()
    yield t
    t.close()


def test_llama_on_rpc_and_cpu(target: GgmlTarget) -> None:
    spec = llama_graph(TWO_LAYERS, n_tokens=8, n_kv=32)
    sc = scenario(RPC_CPU, {"A": spec}, sched_new(), Step("reserve", "A"), Step("alloc", "A"), Step("compute", "A"))
    trace = graph_trace(target.run(sc))
    assert trace.abort is None
    assert trace.engine["name"] == "ggml" and ".so" in Path(trace.engine["lib"]).name
    rules, _ = rules_for(trace.engine["ggml_version"])
    ops = {t.name for t in spec.tensors if not t.is_leaf}
    leafs = {t.name for t in spec.tensors if t.is_leaf}
    for rec in trace.records[1:]:
        assert rec.ok
        assert set(rec.node_names) == ops and len(rec.node_names) == len(ops)
        assert set(rec.leaf_names) == leafs
        assert len(rec.node_backends) == len(rec.node_names) and set(rec.node_backends) <= {0, 1}
        assert len(rec.leaf_backends) == len(rec.leaf_names) and set(rec.leaf_backends) <= {0, 1}
        assert rec.n_splits > 1
        assert rec.splits[0].i_start == 0 and rec.splits[-1].i_end == len(rec.node_names)
        assert all(a.i_end == b.i_start for a, b in zip(rec.splits, rec.splits[1:]))
        n_inputs = sum(len(s.inputs) for s in rec.splits)
        assert rec.graph_size == rules.graph_size(len(rec.node_names), len(rec.leaf_names), rec.n_splits, n_inputs, rec.n_copies)
        assert rec.n_nodes == len(rec.node_names) + 2 * sum(len(s.inputs) for s in rec.splits)
        assert all(size > 0 for size in rec.buffer_sizes)
        # a non-view node runs on its split's backend
        for s in rec.splits:
            for i in range(s.i_start, s.i_end):
                if spec.by_name[rec.node_names[i]].op not in ("view", "reshape", "permute", "transpose"):
                    assert rec.node_backends[i] == s.backend
    # weights decide: the layer-0 projections run on the RPC device, the embedding on the CPU
    rec = trace.records[-1]
    backend = dict(zip(rec.node_names, rec.node_backends))
    assert backend["Qcur-0"] == 0 and backend["Qcur-1"] == 1 and backend["inp_embd"] == 1
    # the reserve step saw the same assignment as the allocations (read before its reset)
    assert trace.records[1].node_backends == rec.node_backends


def test_forced_assignment(target: GgmlTarget) -> None:
    b = GraphBuilder()
    w = b.weight("w", (16, 8), device=0)
    x = b.input("x", (16, 4))
    y = b.op("mul_mat", w, x, name="y")
    z = b.op("scale", y, name="z", scale=0.5)
    b.force("z", 1)
    trace = target.run(scenario(RPC_CPU, {"g": b.build(z)}, sched_new(), Step("compute", "g")))
    rec = trace.records[-1]
    assert trace.abort is None and rec.ok
    assert dict(zip(rec.node_names, rec.node_backends)) == {"y": 0, "z": 1}
    assert [(s.backend, s.i_start, s.i_end, s.inputs) for s in rec.splits] == [(0, 0, 1, ("x",)), (1, 1, 2, ("y",))]


def test_topology_switch_reallocates_at_same_size(target: GgmlTarget) -> None:
    """llama.cpp PR 17617: reserve(32 tokens), a graph of another topology, 2 tokens, then 32
    tokens again: the last alloc re-reserves although its graph size did not change."""
    graphs = {
        "A32": llama_graph(TWO_LAYERS, n_tokens=32, n_kv=64, n_outputs=32),
        "B": llama_graph(TWO_LAYERS, n_tokens=32, n_kv=64, n_outputs=1),
        "A2": llama_graph(TWO_LAYERS, n_tokens=2, n_kv=64, n_outputs=2),
    }
    steps = (sched_new(), Step("reserve", "A32"), Step("alloc", "B"), Step("alloc", "A2"), Step("alloc", "A32"))
    trace = graph_trace(target.run(scenario(RPC_CPU, graphs, *steps)))
    assert trace.abort is None
    reserve, alloc_b, alloc_a2, alloc_a32 = trace.records[1:]
    assert not reserve.events
    # B has one more node and leaf (the output selection) and moves nodes between buffers
    (eb,) = alloc_b.events
    assert eb.via == "sched" and eb.backend_ids_changed and eb.prev_graph_size == reserve.graph_size
    (e2,) = alloc_a2.events
    assert e2.via == "sched" and not e2.backend_ids_changed and e2.reason == "different number of nodes"
    (e,) = alloc_a32.events
    assert e.via == "sched" and not e.backend_ids_changed
    assert e.graph_size == e.prev_graph_size == reserve.graph_size and e.same_size
    assert e.reason == "node inp_embd is not valid"  # sized for 2 tokens, now 32
    assert e.n_nodes == alloc_a32.n_nodes and e.n_splits == alloc_a32.n_splits and e.step == 4


def test_abort_is_reported_and_the_next_scenario_runs(target: GgmlTarget) -> None:
    spec = llama_graph(TWO_LAYERS, n_tokens=4, n_kv=16)
    assert len(spec.tensors) > 100
    trace = target.run(scenario(RPC_CPU, {"A": spec}, sched_new(max_nodes=16), Step("alloc", "A")))
    assert trace.abort is not None
    assert trace.abort.kind == "abort" and trace.abort.step == 1
    assert "GGML_ASSERT" in trace.abort.message and "hash_set.size" in trace.abort.message
    assert [r.kind for r in trace.records] == ["sched_new"]
    trace = target.run(scenario(RPC_CPU, {"A": spec}, sched_new(), Step("compute", "A")))
    assert trace.abort is None and trace.records[-1].ok


def test_a_scenario_is_validated_while_the_worker_runs_it(target: GgmlTarget) -> None:
    """The worker takes what it is sent as valid; the parent validates it meanwhile: an invalid
    scenario raises its ``SpecError``, naming its graph, before the reference sees it, whether
    its shapes cannot be inferred (the pickling fails) or a forced assignment names a backend not
    in the layout (it was sent); the next scenario runs."""
    from pytest_schedfuzz.campaign.engines import Deferred
    from pytest_schedfuzz.model.graph_spec import TensorSpec
    from pytest_schedfuzz.model.shapes import SpecError

    good = llama_graph(TWO_LAYERS, 4, 16)
    forced = GraphSpec(good.tensors, good.roots, ((good.roots[0], 7),))
    x, y = TensorSpec("x", ne=(4, 2), role="input"), TensorSpec("y", ne=(3, 2), role="input")
    unequal = GraphSpec((x, y, TensorSpec("z", "add", ne=(4, 2), args=("x", "y"))), ("z",))
    predicted: list[int] = []
    for bad, why in ((forced, "backend 7, not in the layout"), (unequal, "")):
        with pytest.raises(SpecError, match=f"graph 'B': .*{why}"):
            target.run(Scenario(RPC_CPU, (("B", bad),), (sched_new(), Step("alloc", "B"))), Deferred(lambda: predicted.append(1)))
        assert predicted == []
        trace = target.run(scenario(RPC_CPU, {"A": good}, sched_new(), Step("alloc", "A")))
        assert trace.abort is None and trace.records[-1].ok


def test_weights_are_kept_for_a_scenario_that_has_them_alike_and_freed_before_one_that_does_not(target: GgmlTarget) -> None:
    """A scenario takes the last one's weights where it has them alike (the worker keeps them,
    ``Ggml.kept_weights``) and runs as on fresh ones; weights it does not have are freed before
    it allocates its own, so that a GPU-like device's memory is a fresh run's: two 8 MiB weights
    in turn fit in 12 MiB, only one at a time. A scenario on the CPU alone leaves the device's
    weights to a later scenario of that device, which frees them."""
    from pytest_schedfuzz.model.layout import BackendSpec

    gpu = BackendLayout((BackendSpec("gpu", memory=12 << 20), BackendSpec("cpu")))

    def on_gpu(weight: str) -> Scenario:
        b = GraphBuilder()
        y = b.op("mul_mat", b.weight(weight, (1024, 2048), device=0), b.input("x", (1024, 2)), name="y")
        return scenario(gpu, {"A": b.build(y)}, sched_new(), Step("alloc", "A"), Step("compute", "A"))

    first = target.run(on_gpu("w"))
    assert first.abort is None and first.records[-1].ok
    again = target.run(on_gpu("w"))
    untimed = [replace(r, seconds=0.0, build_seconds=0.0) for r in first.records]
    assert [replace(r, seconds=0.0, build_seconds=0.0) for r in again.records] == untimed
    cpu = target.run(scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("alloc", "A")))
    assert cpu.abort is None
    for weight in ("w2", "w"):
        trace = target.run(on_gpu(weight))
        assert trace.abort is None and trace.records[-1].ok
    with GgmlTarget() as fresh:
        assert [replace(r, seconds=0.0, build_seconds=0.0) for r in fresh.run(on_gpu("w")).records] == untimed


def test_single_buffer_reallocates_by_itself(target: GgmlTarget) -> None:
    """CPU only: one compute buffer, so ggml_gallocr_alloc_graph re-reserves without the scheduler."""
    cpu = ModelShape(layer_devices=(0, 0), output_device=0, cpu_device=0)
    graphs = {"A32": llama_graph(cpu, 32, 64), "A2": llama_graph(cpu, 2, 64)}
    steps = (sched_new(), Step("reserve", "A2"), Step("alloc", "A32"), Step("alloc", "A2"))
    trace = graph_trace(target.run(scenario(BackendLayout.of("cpu"), graphs, *steps)))
    assert trace.abort is None
    assert [[(e.via, e.reason, e.same_size) for e in r.events] for r in trace.records[2:]] == [
        [("gallocr", "node inp_embd is not valid", True)],
        [],
    ]
    assert trace.records[2].splits == trace.records[3].splits and len(trace.records[2].splits) == 1


def test_dead_rpc_server_is_replaced(target: GgmlTarget) -> None:
    sc = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"))
    target.servers.ensure(1)
    victim, port = target.servers.pids[0], target.servers.ports[0]
    os.kill(victim, signal.SIGKILL)
    # until its socket is closed: ggml's RPC client aborts when a dying server accepts but never answers
    deadline = time.monotonic() + 10
    while port_accepts(port):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    trace = target.run(sc)
    assert trace.abort is None and trace.records[-1].ok
    assert target.servers.pids[0] != victim


@pytest.mark.parametrize("lib", ["ggml-0.25.3", "ggml-0.15.3"])
def test_rpc_servers_are_programs_linked_against_the_ggml_under_test(lib: str, tmp_path: Path) -> None:
    """An RPC server is ``rpc_server.c``'s program, exec'd (its own address layout), and it maps
    the very ggml files the worker loads (those of their sonames: ``lib.lib_overlay``), RPC
    library included; a folder with no RPC library is a clear error naming it."""
    folder = library_folder(lib)
    with RpcServers(RpcProgram(resolve_lib(lib))) as servers:
        servers.ensure(2)
        for pid in servers.pids:
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert os.readlink(f"/proc/{pid}/exe").endswith("schedfuzz-rpc-server")
            for stem in ("libggml-base", "libggml-rpc"):
                mapped = {os.path.realpath(line.split(None, 5)[5]) for line in maps.splitlines() if f"/{stem}.so" in line}
                assert mapped == {os.path.realpath(lib_overlay(folder) / shared_library(folder, stem).name)}
    for f in folder.glob("libggml*.so*"):
        if "rpc" not in f.name:
            (tmp_path / f.name).symlink_to(f.resolve())
    with RpcServers(RpcProgram(str(tmp_path))) as servers, pytest.raises(RpcServerError, match=f"{tmp_path}: no libggml-rpc.so there"):
        servers.ensure(1)


def test_unreachable_endpoint_is_retried(target: GgmlTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker checks each RPC server before ggml_backend_rpc_init (which crashes on a dead
    one); the target then restarts that server and sends the scenario again."""
    sc = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"))
    real = target.servers.ensure
    given: list[list[str]] = []

    def first_one_dead(n: int) -> list[str]:
        given.append([f"127.0.0.1:{free_port()}"] if not given else real(n))
        return given[-1]

    monkeypatch.setattr(target.servers, "ensure", first_one_dead)
    trace = target.run(sc)
    assert trace.abort is None and trace.records[-1].ok and len(given) == 2


def test_the_reference_predicts_while_the_worker_runs_and_its_error_waits_for_the_reply(target: GgmlTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """``meanwhile`` (the fuzzer's reference prediction) runs once the worker has the scenario,
    before its records are read, once even when the scenario is sent twice (an RPC server that
    did not answer); what it raises comes after the reply is read, and the worker, still in
    step, runs the next scenario."""
    from pytest_schedfuzz.campaign.engines import Deferred

    sc = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("alloc", "A"))
    target.run(sc)
    pid = target.worker_pid
    calls: list[int | None] = []

    def predict() -> None:
        calls.append(target.worker_pid)
        raise ValueError("the reference failed")

    later = Deferred(predict)
    trace = target.run(sc, later)
    assert trace.abort is None and trace.records[-1].ok and calls == [pid]
    with pytest.raises(ValueError, match="the reference failed"):
        later.result()
    assert calls == [pid]  # not called again
    assert target.run(sc).records[-1].ok and target.worker_pid == pid
    real, given = target.servers.ensure, []

    def first_one_dead(n: int) -> list[str]:
        given.append([f"127.0.0.1:{free_port()}"] if not given else real(n))
        return given[-1]

    monkeypatch.setattr(target.servers, "ensure", first_one_dead)
    counted: list[int] = []
    later = Deferred(lambda: counted.append(1))
    assert target.run(sc, later).records[-1].ok and len(given) == 2 and counted == [1]


def test_step_timeout() -> None:
    with GgmlTarget(step_timeout=1e-4) as t:
        trace = t.run(scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("alloc", "A")))
    assert trace.abort is not None and trace.abort.kind == "timeout" and trace.abort.step == 0


def test_close_leaves_no_process() -> None:
    t = load_target("pytest_schedfuzz.ggml.graph_target:GgmlTarget")
    assert isinstance(t, GgmlTarget) and isinstance(t, Target)
    layout = BackendLayout.of("rpc", "rpc", "cpu")
    spec = llama_graph(ModelShape(layer_devices=(0, 1), output_device=2, cpu_device=2), 4, 16)
    trace = t.run(scenario(layout, {"A": spec}, sched_new(), Step("compute", "A")))
    assert trace.abort is None
    pids, ports, worker = t.servers.pids, t.servers.ports, t.worker_pid
    assert len(pids) == 2 and worker is not None and all(port_accepts(p) for p in ports)
    assert t._forker is not None and t._forker.server is not None and t._spare is not None
    forks, spare = t._forker.server.proc.pid, t._spare.proc.pid
    t.close()
    for pid in [*pids, worker, forks, spare]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(port_accepts(p) for p in ports)


def test_other_library_dir(tmp_path: Path, target: GgmlTarget) -> None:
    lib = tmp_path / "lib"
    shutil.copytree(Path(target.start()["lib"]).parent, lib)
    with GgmlTarget(lib=str(lib)) as t:
        trace = t.run(scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A")))
    assert trace.abort is None
    assert Path(trace.engine["lib"]).parent == lib.resolve()


def test_blas_needs_a_blas_build(target: GgmlTarget) -> None:
    sc = scenario(BackendLayout.of("blas", "cpu"), {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("alloc", "A"))
    try:
        trace = target.run(sc)
    except Unsupported as e:
        assert "BLAS" in str(e)
    else:
        assert trace.abort is None


def test_geometry_check() -> None:
    want = new_tensor("f32", (4, 3))
    check_geometry("t", want, want)
    with pytest.raises(GeometryMismatch, match=r"'t'.*ne: spec \(4, 3, 1, 1\), ggml \(4, 6, 1, 1\)"):
        check_geometry("t", want, new_tensor("f32", (4, 6)))
    with pytest.raises(GeometryMismatch, match="view_src"):
        check_geometry("t", want, Geometry("f32", want.ne, want.nb, "src"))


FRAGMENTS = [
    "\n## SPLIT #0: CPU # 0 inputs", "\n",
    "node #  0 (  GET_ROWS):             inp_embd (   1K) [  CPU         ] use=1,c=0:", "   token_embd (  32K) [  CPU         ]", "\n",
    "\n## SPLIT #1: RPC0[127.0.0.1:5] # 2 inputs", ": ", "[inp_embd (   1K)] ", "[Kcur-0 (rope) (x) (  12K)] ", "\n",
    "node #  3 (   MUL_MAT):               Qcur-0 (   1K) [RPC0[         ] use=1,c=0:", "\n",
    "ggml_gallocr_needs_realloc: src 1 (Kcur-0 (rope)) of node k_store-0 is not valid\n",
    "ggml_gallocr_alloc_graph: cannot reallocate multi buffer graph automatically, call reserve\n",
    "ggml_backend_sched_alloc_splits: failed to allocate graph, reserving (backend_ids_changed = 0)\n",
    "ggml_gallocr_needs_realloc: graph has different number of leafs\n",
    "ggml_gallocr_alloc_graph: reallocating buffers automatically\n",
    "ggml_backend_sched_alloc_splits: failed to allocate graph, reserving (backend_ids_changed = 1)\n",
]


def _parsed(log: SchedLog) -> tuple[object, ...]:
    return (log.errors, [(s.backend_name, s.inputs, s.first_node) for s in log.splits], [(r.via, r.backend_ids_changed, r.reason) for r in log.reallocs])


def test_schedlog_reads_fragments() -> None:
    log = SchedLog()
    log.begin()
    for f in FRAGMENTS:
        log.feed(f)
    assert _parsed(log) == (
        [],
        [("CPU", [], 0), ("RPC0[127.0.0.1:5]", ["inp_embd", "Kcur-0 (rope) (x)"], 3)],
        [("sched", False, "src 1 (Kcur-0 (rope)) of node k_store-0 is not valid"), ("gallocr", False, "different number of leafs"),
         ("sched", True, "backend ids changed")],
    )
    gathered = SchedLog()
    gathered.begin()
    gathered.feed_fragments("".join(f + SEP for f in FRAGMENTS))  # as observe.c gathers them
    assert _parsed(gathered) == _parsed(log)


def test_observe_gathers_the_log_and_reads_backends_at_the_first_split_header() -> None:
    """observe.c, driven as ggml drives it: the fragments come back whole, and every tensor's
    backend is read once, when "## SPLIT #0:" starts a line (inside split_graph), not before."""
    import ctypes

    from pytest_schedfuzz.ggml.bindings import load_helpers

    lib = load_helpers()
    calls: list[int] = []
    backends = (ctypes.c_void_p * 2)(0x1000, 0x2000)

    @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    def get_backend(sched: int, tensor: int) -> int:
        calls.append(tensor)
        return {1: 0x2000, 2: 0x1000}.get(tensor, 0)

    log_fn = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(ctypes.cast(lib.schedfuzz_log, ctypes.c_void_p).value)
    lib.schedfuzz_observe_init(ctypes.cast(get_backend, ctypes.c_void_p).value, 4)
    tensors = (ctypes.c_void_p * 3)(1, 2, 3)
    out = (ctypes.c_int * 3)(7, 7, 7)
    lib.schedfuzz_observe_arm(None, tensors, 3, backends, 2, out)
    log_fn(1, b"a line begun, ", None)
    log_fn(1, b"## SPLIT #0: not at a line start, ", None)  # mid-line: no snapshot
    log_fn(1, b"this\n", None)
    assert calls == []
    for f in FRAGMENTS:
        log_fn(1, f.encode(), None)
    assert calls == [1, 2, 3] and list(out) == [1, 0, -1]  # once, at SPLIT #0, not again at #1
    assert lib.schedfuzz_observe_disarm() == 1
    n, lost = ctypes.c_size_t(0), ctypes.c_int(0)
    text = ctypes.string_at(lib.schedfuzz_log_take(ctypes.byref(n), ctypes.byref(lost)), n.value).decode()
    assert lost.value == 0 and text.split(SEP)[3:-1] == FRAGMENTS
    # a split's later node lines (here after each first one, one ending in the fragment that
    # starts the next header) are dropped in C: the parser reads nothing from them
    more = list(FRAGMENTS)
    more[5:5] = ["node #  1 (       ADD):                  x-0 (   1K) [  CPU         ] use=1,c=0:", "   inp_embd (   1K) [  CPU         ]", "\n",
                 "node #  2 (     SCALE):                  y-0 (   1K) [  CPU         ] use=1,c=0:\n"]
    k = more.index("node #  3 (   MUL_MAT):               Qcur-0 (   1K) [RPC0[         ] use=1,c=0:") + 2
    more[k:k] = ["node #  4 (       ADD):                  z-0 (   1K) [RPC0[         ] use=1,c=0:", "   Qcur-0 (   1K) [RPC0[         ]\nggml_gallocr_"]
    more[k + 2] = more[k + 2].removeprefix("ggml_gallocr_")
    for f in more:
        log_fn(1, f.encode(), None)
    text = ctypes.string_at(lib.schedfuzz_log_take(ctypes.byref(n), ctypes.byref(lost)), n.value).decode()
    assert lost.value == 0 and "node #  3" in text and not any(f"node #  {i}" in text for i in (1, 2, 4))
    gathered, whole = SchedLog(), SchedLog()
    gathered.begin()
    whole.begin()
    gathered.feed_fragments(text)
    for f in more:
        whole.feed(f)
    assert _parsed(gathered) == _parsed(whole) == _parsed_fragments()


def test_observe_reads_the_names_of_tensors_in_one_call() -> None:
    """``schedfuzz_names``: each tensor's NUL-ended name field (63 bytes at most), in order."""
    import ctypes

    from pytest_schedfuzz.ggml.bindings import load_helpers

    lib = load_helpers()
    offset, size = 8, 64  # a name field after 8 bytes of something else
    names = [b"inp_embd", b"", "Kcur-0 (rope) é".encode(), b"x" * 63]
    tensors = [ctypes.create_string_buffer(b"\xff" * offset + n + b"\0" * (size - len(n))) for n in names]
    out = ctypes.create_string_buffer(len(names) * size)
    n = lib.schedfuzz_names((ctypes.c_void_p * 4)(*map(ctypes.addressof, tensors)), 4, offset, size, out)
    assert out.raw[:n].split(b"\0")[:-1] == names


def _parsed_fragments() -> tuple[object, ...]:
    log = SchedLog()
    log.begin()
    for f in FRAGMENTS:
        log.feed(f)
    return _parsed(log)


@pytest.mark.parametrize("lib", ["ggml-0.25.3", "ggml-0.15.3"])
def test_an_rpc_server_crash_is_charged_to_the_step_that_caused_it(lib: str) -> None:
    """The corpus's RPC server SIGSEGV (a CPY into a CPU input placed on the RPC backend),
    followed by more steps: 0.25.3 sends GRAPH_COMPUTE without waiting, so only the round trip
    after the compute charges the crash to that step. The next scenario runs on a fresh server."""

    from pytest_schedfuzz.cases.corpus import load_case

    case = load_case(next((Path(__file__).resolve().parents[2] / "corpus").glob("no-abort-*-4257100ce1.json")))
    assert case.scenario is not None
    crashing = replace(case.scenario, steps=(*case.scenario.steps, Step("alloc", "g0"), Step("alloc", "g0")))
    clean = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"))
    with GgmlTarget(lib=lib) as t:
        for _ in range(2):
            trace = t.run(crashing)
            assert trace.abort is not None and trace.abort.step == case.step, trace.abort
            assert "was killed by SIGSEGV" in trace.abort.message
            after = t.run(clean)
            assert after.abort is None and after.records[-1].ok


@pytest.mark.parametrize("lib", ["ggml-0.25.3", "ggml-0.15.3"])
def test_a_server_crash_is_charged_to_its_scenario_and_a_kill_from_outside_to_nothing(lib: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that crashes (SIGSEGV) after the worker's last reply of a scenario (RPC
    computes asynchronously) is that scenario's crash, not the next one's. A server killed
    from outside (SIGKILL: the OOM killer, a user) is an infrastructure fault: the scenario runs
    again on a fresh server and nothing is charged; twice in a row is a TargetError."""
    clean = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"), Step("alloc", "A"))
    with GgmlTarget(lib=lib) as t:
        assert t.run(clean).abort is None
        real = t._collect
        kills: list[int] = []

        def then_signal_the_server(worker, records):  # type: ignore[no-untyped-def]
            result = real(worker, records)
            if kills:
                os.kill(t.servers.pids[0], kills.pop(0))
                while not t.servers.dead():
                    pass
            return result

        monkeypatch.setattr(t, "_collect", then_signal_the_server)
        kills[:] = [signal.SIGSEGV]
        trace = t.run(clean)
        assert trace.abort is not None and trace.abort.kind == "crash" and trace.abort.step == 2
        assert "an RPC server died during this scenario" in trace.abort.message and "killed by SIGSEGV" in trace.abort.message
        kills[:] = [signal.SIGKILL]
        trace = t.run(clean)
        assert trace.abort is None and not kills  # killed, then run again on a fresh server
        kills[:] = [signal.SIGKILL, signal.SIGKILL]
        with pytest.raises(TargetError, match="infrastructure fault, twice in a row.*RPC server .* was killed by SIGKILL"):
            t.run(clean)
        monkeypatch.undo()
        assert t.run(clean).abort is None  # on a fresh server
        os.kill(t.servers.pids[0], signal.SIGKILL)  # while idle
        time.sleep(0.2)
        assert t.run(clean).abort is None


def test_exiting_reads_the_kernels_exit_flag_before_the_process_is_a_zombie(tmp_path: Path) -> None:
    """``exiting`` is true from the moment the kernel begins the exit (``PF_EXITING``, set before
    the process's sockets close), not only once it is a zombie: a child that frees 512 MiB on
    SIGKILL is seen mid-exit. A running process is not exiting; a zombie and a reaped pid are."""
    import subprocess
    import sys

    prog = tmp_path / "odd) name ( R"  # /proc/PID/stat's comm, with spaces and parentheses
    prog.symlink_to(sys.executable)
    child = subprocess.Popen([str(prog), "-c", "import time; b = bytearray(b'x') * (512 << 20); print(flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"\n"
    assert not exiting(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    seen: list[tuple[str, bool]] = []
    while not seen or seen[-1][0] != "Z":
        state = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0]
        seen.append((state, exiting(child.pid)))
    assert any(state != "Z" and flag for state, flag in seen), seen[:5]  # caught mid-exit
    assert seen[-1] == ("Z", True)
    child.wait()
    assert exiting(child.pid)  # gone


def test_dead_waits_for_no_healthy_server_and_reports_a_crashed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RpcServers.dead`` after a healthy scenario returns at once (it used to give every server
    0.2 s to die: 13-16% of a ci ``matches-reference`` run); a crashed server, zombie or reaped,
    is reported with its signal."""
    with RpcServers(RpcProgram()) as servers:
        servers.ensure(2)
        slept: list[float] = []
        with monkeypatch.context() as m:
            m.setattr(time, "sleep", slept.append)
            assert servers.dead() == [] and slept == []
        pid = servers.pids[1]
        os.kill(pid, signal.SIGSEGV)
        while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            pass
        (report,) = servers.dead()
        assert report.startswith(f"RPC server 127.0.0.1:{servers.ports[1]} was killed by SIGSEGV")
        assert servers.dead() == [report]


def test_a_worker_killed_from_outside_is_restarted_and_the_scenario_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"))
    with GgmlTarget() as t:
        assert t.run(clean).abort is None
        kills = _signal_the_worker_first(t, monkeypatch, signal.SIGKILL)
        trace = t.run(clean)
        assert trace.abort is None and trace.records[-1].ok and not kills


SYS_TGKILL = 234  # x86-64's syscall number (asm/unistd_64.h)


def _signal_the_worker_first(t: GgmlTarget, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals) -> list[signal.Signals]:
    """Have the next run's worker take ``sig`` once it has the scenario; the signals not sent yet.
    The worker is stopped (SIGSTOP) before the scenario is sent, and continued once ``sig`` is
    pending: a worker left running could finish a small scenario before the signal arrived (a
    loaded machine deschedules the parent between its send and its kill), and die idle."""
    real_live, real_collect, signals = t._live_worker, t._collect, [sig]

    def stopped():  # type: ignore[no-untyped-def]
        worker = real_live()
        if signals:
            os.kill(worker.proc.pid, signal.SIGSTOP)
            while Path(f"/proc/{worker.proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
                time.sleep(0.001)
        return worker

    def signal_first(worker, records):  # type: ignore[no-untyped-def]
        if signals:
            # to its main thread (tgkill), which runs the scenario: a signal to the process may go
            # to one of ggml's threads, whose handler (``crash_hook.c``) then prints its stack while
            # the main thread finishes the scenario and says so
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syscall(SYS_TGKILL, worker.proc.pid, worker.proc.pid, signals.pop()) != 0:
                raise OSError(ctypes.get_errno(), "tgkill")
            os.kill(worker.proc.pid, signal.SIGCONT)
        return real_collect(worker, records)

    monkeypatch.setattr(t, "_live_worker", stopped)
    monkeypatch.setattr(t, "_collect", signal_first)
    return signals


def test_a_crash_is_confirmed_on_the_spare_worker_and_fresh_rpc_servers_with_the_same_fork_server() -> None:
    """``Engines.confirmed`` runs a crashed scenario again on a fresh worker and fresh RPC
    servers: the spare (forked before the crash, it ran nothing but the startup probe), from the
    fork server that forked the crashed one (it never initializes ggml), so that no Python
    process has to start; a crash that does not come back is unconfirmed."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.model.trace import Abort, Trace
    from pytest_schedfuzz.profiles import FuzzConfig

    clean = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"))
    fuzzer = Fuzzer(FuzzConfig(database=None, confirm_runs=1))  # one replay: the spare's
    try:
        t = fuzzer.engines.target
        assert isinstance(t, GgmlTarget) and t.run(clean).abort is None
        assert t._forker is not None and t._forker.server is not None and t._spare is not None
        server, spare, servers = t._forker.server.proc.pid, t._spare.proc.pid, set(t.servers.pids)
        # a crash as the target reports one (a real one: test_workers_after_aborts_are_forked...)
        crashed = Trace((), Abort(0, "crash", "the worker was killed by SIGSEGV"))
        again = fuzzer.engines.confirmed(clean, crashed)
        assert again.abort is None and fuzzer.stats.unconfirmed == 1
        assert t.worker_pid == spare and t._forker.server is not None and t._forker.server.proc.pid == server
        assert t.servers.pids and not servers & set(t.servers.pids)
    finally:
        fuzzer.close()


def test_a_timeout_counts_only_if_a_fresh_worker_hangs_too_with_five_times_the_patience():
    """A machine loaded by other work (pytest-xdist inside pytest-xdist) can stall a step past
    its timeout: the confirmation run gets five times the step timeout, so a slow step passes
    and a hang is still a finding; the step timeout is restored after."""
    from pytest_schedfuzz.campaign.engines import CONFIRM_TIMEOUT_FACTOR
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.model.trace import Abort, Trace
    from pytest_schedfuzz.profiles import FuzzConfig

    class Slow:
        """Times out under the usual timeout, finishes under a longer one."""

        def __init__(self, hangs: bool) -> None:
            self.step_timeout, self.hangs, self.seen = 60.0, hangs, []

        def run(self, scenario: Scenario) -> Trace:
            self.seen.append(self.step_timeout)
            if self.hangs or self.step_timeout < 60.0 * CONFIRM_TIMEOUT_FACTOR:
                return Trace((), Abort(0, "timeout", f"step 0 did not finish within {self.step_timeout:g} s"))
            return Trace(())

        def close(self) -> None:
            pass

    for hangs in (False, True):
        fuzzer = Fuzzer(FuzzConfig(database=None))
        fuzzer.engines._target = slow = Slow(hangs)  # type: ignore[assignment]
        trace = fuzzer.engines.confirmed(Scenario(RPC_CPU, (), ()), fuzzer.engines.run(Scenario(RPC_CPU, (), ())))
        assert (trace.abort is not None) == hangs and slow.seen == [60.0, 300.0] and slow.step_timeout == 60.0
        assert fuzzer.stats.unconfirmed == (0 if hangs else 1)


# every op of the spec language that llama_graph does not make, over inputs x and y (8 x 4, f32) and
# xs, computed first and kept (a view_tensor's source: see the strategies' ``_view_leaf``)
OP_CASES: list[tuple[str, tuple[str | None, ...], dict[str, object]]] = [
    ("sub", ("x", "y"), {}), ("div", ("x", "y"), {}), ("add", ("x", "y"), {"inplace": True}), ("mul", ("x", "y"), {"inplace": True}),
    ("scale", ("x",), {"scale": 0.5, "inplace": True}), ("silu", ("x",), {"inplace": True}), ("sum", ("x",), {}), ("log", ("x",), {}),
    ("exp", ("x",), {}), ("sigmoid", ("x",), {}), ("dup", ("x",), {}), ("step", ("x",), {}), ("relu", ("x",), {}), ("sqr", ("x",), {}), ("cumsum", ("x",), {}), ("argmax", ("x",), {}), ("argsort", ("x",), {"order": 1}),
    ("clamp", ("x",), {"min": -0.5, "max": 0.25}), ("sum_rows", ("x",), {}), ("concat", ("x", "y"), {"dim": 1}),
    ("pad", ("x",), {"pad": (1, 0, 0, 2, 0, 0, 0, 0)}), ("cast", ("x",), {"type": "f16"}), ("fill", ("x",), {"value": 3.0}),
    ("fill", ("x",), {"value": 2.0, "inplace": True}), ("glu", ("x", None), {"glu": 2, "swapped": True}), ("glu", ("x", "y"), {"glu": 0}),
    ("cont", ("x",), {"ne": (4, 8)}), ("top_k", ("x",), {"k": 3}), ("view_tensor", ("xs",), {}), ("permute", ("x",), {"axes": (1, 0, 2, 3)}),
    ("view", ("x",), {"ne": (4, 2), "nb": (32,), "offset": 4}), ("reshape", ("x",), {"ne": (2, 16)}), ("transpose", ("x",), {}),
    ("rms_norm", ("x",), {"eps": 1e-5}), ("soft_max_ext", ("x", None), {"scale": 0.5}),
]


@pytest.mark.parametrize("lib", ["ggml-0.25.3", "ggml-0.15.3"])
def test_graph_c_builds_every_op_with_the_geometry_shapes_infers(lib: str) -> None:
    """graph.c (the worker's graph builder) makes each op with ggml's own constructor, checked
    against the spec's geometry, and the CPU-only values check's graph alike: every op computes,
    its node where the reference orders it. 0.15.3's top_k and clamp are other ops: refused by name."""
    from reference.predict import predict

    assert {op for op, _, _ in OP_CASES} | {"get_rows", "mul_mat", "mul_mat_id", "rope", "flash_attn_ext", "cpy", "set_rows", "ssm_conv",
                                             "ssm_scan"} == set(__import__("pytest_schedfuzz.model.ops", fromlist=["OPS"]).OPS)
    with GgmlTarget(lib) as target:
        for op, args, params in OP_CASES:
            b = GraphBuilder()
            b.input("x", (8, 4))
            b.input("y", (8, 4))
            b.op("scale", "x", name="xs", output=True, scale=2.0)
            out = b.op(op, *args, name="out", **params)
            if op == "view_tensor":  # a leaf: an op reads it
                out = b.op("add", out, b.weight("w", (8, 4), device=0), name="last")
            sc = scenario(BackendLayout.of("cpu"), {"g": b.build("xs", out)}, sched_new(), Step("compute", "g"))
            if op in ("top_k", "clamp") and lib == "ggml-0.15.3":
                with pytest.raises(Unsupported, match="GGML_OP_TOP_K is ggml 0.25.3's|0.15.3's ggml_clamp works in place"):
                    target.run(sc)
                continue
            trace = target.run(sc)
            assert trace.abort is None and trace.records[1].ok, (op, trace.abort)
            assert trace.records[1].values == "" and trace.records[1].values_checked, (op, trace.records[1].values)
            want = predict(sc, rules=rules_for(target.engine["ggml_version"])[0]).records[1]
            assert (trace.records[1].node_names, trace.records[1].leaf_names) == (want.node_names, want.leaf_names), op


def test_graph_c_reports_a_tensor_ggml_makes_unlike_its_geometry() -> None:
    """A geometry the parent sends that ggml does not give (a planted fault in the shape
    inference: nb[1] of a transpose) is a harness error naming the tensor and the field, not a run."""
    b = GraphBuilder()
    b.input("x", (8, 4))
    spec = b.build(b.op("transpose", "x", name="xt"))
    xt = spec.geometry["xt"]
    spec.__dict__["geometry"] = {**spec.geometry, "xt": Geometry(xt.type, xt.ne, (xt.nb[0], 99, *xt.nb[2:]), xt.view_src, xt.view_offs)}
    with GgmlTarget() as target:
        with pytest.raises(TargetError, match=r"tensor 'xt': ops.infer and ggml disagree: nb: spec \(32, 99, 128, 128\), ggml \(32, 4, 128, 128\)"):
            target.run(scenario(BackendLayout.of("cpu"), {"g": spec}, sched_new(), Step("alloc", "g")))


def test_children_keep_their_bytecode_where_the_user_writes_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker or RPC server starts after every abort: under ``PYTHONDONTWRITEBYTECODE`` each
    compiled ggml-python's bindings again. Children write their bytecode to schedfuzz's cache
    instead (not next to the sources), and the next child reads it."""
    import subprocess
    import sys

    from pytest_schedfuzz.ggml.lib import child_env

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv("SCHEDFUZZ_CACHE", str(tmp_path))
    env = child_env(None)
    assert "PYTHONDONTWRITEBYTECODE" not in env
    code = "import sys; from pytest_schedfuzz.ggml.lib import import_ggml; import_ggml(); print(sys.dont_write_bytecode, sys.pycache_prefix)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", str(tmp_path / "pycache")]
    assert list((tmp_path / "pycache").rglob("ggml/ggml.cpython-*.pyc"))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert "PYTHONPYCACHEPREFIX" not in child_env(None)  # the user's own choice otherwise


def _parent_and_command(pid: int) -> tuple[int, str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1]), Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " ")


def test_workers_after_aborts_are_forked_from_one_server_and_end_as_processes_of_their_own_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker dies at every ggml abort: its successor is forked from the target's fork server
    (which imported everything once), not started as a new Python process; an abort, a crash
    signal and a kill from outside read as they do from a process of its own."""
    aborting = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(max_nodes=16), Step("alloc", "A"))
    clean = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"))
    with GgmlTarget() as t:
        workers = []
        for _ in range(3):
            trace = t.run(aborting)
            assert trace.abort is not None and trace.abort.kind == "abort" and "hash_set.size" in trace.abort.message
            assert t.run(clean).abort is None
            workers.append(t.worker_pid)
        assert t._forker is not None and t._forker.server is not None and len(set(workers)) == 3
        server = t._forker.server.proc.pid
        parent, command = _parent_and_command(workers[-1])
        assert parent == server and "-m pytest_schedfuzz.process.forkserver" in command and "pytest_schedfuzz.ggml.graph_worker" in command
        # not the RPC servers (``rpc``: forked, they would share their address layout)
        assert all(_parent_and_command(pid)[0] == os.getpid() for pid in t.servers.pids)
        # a crash: the signal it died of, as from a process of its own
        _signal_the_worker_first(t, monkeypatch, signal.SIGSEGV)
        trace = t.run(clean)
        assert trace.abort is not None and trace.abort.kind == "crash" and "was killed by SIGSEGV" in trace.abort.message
        # the fork server killed from outside takes its workers with it: the scenario runs again on a new server
        os.kill(server, signal.SIGKILL)
        assert t.run(clean).abort is None
        assert t._forker.server is not None and t._forker.server.proc.pid != server
        assert _parent_and_command(t.worker_pid or 0)[0] == t._forker.server.proc.pid


def test_a_worker_after_the_next_test_item_is_forked_by_the_same_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest names the test running in ``PYTEST_CURRENT_TEST``: in the worker's environment it
    changed with every item, and the fork server (one per environment) was started again for
    each item whose worker started (36 times in a 60 s ci run). A worker needs none of it."""
    aborting = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(max_nodes=16), Step("alloc", "A"))
    with GgmlTarget() as t:
        servers = []
        for item in ("schedfuzz::reuse-sound (call)", "schedfuzz::corpus/a-case (call)"):
            monkeypatch.setenv("PYTEST_CURRENT_TEST", item)
            assert t.run(aborting).abort is not None  # the next run starts a new worker
            assert t._forker is not None and t._forker.server is not None
            servers.append(t._forker.server.proc.pid)
        assert servers[0] == servers[1]


def test_a_fork_server_that_cannot_import_its_module_leaves_workers_to_start_as_processes_of_their_own() -> None:
    env = worker_env(child_env(None))
    assert ForkServer.start("pytest_schedfuzz.no_such_module", (), env, 60.0) is None
    server = ForkServer.start("pytest_schedfuzz.ggml.graph_worker", (), env, 60.0)
    assert server is not None and server.alive()
    server.close()
    assert not server.alive()


def test_a_modules_prefork_runs_once_in_the_fork_server_and_its_workers_inherit_it(tmp_path: Path) -> None:
    """What a worker module's ``prefork()`` makes (the llama.cpp worker: llama.h parsed and bound)
    is made once, before any fork: each worker has it without making it."""
    (tmp_path / "prefork_probe.py").write_text(
        "import os, sys\nMADE = []\n"
        "def prefork():\n    MADE.append(os.getpid())\n"
        "def main():\n    os.write(1, f'{MADE} {os.getpid()}'.encode())\n")
    env = worker_env(child_env(None))
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    server = ForkServer.start("prefork_probe", (), env, 60.0)
    assert server is not None
    try:
        said = []
        for _ in range(2):
            with open(tmp_path / "stderr", "wb") as err:
                worker = server.spawn(err)
            assert worker is not None
            worker.stdin.close()
            said.append(worker.stdout.read().decode())
            worker.wait(10)
            worker.stdout.close()
    finally:
        server.close()
    made = {s.split("] ")[0] + "]" for s in said}
    assert made == {f"[{server.proc.pid}]"}, said  # made once, by the server; both workers have it
    assert len({s.split("] ")[1] for s in said}) == 2  # two workers of their own


def test_a_new_environment_gets_a_new_fork_server_and_the_old_one_retires_once_its_workers_have_exited(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker handed out before the environment changed lives on (a test's ``setenv``, then
    the running worker's next scenario); its server exits once it is seen to exit."""
    clean = scenario(RPC_CPU, {"A": llama_graph(TWO_LAYERS, 4, 16)}, sched_new(), Step("compute", "A"))
    with GgmlTarget() as t:
        assert t.run(clean).abort is None
        assert t._forker is not None and t._forker.server is not None
        old, worker = t._forker.server, t._worker
        monkeypatch.setenv("SCHEDFUZZ_TEST_ENV", "1")
        assert t.run(clean).abort is None and t._worker is worker  # no new worker yet
        t._spare.close()  # type: ignore[union-attr]
        t._spare = None
        fresh = t._new_worker(worker_env(t._env()))
        assert t._forker.server is not old and old.alive() and old.live == {worker.proc.pid}  # type: ignore[union-attr]
        assert t.run(clean).abort is None  # the old worker still runs
        worker.close()  # type: ignore[union-attr]
        assert not old.alive() and not old.live
        fresh.close()
