"""``schedfuzz compare``: each difference between two builds' runs is put down to its cause."""

from __future__ import annotations

from pytest_schedfuzz.campaign.compare import differences
from pytest_schedfuzz.cli import main
from pytest_schedfuzz.model.llama_trace import CallRecord, LlamaAbort, LlamaTrace, SchedCall


def _alloc(nodes: int, size_changed: bool | None = None, ids: bool = False, counted: tuple[int, int] | None = None) -> SchedCall:
    realloc = size_changed is not None
    return SchedCall("alloc", 0, n_nodes=nodes, n_leafs=5, realloc=realloc, backend_ids_changed=ids, graph_size=nodes, prev_graph_size=nodes,
                     ggml_ids_changed=ids if realloc else None, ggml_size_changed=size_changed,
                     llama_n_same=counted[0] if counted else None, llama_n_diff=counted[1] if counted else None)


def _trace(*calls: tuple[SchedCall, ...], abort: LlamaAbort | None = None) -> LlamaTrace:
    return LlamaTrace(tuple(CallRecord(i, "decode", 0, c) for i, c in enumerate(calls)), abort)


def test_each_difference_is_put_down_to_its_cause() -> None:
    base = _trace((_alloc(10),), (_alloc(10, False, counted=(1, 0)),))
    assert differences(0, base, base) == []
    # other graphs and another decision: the builds' graph code
    (d,) = differences(0, base, _trace((_alloc(10),), (_alloc(12),)))
    assert (d.call, d.cause) == (1, "graphs differ")
    # other graphs, the same decisions: nothing to put down
    assert differences(0, base, _trace((_alloc(11),), (_alloc(10, False, counted=(1, 0)),))) == []
    # the same graphs, another decision: ggml or what llama.cpp reserved
    (d,) = differences(0, base, _trace((_alloc(10),), (_alloc(10, True, counted=(0, 1)),)))
    assert d.cause == "decision differs" and "'same'" in d.a and "'changed'" in d.b
    # the same decisions, other counts: the callbacks count otherwise
    (d,) = differences(0, base, _trace((_alloc(10),), (_alloc(10, False, counted=(0, 0)),)))
    assert d.cause == "counting differs"
    # one build aborts
    (d,) = differences(0, base, _trace((_alloc(10),), abort=LlamaAbort(1, "abort", "GGML_ASSERT")))
    assert d.cause == "outcome differs" and d.b == "abort in call 1"


def test_the_command_compares_two_builds(capsys) -> None:
    assert main(["compare", "--a", "llama.cpp-0.3.36", "--b", "llama.cpp-b11739", "--workloads", "3", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "compared 3 workloads on llama.cpp-0.3.36 (A) and llama.cpp-b11739 (B)" in out and "GPU-like devices: no (RPC only)" in out
