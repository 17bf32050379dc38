"""ggml's own figures in every run (``campaign.observed``): a same-size finding is confirmed by
ggml's own check before it is reported, a sample of scenarios is compared with ggml's figures,
and a replay that cannot run is a harness error, never an empty result."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.campaign import observed
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.corpus import load_case
from pytest_schedfuzz.engine import TargetError
from pytest_schedfuzz.model.graph_spec import GraphBuilder
from pytest_schedfuzz.model.layout import BackendLayout
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.model.trace import Abort, ReallocEvent, StepRecord, Trace
from pytest_schedfuzz.profiles import FuzzConfig

CORPUS = Path(__file__).resolve().parents[2] / "corpus"


def three_steps() -> Scenario:
    b = GraphBuilder()
    b.input("x", (8, 2))
    graph = b.build(b.op("scale", "x", name="y", scale=2.0))
    steps = (Step("sched_new", params=SchedParams(64, False, True)), Step("reserve", "g"), Step("alloc", "g"))
    return Scenario(BackendLayout.of("rpc", "cpu"), (("g", graph),), steps)


SAME = ReallocEvent(2, "sched", False, 1, "node y is not valid", graph_size=10, prev_graph_size=10, n_nodes=5)
TRACE = Trace((StepRecord(0, "sched_new"), StepRecord(1, "reserve"), StepRecord(2, "alloc", graph_size=10, n_nodes=5, n_leafs=3, events=(SAME,))))


def ggml_says(step: int, size: int = 10, nodes: int = 5, leafs: int = 3) -> observed.Run:
    return lambda sc: Trace((), Abort(step, "abort", f"ggml-backend.cpp:1: ggml_backend_sched_alloc_splits: unexpected graph reallocation "
                                                     f"(graph size = {size}, nodes = {nodes}, leafs = {leafs}), debug_realloc = 1"))


def test_a_same_size_finding_is_reported_only_where_ggml_s_own_check_agrees() -> None:
    sc = three_steps()
    assert observed.check_same_size_decisions(sc, TRACE, ggml_says(2)) == ([], "same")
    for other in (ggml_says(2, size=12), lambda sc: Trace(())):
        (v,), checked = observed.check_same_size_decisions(sc, TRACE, other)
        assert checked == "false" and v.signature() == "matches-reference[what=ggml-same-size]" and "GGML_SCHED_DEBUG_REALLOC=1" in v.message
    # a replay that ends in something else than ggml's check cannot confirm: a harness error
    with pytest.raises(TargetError, match="harness error"):
        observed.check_same_size_decisions(sc, TRACE, lambda sc: Trace((), Abort(1, "crash", "the worker was killed by SIGSEGV")))


def test_a_same_size_reallocation_the_formula_calls_changed_is_caught() -> None:
    """The other direction: ggml's own check stops at a re-reservation the harness derives as
    changed (a planted formula: prev graph size off by two), or before the derived same-size one."""
    sc = three_steps()
    changed = Trace((*TRACE.records[:2], StepRecord(2, "alloc", graph_size=10, n_nodes=5, n_leafs=3, events=(replace(SAME, prev_graph_size=8),))))
    assert observed.check_same_size_decisions(sc, changed, lambda sc: Trace(())) == ([], "changed")
    (v,), checked = observed.check_same_size_decisions(sc, changed, ggml_says(2))
    assert checked == "missed" and v.signature() == "matches-reference[what=derived-changed]"
    assert "the harness derives a changed size there (graph size 10, prev 8" in v.message
    (v,), checked = observed.check_same_size_decisions(sc, TRACE, ggml_says(1))
    assert checked == "missed" and "no re-reservation there" in v.message


def test_ggml_s_figures_at_the_first_re_reservation_are_compared_with_the_derived_record_and_the_reference() -> None:
    sc = three_steps()
    assert observed.compare_first(sc, TRACE, TRACE, ggml_says(2)) == ([], True)
    found, _ = observed.compare_first(sc, TRACE, TRACE, ggml_says(2, nodes=7))
    assert [v.signature() for v in found] == ["matches-reference[what=ggml-graph-size]", "matches-reference[what=derived-graph-size]"]
    (v,), _ = observed.compare_first(sc, TRACE, TRACE, lambda sc: Trace(()))
    assert v.signature() == "matches-reference[what=ggml-realloc]"
    assert observed.compare_first(sc, Trace(TRACE.records[:2]), TRACE, lambda sc: Trace(())) == ([], False)


def test_the_sample_is_one_in_ten_and_stable() -> None:
    sc = three_steps()
    assert observed.sampled(sc) == observed.sampled(sc) and observed.sampled(sc, every=1)
    assert observed.sampled(Scenario.from_json(json.loads(sc.dumps()))) == observed.sampled(sc)  # a replay from its case file
    variants = [Scenario(sc.layout, sc.graphs, sc.steps[:2] + (Step("alloc", "g"),) * k) for k in range(1, 201)]
    assert 5 <= sum(observed.sampled(v) for v in variants) <= 40


def test_a_llama_cpp_same_size_finding_is_reported_only_where_ggml_s_own_check_agrees() -> None:
    from pytest_schedfuzz.model.llama_model import ModelSpec
    from pytest_schedfuzz.model.llama_trace import CallRecord, LlamaAbort, LlamaTrace, SchedCall
    from pytest_schedfuzz.model.llama_workload import ContextParams, Devices, LlamaWorkload

    w = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=1), ContextParams(), ())
    same = SchedCall("alloc", 0, n_nodes=10, graph_size=20, prev_graph_size=20, realloc=True, realloc_reason="node embd is not valid")
    trace = LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0, n_nodes=10, graph_size=20),)), CallRecord(0, "decode", 0, (same,))))

    def says(call: int, size: int = 20) -> observed.Callable[[LlamaWorkload], LlamaTrace]:
        return lambda w: LlamaTrace((), LlamaAbort(call, "abort", f"unexpected graph reallocation (graph size = {size}, nodes = 12, leafs = 3)"))

    assert observed.confirm_llama_same_size(w, trace, says(0)) == []
    for other in (says(0, size=22), says(1), lambda w: LlamaTrace(())):
        (v,) = observed.confirm_llama_same_size(w, trace, other)
        assert v.signature() == "llama-no-same-size-realloc[what=ggml-same-size]"
    with pytest.raises(TargetError, match="harness error"):
        observed.confirm_llama_same_size(w, trace, lambda w: LlamaTrace((), LlamaAbort(0, "crash", "killed by SIGSEGV")))


@pytest.mark.parametrize(("pattern", "lib"), [
    ("no-same-size-realloc-explained-lost-lost-by-compute-changed-*.json", "ggml-0.25.3"),
    ("no-same-size-realloc-explained-lost-lost-by-compute-changed-*.json", "ggml-0.15.3"),
    ("llama-no-same-size-realloc-explained-lost-lost-by-decode-aft-21a6c03d81.json", None),
])
def test_the_real_engines_confirm_a_starter_corpus_same_size_finding(pattern: str, lib: str | None) -> None:
    """Replayed with no known bugs (so that it is new), a same-size case of the starter corpus is
    confirmed by ggml's own GGML_SCHED_DEBUG_REALLOC=1 check, on the graph engine and on
    llama.cpp, and reported as before."""
    case = load_case(next(CORPUS.glob(pattern)))
    f = Fuzzer(FuzzConfig(lib=lib, database=None))
    try:
        found = f.replay(case)
        assert case.signature in [v.signature() for v in found]
        assert f.stats.ggml_same_size_confirmed == 1 and f.stats.ggml_figures_disagree == 0
    finally:
        f.close()


def test_llama_cpp_input_leafs_that_share_a_name_are_each_a_graph_input() -> None:
    """With backend samplers and ``n_copies`` 4, llama.cpp's graph has input leafs that share a
    name; ggml's pass 6 makes each a graph input (``n_graph_inputs``), so the derived graph size
    counts each, and equals ggml's own figure at the first re-reservation (under
    GGML_SCHED_DEBUG_REALLOC=2). Counted by name, it was 504 against ggml's 528: a run with
    nothing known reported llama-no-same-size-realloc[what=ggml-same-size]."""
    from pytest_schedfuzz.campaign.observed import FIGURES
    from pytest_schedfuzz.llama.llama_target import LlamaTarget
    from pytest_schedfuzz.model.llama_workload import LlamaWorkload
    from pytest_schedfuzz.properties.derived import llama_trace

    w = LlamaWorkload.from_json({
        "calls": [{"kind": "decode", "parts": [{"n_tokens": 32, "outputs": "none", "seq": 1}]},
                  {"kind": "decode", "parts": [{"n_tokens": 9, "outputs": "last", "seq": 1}]}],
        "ctx": {"backend_samplers": True, "embeddings": False, "flash_attn": "on", "kv_unified": False, "n_batch": 32, "n_ctx": 1024,
                "n_outputs_max": 0, "n_outputs_max_per_seq": 0, "n_seq_max": 4, "n_ubatch": 32, "offload_kqv": True, "op_offload": True,
                "pooling": "none", "sampler_chain": "top_p-min_p-temp-dist", "type_k": "f32", "type_v": "f32"},
        "devices": {"n_gpu_layers": 99, "n_rpc": 2, "tensor_split": [1.0, 3.0]},
        "model": {"arch": "llama", "kind": "moe", "n_ctx_train": 4096, "n_embd": 64, "n_expert": 4, "n_expert_used": 2, "n_ff": 32, "n_head": 2,
                  "n_head_kv": 1, "n_layer": 3, "seed": 1}})
    with LlamaTarget() as normal, LlamaTarget(debug_realloc=2) as oracle:
        trace = llama_trace(normal.run(w, False, False, None))
        abort = oracle.run(w, False, False, None).abort
    assert trace.abort is None and abort is not None
    call, s = next((call, s) for call, s in trace.sched_calls() if s.kind == "alloc" and s.realloc)
    m = FIGURES.search(abort.message)
    assert m is not None and abort.call == call and s.counts is not None
    assert s.counts.input_leafs > len(s.inputs)  # some input leafs share a name
    assert int(m.group(1)) == s.graph_size


def test_a_planted_formula_that_never_says_same_size_is_caught_by_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """The starter corpus's same-size case on the real ggml 0.25.3 (no realloc callback), with a
    planted graph-size formula that makes every graph size differ from the previous one: the
    harness then derives no same-size reallocation at all, and only ggml's own check, run on the
    sample whatever the derived decisions say, shows the false negative."""
    from pytest_schedfuzz.properties import derived

    case = load_case(next(CORPUS.glob("no-same-size-realloc-explained-lost-lost-by-compute-changed-*.json")))
    real = derived.graph_size
    calls = iter(range(1, 1 << 30))
    monkeypatch.setattr(derived, "graph_size", lambda c, rules: real(c, rules) + next(calls) if c is not None else 0)
    f = Fuzzer(FuzzConfig(lib="ggml-0.25.3", database=None, size_oracle=True))
    try:
        found = f.check("no-same-size-realloc", f.scenario_for(case))
        assert "matches-reference[what=derived-changed]" in [v.signature() for v in found]
        assert f.stats.ggml_decisions == {"missed": 1}
    finally:
        f.close()
