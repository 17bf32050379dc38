"""llama-server's draft-simple (``-md``) on a hybrid server: a draft context on a draft model of its
own, which decodes every target batch too and rolls its own recurrent state back. llama-server
gives that context no snapshots (``cparams_dft.n_rs_seq = 0``), so it rolls back from a checkpoint
taken before the drafts; a program that passes the target's ``n_rs_seq`` to both contexts rolls
it back by snapshots. Each rollback is llama.cpp's own answer, recorded per call and counted in
``explored``, on 0.3.36 and on b11739."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from llama_helpers import CTX, NEMOTRON, decode, first_finding_reproduced

from pytest_schedfuzz.builds.names import UPSTREAM
from pytest_schedfuzz.campaign.compare import drawn
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.campaign.stats import llama_features
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import Call, Devices, DraftModel, LlamaWorkload, WorkloadError
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import LLAMA_GROUP
from pytest_schedfuzz.properties.derived import llama_trace
from pytest_schedfuzz.strategies.llama_workloads import llama_workloads

# prompts on two slots; a step of 2 drafts, none accepted (the last token and the drafts: 3 positions, as many as the
# snapshots); the next token; a rejected draft dropped with seq_rm; a step of 5 drafts (more than the snapshots: the
# target's checkpoint, replayed); both slots in one batch
CALLS = (decode((0, 6, "last")), decode((1, 4, "last")), Call("spec", seq=0, n_draft=2, accept=0), decode((1, 3, "all")),
         Call("seq_rm", seq=1, n_drop=2), decode((0, 1, "last"), (1, 1, "last")), Call("spec", seq=1, n_draft=5, accept=1),
         decode((0, 1, "last"), (1, 3, "last")))
SERVED = LlamaWorkload(NEMOTRON, Devices(n_rpc=1), CTX, CALLS, draft="model", draft_model=DraftModel((), 99, 3))
# as llama-server makes it: a draft context without snapshots (its target's seq_rm of last positions is then no workload)
SERVER = replace(SERVED, draft_model=DraftModel((), 99, 0), calls=tuple(c for c in CALLS if c.kind != "seq_rm"))


def test_a_draft_model_workload_round_trips_and_a_workload_without_one_reads_as_before() -> None:
    for w in (SERVED, SERVER):
        assert LlamaWorkload.from_json(w.to_json()) == w
    assert "n_rs_seq" not in SERVER.to_json()["draft_model"] and SERVED.to_json()["draft_model"]["n_rs_seq"] == 3
    assert "(draft-simple)" in SERVED.describe() and "n_rs_seq 3" in SERVED.describe()


@pytest.mark.parametrize(("w", "why"), [
    (replace(SERVED, draft_model=None), "draft 'model': needs the draft model's placement"),
    (replace(SERVED, draft_model=DraftModel((), 99, 4)), "draft_model.n_rs_seq 4: 0..the target's n_rs_seq 3"),
    (replace(SERVED, model=ModelSpec(n_layer=2), ctx=replace(CTX, n_rs_seq=0)), "only for draft 'model' on a model that rolls back"),
    # the draft context drops what the target drops: without snapshots, not a recurrent state's last positions
    (replace(SERVED, draft_model=DraftModel((), 99, 0)), "a nemotron model's recurrent state cannot drop its last positions"),
])
def test_validate_holds_the_draft_contexts_limits(w: LlamaWorkload, why: str) -> None:
    with pytest.raises(WorkloadError, match=why):
        w.validate()


def test_the_strategy_draws_draft_models_with_and_without_snapshots() -> None:
    """Over 300 draws of the families that roll back, as a campaign draws them: draft-simple in
    some, its context with the target's snapshots or none, every one a valid workload; none
    where the caller does not ask for it (the tests' own draws stay as their seeds were picked)."""
    counts: Counter[str] = Counter()

    @seed(64)
    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
    @given(llama_workloads(families=("dense", "nemotron", "lfm2"), draft_models=True))
    def draw(w: LlamaWorkload) -> None:
        w.validate()
        assert LlamaWorkload.from_json(w.to_json()) == w
        counts.update(llama_features(w))

    draw()
    model = counts["draft model (draft-simple, a context on a draft model)"]
    assert not any(w.draft == "model" for w in drawn(llama_workloads(families=("dense", "nemotron", "lfm2")), 50, 64))
    assert 30 <= model <= 150 and counts["speculative steps, draft model"] >= 5, counts
    assert 5 <= counts["draft model with n_rs_seq > 0"] < model, counts


@pytest.mark.engine
@pytest.mark.parametrize("lib", ["llama.cpp-0.3.36", UPSTREAM])
@pytest.mark.parametrize(("w", "draft_rollbacks"), [
    # with snapshots: the small step's drafts and its rejection, and the seq_rm, by them; the large step from the checkpoint
    (SERVED, {2: "snapshot", 4: "snapshot", 6: "checkpoint"}),
    # llama-server's: every rollback from the checkpoint; the small step's after the target's snapshot rollback decodes
    # the accepted token again in the draft context alone
    (SERVER, {2: "checkpoint", 5: "checkpoint"}),
], ids=["snapshots", "llama-server"])
def test_the_draft_context_rolls_its_recurrent_state_back_as_llama_cpp_lets_it(lib: str, w: LlamaWorkload, draft_rollbacks: dict[int, str]) -> None:
    f = Fuzzer(FuzzConfig(database=None, llama_lib=lib))
    try:
        # the one finding is the lost reservation of a topology switch (a per-sequence ubatch's graph), as without a draft
        found = {v.signature() for v in f.check_llama(LLAMA_GROUP, w)}
        assert all(sig.startswith("llama-no-same-size-realloc[explained=lost") and "topology=switch" in sig for sig in found), found
        trace = llama_trace(f.engines.run_llama(w))
        assert trace.abort is None and all(c.rc == 0 for c in trace.calls), [(c.index, c.rc) for c in trace.calls]
        assert {c.index: c.draft_rollback for c in trace.calls if c.draft_rollback} == draft_rollbacks
        assert any(s.context == 1 for _, s in trace.sched_calls())  # the draft context's scheduler computed
        decoded = f.stats.llama_decoded
        rows = ["draft model (draft-simple, a context on a draft model)", "speculative steps, draft model"]
        rows += [f"observed: draft context {how} rollback" for how in set(draft_rollbacks.values())]
        for row in rows + (["draft model with n_rs_seq > 0"] if w is SERVED else []):
            assert decoded.get(row, 0) == 1, (row, decoded)
    finally:
        f.close()


@pytest.mark.engine
def test_the_draft_contexts_graphs_are_captured_and_predicted_by_the_reference() -> None:
    """On 0.3.36 the draft model's context, its checkpoints and replays included, is captured
    whole beside the target's, and the reference places every node as ggml did."""
    f = Fuzzer(FuzzConfig(database=None))
    f.llama_judged = ("llama-matches-reference",)
    try:
        assert f.check_llama("llama-matches-reference", SERVER) == []
        # the target's graphs and the draft context's, each a scenario of its own, predicted node by node
        assert f.stats.llama_captured == 2 and not f.stats.llama_not_captured
    finally:
        f.close()


@pytest.mark.engine
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake builds the reproducer")
def test_the_reproducer_makes_the_draft_context_and_its_rollbacks(tmp_path: Path) -> None:
    """The exported C of a draft-simple workload makes the draft context on the draft model with
    llama-server's parameters, mirrors every target batch, and rolls it back as the worker does:
    the finding (the lost reservation) reproduces in the same call."""
    # a step of 3 drafts with 1 accepted, then 5 with none: the target's ubatches switch topology by their sizes
    w = replace(SERVER, calls=(decode((0, 6, "last")), decode((1, 4, "last")), Call("spec", seq=0, n_draft=3, accept=1), decode((1, 3, "all")),
                               decode((0, 1, "last"), (1, 1, "last")), Call("spec", seq=1, n_draft=5, accept=0), decode((0, 1, "last"), (1, 3, "last"))))
    _, source = first_finding_reproduced(w, None, tmp_path)
    assert "DRAFT_MODEL = 1" in source and "cp.n_rs_seq = 0;" in source


@pytest.mark.engine
def test_a_draft_that_finds_no_slot_leaves_the_draft_context_where_the_target_is() -> None:
    """A speculative step whose drafting finds the draft context's cache full (the 0.3.36 nightly's
    harness error): the drafts decoded before the failing one are dropped again, so that the next
    target batch's catch-up follows the draft context's positions (before: ``llama_decode`` -1 in
    the draft context, an inconsistent position, for a valid workload)."""
    ctx = replace(CTX, n_seq_max=1, n_rs_seq=0, n_batch=64, n_ubatch=32)
    calls = (*[decode((0, 64, "none"))] * 3, decode((0, 63, "last")), Call("spec", seq=0, n_draft=2, accept=2), decode((0, 1, "last")))
    w = LlamaWorkload(ModelSpec(), Devices(), ctx, calls, draft="model", draft_model=DraftModel((), 99, 0))
    w.validate()
    f = Fuzzer(FuzzConfig(database=None))
    try:
        trace = llama_trace(f.engines.run_llama(w))
        rcs = {c.index: c.rc for c in trace.calls if c.index >= 0}
        assert trace.abort is None and rcs[4] == 1 and rcs[5] == 0, rcs  # the step found no slot; the next token decodes in both
    finally:
        f.close()
