"""Issue 47's server dimensions: split mode tensor (both builds: one meta device over the RPC
devices), ``tensor_split`` with a zero share, b11739's MoE cache (``moe_cache_size``: experts in
host memory, a device cache for them filled through ggml's copy callback), and a draft model of its
own on another device (``--spec-draft-devices``), as workloads, drawn by the strategies where the
build and the model have them, counted in ``explored``, and exported."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from llama_helpers import first_finding_exported, first_finding_reproduced

from pytest_schedfuzz.builds.names import UPSTREAM
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.campaign.stats import Stats, llama_features
from pytest_schedfuzz.cases.capture import capture
from pytest_schedfuzz.cases.corpus import Case, load_case, save_case
from pytest_schedfuzz.cases.export import ExportError, build_and_run
from pytest_schedfuzz.cases.export_llama import export_llama_case
from pytest_schedfuzz.engine import Unsupported
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import (
    CPU_DEVICE,
    Call,
    ContextParams,
    Devices,
    DraftModel,
    LlamaWorkload,
    Part,
    WorkloadError,
    all_experts_bytes,
)
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import LLAMA_GROUP
from pytest_schedfuzz.properties.derived import llama_trace
from pytest_schedfuzz.properties.llama_logits import cpu_only
from pytest_schedfuzz.properties.llama_properties import LLAMA_CHECKS, unmade_calls
from pytest_schedfuzz.strategies.llama_workloads import DEFAULT_ABSENT, llama_workloads

MOE = ModelSpec(kind="moe", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, n_expert=4, n_expert_used=2)
MAMBA = ModelSpec(kind="mamba2", arch="mamba2", n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, ssm_state=16, ssm_conv=4, ssm_groups=1,
                  ssm_head_dim=16)


def decode(*parts: tuple[int, int, str]) -> Call:
    return Call("decode", tuple(Part(s, n, o) for s, n, o in parts))


# a server's traffic on two slots: prompts (larger than the ubatch), single tokens, a draft verified and rolled back
CALLS = (decode((0, 20, "last")), decode((0, 1, "last")), decode((0, 1, "last"), (1, 4, "last")), decode((0, 3, "all")),
         Call("seq_rm", seq=0, n_drop=2), decode((0, 1, "last"), (1, 1, "last")), decode((1, 40, "last")))
TENSOR = LlamaWorkload(MOE, Devices(n_rpc=2, split_mode="tensor"), ContextParams(n_seq_max=2, flash_attn="auto"), CALLS)
# -ot exps=CPU with the layers on an RPC device, and a MoE cache for half of the experts
CACHED = LlamaWorkload(MOE, Devices(n_rpc=1, overrides=(("_exps", CPU_DEVICE),)),
                       ContextParams(n_seq_max=2, moe_cache_size=all_experts_bytes(MOE) // 2), CALLS)
# draft-mtp with the draft's model of its own on the second RPC device (--spec-draft-devices RPC1)
MTP = ModelSpec(kind="mtp", arch="glm4moe", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, n_expert=4, n_expert_used=2)
OWN = LlamaWorkload(MTP, Devices(n_rpc=2), ContextParams(n_batch=32, n_outputs_max=8, n_outputs_max_per_seq=8, flash_attn="auto"),
                    (decode((0, 12, "last")), Call("spec", seq=0, n_draft=3, accept=1), Call("spec", seq=0, n_draft=2, accept=2), decode((0, 1, "last"))),
                    draft="mtp", draft_model=DraftModel((1,)))


def test_the_new_parameters_round_trip_and_old_workloads_read_as_before() -> None:
    for w in (TENSOR, CACHED, replace(TENSOR, devices=replace(TENSOR.devices, tensor_split=(1.0, 0.0))), OWN):
        assert LlamaWorkload.from_json(w.to_json()) == w
    assert CACHED.to_json()["ctx"]["moe_cache_size"] == all_experts_bytes(MOE) // 2
    # no cache: the field is not written, and a workload written before it existed reads with none
    old = replace(CACHED, ctx=replace(CACHED.ctx, moe_cache_size=0)).to_json()
    assert "moe_cache_size" not in old["ctx"] and LlamaWorkload.from_json(old).ctx.moe_cache_size == 0
    assert "split_mode tensor" in TENSOR.describe() and f"moe_cache_size {all_experts_bytes(MOE) // 2}" in CACHED.describe()


@pytest.mark.parametrize(
    ("w", "field"),
    [
        (replace(TENSOR, ctx=replace(TENSOR.ctx, flash_attn="off")), "split_mode tensor: needs flash attention"),
        (replace(TENSOR, model=MAMBA, calls=(decode((0, 4, "last")),)), "split_mode tensor: llama.cpp has none for architecture 'mamba2'"),
        (replace(TENSOR, ctx=replace(TENSOR.ctx, backend_samplers=True)), "split_mode tensor: no backend samplers"),
        (replace(TENSOR, calls=(Call("set_sampler", seq=0, on=True),)), "no backend sampler with split mode tensor"),
        (replace(TENSOR, devices=Devices(n_rpc=0, split_mode="tensor")), "split_mode tensor: needs at least one device"),
        (replace(CACHED, model=ModelSpec(n_layer=2)), "moe_cache_size .*: needs a mixture-of-experts model"),
        (replace(CACHED, devices=Devices(n_rpc=0)), "moe_cache_size .*: needs a device of GPU type"),
        (replace(CACHED, devices=replace(CACHED.devices, split_mode="tensor"), ctx=replace(CACHED.ctx, flash_attn="on")),
         "does not support split mode tensor"),
        (replace(CACHED, ctx=replace(CACHED.ctx, moe_cache_size=-1)), "moe_cache_size -1: bytes"),
        (replace(OWN, draft=""), "draft_model: only for a draft context"),
        (replace(OWN, draft_model=DraftModel((2,))), r"draft_model.devices \[2\]: distinct indices of the target's 2 devices"),
        (replace(OWN, draft_model=DraftModel((), -1)), "draft_model.n_gpu_layers -1"),
    ],
)
def test_what_llama_cpp_refuses_with_them_is_an_invalid_workload(w: LlamaWorkload, field: str) -> None:
    with pytest.raises(WorkloadError, match=field):
        LlamaWorkload.from_json(w.to_json())


def test_the_strategy_draws_tensor_zero_shares_and_the_moe_cache_only_for_a_build_that_has_it() -> None:
    """Over 300 draws each: split mode tensor (never with flash attention off, backend samplers,
    a Mamba-2 layer or an override to a device), a zero ``tensor_split`` share, and for a build
    with ``moe_cache_size`` (b11739: nothing absent) the MoE cache, part and all of the experts,
    always with experts in host memory; never for the default build (0.3.36)."""
    seen: dict[bool, Counter[str]] = {}
    for has_cache in (True, False):
        counts: Counter[str] = Counter()

        @seed(47)
        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
        @given(llama_workloads(absent=frozenset() if has_cache else DEFAULT_ABSENT, families=("dense", "moe", "mamba2", "hybrid")))
        def draw(w: LlamaWorkload) -> None:
            w.validate()
            assert LlamaWorkload.from_json(w.to_json()) == w
            if w.devices.split_mode == "tensor":
                assert all(d == CPU_DEVICE for _, d in w.devices.overrides)
            if w.ctx.moe_cache_size:
                assert any(d == CPU_DEVICE and p.endswith("_exps") for p, d in w.devices.overrides)
            counts.update(llama_features(w))

        draw()
        seen[has_cache] = counts
    for counts in seen.values():
        assert counts["split_mode tensor"] >= 10 and counts["tensor_split with a zero share"] >= 10, counts
    assert seen[True]["moe cache < all experts' bytes"] >= 5 and seen[True]["moe cache >= all experts' bytes"] >= 1, seen[True]
    assert not [f for f in seen[False] if f.startswith("moe cache")]


def _case(w: LlamaWorkload, tmp_path: Path, lib: str) -> Case:
    case = Case("llama-no-abort", "llama-no-abort[call=decode,kind=abort,message=x]", None, "x", 1, engine={"name": "llama.cpp", "lib": lib}, llama=w)
    return load_case(save_case(tmp_path, case))


def test_the_reproducer_sets_split_mode_tensor_and_the_moe_cache_where_the_build_has_it(tmp_path: Path) -> None:
    from pytest_schedfuzz.llama.llama_target import resolve_lib_dir

    export_llama_case(_case(TENSOR, tmp_path, ""), tmp_path / "tensor", "llama.cpp-0.3.36")
    source = (tmp_path / "tensor" / "repro.c").read_text()
    assert "mp.split_mode = LLAMA_SPLIT_MODE_TENSOR;" in source and "moe_cache_size" not in source
    export_llama_case(_case(CACHED, tmp_path, ""), tmp_path / "cached", UPSTREAM)
    assert f"cp.moe_cache_size = {all_experts_bytes(MOE) // 2};" in (tmp_path / "cached" / "repro.c").read_text()
    with pytest.raises(ExportError, match=f"sets ctx.moe_cache_size {all_experts_bytes(MOE) // 2}, which the llama_context_params of "
                                          f"{resolve_lib_dir('llama.cpp-0.3.36')} has no field for"):
        export_llama_case(_case(CACHED, tmp_path, ""), tmp_path / "refused", "llama.cpp-0.3.36")
    # llama-same-logits's second run, on the CPU alone, has no device for a cache
    assert cpu_only(CACHED, None).ctx.moe_cache_size == 0


@pytest.mark.engine
@pytest.mark.parametrize("lib", ["llama.cpp-0.3.36", UPSTREAM])
def test_split_mode_tensor_on_two_rpc_devices_decodes_and_every_llama_property_judges_it(lib: str) -> None:
    """One meta device over two RPC servers: every call is made, and the properties find nothing.
    llama-matches-reference cannot judge it: the scheduler's backend is the meta device, which a
    graph scenario cannot make (``not captured: backend``); on b11739 it judges no workload (the
    reference has no rules of ggml 0.27.0)."""
    f = Fuzzer(FuzzConfig(database=None, llama_lib=lib))
    try:
        assert f.check_llama(LLAMA_GROUP, TENSOR) == []
        assert "llama-matches-reference" in f.llama_judged
        decoded = f.stats.llama_decoded
        assert decoded["split_mode tensor"] == decoded["observed: meta device (split mode tensor)"] == decoded["2 RPC"] == 1
        assert f.stats.llama_not_captured == ({"backend": 1} if lib != UPSTREAM else {"ggml 0.27.0: no reference rules": 1})
    finally:
        f.close()


@pytest.mark.engine
def test_the_moe_cache_is_made_on_an_rpc_device_and_its_graphs_follow_the_ubatch() -> None:
    """b11739 makes the MoE cache with an RPC device (ggml-rpc's devices are of GPU type): its
    constructor logs the cache's size, and each small ubatch's graph looks its experts' slots up in
    the slot maps, host weights the scheduler copies to the device through llama.cpp's copy
    callback (an input of the device's split). A ubatch too large for the cache reads the host
    experts instead: the graphs differ by ubatch size, and the worst case reserved at the start
    is lost, which llama-no-same-size-realloc finds (the seeds' n_same); never without the cache."""
    f = Fuzzer(FuzzConfig(database=None, llama_lib=UPSTREAM))
    try:
        assert f.check_llama(LLAMA_GROUP, replace(CACHED, ctx=replace(CACHED.ctx, moe_cache_size=0))) == []
        found = f.check_llama(LLAMA_GROUP, CACHED)
        # the re-plan that lost the reservation is the cache's lookup, not op offload (its own signature)
        signature = "llama-no-same-size-realloc[explained=lost,lost_by=decode: changed (MoE cache lookup)]"
        assert found and {v.signature() for v in found} == {signature}, [v.signature() for v in found]
        trace = llama_trace(f.engines.run_llama(CACHED))
        init = trace.calls[0]
        assert init.rc == 0 and any("MoE cache size = " in x for x in init.log), init.log
        assert unmade_calls(CACHED, trace) == [] and LLAMA_CHECKS["llama-no-abort"](CACHED, trace) == []
        slots = {x.split("@")[0] for _, s in trace.sched_calls() for x in s.offloaded}
        assert slots == {"moe_cache.slot_map-0", "moe_cache.slot_map-1"}
        assert len({s.n_nodes for _, s in trace.sched_calls() if s.kind == "alloc"}) > 1
        decoded = f.stats.llama_decoded
        for feature in ("moe cache < all experts' bytes", "observed: moe cache made", "observed: moe cache slot map copied to a device"):
            assert decoded[feature] == 1, feature
    finally:
        f.close()


@pytest.mark.engine
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake builds the reproducer")
def test_the_moe_cache_finding_is_exported_and_reproduced_by_ggmls_own_check_on_b11739(tmp_path: Path) -> None:
    """The reproducer of the MoE cache's first same-size reallocation sets ``moe_cache_size``
    (b11739's declarations have it), builds against b11739's libraries, and reproduces in the same
    call: ggml's own check aborts there (``GGML_SCHED_DEBUG_REALLOC=1``), and llama.cpp's own
    counter says ``n_same = 1``."""
    v = first_finding_exported(CACHED, UPSTREAM, tmp_path)
    assert f"cp.moe_cache_size = {CACHED.ctx.moe_cache_size};" in (tmp_path / "repro" / "repro.c").read_text()
    built = build_and_run(tmp_path / "repro")
    assert built.code == 1, built.output[-3000:]
    assert f"REPRODUCED: [llama-no-same-size-realloc] call {v.step}" in built.output and "unexpected graph reallocation" in built.output
    assert "n_same = 1, n_diff = 0" in built.output, built.output[-3000:]


@pytest.mark.engine
def test_a_moe_cache_on_a_build_without_it_is_refused_before_any_call() -> None:
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    target = LlamaTarget("llama.cpp-0.3.36")
    try:
        with pytest.raises(Unsupported, match=f"ctx.moe_cache_size {all_experts_bytes(MOE) // 2}: this build's llama_context_params has no such field"):
            target.run(CACHED)
        assert target.engine["absent_params"] == "moe_cache_size"
        worker = target._worker
        trace = llama_trace(target.run(replace(CACHED, ctx=replace(CACHED.ctx, moe_cache_size=0))))  # the same worker goes on
        assert trace.abort is None and all(c.rc == 0 for c in trace.calls) and target._worker is worker
    finally:
        target.close()


@pytest.mark.engine
def test_b11739s_drawn_workloads_with_tensor_zero_shares_and_the_moe_cache_decode() -> None:
    """b11739's workloads as the ci profile draws them (two RPC devices; the absent call kinds and
    parameters as the engine tells them: none of its parameters): each new dimension reaches a
    successful decode, and every call is made or the workload is a finding."""
    f = Fuzzer(FuzzConfig(database=None, llama_lib=UPSTREAM))
    stats, dead, found = Stats(), [], set()
    try:
        info = f.engines.llama_target.start()
        assert info["absent_params"] == ""
        absent = frozenset(filter(None, info["absent_calls"].split(",")))

        @seed(47)
        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
        @given(llama_workloads(limits=DeviceLimits.of(rpc=2), absent=absent))
        def run(w: LlamaWorkload) -> None:
            trace = llama_trace(f.engines.run_llama(w))
            stats.add_llama(w, trace)
            assert unmade_calls(w, trace) == [], w.describe()
            if LLAMA_CHECKS["llama-no-abort"](w, trace):
                found.update(llama_features(w))
            elif not (trace.calls[0].rc == 0 and any(c.kind == "decode" and c.rc == 0 for c in trace.calls)):
                dead.append(w.describe())

        run()
    finally:
        f.close()
    assert stats.llama_workloads == 150 and dead == []
    for feature in ("split_mode tensor", "observed: meta device (split mode tensor)", "tensor_split with a zero share",
                    "observed: moe cache made", "observed: moe cache slot map copied to a device"):
        assert stats.llama_decoded.get(feature, 0) > 0 or feature in found, (feature, stats.llama_explored)
    assert any(stats.llama_decoded.get(f"moe cache {c} all experts' bytes", 0) for c in ("<", ">="))


@pytest.mark.engine
@pytest.mark.parametrize("lib", ["llama.cpp-0.3.36", UPSTREAM])
def test_a_draft_model_of_its_own_puts_the_draft_contexts_scheduler_on_its_device(lib: str) -> None:
    """``--spec-draft-devices RPC1``: the target's file loaded again on the second RPC device, the
    MTP context made on it. The draft context's scheduler has that device and the CPU, the
    target's both RPC devices; both contexts' graphs are captured and judged by the reference,
    and every property judges the workload: on b11739 nothing is found, on 0.3.36 only the
    target's known lost reservation (its MTP layer's graph by the verification's sizes)."""
    f = Fuzzer(FuzzConfig(database=None, llama_lib=lib))
    try:
        found = {v.signature() for v in f.check_llama(LLAMA_GROUP, OWN)}
        assert {f for f in found if "topology=switch" not in f} == set() and all(f.startswith("llama-no-same-size-realloc[explained=lost") for f in found)
        assert bool(found) == (lib != UPSTREAM), found
        unjudged = {} if lib != UPSTREAM else {"ggml 0.27.0: no reference rules": 1}  # no rules of 0.27.0: not judged
        assert "llama-matches-reference" in f.llama_judged and f.stats.llama_not_captured == unjudged
        assert f.stats.llama_decoded["draft mtp on a draft model of its own, on one device (--spec-draft-devices)"] == 1
        trace = llama_trace(f.engines.llama_target.run(OWN, capture=True))
        assert unmade_calls(OWN, trace) == []
        kinds = [[b.kind for b in capture(OWN, trace, c).scenario.layout.backends] for c in (0, 1)]
        assert kinds == [["rpc", "rpc", "cpu"], ["rpc", "cpu"]]
    finally:
        f.close()


@pytest.mark.engine
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake builds the reproducer")
def test_a_draft_models_case_is_exported_with_its_own_model_and_reproduces(tmp_path: Path) -> None:
    """The reproducer loads the model file a second time on the draft's device and makes the MTP
    context on it, as llama-server does; on 0.3.36 the lost reservation reproduces in its call."""
    v, source = first_finding_reproduced(OWN, "llama.cpp-0.3.36", tmp_path)
    assert "ddevs[n_ddevs++] = devs[1];" in source and "dft = llama_init_from_model(dft_model ? dft_model : model, cp);" in source
    assert v.property == "llama-no-same-size-realloc"


@pytest.mark.engine
def test_split_mode_tensor_with_the_kv_cache_on_the_host_computes_other_logits_on_0_3_36() -> None:
    """``-sm tensor -nkvo`` on two RPC devices: 0.3.36's logits differ from the CPU-only run's
    (the starter corpus's known case was found with an RPC and a GPU-like device: the meta device
    computes, whatever its members, so both are one signature); with the KV cache offloaded they
    agree."""
    heads = replace(MOE, n_head=4, n_head_kv=2)  # two KV heads: one per device
    w = LlamaWorkload(heads, Devices(n_rpc=2, split_mode="tensor"), ContextParams(n_seq_max=2, n_batch=8, n_ubatch=8, flash_attn="on", kv_unified=True,
                                                                              offload_kqv=False), (decode((0, 1, "last")),))
    f = Fuzzer(FuzzConfig(database=None, llama_lib="llama.cpp-0.3.36"))
    try:
        found = [v for v in f.check_llama(LLAMA_GROUP, w) if v.property == "llama-same-logits"]
        assert [v.signature() for v in found] == ["llama-same-logits[kv=host,on=Meta]"]
        assert [v for v in f.check_llama(LLAMA_GROUP, replace(w, ctx=replace(w.ctx, offload_kqv=True))) if v.property == "llama-same-logits"] == []
    finally:
        f.close()
    known = [load_case(p) for p in (Path(__file__).parents[2] / "corpus").glob("llama-same-logits-*.json")]
    assert "llama-same-logits[kv=host,on=Meta]" in {c.signature for c in known if c.expected_failure}
