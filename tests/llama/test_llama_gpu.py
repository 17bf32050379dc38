"""llama.cpp on schedfuzz's GPU-like devices (``ggml/fake_gpu.c``, registered with ggml's backend
registry in the llama worker): placement as users set it, op offload, pipeline parallelism and its
fallback, splits for an op a device refuses, and llama-same-logits against the CPU alone."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.campaign.stats import llama_observed
from pytest_schedfuzz.cases.corpus import load_case
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.layout import BackendSpec
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_trace import LlamaAbort
from pytest_schedfuzz.model.llama_workload import CPU_DEVICE, Call, ContextParams, Devices, LlamaWorkload, Part, WorkloadError
from pytest_schedfuzz.properties.derived import llama_trace
from pytest_schedfuzz.properties.llama_logits import cpu_only, logit_pairs
from pytest_schedfuzz.properties.llama_properties import (
    LLAMA_CHECKS,
    cpu_run_violations,
    llama_no_abort,
    llama_same_logits,
    out_of_memory,
)

GPU = BackendSpec("gpu")
ASYNC = BackendSpec("gpu", asynchronous=True)


def decode(*parts: tuple[int, int, str]) -> Call:
    return Call("decode", tuple(Part(s, n, o) for s, n, o in parts))


# a prompt of 32 tokens (all outputs), then generation, a rejected draft rolled back, and a 2-token draft
TRAFFIC = (decode((0, 32, "all")), decode((0, 7, "last")), decode((0, 1, "last")), Call("seq_rm", seq=0, n_drop=3), decode((0, 2, "all")))


def workload(devices: Devices, **ctx: object) -> LlamaWorkload:
    w = LlamaWorkload(ModelSpec(n_layer=2), devices, ContextParams(n_seq_max=1, **ctx), TRAFFIC)  # type: ignore[arg-type]
    w.validate()
    return w


@pytest.fixture(scope="module")
def target():
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    t = LlamaTarget()
    yield t
    t.close()


def _judged_clean(w: LlamaWorkload, trace, but: tuple[str, ...] = ()) -> None:
    assert trace.abort is None and all(c.rc == 0 for c in trace.calls), trace.calls
    assert [v for p, check in LLAMA_CHECKS.items() if p not in but for v in check(w, trace)] == []


def test_devices_round_trip_and_bad_placements_are_refused() -> None:
    dv = Devices(n_rpc=1, gpus=(GPU, ASYNC), gpu_free=(0, 1 << 20), split_mode="none", main_gpu=2, tensor_split=(1.0, 2.0, 1.0),
                 overrides=(("_exps", 1), ("token_embd", CPU_DEVICE)))
    w = workload(dv)
    assert LlamaWorkload.from_json(w.to_json()) == w
    for bad, field in ((replace(dv, main_gpu=3), "main_gpu"), (replace(dv, tensor_split=(1.0,)), "tensor_split"),
                       (replace(dv, overrides=(("x", 3),)), "overrides"), (replace(dv, gpus=(BackendSpec("gpu", shared_buft=True),), gpu_free=()), "gpus"),
                       (replace(dv, split_mode="row"), "split_mode"), (replace(dv, gpu_free=(1,)), "gpu_free")):
        with pytest.raises(WorkloadError, match=field):
            replace(w, devices=bad).validate()


@pytest.mark.engine
def test_llama_places_layers_on_a_gpu_like_device_and_honours_a_tensor_override(target) -> None:
    """llama.cpp enumerates the registered device as a GPU, offloads every layer to it and keeps
    the FFN weights the override sends to the CPU there; the scheduler then runs splits on it, and
    ggml's op offload copies the CPU-resident weights of a 32-token batch to it."""
    w = workload(Devices(n_rpc=0, gpus=(BackendSpec("gpu", offload_min_batch=16),), overrides=(("ffn_(up|down|gate)", CPU_DEVICE),)))
    trace = llama_trace(target.run(w))
    # op offload moves the token embeddings' get_rows between GPU0 and the CPU with the batch size:
    # the worst-case plan is replaced, and a later batch re-plans at the same size (a known finding)
    _judged_clean(w, trace, but=("llama-no-same-size-realloc",))
    log = trace.calls[0].log
    assert any(x.startswith("llama_prepare_model_devices: using device GPU0 (schedfuzz GPU-like device") for x in log), log
    assert "load_tensors: offloaded 3/3 layers to GPU" in log
    overridden = [x for x in log if "buffer type overridden to CPU" in x]
    assert len(overridden) == 6 and all("ffn_" in x for x in overridden)  # up, down, gate of both layers
    allocs = [s for _, s in trace.sched_calls() if s.kind == "alloc"]
    # the 32-token prompt: every op on GPU0, the CPU-resident weights copied in (op offload): the
    # FFN's 6, and the token embeddings, which llama.cpp always keeps on the CPU
    assert {b for b, _ in allocs[0].splits} == {"GPU0"} and len(allocs[0].offloaded) == 7
    assert "token_embd.weight@GPU0" in allocs[0].offloaded and "blk.1.ffn_up.weight@GPU0" in allocs[0].offloaded
    # 7, 1 and 2 tokens: under offload_min_batch, the FFNs run on the CPU beside their weights
    assert all({b for b, _ in s.splits} == {"GPU0", "CPU"} and s.offloaded == () for s in allocs[1:])


@pytest.mark.engine
def test_pipeline_parallelism_on_two_asynchronous_gpu_like_devices(target) -> None:
    w = workload(Devices(n_rpc=0, gpus=(ASYNC, ASYNC)))
    trace = llama_trace(target.run(w))
    _judged_clean(w, trace)
    assert "llama_context: pipeline parallelism enabled" in trace.calls[0].log
    new = [s for _, s in trace.sched_calls() if s.kind == "new"]
    assert len(new) == 1 and new[0].parallel
    assert all(s.n_copies == 4 for _, s in trace.sched_calls() if s.kind in ("reserve", "alloc"))  # GGML_SCHED_MAX_COPIES
    # synchronous devices: no pipeline parallelism
    sync = llama_trace(target.run(workload(Devices(n_rpc=0, gpus=(ASYNC, GPU)))))
    assert not any(s.parallel for _, s in sync.sched_calls() if s.kind == "new")


@pytest.mark.engine
def test_compute_buffers_that_do_not_fit_make_llama_drop_pipeline_parallelism(target) -> None:
    """Free memory for one copy of the compute buffers but not for four: llama.cpp's first
    reservation fails, and it builds a scheduler without pipeline parallelism that fits."""
    w = workload(Devices(n_rpc=0, gpus=(ASYNC, ASYNC), gpu_free=(600_000, 600_000)))
    trace = llama_trace(target.run(w))
    _judged_clean(w, trace)
    assert "sched_reserve: compute buffer allocation failed, retrying without pipeline parallelism" in trace.calls[0].log
    init = trace.calls[0].sched
    new = [s for s in init if s.kind == "new"]
    assert [s.parallel for s in new] == [True, False]
    assert [s.ok for s in init if s.kind == "reserve"][0] is False
    assert all(s.n_copies == 1 for c in trace.calls[1:] for s in c.sched if s.kind == "alloc")
    # too little for even one copy: llama.cpp refuses the context, which is not a finding
    full = workload(Devices(n_rpc=0, gpus=(ASYNC, ASYNC), gpu_free=(300_000, 300_000)))
    refused = llama_trace(target.run(full))
    assert refused.calls[0].rc != 0 and out_of_memory(full, refused) and LLAMA_CHECKS["llama-no-abort"](full, refused) == []


def test_an_adapter_a_full_device_refuses_is_out_of_memory_not_a_harness_error() -> None:
    """A LoRA adapter llama.cpp cannot allocate on a GPU-like device left little free memory is
    refused rightly, as a context is (not judged, counted); the message is llama.cpp's, as a ci
    run under -n 2 met it. Elsewhere a refused load stays a call the harness could not make."""
    from pytest_schedfuzz.model.llama_model import LoraSpec
    from pytest_schedfuzz.model.llama_trace import CallRecord, LlamaTrace, SchedCall
    from pytest_schedfuzz.properties.llama_properties import unmade_calls

    said = ("llama_adapter_lora_init failed: alloc_tensor_range: failed to allocate GPU0 buffer of size 14336 / "
            "llama_adapter_lora_init_from_file_ptr: failed to apply lora adapter: failed to allocate buffer for lora adapter")
    full = LlamaWorkload(ModelSpec(n_layer=2), Devices(n_rpc=0, gpus=(ASYNC, ASYNC), gpu_free=(440_871, 1_246_974)), ContextParams(n_seq_max=1),
                         (Call("lora_load", adapter=0), Call("lora_free", adapter=0)), (LoraSpec(),))
    trace = LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "lora_load", said), CallRecord(1, "lora_free", "adapter 0 is not loaded: its lora_load failed")))
    assert out_of_memory(full, trace) == said
    roomy = replace(full, devices=replace(full.devices, gpu_free=()))
    assert out_of_memory(roomy, trace) == "" and len(unmade_calls(roomy, trace)) == 2


@pytest.mark.engine
def test_an_op_the_device_refuses_splits_the_graph_around_it(target) -> None:
    plain = llama_trace(target.run(workload(Devices(n_rpc=0, gpus=(GPU,)))))
    refusing = llama_trace(target.run(workload(Devices(n_rpc=0, gpus=(BackendSpec("gpu", unsupported=("SOFT_MAX",)),)))))
    alloc = next(s for _, s in refusing.sched_calls() if s.kind == "alloc")
    backends = [b for b, _ in alloc.splits]
    # every layer's attention goes to the CPU for its softmax and comes back
    assert backends.count("CPU") >= 2 and backends.count("GPU0") >= 3
    assert alloc.n_splits > next(s for _, s in plain.sched_calls() if s.kind == "alloc").n_splits


@pytest.mark.engine
def test_same_logits_holds_on_real_layouts_and_catches_a_device_that_corrupts_an_op(target) -> None:
    layouts = (Devices(n_rpc=0, gpus=(ASYNC, ASYNC)), Devices(n_rpc=1, gpus=(BackendSpec("gpu", offload_min_batch=8),), overrides=(("ffn_up", CPU_DEVICE),)),
               Devices(n_rpc=0, gpus=(BackendSpec("gpu", unsupported=("SOFT_MAX",), graph_optimize=True),)))
    cpu = llama_trace(target.run(cpu_only(workload(layouts[0]), None), logits=True))
    assert sum(len(c.logits) for c in cpu.calls) == 6  # first and last output of each decode (one row for a single output)
    for dv in layouts:
        w = workload(dv)
        assert llama_same_logits(w, llama_trace(target.run(w, logits=True)), cpu) == []
    planted = workload(Devices(n_rpc=0, gpus=(ASYNC, replace(ASYNC, corrupt_op="MUL_MAT"))))
    (v,) = llama_same_logits(planted, llama_trace(target.run(planted, logits=True)), cpu)
    assert v.step == 0 and v.facts == {"on": "GPU-like"} and "differ from the CPU-only run's" in v.message
    # a device whose matmuls come back NaN or +Inf: a NaN never exceeds a tolerance, and is judged first
    for value in ("nan", "inf"):
        planted = workload(Devices(n_rpc=0, gpus=(ASYNC, replace(ASYNC, corrupt_op=f"MUL_MAT={value}"))))
        trace = llama_trace(target.run(planted, logits=True))
        assert any(not math.isfinite(x) for c in trace.calls for row in c.logits for x in row), value
        (v,) = llama_same_logits(planted, trace, cpu)
        assert v.signature() == f"llama-same-logits[on=GPU-like,value={value}]" and "on the devices only" in v.message, v


@pytest.mark.engine
def test_the_cpu_only_run_is_judged_like_any_run(target) -> None:
    """llama-same-logits' reference run, on the CPU alone, is a run of its own: a crash there is a
    llama-no-abort finding (``run=cpu-only``), not a workload skipped; a decode that fails on one side
    only is a finding; what was compared is counted in rows, not in workloads attempted."""
    w = workload(Devices(n_rpc=0, gpus=(ASYNC,)))
    trace = llama_trace(target.run(w, logits=True))
    cpu_w = cpu_only(w, trace)
    cpu = llama_trace(target.run(cpu_w, logits=True))
    assert cpu_run_violations(w, trace, cpu_w, cpu) == [] and sum(1 for _ in logit_pairs(trace, cpu)) == 6
    crashed = replace(cpu, abort=LlamaAbort(2, "crash", "the worker was killed by SIGSEGV\nC stack: ggml_compute_forward_mul_mat < ggml_graph_compute"))
    (v,) = cpu_run_violations(w, trace, cpu_w, crashed)
    assert v.property == "llama-no-abort" and v.facts["run"] == "cpu-only" and v.message.startswith("the CPU-only run of this workload")
    assert list(logit_pairs(trace, crashed)) == [] and llama_same_logits(w, trace, crashed) == []
    failed = replace(cpu, calls=tuple(replace(c, rc=1, logits=()) if c.index == 2 else c for c in cpu.calls))
    (v,) = cpu_run_violations(w, trace, cpu_w, failed)
    assert v.signature() == "llama-same-logits[on=devices,value=rc]" and v.step == 2


@pytest.mark.engine
def test_the_cpu_only_run_resolves_flash_attention_as_the_devices_run_did(target) -> None:
    """Flash attention "auto" with a GPU-like device that refuses FLASH_ATTN_EXT: llama.cpp turns
    it off for the context (it logs so), where the CPU alone keeps it on, and the two attentions'
    kernels differ by ~1e-3 (a ci run's false llama-same-logits finding). The CPU-only run takes
    the resolution llama.cpp logged; a device that supports it leaves "auto" on."""
    model = ModelSpec(kind="moe", n_layer=3, n_embd=128, n_head=4, n_head_kv=4, n_ff=16, n_expert=4, n_expert_used=2, seed=1)
    calls = tuple(decode((0, n, "last" if n == 1 else "none")) for n in (1, 1, 64, 1, 64, 1))
    ctx = ContextParams(n_ctx=256, n_batch=64, n_ubatch=32, n_seq_max=1, flash_attn="auto", op_offload=False)
    for refused, resolved in (((), "on"), (("FLASH_ATTN_EXT",), "off")):
        w = LlamaWorkload(model, Devices(n_rpc=1, gpus=(BackendSpec("gpu", unsupported=refused), GPU), overrides=((r"blk\.0\.", CPU_DEVICE),)), ctx, calls)
        w.validate()
        trace = llama_trace(target.run(w, logits=True))
        assert trace.flash_attn() == resolved and cpu_only(w, trace).ctx.flash_attn == resolved
        assert llama_same_logits(w, trace, llama_trace(target.run(cpu_only(w, trace), logits=True))) == []
    # the comparison the property made before: against the CPU alone's own "auto" (on)
    (v,) = llama_same_logits(w, trace, llama_trace(target.run(cpu_only(w, None), logits=True)))
    assert "differ from the CPU-only run's" in v.message
    assert "observed: flash attention auto, off (a device refused it)" in llama_observed(trace)


@pytest.mark.engine
def test_drawn_workloads_reach_every_gpu_like_placement_with_workloads_that_decoded(target, no_module_constants: None) -> None:
    """100 drawn workloads (one RPC device at most, every model family, as the ci profile): each GPU-like setting,
    placement option and what the scheduler then does (n_copies > 1, op offload) is reached by
    workloads that decoded; contexts refused for lack of memory stay a small share, each on a
    device left little free memory, and none is a finding."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from pytest_schedfuzz.campaign.stats import Stats
    from pytest_schedfuzz.strategies.llama_workloads import FAMILIES, llama_workloads

    stats, full = Stats(), []

    # (without the modules' constants, which every change elsewhere changes) a seed under which every placement
    # reaches three decodes and some contexts are refused for memory (re-picked when the LFM2 models came)
    @seed(8)
    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
    @given(llama_workloads(limits=DeviceLimits.of(rpc=1, gpu=2), families=FAMILIES))
    def run(w: LlamaWorkload) -> None:
        trace = llama_trace(target.run(w))
        stats.add_llama(w, trace)
        if out_of_memory(w, trace):
            full.append(w)
            assert LLAMA_CHECKS["llama-no-abort"](w, trace) == []

    run()
    assert len(full) <= 10 and all(w.devices.gpu_free for w in full), [(w.model.kind, w.draft) for w in full]
    for shown in ("1 GPU-like", "2 GPU-like", "GPU-like asynchronous", "GPU-like host buffer", "GPU-like unsupported ops", "GPU-like max_size",
                  "GPU-like graph_optimize", "GPU-like offload_op, op_offload on", "tensor overrides", "split_mode none", "GPU-like little free memory",
                  *(f"model {f}" for f in FAMILIES), "observed: n_copies > 1", "observed: op offloaded to a device"):
        assert stats.llama_decoded.get(shown, 0) >= 3, (shown, stats.llama_explored.get(shown))
    assert "observed: n_copies > 1" in next(x for x in stats.summary_lines() if x.startswith("llama.cpp explored"))


def test_a_decode_that_cannot_grow_a_buffer_on_a_full_device_is_signed_by_its_replan(target) -> None:
    """The starter corpus's decode returning -2: a same-size re-plan (the Mamba-2 fewer-sequences
    cause) must grow a buffer on devices drawn nearly full. Its signature names the re-plan and
    the drawn memory, so that a known case of it never hides a -2 of another cause: the same
    failure with no re-plan during the call, or on devices with no memory drawn, signs differently."""
    case = load_case(next((Path(__file__).resolve().parents[2] / "corpus").glob("llama-no-abort-*-45088e1fca.json")))
    assert case.llama is not None and case.expected_failure
    trace = llama_trace(target.run(case.llama))
    found = llama_no_abort(case.llama, trace)
    assert [(v.signature(), v.step) for v in found] == [(case.signature, case.step)]
    assert "during a re-plan (node node_7 is not valid)" in found[0].message
    call = trace.calls[[c.index for c in trace.calls].index(case.step)]
    no_replan = replace(call, sched=tuple(replace(s, realloc=False, realloc_reason="") for s in call.sched))
    other = replace(trace, calls=tuple(no_replan if c is call else c for c in trace.calls))
    assert [v.signature() for v in llama_no_abort(case.llama, other)] == ["llama-no-abort[gpu_free=drawn,kind=decode,rc=-2,replanned=no]"]
    unlimited = replace(case.llama, devices=replace(case.llama.devices, gpu_free=()))
    assert [v.signature() for v in llama_no_abort(unlimited, trace)] == ["llama-no-abort[gpu_free=unlimited,kind=decode,rc=-2,replanned=yes]"]


@pytest.mark.engine
def test_a_context_that_does_not_fit_is_judged_on_the_scheduler_calls_made_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices too full for the context: llama.cpp built schedulers and reserved (and failed) before
    it gave up; those calls are judged (a planted check that flags a failed reserve sees them), and
    the summary counts the context as judged, not as skipped."""
    from pytest_schedfuzz.campaign import checks
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.profiles import FuzzConfig
    from pytest_schedfuzz.properties import LLAMA_GROUP, Violation

    full = workload(Devices(n_rpc=0, gpus=(ASYNC, ASYNC), gpu_free=(300_000, 300_000)))
    fuzzer = Fuzzer(FuzzConfig(database=None))
    try:
        assert fuzzer.check_llama(LLAMA_GROUP, full) == []
        assert (fuzzer.stats.llama_out_of_memory, fuzzer.stats.llama_out_of_memory_judged) == (1, 1)

        def planted(w: LlamaWorkload, trace) -> list[Violation]:  # type: ignore[no-untyped-def]
            return [Violation("llama-no-abort", max(c, 0), "a reserve failed", {"planted": "reserve"}) for c, s in trace.sched_calls()
                    if s.kind == "reserve" and not s.ok][:1]

        monkeypatch.setitem(checks.LLAMA_CHECKS, "llama-no-abort", planted)
        (v,) = fuzzer.check_llama(LLAMA_GROUP, full)
        assert v.facts == {"planted": "reserve"}
    finally:
        fuzzer.close()
