"""The C encoder (``ggml/encode.c``) makes the program ``program.encode_rows`` makes, in Python,
of every spec: drawn, the starter corpus's, llama.cpp's captured graphs, with and without
persistent tensors, under both ggml versions' API; and fails where it fails, alike."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.capture import capture
from pytest_schedfuzz.cases.corpus import case_files, load_case
from pytest_schedfuzz.ggml.program import GraphProgram, encode, encode_rows, native_encoder
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.strategies import scenarios

ROOT = Path(__file__).resolve().parents[2]
TYPES = {"f32": 0, "f16": 1, "i32": 26, "i64": 27, "q8_0": 8}


def _program(p: GraphProgram) -> tuple[object, ...]:
    return (p.records.tobytes(), p.reals.tobytes(), p.names, p.words.tobytes(), p.roots.tobytes(), p.n, p.index, p.persistent)


def _outcome(fn, spec: GraphSpec, persistent: bool, version: str) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    try:
        return ("program", _program(fn(spec, persistent, TYPES, version)))
    except Exception as e:  # noqa: BLE001 -- compared: the same error, or the same program
        return ("error", type(e), str(e))


def _assert_alike(spec: GraphSpec) -> None:
    spec.geometry  # inferred by the parent (``Scenario.validate``)
    sent = pickle.loads(pickle.dumps(spec))  # as the worker gets it: rows
    for version in ("0.25.3", "0.15.3"):
        for persistent in (True, False):
            assert _outcome(encode, sent, persistent, version) == _outcome(encode_rows, sent, persistent, version), (spec.label, version, persistent)


def test_the_c_encoder_is_built_here() -> None:
    assert isinstance(native_encoder(), ModuleType), native_encoder()


def test_the_starter_corpus_graphs_encode_alike() -> None:
    specs = [g for c in map(load_case, case_files(ROOT / "corpus")) if c.scenario is not None for _, g in c.scenario.graphs]
    assert len(specs) > 10
    for spec in specs:
        _assert_alike(spec)


@pytest.mark.engine
def test_llama_cpps_captured_graphs_encode_alike() -> None:
    """The starter corpus's llama.cpp same-size findings (a MoE graph on RPC and CPU, op offload on
    GPU-like devices, Mamba-2's state copies, a dense model), their graphs as captured."""
    fuzzer = Fuzzer(FuzzConfig(database=None))
    try:
        for digest in ("47d17e5928", "be71aa4ab0", "8915ae6c62", "4e6374f1c3"):
            case = load_case(next((ROOT / "corpus").glob(f"llama-no-same-size-realloc-*-{digest}.json")))
            assert case.llama is not None
            captured = capture(case.llama, fuzzer.engines.run_llama(case.llama, capture=True))
            for _, spec in captured.scenario.graphs:
                _assert_alike(spec)
    finally:
        fuzzer.close()


@settings(max_examples=120, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.one_of(scenarios(), scenarios(DeviceLimits.of(rpc=2, gpu=2), compute=True, max_extra_ops=8)))
def test_drawn_graphs_encode_alike(scenario) -> None:  # type: ignore[no-untyped-def]
    scenario.validate()
    for _, spec in scenario.graphs:
        _assert_alike(spec)


def test_what_python_refuses_the_c_encoder_refuses_alike() -> None:
    b = GraphBuilder()
    b.input("x", (8, 2))
    b.op("top_k", "x", name="k", k=2)  # GGML_OP_TOP_K is 0.25.3's: Unsupported on 0.15.3
    spec = b.build("k")
    _assert_alike(spec)
    assert _outcome(encode, pickle.loads(pickle.dumps(spec)), True, "0.15.3")[1].__name__ == "Unsupported"  # type: ignore[union-attr]
    odd = {**TYPES}
    del odd["f32"]
    sent = pickle.loads(pickle.dumps(spec))
    with pytest.raises(KeyError, match="f32"):
        encode(sent, True, odd, "0.25.3")
    with pytest.raises(KeyError, match="f32"):
        encode_rows(sent, True, odd, "0.25.3")
