"""The llama.cpp target: workloads, the properties on synthetic traces, and the real llama.cpp
(llama-cpp-python 0.3.36, ggml 0.25.3) with RPC devices on loopback."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from pytest_schedfuzz.cases.corpus import load_case
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_trace import CallRecord, LlamaAbort, LlamaTrace, SchedCall
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, Part, WorkloadError
from pytest_schedfuzz.properties.base import Violation
from pytest_schedfuzz.properties.derived import llama_trace
from pytest_schedfuzz.properties.llama_properties import (
    LLAMA_CHECKS,
    llama_no_same_size_realloc,
    llama_reuse_sound,
    scheduler_reuses,
)
from pytest_schedfuzz.strategies import sampled
from pytest_schedfuzz.strategies.llama_workloads import llama_workloads

MOE = ModelSpec(kind="moe", n_layer=1, n_embd=16, n_head=1, n_head_kv=1, n_ff=16, n_expert=4, n_expert_used=2)


def decode(*parts: tuple[int, int, str]) -> Call:
    return Call("decode", tuple(Part(s, n, o) for s, n, o in parts))


# a MoE context in warmup: llama.cpp routes every token to all 4 experts, not 2, and does not
# reserve again ("warmups are usually with small batches"), so a warmup batch of more than
# n_ubatch * 2 / 4 tokens outgrows ffn_moe_weights' reservation: a same-size reallocation
# (shrunk by the fuzzer from a server-like workload)
WARMUP = LlamaWorkload(
    MOE, Devices(n_rpc=1, n_gpu_layers=0),
    ContextParams(n_ctx=256, n_batch=8, n_ubatch=8, flash_attn="off", op_offload=False, kv_unified=False, embeddings=True),
    (decode((0, 1, "last")), Call("set_warmup", on=True), decode((0, 1, "last")), decode((0, 5, "last"))),
)
# ordinary traffic of one slot: prompt chunks, then token generation, all within the reservation
STEADY = LlamaWorkload(
    ModelSpec(n_layer=1), Devices(n_rpc=1), ContextParams(n_seq_max=2),
    (decode((0, 32, "none")), decode((0, 7, "last")), decode((0, 1, "last")), decode((0, 1, "last"), (1, 5, "last")), decode((0, 1, "last"), (1, 1, "last"))),
)


def test_sampled_keeps_one_strategy_per_tuple_of_values_and_types() -> None:
    """The strategies draw from ``sampled``, which keeps a ``sampled_from`` per tuple: equal
    tuples of other types (floats for a tensor split, ints for sequence ids, booleans) are other
    strategies, or a workload would draw a sequence id 2.0 after a split drew from (1.0, 2.0, 3.0)."""
    floats, bools = sampled((1.0, 2.0, 3.0)), sampled((True, False))
    ints, bits = sampled((1, 2, 3)), sampled((1, 0))
    assert ints is not floats and bits is not bools and sampled((1, 2, 3)) is ints
    assert [type(x) for x in ints.elements] == [int] * 3 and [type(x) for x in bits.elements] == [int] * 2


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(llama_workloads())
def test_generated_workloads_are_valid_and_round_trip(w: LlamaWorkload) -> None:
    w.validate()
    assert LlamaWorkload.from_json(w.to_json()) == w


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda w: replace(w, ctx=replace(w.ctx, n_ubatch=-3)), "ctx.n_ubatch"),
        (lambda w: replace(w, calls=(decode((5, 1, "last")),)), "sequence id 5 >= n_seq_max"),
        (lambda w: replace(w, ctx=replace(w.ctx, n_outputs_max=1), calls=(decode((0, 2, "all")),)), "n_outputs_max"),
        (lambda w: replace(w, calls=(decode((0, 65, "last")),)), "n_batch"),
        (lambda w: replace(w, devices=Devices(n_rpc=7)), "devices.n_rpc"),
        (lambda w: replace(w, calls=(Call("set_causal_attn", on=False), decode((0, 64, "last")))), "causal attention is off"),
        (lambda w: replace(w, model=replace(w.model, n_head=0)), "model: n_head"),
    ],
)
def test_invalid_workloads_are_refused_naming_the_field(change, field: str) -> None:
    with pytest.raises(WorkloadError, match=field):
        LlamaWorkload.from_json(change(STEADY).to_json())


def _alloc(sched: int, size: int, prev: int, reason: str = "", ids: bool = False, n_nodes: int = 10, tokens: int = 1) -> SchedCall:
    return SchedCall("alloc", sched, n_nodes=n_nodes, graph_size=size, prev_graph_size=prev, inputs={"inp_tokens": (tokens, 1, 1, 1)},
                     realloc=bool(reason), backend_ids_changed=ids, realloc_reason=reason)


def test_same_size_realloc_is_explained_as_a_lost_reservation() -> None:
    w = replace(STEADY, calls=STEADY.calls[:3])
    reserve = SchedCall("reserve", 0, n_nodes=10, graph_size=20, inputs={"inp_tokens": (32, 1, 1, 1)})
    trace = LlamaTrace((
        CallRecord(-1, "init", 0, (SchedCall("new", 0, max_nodes=1024), reserve)),
        CallRecord(0, "decode", 0, (_alloc(0, 22, 20, "different number of nodes", n_nodes=12, tokens=1),)),
        CallRecord(1, "decode", 0, (_alloc(0, 20, 22, "different number of nodes", tokens=1),)),
        CallRecord(2, "decode", 0, (_alloc(0, 20, 20, "node inp_embd is not valid", tokens=7),)),
    ))
    (v,) = llama_no_same_size_realloc(w, trace)
    # no switch call and no other kind of graph: what changed the topology is the batch's class
    assert v.step == 2 and v.facts == {"explained": "lost", "lost_by": "decode: nodes", "topology": "switch by tokens"}
    assert "node inp_embd is not valid" in v.message
    assert "replaced in call 0" in v.message and "inp_tokens [1, 1, 1, 1] -> [7, 1, 1, 1]" in v.message
    # the corpus's case: a decode with no outputs after the reservation's all outputs, two signatures
    # where the same batch class had one before
    def outputs(n: int) -> dict[str, tuple[int, ...]]:
        return {"inp_tokens": (8, 1, 1, 1), "out_ids": (n, 1, 1, 1)}

    no_outputs = replace(trace, calls=(
        CallRecord(-1, "init", 0, (SchedCall("new", 0, max_nodes=1024), replace(reserve, n_nodes=67, inputs=outputs(8)))),
        CallRecord(0, "decode", 0, (replace(_alloc(0, 18, 20, "different number of nodes", n_nodes=46), inputs=outputs(0)),)),
        CallRecord(1, "decode", 0, (replace(_alloc(0, 18, 18, "node inp_embd is not valid", n_nodes=46), inputs=outputs(2)),)),
        CallRecord(2, "decode", 0, ()),
    ))
    (v,) = llama_no_same_size_realloc(w, no_outputs)
    assert v.facts["topology"] == "switch by outputs" and "outputs all -> none" in v.message
    # between graphs of two topologies ggml compares backend ids by position: the node it names as moved
    # is whichever sits where they first differ, so the signature is the batch class's, the move in the message
    for name in ("norm-0", "h_nextn"):
        moved = replace(_alloc(0, 18, 20, "backend ids changed", ids=True, n_nodes=46), inputs=outputs(0), moved=f"node {name}: #1 CPU -> #0 RPC0[127.0.0.1:1]")
        (v,) = llama_no_same_size_realloc(w, replace(no_outputs, calls=no_outputs.calls[:1] + (CallRecord(0, "decode", 0, (moved,)),) + no_outputs.calls[2:]))
        assert v.facts == {"explained": "lost", "lost_by": "decode: changed", "topology": "switch by outputs"}, v.facts
        assert f"node {name}: #1 CPU -> #0 RPC0" in v.message
    trace2 = replace(trace, calls=trace.calls[:3] + (CallRecord(2, "decode", 0, (_alloc(0, 20, 20, "backend ids changed", ids=True),)),))
    assert llama_no_same_size_realloc(w, trace2) == []


def test_reuse_sound_catches_a_kept_scheduler_that_is_too_small() -> None:
    """A planted llama.cpp that keeps its scheduler across a reservation asking for more nodes."""
    new = SchedCall("new", 0, max_nodes=1024, op_offload=True)
    kept = (CallRecord(-1, "init", 0, (SchedCall("sched_reserve", -1, max_nodes=1024), new, SchedCall("reserve", 0))),
            CallRecord(0, "set_warmup", 0, ()),
            CallRecord(1, "decode", 0, (SchedCall("sched_reserve", -1, max_nodes=4096), SchedCall("reserve", 0))))
    trace = LlamaTrace(kept)
    assert [c for c, _, _ in scheduler_reuses(trace)] == [1]
    (v,) = llama_reuse_sound(STEADY, trace)
    assert "max_nodes 4096" in v.message
    smaller = replace(trace, calls=kept[:2] + (CallRecord(1, "decode", 0, (SchedCall("sched_reserve", -1, max_nodes=512), SchedCall("reserve", 0))),))
    assert llama_reuse_sound(STEADY, smaller) == []


@pytest.fixture(scope="module")
def target():
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    t = LlamaTarget()
    yield t
    t.close()


@pytest.mark.engine
def test_traffic_within_the_reservation_passes(target) -> None:
    trace = llama_trace(target.run(STEADY))
    assert trace.abort is None
    allocs = [s for _, s in trace.sched_calls() if s.kind == "alloc"]
    assert len(allocs) >= 5 and all(not s.realloc for s in allocs)
    assert [c.rc for c in trace.calls if c.kind == "decode"] == [0] * 5
    assert all(f(STEADY, trace) == [] for f in LLAMA_CHECKS.values())
    assert trace.engine["ggml_version"] == "0.25.3"


@pytest.mark.engine
def test_a_same_size_sequence_is_caught_and_ggml_confirms_it(target) -> None:
    trace = llama_trace(target.run(WARMUP))
    (v,) = llama_no_same_size_realloc(WARMUP, trace)
    # what the reservation did not cover, as a Release build tells it too: no input grew, a node did
    assert v.step == 3 and v.facts["outgrown"] == "no input" and v.facts["explained"] == "not-dominating"
    assert "ggml-alloc: node ffn_moe_weights-N" in v.message
    # ggml's own check (GGML_SCHED_DEBUG_REALLOC=1) aborts at the same call
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    with LlamaTarget(debug_realloc=1) as strict:
        confirmed = llama_trace(strict.run(WARMUP))
    assert confirmed.abort is not None and confirmed.abort.call == 3
    assert "unexpected graph reallocation" in confirmed.abort.message


@pytest.mark.engine
def test_graph_size_is_the_one_ggml_computes(target) -> None:
    """GGML_SCHED_DEBUG_REALLOC=2 makes ggml abort on the first reallocation, printing its graph size."""
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    for w in (WARMUP, replace(WARMUP, devices=Devices(n_rpc=2, n_gpu_layers=99))):
        ours = next(s for _, s in llama_trace(target.run(w)).sched_calls() if s.realloc)
        with LlamaTarget(debug_realloc=2) as t:
            trace = t.run(w)
        assert trace.abort is not None
        assert f"graph size = {ours.graph_size}, nodes = " in trace.abort.message


@pytest.mark.engine
def test_an_abort_is_a_finding_and_the_next_workload_runs(target) -> None:
    # llama.cpp 0.3.36 asserts in output_reserve when embeddings without pooling output every
    # token past a limit of one output (llama-server sets no limit with embeddings)
    bad = replace(STEADY, ctx=replace(STEADY.ctx, embeddings=True, n_outputs_max=1, n_outputs_max_per_seq=1), calls=(decode((0, 2, "last")),))
    target.start()
    spare = target._spare
    assert spare is not None
    # forked by the target's fork server, which has libllama loaded (``process.forkserver``)
    assert target._forker is not None and target._forker.server is not None
    assert int(open(f"/proc/{spare.proc.pid}/stat").read().rsplit(")", 1)[1].split()[1]) == target._forker.server.proc.pid
    trace = llama_trace(target.run(bad))
    (v,) = LLAMA_CHECKS["llama-no-abort"](bad, trace)
    assert v.step == 0 and "n_outputs_max" in v.message
    assert target._worker is None  # the aborted worker is gone: the next workload takes the spare, started meanwhile
    assert llama_trace(target.run(STEADY)).abort is None
    assert target._worker is not None and target._worker.proc.pid == spare.proc.pid and target._spare is not None
    pids = target.servers.pids + [target._worker.proc.pid, target._spare.proc.pid]
    target.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_crash_signatures_name_the_assert_that_raised_them() -> None:
    """Two SIGABRTs from different C asserts are different bugs: a known one must not hide the other."""
    from pytest_schedfuzz.model.llama_trace import LlamaAbort

    def sig(message: str, kind: str = "crash") -> str:
        (v,) = LLAMA_CHECKS["llama-no-abort"](STEADY, LlamaTrace((), LlamaAbort(1, kind, message)))
        return v.signature()

    a = sig("the worker was killed by SIGABRT\npython: /b/src/llama-kv-cells.h:351: void f(): Assertion `!seq[i].test(seq_id)' failed.\n")
    b = sig("the worker was killed by SIGABRT\npython: /b/ggml/src/ggml.c:1342: ggml_row_size: Assertion `ne % 32 == 0' failed.\n")
    assert a != b and "llama-kv-cells.h" in a and ":351" not in a
    # ggml's own abort message keeps the form the starter corpus records
    assert sig("/b/ggml/src/ggml.c:3354: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed\n", "abort") == \
        "llama-no-abort[call=decode,kind=abort,message=ggml.c: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed]"


# ------------------------------------------------------------------ issue 19: the target tells the truth


@pytest.mark.engine
def test_every_generated_workload_initializes_and_decodes_or_is_a_finding(target, no_module_constants: None) -> None:
    """200 drawn workloads: each one's context comes up and decodes (backend samplers included,
    as llama-server makes them: sampler chains), or it is a finding; no call is left unmade, and
    every generated dimension reaches a successful decode (the llama.cpp explored statistics)."""
    from hypothesis import Phase, seed

    from pytest_schedfuzz.campaign.stats import Stats, llama_features
    from pytest_schedfuzz.properties.llama_properties import unmade_calls

    stats, dead, found = Stats(), [], set()

    # one whose 200 draws decode each asserted dimension (re-picked when the modules' constants were left out)
    @seed(4)
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
    @given(llama_workloads(limits=DeviceLimits.of(rpc=2)))  # GPU-like devices: tests/llama/test_llama_gpu.py
    def run(w: LlamaWorkload) -> None:
        trace = llama_trace(target.run(w))
        stats.add_llama(w, trace)
        assert unmade_calls(w, trace) == [], w.describe()
        if LLAMA_CHECKS["llama-no-abort"](w, trace):
            found.update(llama_features(w))
        else:
            init = trace.calls[0]
            if not (init.rc == 0 and any(c.kind == "decode" and c.rc == 0 for c in trace.calls)):
                dead.append(w.describe())

    run()
    assert stats.llama_workloads == 200 and dead == []
    # a dimension drawn only in workloads that were findings (a crash on a rare draw) is alive; one
    # this build lacks (b11739's moe_cache_size) is listed as never drawn, with that reason
    never = sorted(f for f, n in stats.llama_explored.items() if stats.llama_decoded.get(f, 0) == 0 and f not in found
                   and not f.endswith("absent (this build lacks it)"))
    assert never == [], f"dimensions drawn that never decoded: {never}"
    for f in ("backend samplers greedy", "backend samplers top_k-temp-dist", "call set_sampler", "embeddings pooling mean",
              "flash_attn on", "kv q8_0/q8_0", "kv per sequence", "2 RPC", "model moe", "tensor_split", "partial offload",
              "lora adapters", "call lora_load", "call lora_set", "call lora_free", "split_mode tensor", "tensor_split with a zero share",
              "observed: meta device (split mode tensor)"):
        assert stats.llama_decoded.get(f, 0) > 0, f
    line = next(x for x in stats.summary_lines() if x.startswith("llama.cpp explored"))
    assert "backend samplers greedy" in line


def test_a_context_that_does_not_initialize_is_a_finding_not_a_pass() -> None:
    trace = LlamaTrace((CallRecord(-1, "init", -1, (), ("llama_init_from_model: failed to initialize the context: the backend samplers must be of type llama_sampler_chain",)),))
    (v,) = LLAMA_CHECKS["llama-no-abort"](STEADY, trace)
    assert v.facts["kind"] == "init" and "llama_sampler_chain" in v.message


def test_a_call_the_harness_could_not_make_is_a_harness_error() -> None:
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.engine import TargetError
    from pytest_schedfuzz.profiles import FuzzConfig
    from pytest_schedfuzz.properties import LLAMA_GROUP

    w = replace(STEADY, calls=(decode((0, 4, "last")), Call("seq_rm", seq=0, n_drop=2)))
    traces = {
        "refused": LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "decode", 0), CallRecord(1, "seq_rm", 1))),
        "unseen": LlamaTrace((CallRecord(-1, "init", 0, ()), CallRecord(0, "decode", 0), CallRecord(1, "seq_rm", 0))),
        "invalid": LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "decode", -1), CallRecord(1, "seq_rm", 0))),
    }

    class Fake:
        def __init__(self, trace: LlamaTrace) -> None:
            self.trace, self.runs = trace, 0

        def run(self, workload: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile=None, on_graph=None) -> LlamaTrace:
            self.runs += 1
            if meanwhile is not None:
                meanwhile()
            return self.trace

        def close(self) -> None:
            pass

    fuzzer = Fuzzer(FuzzConfig(database=None))
    for what, trace in traces.items():
        fuzzer.engines._llama = Fake(trace)
        with pytest.raises(TargetError, match="harness error"):
            fuzzer.check_llama(LLAMA_GROUP, w)
    # one run of a workload is judged by every llama property
    fuzzer.engines._llama = Fake(LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "decode", -3), CallRecord(1, "seq_rm", 0))))
    found = fuzzer.check_llama(LLAMA_GROUP, w)
    assert fuzzer.engines._llama.runs == 1 and [v.property for v in found] == ["llama-no-abort"]
    fuzzer.engines._llama = None


def test_the_reference_judges_the_captured_graphs_while_llama_cpp_runs_the_cpu_only_workload() -> None:
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.model.layout import BackendSpec
    from pytest_schedfuzz.profiles import FuzzConfig
    from pytest_schedfuzz.properties import LLAMA_GROUP

    w = replace(STEADY, devices=Devices(n_rpc=0, n_gpu_layers=99, gpus=(BackendSpec("gpu"),)))
    fuzzer = Fuzzer(FuzzConfig(database=None))
    judged_during: list[tuple[bool, int, int]] = []  # (logits run, not captured before meanwhile, after)

    class Fake:
        def run(self, workload: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile=None, on_graph=None) -> LlamaTrace:
            before = sum(fuzzer.stats.llama_not_captured.values())
            if meanwhile is not None:
                meanwhile()
            judged_during.append((logits, before, sum(fuzzer.stats.llama_not_captured.values())))
            return LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "decode", 0), CallRecord(1, "decode", 0)))

        def close(self) -> None:
            pass

    fuzzer.engines._llama = Fake()
    # no graph was captured: the reference counts the workload as not captured, during the second run
    assert fuzzer.check_llama(LLAMA_GROUP, w) == []
    assert judged_during == [(True, 0, 0), (True, 0, 1)]
    fuzzer.engines._llama = None


def test_a_cpu_only_run_is_kept_for_the_next_workload_with_the_same_model_context_and_calls() -> None:
    """llama-same-logits' oracle, the CPU-only run, is made once for workloads that differ only in
    their devices (what a mutation often changes): the second is compared with the kept run, and a
    difference is still found; a CPU-only run that aborted is not kept."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.model.layout import BackendSpec
    from pytest_schedfuzz.profiles import FuzzConfig
    from pytest_schedfuzz.properties import LLAMA_GROUP

    one = replace(STEADY, devices=Devices(n_rpc=0, n_gpu_layers=99, gpus=(BackendSpec("gpu"),)))
    two = replace(one, devices=Devices(n_rpc=1, n_gpu_layers=99, gpus=(BackendSpec("gpu", asynchronous=True),)))
    fuzzer = Fuzzer(FuzzConfig(database=None))
    cpu_runs: list[LlamaWorkload] = []

    class Fake:
        def __init__(self, cpu_abort: LlamaAbort | None) -> None:
            self.cpu_abort = cpu_abort

        def run(self, workload: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile=None, on_graph=None) -> LlamaTrace:
            on_cpu = not workload.devices.gpus
            cpu_runs.extend([workload] if on_cpu else [])
            row = (0.0, 1.0) if on_cpu else (0.0, 2.0)  # the devices get the second logit wrong
            calls = (CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)),
                     *(CallRecord(c, "decode", 0, logits=(row,)) for c in range(len(workload.calls))))
            return LlamaTrace(calls, self.cpu_abort if on_cpu else None)

        def close(self) -> None:
            pass

    fuzzer.engines._llama = Fake(None)
    for w in (one, two, one):
        assert [v.property for v in fuzzer.check_llama(LLAMA_GROUP, w)] == ["llama-same-logits"]
    assert len(cpu_runs) == 1 and fuzzer.stats.llama_cpu_runs_kept == 2 and fuzzer.stats.llama_logits_compared == 3
    other = replace(one, calls=one.calls[:1])
    cpu_runs.clear()
    fuzzer.engines._llama = Fake(LlamaAbort(0, "abort", "the CPU-only run aborted"))
    for _ in range(2):  # an aborted CPU-only run is judged (a finding of its own), and not kept
        assert [v.signature() for v in fuzzer.check_llama(LLAMA_GROUP, other)] == [
            "llama-no-abort[call=decode,kind=abort,message=the CPU-only run aborted,run=cpu-only]"]
    assert len(cpu_runs) == 2 and fuzzer.stats.llama_cpu_runs_kept == 2
    fuzzer.engines._llama = None


def test_an_unknown_scheduler_line_is_an_error_not_a_pass() -> None:
    from pytest_schedfuzz.ggml.schedlog import SchedLog

    log = SchedLog()
    log.feed("ggml_gallocr_reserve_n_impl: reallocating CPU buffer from size 0.00 MiB to 0.12 MiB\n")
    log.feed("ggml_backend_sched_alloc_splits: failed to allocate graph, reserving (backend_ids_changed = 0)\n")
    assert log.errors == [] and len(log.reallocs) == 1
    log.feed("ggml_backend_sched_alloc_splits: graph reallocation (reason 7)\n")
    assert log.errors and "does not know" in log.errors[0]


def test_the_reuse_note_needs_the_reuse_line() -> None:
    from pytest_schedfuzz.campaign.stats import Stats

    blind = Stats(llama_workloads=1)
    assert "not observable" in "".join(blind.summary_lines())
    seen = Stats(llama_workloads=1, llama_sched_reserves=3)
    assert "built a new scheduler on each of its 3 reservations" in "".join(seen.summary_lines())


def _lost(first_alloc: SchedCall, switch: Call | None = None) -> str:
    """The signature of a same-size realloc after the reservation was lost to ``first_alloc``."""
    calls = ((switch,) if switch else ()) + (decode((0, 1, "last")), decode((0, 2, "last")))
    w = replace(STEADY, calls=calls)
    reserve = SchedCall("reserve", 0, n_nodes=10, graph_size=20, inputs={"inp_tokens": (32, 1, 1, 1)})
    recs = (CallRecord(-1, "init", 0, (SchedCall("new", 0, max_nodes=1024), reserve)),) + ((CallRecord(0, switch.kind, 0),) if switch else ())
    k = len(recs) - 1
    trace = LlamaTrace(recs + (CallRecord(k, "decode", 0, (first_alloc,)),
                               CallRecord(k + 1, "decode", 0, (_alloc(0, 20, 20, "node inp_embd is not valid", tokens=2),))))
    (v,) = llama_no_same_size_realloc(w, trace)
    return v.signature()


def test_two_causes_of_a_backend_change_get_two_signatures() -> None:
    """``lost_by=changed`` once hid every cause behind its first: the kind of tensor that moved, the
    call that re-planned and the switch before it now sign a lost reservation; the model's names,
    layer numbers, endpoints and the devices it moved between (drawn) do not."""
    def changed(moved: str) -> SchedCall:
        return replace(_alloc(0, 20, 20, "backend ids changed", ids=True), moved=moved)

    norm = _lost(changed("node norm-3 (RMS_NORM): #0 RPC0[127.0.0.1:5001] -> #1 RPC0[127.0.0.1:5002]"))
    norm_other_port = _lost(changed("node norm-1 (RMS_NORM): #0 RPC0[127.0.0.1:6001] -> #1 RPC0[127.0.0.1:6002]"))
    norm_to_cpu = _lost(changed("node attn_norm-2 (RMS_NORM): #0 RPC0[127.0.0.1:6001] -> #2 CPU"))
    ffn = _lost(changed("node ffn_out-3 (ADD): #1 RPC0[127.0.0.1:5002] -> #2 CPU"))
    after_warmup = _lost(changed("node norm-3 (RMS_NORM): #0 RPC0[127.0.0.1:5001] -> #1 RPC0[127.0.0.1:5002]"), Call("set_warmup", on=True))
    weight = _lost(changed("leaf blk.1.ssm_out.weight (weight): #0 RPC0[127.0.0.1:5001] -> #2 CPU"))
    weight_rpc = _lost(changed("leaf blk.0.ffn_down.weight (weight): #0 RPC0[127.0.0.1:5001] -> #1 RPC0[127.0.0.1:5002]"))
    gpu = _lost(changed("node embd (GET_ROWS): #0 GPU0 -> #1 CPU"))
    gpu_behind_rpc = _lost(changed("node embd (GET_ROWS): #1 GPU0 -> #3 CPU"))
    second_gpu = _lost(changed("node embd (GET_ROWS): #1 GPU1 -> #2 CPU"))
    assert norm == norm_other_port == norm_to_cpu and "changed (node RMS_NORM)" in norm
    assert gpu == gpu_behind_rpc == second_gpu and "changed (node GET_ROWS)" in gpu
    assert weight == weight_rpc and "changed (leaf weight)" in weight
    assert len({norm, ffn, after_warmup, gpu, weight}) == 5
    # op offload: the reservation and the re-planned graph copy different host-resident weights to devices
    # (which device's offload_op wants an op depends on the batch): one cause, wherever the node went
    offloaded = [_lost(replace(changed(f"node embd (GET_ROWS): {move}"), offloaded=("token_embd.weight@GPU1",)))
                 for move in ("#0 GPU0 -> #2 CPU", "#0 GPU0 -> #1 GPU1")]
    after_warmup_offloaded = _lost(replace(changed("node embd (GET_ROWS): #0 GPU0 -> #2 CPU"), offloaded=("token_embd.weight@GPU1",)),
                                   Call("set_warmup", on=True))
    assert offloaded[0] == offloaded[1] == after_warmup_offloaded and "lost_by=decode: changed (op offload)" in offloaded[0]
    # the node that moved reads a host-resident weight (only op offload puts it on a device): the same
    # cause through a topology switch too (the fresh-clone CI's dense model with a greedy backend
    # sampler: 67 -> 46 nodes), where the offloaded sets alone cannot say it
    through_switch = _lost(replace(changed("node embd (GET_ROWS): #0 GPU0 -> #1 CPU"), moved_by_offload=True, n_nodes=7))
    assert through_switch == offloaded[0] == "llama-no-same-size-realloc[explained=lost,lost_by=decode: changed (op offload)]"
    assert "decode after set_warmup(true)" in after_warmup


def test_crashes_in_different_functions_are_different_findings(tmp_path) -> None:
    """A SIGSEGV carries no assert: the C stack the preloaded crash hook prints tells them apart,
    for the llama.cpp target and the graph engine alike."""
    import subprocess
    import sys

    from pytest_schedfuzz.ggml.lib import resolve_lib
    from pytest_schedfuzz.model.scenario import Scenario
    from pytest_schedfuzz.model.trace import Abort, Trace
    from pytest_schedfuzz.process.crash import CRASH_HOOK, build_preload, stack_line, with_preload
    from pytest_schedfuzz.properties import no_abort

    lib = Path(resolve_lib(None)) / "libggml-base.so"
    stacks = {}
    for fn in ("ggml_nbytes", "ggml_nelements"):
        code = f"import ctypes; f = ctypes.CDLL({str(lib)!r}).{fn}; f.argtypes = [ctypes.c_void_p]; f(ctypes.c_void_p(8))"
        proc = subprocess.run([sys.executable, "-c", code], env=with_preload(dict(os.environ), build_preload(CRASH_HOOK)), capture_output=True, text=True)
        assert proc.returncode == -11
        stacks[fn] = stack_line(proc.stderr)
        assert stacks[fn].startswith(f"C stack: {fn}"), proc.stderr[-2000:]
    sigs = {LLAMA_CHECKS["llama-no-abort"](STEADY, LlamaTrace((), LlamaAbort(0, "crash", f"the worker was killed by SIGSEGV\n{s}")))[0].signature()
            for s in stacks.values()}
    assert len(sigs) == 2
    sc = Scenario.from_json(json.loads((Path(__file__).parents[2] / "corpus" / "no-abort-during-compute-kind-crash-message-the-worker-was-ki-01b07046ee.json").read_text())["scenario"])
    graph = {no_abort(sc, Trace((), Abort(0, "crash", f"the worker was killed by SIGSEGV\n{s}")), Trace(()))[0].signature() for s in stacks.values()}
    assert len(graph) == 2


@pytest.mark.engine
def test_graph_sizes_follow_ggml_through_every_split_graph(target) -> None:
    """llama.cpp's fused-op probes call ggml_backend_sched_split_graph themselves; the hook sees
    them, so each record's previous graph size is the one ggml keeps (``debug_prev_graph_size``),
    and the first same-size reallocation is the call ggml's own check aborts in."""
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    auto = replace(STEADY, ctx=replace(STEADY.ctx, flash_attn="auto"))
    trace = llama_trace(target.run(auto))
    init = trace.calls[0].sched
    assert [s.kind for s in init if s.kind in ("split", "reserve")][:1] == ["split"]  # a probe, before the reservations
    last: dict[int, int] = {}
    for _, s in trace.sched_calls():
        if s.kind in ("split", "reserve", "reserve_size", "alloc"):
            assert s.prev_graph_size == last.get(s.sched, 0), s
            last[s.sched] = s.graph_size
    found = [load_case(p) for p in sorted((Path(__file__).parents[2] / "corpus").glob("llama-no-same-size-realloc-*.json"))]
    cases = [c.llama for c in found if c.off_build(target.start()["ggml_version"], "available") is None]  # this llama.cpp line's
    with LlamaTarget(debug_realloc=1) as strict:
        for w in cases:
            ours = [c.index for c in llama_trace(target.run(w)).calls for s in c.sched if s.same_size]
            assert ours[:1] == [llama_trace(strict.run(w)).abort.call]


def _observed(size: int, prev: int, ggml_size_changed: bool, n_same: int | None, n_diff: int | None, ids: bool = False) -> SchedCall:
    return replace(_alloc(0, size, prev, "backend ids changed" if ids else "node inp_embd is not valid", ids=ids),
                   ggml_ids_changed=ids, ggml_size_changed=ggml_size_changed, llama_n_same=n_same, llama_n_diff=n_diff)


def _counting_trace(*allocs: SchedCall) -> LlamaTrace:
    new = SchedCall("new", 0, max_nodes=1024, observes_realloc=True, owner_counts=True)
    return LlamaTrace((CallRecord(-1, "init", 0, (new, SchedCall("reserve", 0, n_nodes=10, graph_size=20))),
                       *(CallRecord(i, "decode", 0, (a,)) for i, a in enumerate(allocs))))


def test_counters_agree_holds_when_llama_cpp_counts_what_ggml_says() -> None:
    from pytest_schedfuzz.properties.llama_properties import llama_counters_agree

    trace = _counting_trace(_observed(22, 20, True, 0, 1), _observed(22, 22, False, 1, 1), _observed(22, 22, False, None, None, ids=True))
    assert llama_counters_agree(STEADY, trace) == []
    # the judged same-size decision is ggml's: the second realloc is one, the first is not
    assert [s.same_size for _, s in trace.sched_calls() if s.kind == "alloc"] == [False, True, False]


def test_counters_agree_catches_a_llama_cpp_that_miscounts_or_stays_silent() -> None:
    """Planted faults of the seeds' llama.cpp: it counts a same-size realloc as changed, or
    traces nothing for a realloc it should count."""
    from pytest_schedfuzz.properties.llama_properties import llama_counters_agree

    (v,) = llama_counters_agree(STEADY, _counting_trace(_observed(22, 20, True, 0, 1), _observed(22, 22, False, 0, 2)))
    assert v.signature() == "llama-counters-agree[what=counters]" and v.step == 1
    assert "llama.cpp counts n_same = 0, n_diff = 2; the harness counts n_same = 1, n_diff = 1" in v.message
    (v,) = llama_counters_agree(STEADY, _counting_trace(_observed(22, 22, False, None, None)))
    assert "llama.cpp traced nothing" in v.message


def test_counters_agree_catches_a_derived_graph_size_that_ggml_contradicts() -> None:
    """The harness's graph-size formula says same size where ggml's callback says changed: the
    formula (the reference's rule for this version) is wrong, and the finding says so."""
    from pytest_schedfuzz.properties.llama_properties import llama_counters_agree

    (v,) = llama_counters_agree(STEADY, _counting_trace(_observed(22, 22, True, 0, 1)))
    assert v.signature() == "llama-counters-agree[what=graph-size]"
    assert "graph_size_changed = 1" in v.message and "graph_size 22 (prev 22)" in v.message


def test_reuse_sound_judges_every_parameter_the_seeds_llama_cpp_asked_for() -> None:
    """On the seeds' build the asked parameters are observed (its sched_new line): a parallel
    scheduler kept for the fallback without pipeline parallelism is caught as such."""
    new = SchedCall("new", 0, max_nodes=1024, parallel=True, op_offload=True)
    asked = SchedCall("sched_params", -1, max_nodes=1024, parallel=False, op_offload=True)
    trace = LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("sched_params", -1, max_nodes=1024, parallel=True, op_offload=True), new,
                                                   SchedCall("reserve", 0), asked, SchedCall("reuse", 0, max_nodes=1024, current_max_nodes=1024),
                                                   SchedCall("reserve", 0))),))
    (v,) = llama_reuse_sound(STEADY, trace)
    assert v.signature() == "llama-reuse-sound[why=parallel]" and "parallel True" in v.message


LORA_W = LlamaWorkload(
    ModelSpec(n_layer=2), Devices(n_rpc=1), ContextParams(n_seq_max=1),
    (decode((0, 8, "last")), Call("lora_load", adapter=0), Call("lora_set", adapters=1), decode((0, 1, "last")),
     Call("lora_set", adapters=0), Call("lora_free", adapter=0), Call("lora_set", adapters=0), decode((0, 1, "last"))),
)


def test_lora_workloads_round_trip_and_invalid_adapter_calls_are_refused() -> None:
    from pytest_schedfuzz.model.llama_model import LoraSpec

    w = replace(LORA_W, loras=(LoraSpec(rank=2, targets=("attn_q", "ffn_up")),))
    assert LlamaWorkload.from_json(w.to_json()) == w
    for calls, needle in (
        ((Call("lora_set", adapters=1),), "attaches adapters that are not loaded"),
        ((Call("lora_load", adapter=0), Call("lora_set", adapters=1), Call("lora_free", adapter=0)), "adapter 0 is attached to the context"),
        ((Call("lora_free", adapter=0),), "adapter 0 is not loaded"),
        ((Call("lora_load", adapter=1),), "adapter 1: the workload has 1"),
    ):
        with pytest.raises(WorkloadError, match=needle):
            replace(w, calls=calls).validate()
    with pytest.raises(WorkloadError, match="attention only for a moe model"):
        replace(w, model=MOE, loras=(LoraSpec(targets=("ffn_up",)),)).validate()


@pytest.mark.engine
def test_a_lora_adapter_written_with_gguf_loads_and_raises_max_nodes_by_six_per_weight(target) -> None:
    """llama.cpp counts a loaded adapter in the worst case of the model's contexts (6 nodes per
    adapted weight) at the next reservation, which attaching it triggers; freed, it is gone from
    the next one; the worker frees what a workload leaves loaded, so the next workload on the
    cached model starts without it."""
    from pytest_schedfuzz.model.llama_model import LoraSpec

    lora = LoraSpec(rank=2, targets=("attn_q", "ffn_up"))
    w = replace(LORA_W, loras=(lora,))
    for _ in range(2):
        trace = llama_trace(target.run(w))
        assert trace.abort is None and all(c.rc == 0 for c in trace.calls)
        asked = [s.max_nodes for _, s in trace.sched_calls() if s.kind == "sched_reserve"]
        assert asked == [1024, 1024 + 6 * lora.n_weights(w.model), 1024]
        assert all(check(w, trace) == [] for check in LLAMA_CHECKS.values())


@pytest.mark.engine
def test_an_adapter_that_failed_to_load_is_a_refused_call_then_a_refused_free(target, tmp_path, monkeypatch) -> None:
    """A lora_load llama.cpp refuses leaves nothing to free: the lora_free after it is refused too,
    not a harness error (a ci run under xdist met one: the worker raised a KeyError)."""
    from pytest_schedfuzz.model.llama_model import LoraSpec

    bad = tmp_path / "not-an-adapter.gguf"
    bad.write_bytes(b"GGUF, but not really")
    monkeypatch.setattr("pytest_schedfuzz.llama.llama_target.write_lora", lambda *a: bad)
    w = replace(LORA_W, loras=(LoraSpec(),), calls=(Call("lora_load", adapter=0), Call("lora_free", adapter=0), decode((0, 1, "last"))))
    trace = llama_trace(target.run(w))
    assert trace.abort is None
    load, free, dec = [c for c in trace.calls if 0 <= c.index < 3]
    assert "llama_adapter_lora_init failed" in str(load.rc) and free.rc == "adapter 0 is not loaded: its lora_load failed" and dec.rc == 0


def test_an_rpc_failure_in_llama_cpp_is_signed_by_how_the_server_failed_or_what_changed_before() -> None:
    """The RPC client says the same for every server failure; a server that died says how, and
    one that refused a command is told apart by the last call that changed the devices' contents
    (a LoRA adapter freed, a sampler set...), so two causes never share a signature."""
    rpc = "ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed response"
    w = replace(LORA_W, calls=(decode((0, 1, "last")), Call("lora_load", adapter=0), decode((0, 1, "last")), Call("lora_free", adapter=0), decode((0, 1, "last"))))
    (refused,) = LLAMA_CHECKS["llama-no-abort"](w, LlamaTrace((), LlamaAbort(4, "abort", rpc)))
    assert refused.facts["server"] == "refused after lora_free"
    (died,) = LLAMA_CHECKS["llama-no-abort"](w, LlamaTrace((), LlamaAbort(4, "abort", rpc + "\nRPC server 127.0.0.1:1 was killed by SIGSEGV")))
    assert died.facts["server"] == "was killed by SIGSEGV" and died.signature() != refused.signature()
    (first,) = LLAMA_CHECKS["llama-no-abort"](w, LlamaTrace((), LlamaAbort(0, "abort", rpc)))
    assert first.facts["server"] == "refused after -"


def test_a_kernel_assert_is_one_signature_whichever_process_ran_the_device() -> None:
    """A ggml kernel's assert that kills the worker (the CPU, a GPU-like device) and the same
    assert killing an RPC server (the client then aborts) are one cause: split mode tensor's NaN
    kept by the meta backend's SCALE-by-0 asserts in fused RMS_NORM on whichever devices were
    drawn. A ``GGML_ASSERT`` in a server is signed as the worker's abort would be; a server killed
    without an assert (a segfault) keeps how it died, and a different assert stays apart."""
    norm = ("/b/ggml/src/ggml-cpu/ops.cpp:4150: void ggml_compute_forward_rms_norm_f32(const ggml_compute_params*, ggml_tensor*, ggml_tensor*) "
            "[with ggml_rms_norm_fuse_op FUSE_OP = GGML_RMS_NORM_FUSE_OP_MUL]: Assertion `scale > 0.0f' failed.")
    rpc = "/b/ggml/src/ggml-rpc/ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed response"

    def signed(kind: str, message: str, servers: tuple[str, ...] = (), phase: str = "") -> Violation:
        (v,) = LLAMA_CHECKS["llama-no-abort"](STEADY, LlamaTrace((), LlamaAbort(1, kind, message, phase=phase, servers=servers)))
        return v

    worker = signed("crash", f"the worker was killed by SIGABRT\npython: {norm}")
    server = signed("abort", f"{rpc}\nRPC server 127.0.0.1:1 was killed by SIGABRT; its last output:\nschedfuzz-rpc-server: {norm}",
                    ("127.0.0.1:1: killed by SIGABRT",), phase="compute")
    assert worker.signature() == server.signature() and server.facts["kind"] == "crash" and "server" not in server.facts
    assert "Remote RPC server crashed" in server.message  # what the client said stays in the message
    ggml_assert = "/b/ggml/src/ggml.c:1700: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed"
    in_worker = signed("abort", ggml_assert, phase="compute")
    in_server = signed("abort", f"{rpc}\nRPC server 127.0.0.1:1 was killed by SIGABRT; its last output:\nschedfuzz-rpc-server: {ggml_assert}",
                       ("127.0.0.1:1: killed by SIGABRT",), phase="compute")
    assert in_worker.signature() == in_server.signature() != worker.signature()
    segv = signed("abort", f"{rpc}\nRPC server 127.0.0.1:1 was killed by SIGSEGV", ("127.0.0.1:1: killed by SIGSEGV",), phase="compute")
    assert segv.facts["server"] == "was killed by SIGSEGV" and segv.signature() != server.signature()



def test_an_rpc_refusal_is_signed_by_the_command_the_server_refused_whatever_came_before() -> None:
    """A server that refused a command (``RpcServers.refusals``: the command it closed the
    connection after, and ggml's words where it logged any) signs the failure by the command: one
    cause reached after a lora_free or a seq_rm, on a build that names the command (its source on
    disk) or one whose server says only its number and the method that refused, noticed by the
    client in llama.cpp's code or in a compute, is one signature; the server's words stay in the
    message."""
    rpc = "ggml-rpc.cpp:686: Remote RPC server crashed or returned malformed response"
    silent = ("127.0.0.1:5: schedfuzz-rpc-server: closed the connection after command GRAPH_RECOMPUTE",)
    numbered = ("127.0.0.1:5: [comm_init] device 0 joined pairwise comm as rank 0",  # b11739's server, split mode tensor: not why
                "127.0.0.1:5: [graph_recompute] device: 0, graph with uid 67 not found",
                "127.0.0.1:5: schedfuzz-rpc-server: closed the connection after command 16")
    signs = set()
    for before, said in ((Call("lora_free", adapter=0), silent), (Call("seq_rm", n_drop=1), numbered)):
        w = replace(LORA_W, calls=(decode((0, 1, "last")), Call("lora_load", adapter=0), decode((0, 1, "last")), before, decode((0, 1, "last"))))
        for phase in ("llama.cpp", "compute"):  # where the client noticed it: 0.3.36's and b11739's
            (v,) = LLAMA_CHECKS["llama-no-abort"](w, LlamaTrace((), LlamaAbort(4, "abort", rpc, refused=said, phase=phase)))
            assert v.facts["server"] == "refused GRAPH_RECOMPUTE" and said[0].split(": ", 1)[1] in v.message
            signs.add(v.signature())
        signs.add(v.signature())
    assert len(signs) == 1
    other = ("127.0.0.1:5: schedfuzz-rpc-server: closed the connection after command SET_TENSOR",)
    (v,) = LLAMA_CHECKS["llama-no-abort"](w, LlamaTrace((), LlamaAbort(4, "abort", rpc, refused=other)))
    assert v.facts["server"] == "refused SET_TENSOR" and v.signature() not in signs


def test_a_llama_cpp_crash_or_timeout_counts_only_if_a_fresh_worker_sees_it_again(tmp_path: Path) -> None:
    """As for the graph engine: a timeout is run again with five times the call timeout (a
    loaded machine passes, a hang does not), a crash again on a fresh worker, up to
    ``confirm_runs`` times (one that comes back only on the third replay is still a finding);
    what never comes back is counted as unconfirmed, kept as a case the summary lists, and the
    last fresh run, captured as the first one was, is what is judged."""
    from pytest_schedfuzz.campaign.engines import CONFIRM_TIMEOUT_FACTOR
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.profiles import FuzzConfig
    from pytest_schedfuzz.properties import LLAMA_GROUP

    class Flaky:
        """A llama.cpp target whose workload fails on its first run and again on run ``back`` (0: never)."""

        def __init__(self, kind: str, back: int) -> None:
            self.call_timeout, self.kind, self.back, self.seen = 60.0, kind, back, []
            self.captured: list[bool] = []
            self.fresh_workers = 0

        def fresh(self) -> None:
            self.fresh_workers += 1

        def run(self, w: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile=None, on_graph=None) -> LlamaTrace:
            self.seen.append(self.call_timeout)
            self.captured.append(capture)
            if len(self.seen) in (1, self.back):
                return LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)),), LlamaAbort(0, self.kind, "gone"))
            return LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "decode", 0, ())))

    for kind, comes_back in (("timeout", (0, 2)), ("crash", (0, 2, 4))):
        for back in comes_back:  # never, on the first replay, on the third (a timeout: one patient replay decides)
            fuzzer = Fuzzer(FuzzConfig(database=None))
            fuzzer.engines._llama = flaky = Flaky(kind, back)
            found = fuzzer.check_llama("llama-no-abort", replace(STEADY, calls=STEADY.calls[:1]))
            assert bool(found) == bool(back) and fuzzer.stats.unconfirmed == (not back)
            replays = back - 1 if back else 1 if kind == "timeout" else fuzzer.config.confirm_runs
            assert flaky.seen == [60.0] + [60.0 * (CONFIRM_TIMEOUT_FACTOR if kind == "timeout" else 1)] * replays and flaky.call_timeout == 60.0
            assert flaky.fresh_workers == replays - 1  # after an abort the target starts one itself; after a clean run it is asked to
    # judged by every llama property: the rerun is captured too (llama-matches-reference judges it);
    # the crash that did not come back is a case in .schedfuzz/unconfirmed/, listed by the summary
    fuzzer = Fuzzer(FuzzConfig(database=tmp_path / "examples", confirm_runs=1))
    fuzzer.engines._llama = flaky = Flaky("crash", 0)
    fuzzer.check_llama(LLAMA_GROUP, replace(STEADY, calls=STEADY.calls[:1]))
    assert flaky.captured == [True, True]
    (kept,) = (tmp_path / "unconfirmed").glob("*.json")
    case = load_case(kept)
    assert case.llama is not None and case.signature == "unconfirmed crash" and str(kept) in "\n".join(fuzzer.stats.summary_lines())


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(llama_workloads(families=("mamba2", "hybrid")))
def test_recurrent_workloads_are_valid_round_trip_and_never_drop_positions(w: LlamaWorkload) -> None:
    w.validate()
    assert LlamaWorkload.from_json(w.to_json()) == w
    if w.model.kind in ("mamba2", "hybrid"):
        assert not any(c.kind == "shift" or (c.kind == "seq_rm" and c.n_drop > 0) for c in w.calls) and not w.loras


def test_a_partial_rollback_of_a_recurrent_model_is_refused_and_a_restore_needs_a_checkpoint() -> None:
    mamba = ModelSpec(kind="mamba2", arch="mamba2", n_layer=1, n_embd=16, n_head=1, n_head_kv=1, n_ff=32)
    for calls, field in (((decode((0, 4, "last")), Call("seq_rm", seq=0, n_drop=2)), "cannot drop"), ((Call("shift", seq=0, n_discard=2),), "cannot drop"),
                         ((Call("restore", seq=0),), "no checkpoint")):
        with pytest.raises(WorkloadError, match=field):
            LlamaWorkload(mamba, Devices(n_rpc=1), ContextParams(), calls).validate()


@pytest.mark.engine
def test_each_model_family_decodes_and_a_draft_on_a_recurrent_model_is_rolled_back_by_its_checkpoint(target, no_module_constants: None) -> None:
    """Mamba-2, the hybrids (LFM2's among them) and glm4moe with its MTP layer beside the dense and MoE llamas: 80
    drawn workloads of every family decode, speculative steps among them; a rejected draft on a recurrent model is restored from its checkpoint (the call
    llama.cpp accepts) and its accepted tokens decoded again."""
    from hypothesis import Phase, seed

    from pytest_schedfuzz.campaign.stats import Stats
    from pytest_schedfuzz.properties.llama_properties import unmade_calls
    from pytest_schedfuzz.strategies.llama_workloads import FAMILIES

    stats = Stats()

    @seed(8)  # (without the modules' constants) one whose 80 draws decode each family and call kind twice (re-picked for LFM2)
    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
    @given(llama_workloads(limits=DeviceLimits.of(rpc=1, gpu=2), families=FAMILIES))
    def run(w: LlamaWorkload) -> None:
        trace = llama_trace(target.run(w))
        stats.add_llama(w, trace)
        assert unmade_calls(w, trace) == [], w.describe()

    run()
    for shown in (*(f"model {f}" for f in FAMILIES), "call checkpoint", "call restore", "call spec"):
        assert stats.llama_decoded.get(shown, 0) >= 2, (shown, stats.llama_explored.get(shown))



@pytest.mark.engine
def test_a_switch_beside_the_point_is_not_named_and_a_causal_one_is(target) -> None:
    """A lost reservation names the last switch before its re-plan only where the re-plan goes
    away without it: the Mamba-2 fewer-sequences cause, found after set_warmup(true), after
    set_warmup(false), after four set_warmup(false) and (on a hybrid model) after set_causal_attn(false), is one signature;
    the MoE warmup cause keeps its set_warmup(true), and a known signature costs no rerun."""
    from pytest_schedfuzz.campaign.causes import switches_told_apart

    corpus = Path(__file__).parents[2] / "corpus"
    run = lambda w: llama_trace(target.run(w))  # noqa: E731

    def signed(stem: str, known: frozenset[str] = frozenset()) -> tuple[set[str], int]:
        case = load_case(next(corpus.glob(f"*{stem}.json")))
        w = case.llama
        found, reruns = switches_told_apart(w, LLAMA_CHECKS["llama-no-same-size-realloc"](w, run(w)), run, known)
        return {v.signature() for v in found if v.step == case.step and v.facts["explained"] == "lost"}, reruns

    fewer = [signed(stem) for stem in ("ca9df62f29", "87a7749a6a", "6fb9783016")]
    assert all(n >= 1 for _, n in fewer)
    (sig,) = set.union(*(s for s, _ in fewer))
    assert "lost_by=decode: not valid," in sig
    # four switches before the re-plan, none the cause: all dropped at once (one at a time, at
    # most three, left the fourth named: the fresh-clone CI's finding)
    assert signed("0fdcfd8c09")[0] == {"llama-no-same-size-realloc[explained=lost,lost_by=decode: not valid,topology=same]"}
    (warmup,), n = signed("b0395baaa3")
    assert n >= 1 and "lost_by=decode after set_warmup(true)" in warmup
    # a recurrent state row gather that no input outgrew (the Debug build names the node in the message)
    with_switch = "llama-no-same-size-realloc[explained=lost,lost_by=decode after set_warmup(true): not valid,topology=same]"
    case = load_case(next(corpus.glob("*ca9df62f29.json")))
    assert case.llama is not None
    every = frozenset(v.signature() for v in LLAMA_CHECKS["llama-no-same-size-realloc"](case.llama, run(case.llama)))  # as first signed
    assert with_switch in every and signed("ca9df62f29", every) == ({with_switch}, 0)  # known signatures cost no rerun


@pytest.mark.engine
def test_a_switch_before_a_topology_switch_of_the_batch_is_not_named(target) -> None:
    """LFM2 with ``n_rs_seq`` 1 writes ``min(n_tokens, n_rs_seq + 1)`` state snapshots, so a
    one-token ubatch has three nodes fewer than the reserved graph: a topology switch by the batch
    (``switch by tokens``). A ``set_causal_attn`` made before it changes no graph: the rerun
    without it shows the same switch, and it is not named (before, the rerun's ``switch by
    tokens`` against the first signing's ``switch`` kept every switch named)."""
    from pytest_schedfuzz.campaign.causes import switches_told_apart

    one, two, three = ({"kind": "decode", "parts": [{"seq": 0, "n_tokens": n, "outputs": "last"}]} for n in (1, 2, 3))
    w = LlamaWorkload.from_json({
        "model": {"arch": "lfm2", "attn_layers": [0], "kind": "lfm2", "n_ctx_train": 4096, "n_embd": 16, "n_expert": 0, "n_expert_used": 0,
                  "n_ff": 32, "n_head": 1, "n_head_kv": 1, "n_layer": 2, "seed": 0, "ssm_conv": 3},
        "devices": {"n_gpu_layers": 0, "n_rpc": 0},
        "ctx": {"n_rs_seq": 1, "n_batch": 8, "n_ubatch": 8, "n_ctx": 256, "n_seq_max": 1, "flash_attn": "off", "offload_kqv": True,
                "op_offload": False, "type_k": "f16", "type_v": "f16", "sampler_chain": "greedy", "backend_samplers": False,
                "kv_unified": False, "embeddings": False, "pooling": "none"},
        "calls": [two, {"kind": "set_causal_attn"}, one, two, three]})
    run = lambda w: llama_trace(target.run(w))  # noqa: E731
    lost = [v for v in LLAMA_CHECKS["llama-no-same-size-realloc"](w, run(w)) if v.facts.get("explained") == "lost"]
    assert lost and lost[0].facts["lost_by"].startswith("decode after set_causal_attn(false)") and lost[0].facts["topology"] == "switch"
    found, reruns = switches_told_apart(w, lost, run, frozenset())
    assert reruns >= 1 and found[0].facts["lost_by"].startswith("decode: ") and found[0].facts["topology"] == "switch by tokens"


@pytest.mark.engine
def test_speculative_servers_draft_verify_and_roll_back_in_both_contexts(target) -> None:
    """Workloads of the MTP family alone (issue 47): an MTP draft context beside the target,
    speculative steps drafted there or from n-gram tables, rolled back, the MTP layer on a
    device of its own, and the draft on a model of its own (on one device, or on the target's
    with -ngld), each reached by workloads that decoded; every call made, and the draft
    context's schedulers told apart from the target's."""
    from hypothesis import Phase, seed

    from pytest_schedfuzz.campaign.stats import Stats
    from pytest_schedfuzz.properties.llama_properties import unmade_calls

    stats, contexts = Stats(), set()

    @seed(3)  # one whose 60 draws reach each speculative dimension (re-picked when drafts got a model of their own)
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
    @given(llama_workloads(limits=DeviceLimits.of(rpc=2), families=("mtp",)))
    def run(w: LlamaWorkload) -> None:
        trace = llama_trace(target.run(w))
        stats.add_llama(w, trace)
        assert unmade_calls(w, trace) == [], w.describe()
        contexts.update(s.context for _, s in trace.sched_calls())

    run()
    for shown in ("model mtp", "draft mtp (an MTP context)", "speculative steps, draft mtp", "speculative steps, n-gram drafts",
                  "speculative steps rolled back", "draft mtp, its layer on a device of its own (-ot blk.N.)",
                  "draft mtp on a draft model of its own, on one device (--spec-draft-devices)",
                  "draft mtp on a draft model of its own, the target's devices (-ngld)"):
        assert stats.llama_decoded.get(shown, 0) >= 1, (shown, stats.llama_explored.get(shown))
    assert contexts == {0, 1}



def test_a_speculative_step_is_signed_as_the_decode_it_makes() -> None:
    """A lost reservation or an abort in a speculative step is signed ``decode`` (llama.cpp sees
    the batches it decodes: a known cause stays one signature); its message names the step."""
    from pytest_schedfuzz.properties.llama_replan import call_kind, replan_trigger

    w = LlamaWorkload(ModelSpec(), Devices(n_rpc=1), ContextParams(n_batch=32, n_outputs_max=8, n_outputs_max_per_seq=4),
                      (Call("decode", (Part(0, 8, "last"),)), Call("spec", seq=0, n_draft=2, accept=1)))
    w.validate()
    assert call_kind(w, 1) == "decode" and replan_trigger(w, 0, 1) == ("decode", None)
    assert "speculative step(seq 0: draft 2, verify 3, accept 1)" in w.calls[1].describe()
