"""No verdict without evidence: values that are not numbers, versions that cannot be read, known
bugs that must not hide another root cause. Pure checks; the engine-backed ones sit beside the
engine they need (``tests/llama``, ``tests/campaign``)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from pytest_schedfuzz.builds.compile import source_tree
from pytest_schedfuzz.campaign.known import KnownBugs
from pytest_schedfuzz.campaign.stats import Stats
from pytest_schedfuzz.cases.corpus import STARTER_CORPUS, Case, case_files, load_case
from pytest_schedfuzz.ggml.cpu_values import difference
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_trace import CallRecord, LlamaAbort, LlamaTrace, SchedCall
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, Part
from pytest_schedfuzz.model.shapes import Geometry
from pytest_schedfuzz.model.trace import Abort, Trace
from pytest_schedfuzz.properties.aborts import no_abort
from pytest_schedfuzz.properties.llama_logits import logits_difference
from pytest_schedfuzz.properties.llama_properties import llama_no_abort, llama_reuse_complete, llama_reuse_sound, scheduler_reuses
from pytest_schedfuzz.properties.realloc import no_same_size_realloc
from pytest_schedfuzz.properties.sites import check_site
from pytest_schedfuzz.sim.driver import Driver, can_reuse
from reference.predict import predict

NAN, INF = math.nan, math.inf


def test_logits_that_are_not_numbers_differ_where_the_cpu_has_numbers() -> None:
    cpu = [0.5, -1.0, 2.0]
    assert logits_difference(cpu, cpu) is None
    assert logits_difference([NAN, -1.0, 2.0], cpu) == (0, "nan")
    assert logits_difference([0.5, -1.0, NAN], cpu) == (2, "nan")
    assert logits_difference([NAN, NAN, NAN], cpu) == (0, "nan")
    assert logits_difference([0.5, INF, 2.0], cpu) == (1, "inf")
    assert logits_difference([0.5, -1.0, -INF], [0.5, -1.0, INF]) == (2, "inf")
    # the same NaN pattern on both sides agrees; another pattern does not
    assert logits_difference([NAN, 1.0], [NAN, 1.0]) is None
    assert logits_difference([NAN, 1.0], [1.0, NAN]) == (0, "nan")
    # a finite difference within the tolerance agrees, beyond it does not
    assert logits_difference([0.5005, -1.0, 2.0], cpu) is None
    assert logits_difference([0.5, -1.0, 2.1], cpu) == (2, "finite")
    assert logits_difference([0.5], cpu) == (0, "count")


def _bytes(values: list[float]) -> bytes:
    return np.asarray(values, np.float32).tobytes()


def test_same_values_catches_nan_and_inf_and_agrees_on_the_cpus_own_nan() -> None:
    geo = Geometry("f32", (3, 1, 1, 1), (4, 12, 12, 12))
    want = _bytes([1.0, NAN, 3.0])
    for tolerant in (False, True):
        assert "flat index 0" in difference("t", geo, _bytes([NAN, NAN, 3.0]), want, tolerant)
        assert "flat index 2" in difference("t", geo, _bytes([1.0, NAN, INF]), want, tolerant)
        assert "flat index 1" in difference("t", geo, _bytes([1.0, 2.0, 3.0]), want, tolerant)
        # another NaN payload where the CPU alone has NaN: the same result
        other_nan = np.frombuffer(want, np.uint32).copy()
        other_nan[1] = 0x7FC00001
        assert difference("t", geo, other_nan.tobytes(), want, tolerant) == ""


def test_a_version_that_cannot_be_read_expects_no_bounded_known_bug() -> None:
    """ggml 0.15.3's bounded bugs (fixed in 0.25.3) are expected there and not on 0.25.3; on a build
    whose version cannot be read, none of them is assumed; the header says how many."""
    def known_on(version: str | None) -> tuple[KnownBugs, set[str]]:
        known = KnownBugs(Stats(), lambda llama: version)
        known.learn(STARTER_CORPUS)
        return known, known.expected(False)

    bounded = {c.signature for c in _starter_cases() if c.llama is None and {"since", "fixed_in"} & set(c.expect or {})}
    unbounded = {c.signature for c in _starter_cases() if c.llama is None and c.expected_failure is not None} - bounded
    assert bounded and unbounded
    _, old = known_on("0.15.3")
    assert bounded <= old
    for version in ("unknown (the library has no ggml_version())", None, "master"):
        known, expected = known_on(version)
        assert not (bounded & expected) and unbounded <= expected, version
        note = known.unknown_version_note(False)
        assert note is not None and "cannot be read" in note and "recorded for some ggml versions only are not expected" in note
    assert known_on("0.25.3")[0].unknown_version_note(False) is None


def _starter_cases() -> list[Case]:
    known = KnownBugs(Stats(), lambda llama: "0.25.3")
    known.learn(STARTER_CORPUS)
    return known.cases


def _assert_lines(source: Path, check: str) -> list[int]:
    return [k for k, line in enumerate(source.read_text().splitlines(), 1) if line.strip() == check]


def test_two_sites_of_one_assert_text_are_two_findings() -> None:
    """ggml-backend.cpp has fifteen ``GGML_ASSERT(buffer)``: the signature keeps the function of the
    check (read from the build's source at the line ggml printed), so two sites are two findings,
    while the same site at another line (another ggml version) stays one."""
    source = source_tree("ggml-0.25.3") / "src" / "ggml-backend.cpp"
    lines = _assert_lines(source, "GGML_ASSERT(buffer);")
    assert len(lines) >= 2
    case = load_case(next(p for p in case_files(STARTER_CORPUS) if "ggml-assert-buf" in p.name))
    assert case.scenario is not None

    def signed(line: int, path: Path = source) -> str:
        abort = Abort(case.step, "abort", f"{path}:{line}: GGML_ASSERT(buffer) failed")
        (v,) = no_abort(case.scenario, Trace((), abort), Trace(()))  # type: ignore[arg-type]
        return v.signature()

    first, second = signed(lines[0]), signed(lines[1])
    assert first != second and "site=ggml_backend_buffer_get_size" in first, (first, second)
    old = source_tree("ggml-0.15.3") / "src" / "ggml-backend.cpp"
    usage = [k for k in _assert_lines(old, "GGML_ASSERT(buffer);") if "ggml_backend_buffer_get_usage" in check_site(f"{old}:{k}: x")]
    new_usage = [k for k in lines if "ggml_backend_buffer_get_usage" in check_site(f"{source}:{k}: x")]
    assert usage and new_usage and usage != new_usage
    assert signed(usage[0], old) == signed(new_usage[0]) == case.signature
    # where the source is not on disk, no site (a line alone would split one bug across builds)
    assert "site=" not in signed(128, Path("/nowhere/ggml-backend.cpp"))


def test_checks_that_differ_by_an_index_or_sit_in_named_lambdas_are_told_apart(tmp_path: Path) -> None:
    """ggml-backend-meta.cpp keeps a lambda per op inside one function, and two of its checks differ
    only in an index (``src_ss[1]``, ``src_ss[2]``), which a signature writes as N: the site names
    the lambda, and counts checks as the signature writes them, so the three are three sites."""
    from pytest_schedfuzz.properties.sites import site_key

    source = tmp_path / "ggml-backend-meta.cpp"
    source.write_text("""static int get_split_state(const int * t) {
    auto handle_mul_mat = [&](const int * src_ss) -> int {
        if (src_ss[0] == 0) {
            GGML_ASSERT(split_states_equal(src_ss[0], src_ss[1]));
        }
        GGML_ASSERT(split_states_equal(src_ss[0], src_ss[1]));
        return 0;
    };
    auto handle_set_rows = [&](const int * src_ss) -> int {
        GGML_ASSERT(split_states_equal(src_ss[0], src_ss[2]));
        return 0;
    };
    GGML_ASSERT(split_states_equal(t[0], t[1]));
    return handle_mul_mat(t) + handle_set_rows(t);
}
""")
    sites = [site_key(f"{source}:{line}: GGML_ASSERT(...) failed") for line in (4, 6, 10, 13)]
    assert sites == ["get_split_state/handle_mul_mat", "get_split_state/handle_mul_mat#2", "get_split_state/handle_set_rows",
                     "get_split_state"], sites


def test_llama_aborts_are_signed_by_call_phase_and_site() -> None:
    """The same assert text in the context's constructor and in a decode, or in its reserve and its
    compute, are different root causes."""
    w = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=1), ContextParams(n_seq_max=1), (Call("decode", (Part(0, 4, "last"),)),))
    source = source_tree("llama.cpp-0.3.36") / "ggml" / "src" / "ggml.c"
    line = next(k for k, text in enumerate(source.read_text().splitlines(), 1) if "GGML_ASSERT(ggml_can_mul_mat(a, b))" in text)
    message = f"{source}:{line}: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed"

    def signed(call: int, phase: str) -> str:
        (v,) = llama_no_abort(w, LlamaTrace((), LlamaAbort(call, "abort", message, phase=phase)))
        return v.signature()

    at_init = signed(-1, "llama.cpp")
    assert at_init == ("llama-no-abort[call=init,kind=abort,message=ggml.c: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed,"
                       "phase=llama.cpp,site=ggml_mul_mat]")
    assert len({at_init, signed(0, "llama.cpp"), signed(0, "reserve"), signed(0, "compute")}) == 4
    # split mode tensor's meta device names its tensors after the devices drawn, and the model names
    # them (or leaves ggml's node_N): one check is one signature for any of them
    meta = "/build/ggml/src/ggml-backend-meta.cpp:605: unsupported mul_mat split states: node={} src0=blk.0.attn_output.weight axis=0 src1={} axis=10"
    names = [(node, src) for node in ("attn_out-0", "node_23") for src in ("Meta(RPC0,RPC1,GPU0,GPU1)#kqv_out-0#0", "Meta(RPC0,GPU0)#kqv_out-0#0", "kqv_out-0")]
    signed_as = {v.signature() for node, src in names for v in llama_no_abort(w, LlamaTrace((), LlamaAbort(0, "abort", meta.format(node, src), phase="alloc")))}
    assert signed_as == {"llama-no-abort[call=decode,kind=abort,message=ggml-backend-meta.cpp: unsupported mul_mat split states: "
                         "node=(tensor) srcN=(tensor) axis=N srcN=(tensor) axis=N,phase=alloc]"}


def test_a_reuse_is_seen_from_the_scheduler_objects_without_its_log_line() -> None:
    """On the seeds' build llama.cpp logs what its sched_new asks for and each reuse; a kept
    scheduler whose reuse line is missing is still a reuse (the next reserve used the same
    scheduler object): it is judged against can_reuse, and the missing line is reported."""
    w = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=1), ContextParams(n_seq_max=1), (Call("decode", (Part(0, 4, "last"),)),))
    new = SchedCall("new", 0, max_nodes=1024, parallel=False, op_offload=True)
    init = (SchedCall("sched_reserve", -1, max_nodes=1024), SchedCall("sched_params", -1, max_nodes=1024, op_offload=True), new, SchedCall("reserve", 0))
    asked = SchedCall("sched_params", -1, max_nodes=2048, op_offload=True)
    unlogged = LlamaTrace((CallRecord(-1, "init", 0, init), CallRecord(0, "decode", 0, (SchedCall("sched_reserve", -1, max_nodes=2048), asked,
                                                                                          SchedCall("reserve", 0)))))
    assert [(call, kept.sched, a.max_nodes) for call, kept, a in scheduler_reuses(unlogged)] == [(0, 0, 2048)]
    assert sorted(v.signature() for v in llama_reuse_sound(w, unlogged)) == ["llama-reuse-sound[why=log]", "llama-reuse-sound[why=max_nodes]"]
    # logged and kept: only the parameters are judged; rebuilt: no reuse at all
    logged = replace(unlogged, calls=(unlogged.calls[0], replace(unlogged.calls[1], sched=(*unlogged.calls[1].sched[:2],
                                                                  SchedCall("reuse", 0, max_nodes=2048, current_max_nodes=1024), SchedCall("reserve", 0)))))
    assert [v.signature() for v in llama_reuse_sound(w, logged)] == ["llama-reuse-sound[why=max_nodes]"]
    rebuilt = replace(unlogged, calls=(unlogged.calls[0], replace(unlogged.calls[1], sched=(*unlogged.calls[1].sched[:2],
                                                                   SchedCall("new", 1, max_nodes=2048, op_offload=True), SchedCall("reserve", 1)))))
    assert scheduler_reuses(rebuilt) == [] and llama_reuse_sound(w, rebuilt) == [] and llama_reuse_complete(w, rebuilt) == []


def test_an_engine_re_plan_between_reservation_and_finding_is_not_signed_as_the_known_loss() -> None:
    """no-same-size-realloc explains a lost reservation from the engine's own re-plans: where the
    engine re-planned in between and the reference predicts another re-plan there, the finding is
    the engine's (explained=engine), not the known op-offload loss (lost_by=compute changed)."""
    case = load_case(next(p for p in case_files(STARTER_CORPUS) if "lost-by-compute-changed" in p.name))
    scenario = Driver(can_reuse, rereserve=bool(case.options.get("rereserve", True))).scenario(case.workload) if case.workload else case.scenario
    assert scenario is not None
    prediction = predict(scenario)
    assert [v.signature() for v in no_same_size_realloc(scenario, prediction, prediction)] == [case.signature]
    (finding,) = no_same_size_realloc(scenario, prediction, prediction)
    first = next(e for e in prediction.events if e.step < finding.step and scenario.steps[e.step].kind != "reserve")
    # the engine's re-plan in between for another reason than the reference predicts there
    planted = Trace(tuple(replace(r, events=tuple(replace(e, reason="node planted-1 is not valid", backend_ids_changed=False) if e is first else e
                                                  for e in r.events)) for r in prediction.records))
    (v,) = no_same_size_realloc(scenario, planted, prediction)
    assert v.facts["explained"] == "engine" and v.facts["lost_by"].endswith("node planted-N") and "engine bug, in between" in v.message
