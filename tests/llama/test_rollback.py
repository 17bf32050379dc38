"""Hybrid servers as users run them: a Nemotron-H model (Mamba-2 layers) and an LFM2 model (short
convolutions), whose recurrent state llama.cpp rolls back by snapshots (``n_rs_seq``), on 0.3.36
and on b11739. A speculative step whose drafts fit the
snapshots, and a ``seq_rm`` of a sequence's last positions, roll the state back by one
(llama_memory_recurrent::seq_rm); more drafts than snapshots are rolled back from a checkpoint, as
llama-server does (its RS mode). A batch of several sequences that fits one ubatch is computed
per sequence (an equal split). Each shows in ``explored`` as llama.cpp did it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from llama_helpers import CTX, LFM2, NEMOTRON, decode

from pytest_schedfuzz.builds.names import UPSTREAM
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, WorkloadError
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import LLAMA_GROUP
from pytest_schedfuzz.properties.derived import llama_trace

# a prompt on each slot, one step of 3 drafts with 1 accepted (2 rolled back: <= n_rs_seq), a rejected
# draft dropped with seq_rm, then one of 5 drafts (more than the snapshots: a checkpoint), then both
# slots' next tokens in one batch that fits a ubatch, unequal (an equal split computes it per sequence)
CALLS = (decode((0, 6, "last")), decode((1, 4, "last")), Call("spec", seq=0, n_draft=3, accept=1), decode((1, 3, "all")),
         Call("seq_rm", seq=1, n_drop=2), decode((0, 1, "last"), (1, 1, "last")), Call("spec", seq=1, n_draft=5, accept=0),
         decode((0, 1, "last"), (1, 3, "last")))
SERVED = LlamaWorkload(NEMOTRON, Devices(n_rpc=1), CTX, CALLS)


@pytest.mark.engine
@pytest.mark.parametrize("lib", ["llama.cpp-0.3.36", UPSTREAM])
@pytest.mark.parametrize("model", [NEMOTRON, LFM2], ids=["nemotron_h", "lfm2"])
def test_a_hybrid_server_rolls_back_by_snapshots_and_splits_per_sequence(lib: str, model: ModelSpec) -> None:
    served = replace(SERVED, model=model)
    f = Fuzzer(FuzzConfig(database=None, llama_lib=lib))
    try:
        # judged by every property: the one finding is the lost reservation of a topology switch (a per-sequence
        # ubatch's graph after the worst case; the corpus's cases of it: docs/findings.md), no abort, no harness error
        found = {v.signature() for v in f.check_llama(LLAMA_GROUP, served)}
        assert all(sig.startswith("llama-no-same-size-realloc[explained=lost") and "topology=switch" in sig for sig in found), found
        trace = llama_trace(f.engines.run_llama(served))
        assert trace.abort is None and all(c.rc == 0 for c in trace.calls)
        rollbacks = {c.index: c.rollback for c in trace.calls if c.rollback}
        assert rollbacks == {2: "snapshot", 4: "snapshot", 6: "checkpoint"}, rollbacks
        decoded = f.stats.llama_decoded
        for row in (f"model {model.kind}", "n_rs_seq > 0", "observed: snapshot rollback", "observed: ubatch split per sequence",
                    "observed: ubatch split per sequence, kv unified", "last positions dropped on a recurrent model (seq_rm)"):
            assert decoded.get(row, 0) == 1, (row, decoded)
    finally:
        f.close()


@pytest.mark.engine
def test_a_kv_cache_per_sequence_is_split_per_sequence_too() -> None:
    """The non-unified KV cache (a stream per sequence): the batch of both slots' next tokens is
    computed per sequence as with the unified one, and ``explored`` tells the two apart."""
    f = Fuzzer(FuzzConfig(database=None))
    try:
        assert f.check_llama("llama-no-abort", replace(SERVED, ctx=replace(CTX, kv_unified=False))) == []
        decoded = f.stats.llama_decoded
        assert decoded.get("observed: ubatch split per sequence, kv per sequence") == 1, decoded
        assert "observed: ubatch split per sequence, kv unified" not in decoded
    finally:
        f.close()


@pytest.mark.engine
def test_without_snapshots_the_same_drafts_roll_back_from_checkpoints() -> None:
    """n_rs_seq 0: every speculative step's rollback is a checkpoint restored (llama-server's
    FULL), and a seq_rm of the last positions is no workload (validate refuses it)."""
    calls = tuple(c for c in CALLS if c.kind != "seq_rm")
    w = replace(SERVED, ctx=replace(CTX, n_rs_seq=0), calls=calls)
    f = Fuzzer(FuzzConfig(database=None))
    try:
        trace = llama_trace(f.engines.run_llama(w))
        assert {c.rollback for c in trace.calls if c.kind == "spec"} == {"checkpoint"}
        assert "observed: snapshot rollback" not in f.stats.llama_decoded
    finally:
        f.close()
    with pytest.raises(WorkloadError, match="cannot drop its last positions"):
        replace(SERVED, ctx=replace(CTX, n_rs_seq=0)).validate()


@pytest.mark.parametrize("ctx, calls, why", [
    (replace(CTX, n_rs_seq=7), CALLS, "n_ubatch 8 > n_rs_seq \\+ 1"),  # llama.cpp asserts it at the first decode
    (CTX, (decode((0, 6, "last")), Call("seq_rm", seq=0, n_drop=4)), "at most n_rs_seq 3 positions"),
    (CTX, (decode((0, 6, "last")), Call("seq_rm", seq=0, n_drop=1), Call("seq_rm", seq=0, n_drop=1)), "once between two decodes"),
])
def test_validate_holds_llama_cpps_rollback_limits(ctx: ContextParams, calls: tuple[Call, ...], why: str) -> None:
    with pytest.raises(WorkloadError, match=why):
        LlamaWorkload(NEMOTRON, Devices(n_rpc=1), ctx, calls).validate()
    # the same rollback twice with a decode between is a workload
    LlamaWorkload(NEMOTRON, Devices(n_rpc=1), CTX, (decode((0, 6, "last")), Call("seq_rm", seq=0, n_drop=1), decode((0, 1, "last")),
                                                    Call("seq_rm", seq=0, n_drop=1))).validate()


@pytest.mark.engine
@pytest.mark.parametrize("model, ops", [(NEMOTRON, {"RELU", "SQR", "SSM_SCAN", "SSM_CONV"}), (LFM2, {"SSM_CONV", "CONCAT", "TRANSPOSE"})],
                         ids=["nemotron_h", "lfm2"])
def test_the_hybrid_graphs_are_captured_and_predicted_by_the_reference(model: ModelSpec, ops: set[str]) -> None:
    """Nemotron-H's MLP's ReLU² (RELU, SQR) joined the graph engine, the capture and the C export;
    LFM2's short convolution is made of ops the engine had: on 0.3.36 the workload's graphs,
    snapshots and per-sequence ubatches included, are captured whole and the reference places
    every node as ggml did."""
    f = Fuzzer(FuzzConfig(database=None))
    f.llama_judged = ("llama-matches-reference",)
    try:
        assert f.check_llama("llama-matches-reference", replace(SERVED, model=model)) == []
        assert f.stats.llama_captured == 1 and f.stats.llama_captured_nodes > 1000 and not f.stats.llama_not_captured
        assert ops <= set(f.stats.captured_ops)
    finally:
        f.close()
