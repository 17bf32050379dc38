"""The specs a graph worker keeps between scenarios (``ggml.kept``): sent once, then by token."""

from __future__ import annotations

import gc
import pickle
from dataclasses import replace

import pytest

from pytest_schedfuzz.ggml import kept
from pytest_schedfuzz.ggml.graph_target import GgmlTarget
from pytest_schedfuzz.ggml.kept import KeptSpecs, SentSpecs
from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.model.layout import BackendLayout
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.sim.models import ModelShape, llama_graph


def _spec(k: int) -> GraphSpec:
    b = GraphBuilder()
    b.input("x", (8, k))
    b.op("scale", "x", name="y", scale=2.0)
    return b.build("y")


def _scenario(*specs: GraphSpec) -> Scenario:
    graphs = tuple((f"g{i}", s) for i, s in enumerate(specs))
    return Scenario(BackendLayout.of("cpu"), graphs, (Step("sched_new", params=SchedParams(64)), *(Step("alloc", name) for name, _ in graphs)))


def _over_the_pipe(req: dict) -> dict:  # type: ignore[type-arg]
    return pickle.loads(pickle.dumps(req))  # type: ignore[no-any-return]


def test_a_spec_is_sent_once_then_by_token_and_the_worker_sees_the_same_scenario() -> None:
    sent, worker = SentSpecs(), KeptSpecs()
    a, b = _spec(1), _spec(2)
    first = sent.request(_scenario(a, b), [], False)
    assert set(first["specs"]) == {0, 1} and first["forget"] == []
    got = worker.scenario(_over_the_pipe(first))
    assert [s.tensors for _, s in got.graphs] == [a.tensors, b.tensors]
    again = sent.request(_scenario(b, a), [], True)
    assert again["specs"] == {} and again["graphs"] == (("g0", 1), ("g1", 0))  # tokens only
    got_again = worker.scenario(_over_the_pipe(again))
    # the worker's own objects of the first request: what it made of them (programs, names) serves again
    assert got_again.graphs[0][1] is got.graphs[1][1] and got_again.graphs[1][1] is got.graphs[0][1]


def test_both_sides_forget_the_least_recently_sent_beyond_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept, "KEPT", 2)
    sent, worker = SentSpecs(), KeptSpecs()
    specs = [_spec(k) for k in range(1, 5)]
    for s in specs[:2]:
        worker.scenario(_over_the_pipe(sent.request(_scenario(s), [], False)))
    worker.scenario(_over_the_pipe(sent.request(_scenario(specs[0]), [], False)))  # 0 is the recent one now
    req = sent.request(_scenario(specs[2]), [], False)
    assert req["forget"] == [1]  # spec 1's token: the least recently sent
    worker.scenario(_over_the_pipe(req))
    assert sorted(worker._specs) == [0, 2]
    # a scenario with more graphs than the limit keeps them all while it is sent
    big = sent.request(_scenario(*specs), [], False)
    assert set(big["specs"]) == {3, 4} and big["forget"] == []
    got = worker.scenario(_over_the_pipe(big))
    assert len(got.graphs) == 4


def test_both_sides_forget_the_least_recently_sent_beyond_the_tensor_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond ``KEPT_TENSORS`` tensors (big captured graphs), the least recently sent specs are
    forgotten, never the scenario's own."""
    monkeypatch.setattr(kept, "KEPT_TENSORS", 5)
    sent, worker = SentSpecs(), KeptSpecs()
    specs = [_spec(k) for k in range(1, 4)]  # two tensors each
    for s in specs[:2]:
        req = sent.request(_scenario(s), [], False)
        assert req["forget"] == []
        worker.scenario(_over_the_pipe(req))
    req = sent.request(_scenario(specs[2]), [], False)
    assert req["forget"] == [0]
    worker.scenario(_over_the_pipe(req))
    assert set(worker._specs) == {1, 2} == {token for token, _ in sent._tokens.values()}
    assert sent.request(_scenario(specs[0], specs[1], specs[2]), [], False)["forget"] == []  # its own: kept, over budget


def test_a_dead_spec_whose_id_comes_again_is_sent_in_full() -> None:
    """The parent holds specs weakly (they carry the reference's graph): an id reused by a new
    spec is not taken for the old one's token."""
    sent, worker = SentSpecs(), KeptSpecs()
    a = _spec(1)
    worker.scenario(_over_the_pipe(sent.request(_scenario(a), [], False)))
    token = next(iter(sent._tokens.values()))[0]
    old_id = id(a)
    del a
    gc.collect()
    b = _spec(3)
    # whether or not b took a's address, it is sent in full and its scenario is b's
    req = sent.request(_scenario(b), [], False)
    assert list(req["specs"].values())[0] is b
    got = worker.scenario(_over_the_pipe(req))
    assert got.graphs[0][1].tensors == b.tensors
    if id(b) == old_id:
        assert req["forget"] == [token]


def test_a_copy_with_other_forced_assignments_is_sent_as_the_kept_spec_s_token() -> None:
    """A captured graph drawn with more nodes forced (``GraphSpec.with_forced``, ``relabeled``:
    its tensors shared) goes as the token of the spec it copies, with its forced assignments and
    label: the worker makes it from the one it keeps, sharing its rows, program and names; a spec
    with equal but not shared tensors is sent in full; a kept base outlives the requests that use
    it, and the two tables stay alike."""
    sent, worker = SentSpecs(), KeptSpecs()
    a = _spec(3)
    worker.scenario(_over_the_pipe(sent.request(_scenario(a), [], False)))
    made = worker._specs[0].__dict__.setdefault("_made_by_worker", {})
    forced = a.with_forced((("y", 0),)).relabeled("drawn")
    req = sent.request(_scenario(forced), [], False)
    assert req["specs"] == {} and req["alike"] == {1: (0, (("y", 0),), "drawn")}
    got = worker.scenario(_over_the_pipe(req)).graphs[0][1]
    assert got.forced == (("y", 0),) and got.label == "drawn" and got.tensors == a.tensors and got.roots == a.roots
    assert got.__dict__["_made_by_worker"] is made and got.rows is worker._specs[0].rows
    equal = GraphSpec(tuple(a.tensors), a.roots, (("y", 0),))
    assert sent.request(_scenario(equal), [], False)["specs"].keys() == {2}


def test_a_base_of_a_copy_is_not_forgotten_by_the_request_that_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept, "KEPT", 2)
    sent, worker = SentSpecs(), KeptSpecs()
    base, other, third = _spec(1), _spec(2), _spec(4)
    for s in (base, other, third):  # base is the least recently sent now, and beyond the limit
        worker.scenario(_over_the_pipe(sent.request(_scenario(s, third) if s is not third else _scenario(s), [], False)))
    copy = other.with_forced((("y", 0),))
    req = sent.request(_scenario(copy), [], False)
    assert req["alike"] and next(iter(req["alike"].values()))[0] not in req["forget"]
    assert worker.scenario(_over_the_pipe(req)).graphs[0][1].forced == (("y", 0),)
    assert set(worker._specs) == {token for token, _ in sent._tokens.values()}


def test_a_scenario_run_again_on_kept_specs_observes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the real worker: the second run of a scenario sends no spec, and ggml is observed doing
    the same (assignments, splits, sizes, reallocations), with its weights bound anew."""
    m = ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1)
    sc = Scenario(BackendLayout.of("rpc", "cpu"), (("A", llama_graph(m, 8, 16)), ("B", llama_graph(m, 1, 16))),
                  (Step("sched_new", params=SchedParams(4096)), Step("reserve", "A"), Step("alloc", "B"), Step("compute", "A")))
    with GgmlTarget() as t:
        first = t.run(sc)
        requests = []
        real = SentSpecs.request

        def spy(self, *args):  # type: ignore[no-untyped-def]
            requests.append(real(self, *args))
            return requests[-1]

        monkeypatch.setattr(SentSpecs, "request", spy)
        second = t.run(sc)
    assert requests and requests[0]["specs"] == {}
    untimed = [replace(r, seconds=0.0, build_seconds=0.0) for r in first.records]
    assert untimed == [replace(r, seconds=0.0, build_seconds=0.0) for r in second.records]
    assert first.abort is None and second.abort is None


def test_a_sent_spec_is_rows_until_its_tensors_are_asked_for() -> None:
    """The worker encodes a spec it was sent from its rows (``GraphSpec.rows``, ``geometry_rows``):
    no tensor or geometry object is made for a scenario that needs none (a sixth of a fresh
    scenario's time went to making them), the program is the one the spec's own objects give,
    and the tensors, once asked for, are the spec's."""
    from pytest_schedfuzz.ggml.program import encode

    spec = llama_graph(ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1), 8, 32)
    spec.geometry  # inferred by the parent before it sends the spec (``Scenario.validate``)
    sent = pickle.loads(pickle.dumps(spec))
    types = {"f32": 0, "f16": 1, "i32": 26, "i64": 27, "q8_0": 8}
    program = encode(sent, True, types, "0.25.3")
    assert "tensors" not in sent.__dict__ and "geometry" not in sent.__dict__
    assert program == encode(spec, True, types, "0.25.3") and program.persistent
    assert sent.tensors == spec.tensors and sent.geometry == spec.geometry and sent == spec
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sent.nothing  # noqa: B018
