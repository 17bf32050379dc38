"""Seed 000's users' servers, scaled down (``campaign.seed_users``, ``schedfuzz seeds``): each
build's counts are llama.cpp's own where its perf data has them, else the harness's, named; the
first user's server climbs n_same on 0.3.36, and the finding says why in ggml's terms."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.campaign.seed_users import USERS, Replayed, counts, lines, replay
from pytest_schedfuzz.model.llama_trace import CallRecord, LlamaTrace, SchedCall
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties.base import LLAMA_GROUP


def test_counts_are_llama_cpps_where_its_perf_data_has_them_else_the_harnesss_named() -> None:
    realloc = SchedCall("alloc", 0, realloc=True, ggml_ids_changed=False, ggml_size_changed=False)
    calls = (CallRecord(0, "decode", 0, (realloc, SchedCall("alloc", 1, realloc=True, ggml_ids_changed=True, ggml_size_changed=False, context=1))),)
    upstream = LlamaTrace(calls, None, {}, {"n_reallocs_same": 3, "n_reallocs_diff": 1, "draft.n_reallocs_same": 0, "draft.n_reallocs_diff": 2})
    assert counts(upstream) == ("target: n_same = 3, n_diff = 1 (llama.cpp's perf data); draft: n_same = 0, n_diff = 2 (llama.cpp's perf data)")
    assert counts(LlamaTrace(calls, None, {}, {})) == ("target: n_same = 1, n_diff = 0 (the harness's count, observed by ggml's realloc callback); "
                                                       "draft: n_same = 0, n_diff = 1 (the harness's count, observed by ggml's realloc callback)")


def test_each_user_says_what_they_ran_and_what_could_not_be_kept() -> None:
    for user in USERS:
        user.workload.validate()
        assert user.said and user.left_out
    tensor, gpus = USERS
    assert tensor.workload.devices.split_mode == "tensor" and tensor.workload.draft == "mtp" and tensor.workload.ctx.n_seq_max == 4
    assert gpus.workload.devices.tensor_split == (1.0, 0.0) and gpus.workload.ctx.moe_cache_size > 0
    assert gpus.workload.draft_model is not None and gpus.workload.draft_model.devices == (1,)  # --spec-draft-devices: the second GPU
    on_b11739 = gpus.for_build(gpu_like=False, has_moe_cache=True)  # no GPU-like device there: RPC devices serve
    assert on_b11739.devices.n_rpc == 2 and not on_b11739.devices.gpus
    assert gpus.for_build(gpu_like=True, has_moe_cache=False).ctx.moe_cache_size == 0


def _replayed(user: int, build: str, gpu_like: bool, has_moe_cache: bool) -> Replayed:
    """User ``user``'s server on ``build``, judged by every llama.cpp property (as ``schedfuzz seeds``)."""
    f = Fuzzer(FuzzConfig(database=None, llama_lib=build))
    try:
        return replay(USERS[user], build, lambda w: (f.engines.run_llama(w), f.check_llama(LLAMA_GROUP, w)), gpu_like, has_moe_cache)
    finally:
        f.close()


@pytest.mark.engine
def test_the_first_users_server_climbs_n_same_on_0336_and_the_finding_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """... and its reproducer, exported as ``schedfuzz seeds --export DIR --check`` does, reproduces."""
    from pytest_schedfuzz.commands.tools import _export_seed_findings

    row = _replayed(0, "llama.cpp-0.3.36", gpu_like=True, has_moe_cache=False)
    target = re.search(r"target: n_same = (\d+), n_diff = (\d+)", row.counts)
    assert target is not None and int(target[1]) > 0, row.counts
    lost = [v for v in row.findings if v.signature().startswith("llama-no-same-size-realloc[explained=lost")]
    assert any("Meta(RPC0,RPC1)" in v.message for v in lost), [v.message for v in row.findings]
    report = "\n".join(lines([row]))
    assert "the worst-case reservation" in report and "backend ids changed" in report
    _export_seed_findings(row, tmp_path, 1, True)
    said = capsys.readouterr().out
    assert re.search(r"reproducer of llama-no-same-size-realloc\[explained=lost.*\(built and run: it reproduces\)", said), said


@pytest.mark.engine
def test_the_second_users_server_climbs_llama_cpps_own_n_same_on_b11739_by_the_moe_cache(tmp_path: Path,
                                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The second user's server (the MoE cache, MTP drafts of varying length, ``-ub`` above the
    cache's 32-token limit) on upstream's b11739: llama.cpp's own counter climbs, and each same-size
    reallocation is the MoE cache's lookup (the one-token plan that replaced the worst case), a
    signature of its own; its reproducer, built against b11739, reproduces."""
    from pytest_schedfuzz.commands.tools import _export_seed_findings

    row = _replayed(1, "llama.cpp-b11739", gpu_like=False, has_moe_cache=True)
    target = re.search(r"target: n_same = (\d+), n_diff = (\d+) \(llama.cpp's perf data\)", row.counts)
    assert target is not None and int(target[1]) > 1, row.counts
    assert {v.signature() for v in row.findings} == {
        "llama-no-same-size-realloc[explained=lost,lost_by=decode: changed (MoE cache lookup)]"}, row.findings
    assert all("ffn_moe_slots" in v.message and "the worst-case reservation" in v.message for v in row.findings)
    _export_seed_findings(row, tmp_path, 2, True)
    said = capsys.readouterr().out
    assert re.search(r"reproducer of llama-no-same-size-realloc\[explained=lost.*\(built and run: it reproduces\)", said), said
