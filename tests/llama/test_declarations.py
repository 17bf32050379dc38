"""Each llama.cpp build through its own declarations (``llama/declarations.py``): 0.3.36 from the
headers llama-cpp-python installs, b11739 from its binding's cdef; a header that does not match
the library is refused; both builds run side by side."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.builds.names import UPSTREAM
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.capture import capture
from pytest_schedfuzz.cases.corpus import load_case
from pytest_schedfuzz.engine import TargetError
from pytest_schedfuzz.llama import declarations, upstream
from pytest_schedfuzz.llama.llama_target import LlamaTarget, default_lib_dir, resolve_lib_dir
from pytest_schedfuzz.llama.upstream import upstream_lib_dir
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.llama_workload import LlamaWorkload
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties.derived import graph_trace, llama_trace


def test_each_build_is_read_from_its_own_declarations() -> None:
    old, new = declarations.find(default_lib_dir()), declarations.find(upstream_lib_dir())
    assert old.source.endswith("include/llama.h") and new.source.endswith(declarations.CDEF_FILE)
    f_old, f_new = declarations.parse(old), declarations.parse(new)

    def fields(ffi, name: str) -> list[str]:
        return [f for f, _ in ffi.typeof(f"struct {name}").fields]

    # b11739 added the MoE cache's size in the middle of the context's parameters, and the
    # realloc counters at the end of its perf data
    assert "moe_cache_size" in fields(f_new, "llama_context_params") and "moe_cache_size" not in fields(f_old, "llama_context_params")
    assert (f_old.sizeof("struct llama_context_params"), f_new.sizeof("struct llama_context_params")) == (160, 168)
    assert fields(f_new, "llama_perf_context_data")[-2:] == ["n_reallocs_same", "n_reallocs_diff"]
    assert "n_reallocs_same" not in fields(f_old, "llama_perf_context_data")


def _check(lib: Path, decl_dir: Path) -> list[str]:
    """``check_bindings`` in a fresh process (it loads libllama)."""
    code = ("import sys; from pathlib import Path; from pytest_schedfuzz.llama import declarations as D; "
            "b = D.Bindings(D.parse(D.find(Path(sys.argv[2]))), sys.argv[1]); "
            "print(repr(D.check_bindings(b, ('llama_decode', 'llama_perf_context'))))")
    out = subprocess.run([sys.executable, "-c", code, str(lib / "libllama.so"), str(decl_dir)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 (our own repr)


def test_declarations_are_checked_against_the_library_both_ways() -> None:
    old, new = default_lib_dir(), upstream_lib_dir()
    assert _check(old, old) == [] and _check(new, new) == []
    # a header of another version: the struct the library writes is larger or smaller than declared
    assert _check(new, old) == ["llama_context_default_params writes a 168-byte struct llama_context_params; the declarations make it 160 bytes"]
    assert _check(old, new) == ["llama_context_default_params writes a 160-byte struct llama_context_params; the declarations make it 168 bytes"]


def test_a_field_the_build_does_not_have_is_an_error_not_a_python_attribute() -> None:
    ffi = declarations.parse(declarations.find(default_lib_dir()))
    b = declarations.Bindings(ffi, str(default_lib_dir() / "libllama.so"))
    params = b.llama_model_params()
    params.n_gpu_layers = 3
    assert params.n_gpu_layers == 3
    # llama-cpp-python's hand-written ctypes took this silently: 0.3.36 has load_mode, not use_mmap
    with pytest.raises(AttributeError, match="no field 'use_mmap'"):
        params.use_mmap = False
    assert isinstance(b.LLAMA_SPLIT_MODE_TENSOR, int) and not b.has("llama_no_such_function")
    assert ctypes.sizeof(b.llama_context_params) == 160


def test_a_name_is_parsed_once_per_bindings() -> None:
    """CFFI caches the types it parsed, not the names it failed to: a struct without a typedef
    (``struct llama_model_params``) failed as a typedef name first, a pycparser run at every use
    (a quarter of an MTP workload's worker time). Each name, found or not, costs one parse."""
    ffi = declarations.parse(declarations.find(default_lib_dir()))
    b = declarations.Bindings(ffi, str(default_lib_dir() / "libllama.so"))
    parsed: list[str] = []
    parse_type = ffi._parser.parse_type

    def counting(cdecl: str) -> object:
        parsed.append(cdecl)
        return parse_type(cdecl)

    ffi._parser.parse_type = counting
    first = [b.llama_model_params, b.has("llama_no_such_function"), b.LLAMA_SPLIT_MODE_TENSOR]
    n = len(parsed)
    assert n >= 2  # the typedef name failed, then "struct llama_model_params"
    assert [b.llama_model_params, b.has("llama_no_such_function"), b.LLAMA_SPLIT_MODE_TENSOR] == first
    assert len(parsed) == n, parsed[n:]


def test_a_worker_given_another_versions_header_refuses_to_run() -> None:
    target = LlamaTarget(UPSTREAM)
    target.declarations = declarations.find(default_lib_dir())  # 0.3.36's llama.h on b11739's libllama
    try:
        with pytest.raises(TargetError, match=r"(?s)do not match .*writes a 168-byte struct llama_context_params"):
            target.start()
    finally:
        target.close()


def test_no_declarations_is_a_usage_error_naming_where_they_were_looked_for(tmp_path: Path) -> None:
    for name in ("libllama.so", "libggml-base.so", "libggml-rpc.so", "libggml.so"):
        (tmp_path / name).symlink_to(upstream_lib_dir() / name)  # the libraries alone, without llama.cdef
    with pytest.raises(TargetError, match=r"no declarations of this build found: no llama\.h in .*include"):
        LlamaTarget(str(tmp_path))


# a context shift on one RPC device: the RoPE shift's graph puts its nodes elsewhere (a re-plan with
# backend ids changed, on both builds)
SHIFTED = {"model": {"arch": "llama", "kind": "dense", "n_layer": 2, "n_embd": 128, "n_head": 8, "n_head_kv": 4, "n_ff": 64, "n_expert": 0,
                     "n_expert_used": 0, "n_ctx_train": 4096, "seed": 0},
           "devices": {"n_rpc": 1, "n_gpu_layers": 99},
           "ctx": {"n_ctx": 512, "n_batch": 128, "n_ubatch": 64, "n_seq_max": 5, "flash_attn": "on", "op_offload": True, "offload_kqv": True,
                   "type_k": "f32", "type_v": "f16", "kv_unified": True, "embeddings": False, "pooling": "none", "n_outputs_max": 0,
                   "n_outputs_max_per_seq": 0, "backend_samplers": False, "sampler_chain": "top_p-min_p-temp-dist"},
           "calls": [{"kind": "decode", "parts": [{"seq": 3, "n_tokens": 25, "outputs": "all"}]},
                     {"kind": "decode", "parts": [{"seq": 3, "n_tokens": 1, "outputs": "last"}]},
                     {"kind": "decode", "parts": [{"seq": 3, "n_tokens": 128, "outputs": "all"}]}, {"kind": "seq_rm", "seq": 3, "n_drop": 24},
                     {"kind": "shift", "seq": 3, "n_discard": 14, "n_keep": 1}, {"kind": "decode", "parts": [{"seq": 3, "n_tokens": 79, "outputs": "none"}]}]}


@pytest.mark.engine
def test_0336_and_b11739_run_one_workload_side_by_side() -> None:
    """One workload on both builds, each through its own layouts: b11739, a Release build, tells
    its decisions through ggml's callback, and its own counters (perf data) agree with them."""
    w = LlamaWorkload.from_json(SHIFTED)
    traces = {}
    for name in ("llama.cpp-0.3.36", UPSTREAM):
        target = LlamaTarget(name)
        try:
            traces[name] = llama_trace(target.run(w))
            engine = target.engine
        finally:
            target.close()
        assert traces[name].abort is None and all(c.rc == 0 for c in traces[name].calls)
    assert engine["realloc_callback"] == "observed" and engine["build"].startswith("Release")
    assert engine["declarations"].endswith(declarations.CDEF_FILE)
    up = traces[UPSTREAM]
    reallocs = [s for c in up.calls for s in c.sched if s.realloc]
    assert reallocs and all(s.observed and s.realloc_reason == "unobservable in a Release build" for s in reallocs)
    counted = [s for s in reallocs if not s.ggml_ids_changed]  # llama.cpp ignores a re-plan after the assignments changed
    assert (up.perf["n_reallocs_same"], up.perf["n_reallocs_diff"]) == (sum(s.same_size for s in counted), sum(not s.same_size for s in counted))
    assert "n_reallocs_same" not in traces["llama.cpp-0.3.36"].perf


@pytest.mark.engine
def test_b11739s_graphs_are_captured_whole_and_replayed_but_not_judged_by_another_versions_rules() -> None:
    """b11739 copies its input embeddings (``inp_mixed_embd``) with ``ggml_dup``: its graphs are
    captured whole, DUP included; the graph engine builds them and ggml places every node as
    ggml 0.27.0 did inside llama.cpp. The reference has no rules of 0.27.0 (its source is not
    published): llama-matches-reference does not judge the workload, and counts it so."""
    f = Fuzzer(FuzzConfig(database=None, llama_lib=UPSTREAM))
    f.llama_judged = ("llama-matches-reference",)
    try:
        w = LlamaWorkload.from_json(SHIFTED)
        captured = capture(w, f.engines.run_llama(w, capture=True))
        assert captured.ops.get("DUP", 0) > 0, captured.ops
        replayed = graph_trace(f.engines.run(captured.scenario))
        assert replayed.abort is None
        records = {r.index: r for r in replayed.records}
        assert [(records[s.step].node_backends, records[s.step].n_splits) for s in captured.steps] == \
               [(s.node_backends, s.n_splits) for s in captured.steps]
        assert f.check_llama("llama-matches-reference", w) == []
        assert f.stats.llama_captured == 0 and f.stats.llama_not_captured == {"ggml 0.27.0: no reference rules": 1}
    finally:
        f.close()


def test_the_graph_head_is_checked_against_ggmls_own_graph_calls() -> None:
    """``struct ggml_cgraph`` is private to ggml (no header declares it): the worker's reading of
    its head is checked with a graph ggml makes; a head that lost a field is refused, naming it."""
    from pytest_schedfuzz.ggml.lib import import_ggml
    from pytest_schedfuzz.llama.structs import CGraphHead, graph_head_wrong

    class NoGrads(ctypes.Structure):  # as if ggml had dropped ``grads`` before ``leafs``
        _fields_ = [f for f in CGraphHead._fields_ if f[0] != "grads"]

    class Shifted(ctypes.Structure):  # as if ggml had put a field before ``size``
        _fields_ = [("flags", ctypes.c_int), *CGraphHead._fields_]

    g = import_ggml()
    assert graph_head_wrong(g, CGraphHead) == ""
    assert "not the ADD's two operands" in graph_head_wrong(g, NoGrads)
    assert "ggml says" in graph_head_wrong(g, Shifted)


def test_a_users_prebuilt_folder_is_loaded_from_a_copy_with_its_bindings_declarations() -> None:
    """The installed package's own folder, as a user with a prebuilt build names it: its
    libraries (``.so.0`` only, built for glibc 2.38) are copied and made loadable, its binding's
    cdef beside them, and the worker starts on b11739."""
    folder = upstream._package_dir()
    lib_dir = resolve_lib_dir(str(folder))
    assert lib_dir == upstream_lib_dir() and (lib_dir / declarations.CDEF_FILE).is_file()
    target = LlamaTarget(str(folder))
    try:
        info = target.start()
    finally:
        target.close()
    assert info["ggml_version"] == "0.27.0" and info["declarations"] == str(lib_dir / declarations.CDEF_FILE)


def test_a_llama_case_is_replayed_on_its_own_llama_cpp_line_only() -> None:
    """0.3.36's known bugs are not expected of b11739 (nor guards there): another llama.cpp
    builds other graphs; a case with GPU-like devices needs a build that can have them."""
    corpus = Path(__file__).parents[2] / "corpus"
    rpc = load_case(next(corpus.glob("*7c476aeac4.json")))
    gpu = load_case(next(corpus.glob("*86b5a395e6.json")))
    assert rpc.off_build("0.25.3", "available") is None
    assert "another llama.cpp" in (rpc.off_build("0.27.0", "unavailable: no source") or "")
    assert "GPU-like devices" in (gpu.off_build("0.25.3", "unavailable: no source") or "")
    bounded = replace(rpc, expect={"fail": "a bug of every version since 0.25", "since": "0.25.0"})
    assert bounded.off_build("0.27.0", "available") is None


def test_ggml_pythons_tensor_layout_is_checked_against_the_builds_ggml_h() -> None:
    ffi = declarations.parse(declarations.find(default_lib_dir()))  # 0.3.36's headers declare ggml_tensor
    assert declarations.declares(ffi, "ggml_tensor")
    assert declarations.check_struct(ffi, "ggml_tensor", {"op": 80, "flags": 148, "name": 256}) == ""
    assert declarations.check_struct(ffi, "ggml_tensor", {"op": 84}) == "op at 84, declared at 80"
    # b11739's binding leaves it opaque: nothing to check there, and the header says which layouts were
    assert not declarations.declares(declarations.parse(declarations.find(upstream_lib_dir())), "ggml_tensor")


def test_a_call_a_build_lacks_is_absent_from_its_workloads_never_emulated(tmp_path: Path) -> None:
    """b11739's declarations without llama_set_warmup: the worker starts, says the call kind is
    absent, the workloads drawn for it have none, and the explored line shows the dead dimension."""
    from hypothesis import HealthCheck, given, settings

    from pytest_schedfuzz.campaign.stats import Stats
    from pytest_schedfuzz.strategies.llama_workloads import llama_workloads

    decl = declarations.find(upstream_lib_dir())
    cdef = "\n".join(line for line in decl.cdef.splitlines() if "llama_set_warmup(" not in line)
    target = LlamaTarget(UPSTREAM)
    target.declarations = declarations.Declarations("b11739 without llama_set_warmup", cdef)
    try:
        info = target.start()
        w = LlamaWorkload.from_json(SHIFTED)
        trace = target.run(w)
    finally:
        target.close()
    assert info["absent_calls"] == "set_warmup"
    stats = Stats()
    stats.add_llama(w, trace)
    assert stats.llama_explored["call set_warmup absent (this build lacks it)"] == 0

    @settings(max_examples=30, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(llama_workloads(limits=DeviceLimits.of(rpc=2), absent=frozenset({"set_warmup"})))
    def none_drawn(drawn: LlamaWorkload) -> None:
        assert all(c.kind != "set_warmup" for c in drawn.calls)

    none_drawn()


def _mamba2_embeddings_server(calls: list[dict[str, object]]) -> LlamaWorkload:
    """A Mamba-2 model on one RPC device, its context made with embeddings on (pooling none)."""
    return LlamaWorkload.from_json({
        "model": {"arch": "mamba2", "kind": "mamba2", "n_ctx_train": 4096, "n_embd": 16, "n_expert": 0, "n_expert_used": 0, "n_ff": 32,
                  "n_head": 1, "n_head_kv": 1, "n_layer": 1, "seed": 0, "ssm_conv": 2, "ssm_head_dim": 8},
        "devices": {"n_gpu_layers": 99, "n_rpc": 1},
        "ctx": {"embeddings": True, "pooling": "none", "flash_attn": "off", "n_batch": 8, "n_ctx": 256, "n_seq_max": 1, "n_ubatch": 8,
                "offload_kqv": True, "op_offload": False, "type_k": "f16", "type_v": "f16", "sampler_chain": "greedy",
                "backend_samplers": False, "kv_unified": False},
        "calls": calls})


@pytest.mark.engine
def test_b11739s_embeddings_switch_reorders_the_leafs_and_is_named_where_another_switch_followed() -> None:
    """On b11739 ``llama_set_embeddings`` changes the order in which the graph's leafs are walked
    (the output weight last with embeddings on) without a new reservation; ggml compares leaf
    backends by position, so the next smaller decode re-plans and loses the reservation. What
    moved is told as the order (``leaf reordered``: the same leafs on the same devices), whichever
    leaf the shift put first, in both directions; and where the workload toggles embeddings twice
    and a ``set_warmup`` follows, the switch named is the one before the call that lost the
    reservation (the nightly first named set_warmup: a rerun without the first toggles lost it
    later, after the second)."""
    from pytest_schedfuzz.campaign.causes import switches_told_apart
    from pytest_schedfuzz.properties.llama_properties import LLAMA_CHECKS

    one, two = ({"kind": "decode", "parts": [{"seq": 0, "n_tokens": n, "outputs": "last"}]} for n in (1, 2))
    target = LlamaTarget(UPSTREAM)
    try:
        run = lambda w: llama_trace(target.run(w))  # noqa: E731
        signed = {}
        for flag in (False, True):
            w = _mamba2_embeddings_server([{"kind": "set_embeddings", "on": flag}, one, two])
            if flag:  # from a context made without embeddings
                w = replace(w, ctx=replace(w.ctx, embeddings=False))
            (v,) = [v for v in LLAMA_CHECKS["llama-no-same-size-realloc"](w, run(w)) if v.facts.get("explained") == "lost"]
            signed[flag] = v.facts["lost_by"]
            assert "(reordered)" in v.message
        assert signed == {False: "decode after set_embeddings(false): changed (leaf reordered)",
                          True: "decode after set_embeddings(true): changed (leaf reordered)"}
        emb, causal = {"kind": "set_embeddings"}, {"kind": "set_causal_attn"}
        w = _mamba2_embeddings_server([one, emb, emb, causal, *[one] * 4, emb, {"kind": "seq_rm", "n_drop": -1},
                                       {"kind": "set_warmup", "on": True}, *[one] * 10, two])
        lost = [v for v in LLAMA_CHECKS["llama-no-same-size-realloc"](w, run(w)) if v.facts.get("explained") == "lost"]
        found, reruns = switches_told_apart(w, lost, run, frozenset())
        assert reruns >= 2 and [v.facts["lost_by"] for v in found if v.step == 21] == [
            "decode after set_embeddings(false): changed (leaf reordered)"]
    finally:
        target.close()
