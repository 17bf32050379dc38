"""The reference's ggml-alloc (``reference/alloc.py``): chunks, in-place reuse, outputs and the
flags of input copies decide each backend's compute buffer size, and a device's ``max_size``
decides when ggml cannot allocate one. Checked against both built-in engines, and each rule
shown load-bearing: without it the reference no longer predicts what the engine does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.cases.corpus import load_case
from pytest_schedfuzz.ggml.graph_target import GgmlTarget
from pytest_schedfuzz.model.graph_spec import GraphBuilder
from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.properties import matches_reference
from pytest_schedfuzz.properties.derived import graph_trace
from reference import alloc, rules, sched
from reference.predict import predict
from reference.rules import rules_for

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
MAX_SIZE = 16384


def test_a_chunk_holds_at_most_max_size_unless_one_tensor_needs_more():
    a = alloc.DynTallocr(alignment=256, max_buffer_size=1024)
    assert [a.alloc(600), a.alloc(600), a.alloc(200)] == [(0, 0), (1, 0), (0, 768)]  # 768 bytes each, then 256
    assert a.alloc(4000) == (2, 0)  # bigger than a chunk: a chunk of its own
    assert [a.max_size(c) for c in range(3)] == [1024, 768, 4096]


def test_the_last_of_16_chunks_takes_the_rest():
    a = alloc.DynTallocr(alignment=32, max_buffer_size=64)
    for _ in range(alloc.GGML_VBUFFER_MAX_CHUNKS - 1):
        a.alloc(64)
    a.alloc(64)
    a.alloc(64)  # the 16th chunk grows past max_size: the device will refuse it
    assert len(a.chunks) == alloc.GGML_VBUFFER_MAX_CHUNKS and a.max_size(15) == 128


def test_freed_neighbours_merge():
    a = alloc.DynTallocr(alignment=32, max_buffer_size=alloc.SIZE_MAX)
    x, y, z = a.alloc(64), a.alloc(64), a.alloc(64)
    a.free_bytes(x, 64)
    a.free_bytes(z, 64)
    a.free_bytes(y, 64)
    assert a.chunks[0].free_blocks == [[0, alloc.SIZE_MAX // 2]]


def chain(parallel: bool, host_buffer: bool = False) -> Scenario:
    """Matmuls and in-place activations on a GPU-like device whose buffers hold at most 16 KiB,
    then an add forced to the CPU and a scaled output: the device's compute buffer needs more
    than one chunk with ``parallel``."""
    b = GraphBuilder()
    x = b.input("x", (64, 16))
    w = b.weight("w", (64, 64), device=0)
    h = b.op("mul_mat", w, x, name="h0")
    for k in range(4):
        h = b.op("mul_mat", w, b.op("silu", h, name=f"act{k}"), name=f"h{k + 1}")
    b.force(b.op("add", h, x, name="cpu_add"), 1)
    graph = b.build(b.op("scale", "cpu_add", name="out", output=True, scale=0.5))
    layout = BackendLayout((BackendSpec("gpu", max_size=MAX_SIZE, alignment=256, host_buffer=host_buffer), BackendSpec("cpu")))
    steps = (Step("sched_new", params=SchedParams(64, parallel, True)), Step("reserve", "g"), Step("alloc", "g"))
    return Scenario(layout, (("g", graph),), steps)


@contextmanager
def without(rule: str) -> Iterator[None]:
    """The reference with one of ggml-alloc's rules taken out."""
    mp = pytest.MonkeyPatch()
    if rule == "in-place reuse":
        mp.setattr(rules.Rules, "inplace_ops", property(lambda self: frozenset()))
    elif rule == "outputs are never freed":
        free_node: Callable = alloc.Gallocr.free_node
        mp.setattr(alloc.Gallocr, "free_node", lambda self, node: free_node(self, replace(node, output=False)))
    elif rule == "split input copies are flagged only with n_copies > 1":
        copy_ref: Callable = sched.Scheduler.copy_ref
        mp.setattr(sched.Scheduler, "copy_ref", lambda self, g, t, b, c, flagged=None: copy_ref(self, g, t, b, c, True))
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(scope="module", params=["ggml-0.25.3", "ggml-0.15.3"])
def engine(request: pytest.FixtureRequest) -> Iterator[GgmlTarget]:
    with GgmlTarget(lib=request.param) as target:
        yield target


def test_compute_buffer_sizes_match_the_engine_and_each_rule_is_load_bearing(engine: GgmlTarget):
    rules = rules_for(engine.start()["ggml_version"])[0]
    sizes = {}
    for parallel in (False, True):
        for host in (False, True):
            sc = chain(parallel, host)
            trace = graph_trace(engine.run(sc))
            assert trace.abort is None and not matches_reference(sc, trace, predict(sc, rules=rules))
            sizes[parallel, host] = trace.records[-1].buffer_sizes
    assert sizes[True, False][0] > MAX_SIZE  # several chunks on the device
    assert sizes == {(False, False): (8192, 8192), (False, True): (8192, 8192), (True, False): (24576, 36864), (True, True): (24576, 36864)}
    for rule, parallel in (("in-place reuse", False), ("outputs are never freed", True),
                           ("split input copies are flagged only with n_copies > 1", False)):
        with without(rule):
            predicted = predict(chain(parallel), rules=rules).records[-1].buffer_sizes
        assert predicted != sizes[parallel, False], f"{rule}: not load-bearing"


def test_a_refused_buffer_is_predicted_and_so_is_the_crash_after_it(engine: GgmlTarget):
    """The starter corpus's crash: the device refuses the 16th chunk, the reservation returns
    false, and the next alloc_graph dereferences the NULL buffer. The reference predicts the
    refusal and the crash (0.15.3 ignores its re-reservation's failure: with that reserve left
    out, it crashes in the same step)."""
    rules = rules_for(engine.start()["ggml_version"])[0]
    case = load_case(next(CORPUS.glob("no-abort-after-failed-allocation-*-5a2e452570.json")))
    assert case.scenario is not None
    first, *_, last = case.scenario.steps
    variants = [case.scenario] + ([replace(case.scenario, steps=(first, last))] if rules.version == "0.15.3" else [])
    for sc in variants:
        trace, prediction = graph_trace(engine.run(sc)), predict(sc, rules=rules)
        assert prediction.abort is not None and prediction.abort.kind == "crash" and "ggml_vbuffer_tensor_alloc" in prediction.abort.message
        assert trace.abort is not None and trace.abort.step == prediction.abort.step == len(sc.steps) - 1
        assert [r.ok for r in trace.records] == [r.ok for r in prediction.records]
        assert not matches_reference(sc, trace, prediction)
