"""The third built-in llama.cpp, ``llama.cpp-0.3.36-seed``: the project's patch set of the seeds'
change (ggml's realloc callback, llama.cpp's ``sched_new``, same/changed realloc counters and
``sched_params::can_reuse``) on the llama.cpp vendored in llama-cpp-python 0.3.36, built like the
pristine one and offered by name (``ggml-0.25.3-seed`` as a graph engine).

The build takes minutes on first use and is cached; nothing here loads a library into the test
process (a second libggml-base.so.0 there would shadow the pristine one): symbols are read with
``nm`` and loading is tried in a child process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_schedfuzz.builds.compile import BuildError, Patch, source_tree
from pytest_schedfuzz.builds.names import SEED_GGML, SEED_LLAMA
from pytest_schedfuzz.builds.seed import PATCHES, build_llama_seed, kept_source, patch_command, seed_patch_files
from pytest_schedfuzz.properties.derived import graph_trace, llama_trace
from pytest_schedfuzz.properties.sites import check_site

# a planted fault for the reuse property: a scheduler is kept whatever max_nodes asks for
CAN_REUSE_IGNORES_MAX_NODES = Patch("src/llama-context.h",
                                    "                && max_nodes  <= other.max_nodes;", "                ;")
# a planted fault for llama-reuse-complete: can_reuse never holds, so every reservation rebuilds
CAN_REUSE_NEVER = Patch("src/llama-context.h", "            return parallel   == other.parallel", "            return false && parallel == other.parallel")
# the files the patch set changes, relative to the llama.cpp folder
PATCHED = ("ggml/include/ggml-backend.h", "ggml/src/ggml-backend.cpp", "src/llama-context.cpp", "src/llama-context.h")
CALLBACK = ("typedef void (*ggml_backend_sched_realloc_callback)(ggml_backend_sched_t sched, struct ggml_cgraph * graph, "
            "bool backend_ids_changed, bool graph_size_changed, void * user_data);")
TRACE = b"%s: graph reallocation: nodes = %d, splits = %d, n_same = %d, n_diff = %d\n"
PERF = b"%s:   graph reallocs = %10d    / %5d        (same size) / (changed size)\n"
REUSE = b"%s: reusing scheduler: max_nodes = %zu (current max_nodes = %zu)\n"


def _pristine_lib() -> Path:
    from pytest_schedfuzz.llama.llama_target import default_lib_dir

    return default_lib_dir()


def _patched_copy(tmp_path: Path) -> Path:
    src = source_tree("llama.cpp-0.3.36")
    for f in PATCHED:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / f, tmp_path / f)
    for p in seed_patch_files():
        # exactly, in order, as the build applies them
        proc = subprocess.run([*patch_command(), str(p)], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp_path


def _exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_the_patch_set_applies_in_order_on_the_pristine_tree(tmp_path: Path) -> None:
    names = [p.name for p in seed_patch_files()]
    assert names == ["0001-ggml-backend-realloc-callback.patch", "0002-llama-context-sched-new-realloc-counters.patch",
                     "0003-llama-context-sched-params-can-reuse.patch"]
    tree = _patched_copy(tmp_path)
    header = (tree / "ggml/include/ggml-backend.h").read_text()
    assert CALLBACK in header
    assert ("GGML_API void                 ggml_backend_sched_set_realloc_callback(ggml_backend_sched_t sched, "
            "ggml_backend_sched_realloc_callback callback, void * user_data);") in header
    sched = (tree / "ggml/src/ggml-backend.cpp").read_text()
    assert "debug_graph_size" not in sched and "debug_prev_graph_size" not in sched
    assert "const bool graph_size_changed = sched->prev_graph_size != sched->graph_size;" in sched
    assert "const bool unexpected = !backend_ids_changed && !graph_size_changed;" in sched
    ctx = (tree / "src/llama-context.cpp").read_text()
    # both schedulers of sched_reserve come from sched_new, which alone calls ggml_backend_sched_new
    assert ctx.count("ggml_backend_sched_new(") == 1 and ctx.count("sched_new({") == 2
    assert "ggml_backend_sched_set_realloc_callback(sched.get(), sched_graph_realloc, this);" in ctx
    # the planted fault's text is there once
    assert (tree / CAN_REUSE_IGNORES_MAX_NODES.file).read_text().count(CAN_REUSE_IGNORES_MAX_NODES.old) == 1
    # the public API keeps its layout (llama-cpp-python's ctypes binding returns llama_perf_context_data by value)
    assert all("include/llama.h" not in p.read_text() for p in seed_patch_files())


def test_every_patch_explains_itself_before_its_diff() -> None:
    for p in seed_patch_files():
        head = p.read_text().split("\ndiff --git ", 1)[0]
        assert "seed" in head.lower() and len(head.splitlines()) >= 5, p.name
    assert PATCHES.joinpath(SEED_LLAMA).is_dir()


def test_an_extra_patch_that_does_not_apply_is_a_build_error_naming_it() -> None:
    with pytest.raises(BuildError, match=r"src/llama-context\.h: the text to replace occurs 0 times"):
        build_llama_seed((Patch("src/llama-context.h", "no such text in llama.cpp", ""),))


@pytest.fixture(scope="module")
def seed_lib() -> Path:
    return build_llama_seed()


@pytest.mark.engine
def test_the_build_holds_the_libraries_the_harness_loads(seed_lib: Path) -> None:
    for stem in ("libllama", "libggml-base", "libggml-cpu", "libggml", "libggml-rpc"):
        assert (seed_lib / f"{stem}.so").exists() and (seed_lib / f"{stem}.so.0").exists(), stem
    built = json.loads((seed_lib / "BUILT").read_text())
    assert built[0] == SEED_GGML and built[1]["patches"] == [p.name for p in seed_patch_files()]
    assert not (seed_lib.parent / "build").exists() and not (seed_lib.parent / "llama.cpp").exists()
    # the patched sources an abort's check site is read from, where the libraries name their deleted work tree
    work = seed_lib.parent / "llama.cpp"
    line = next(k for k, text in enumerate((seed_lib.parent / "ggml/src/ggml-backend.cpp").read_text().splitlines(), 1)
                if "const bool unexpected = !backend_ids_changed && !graph_size_changed;" in text)
    assert check_site(f"{work}/ggml/src/ggml-backend.cpp:{line}: x").endswith("in ggml_backend_sched_alloc_splits")
    assert kept_source(f"{work}/src/llama-context.cpp") == seed_lib.parent / "src/llama-context.cpp"
    # the same sonames and RUNPATH as llama-cpp-python's own libraries
    for stem in ("libllama", "libggml-base"):
        dyn = subprocess.run(["readelf", "-d", str(seed_lib / f"{stem}.so")], capture_output=True, text=True, check=True).stdout
        assert f"Library soname: [{stem}.so.0]" in dyn and "Library runpath: [$ORIGIN]" in dyn


@pytest.mark.engine
def test_the_build_exports_the_realloc_callback(seed_lib: Path) -> None:
    assert "ggml_backend_sched_set_realloc_callback" in _exported(seed_lib / "libggml-base.so")
    assert "ggml_backend_sched_set_realloc_callback" not in _exported(_pristine_lib() / "libggml-base.so")
    # the rest of the pristine API is there: the seed is 0.25.3 plus one function
    added = _exported(seed_lib / "libggml-base.so") ^ _exported(_pristine_lib() / "libggml-base.so")
    assert added == {"ggml_backend_sched_set_realloc_callback"}
    probe = ("import ctypes, sys; ctypes.CDLL(sys.argv[1] + '/libggml-base.so.0').ggml_backend_sched_set_realloc_callback; "
             "ctypes.CDLL(sys.argv[1] + '/libllama.so.0').llama_perf_context_print")
    subprocess.run([sys.executable, "-c", probe, str(seed_lib)], check=True)


@pytest.mark.engine
def test_libllama_traces_and_counts_reallocations(seed_lib: Path) -> None:
    data = (seed_lib / "libllama.so").read_bytes()
    assert TRACE in data and PERF in data and REUSE in data
    assert b"sched_graph_realloc" in data
    pristine = (_pristine_lib() / "libllama.so").read_bytes()
    assert TRACE not in pristine and PERF not in pristine


@pytest.mark.engine
def test_the_names_resolve_to_the_build(seed_lib: Path) -> None:
    from pytest_schedfuzz.builds.compile import ggml_source_location
    from pytest_schedfuzz.builds.installed import LibError, base_library
    from pytest_schedfuzz.ggml.build import build_fake_gpu
    from pytest_schedfuzz.ggml.lib import resolve_lib
    from pytest_schedfuzz.llama.llama_target import resolve_lib_dir

    assert resolve_lib(SEED_GGML) == str(seed_lib)
    assert resolve_lib_dir(SEED_LLAMA) == seed_lib
    assert resolve_lib_dir("llama.cpp-0.3.36") == _pristine_lib()
    with pytest.raises(LibError, match="ggml-0.25.3-seed"):
        resolve_lib("no-such-ggml")
    # the GPU-like device compiles against the seed's own (patched) headers
    src = ggml_source_location(str((seed_lib / "libggml-base.so.0").resolve()))
    assert isinstance(src, Path) and CALLBACK in (src / "include" / "ggml-backend.h").read_text()
    assert build_fake_gpu(str(base_library(seed_lib))).exists()


@pytest.mark.engine
def test_the_seed_is_compiled_as_the_pristine_build(seed_lib: Path) -> None:
    """Same compiler flags (Debug, the native CPU backend) as llama-cpp-python's install: the
    libraries differ only by the patches."""

    def producers(lib: Path) -> set[str]:
        info = subprocess.run(["readelf", "--debug-dump=info", str(lib)], capture_output=True, text=True, check=True).stdout
        return {line.split("): ", 1)[-1] for line in info.splitlines() if "DW_AT_producer" in line}

    for name in ("libggml-cpu.so", "libggml-base.so"):
        assert producers(seed_lib / name) == producers(_pristine_lib() / name), (
            f"{name}: the seed and the installed llama-cpp-python were compiled with different flags; a llama-cpp-python "
            "wheel from pip's cache (which ignores build settings) may predate requirements.txt's: reinstall it with --no-cache-dir")


def _decode(*parts: tuple[int, int, str]):
    from pytest_schedfuzz.model.llama_workload import Call, Part

    return Call("decode", tuple(Part(s, n, o) for s, n, o in parts))


def _sampler_workload(*calls):
    from pytest_schedfuzz.model.llama_model import ModelSpec
    from pytest_schedfuzz.model.llama_workload import ContextParams, Devices, LlamaWorkload

    return LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=1), ContextParams(n_seq_max=1, backend_samplers=True, sampler_chain="top_k-greedy"), calls)


def _run(lib: Path | str, workload):
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    target = LlamaTarget(lib_dir=str(lib))
    try:
        return llama_trace(target.run(workload))
    finally:
        target.close()


@pytest.mark.engine
def test_the_seed_keeps_its_scheduler_where_can_reuse_holds_and_ggml_and_llama_cpp_tell_every_realloc(seed_lib: Path) -> None:
    """A server detaching and re-attaching a sequence's sampler chain: the worst case needs
    fewer nodes, then as many as the scheduler has, so sched_new reuses it twice; the reuses
    are observed with the parameters llama.cpp asked for, every reallocation's decision comes
    from ggml's callback, llama.cpp's counters are read after each, and every property holds."""
    from pytest_schedfuzz.model.llama_workload import Call
    from pytest_schedfuzz.properties.llama_properties import LLAMA_CHECKS, scheduler_reuses

    w = _sampler_workload(_decode((0, 8, "last")), Call("set_sampler", seq=0, on=False), _decode((0, 1, "last")),
                          Call("set_sampler", seq=0, on=True, chain="top_k-greedy"), _decode((0, 1, "last")))
    trace = _run(seed_lib, w)
    reuses = scheduler_reuses(trace)
    assert [(call, kept.max_nodes, asked.max_nodes) for call, kept, asked in reuses] == [(2, 1248, 1024), (4, 1248, 1248)]
    assert sum(s.kind == "new" for _, s in trace.sched_calls()) == 1
    reallocs = [s for _, s in trace.sched_calls() if s.realloc]
    assert reallocs and all(s.observed for s in reallocs)
    assert all(s.llama_n_same is not None for s in reallocs if not s.ggml_ids_changed)
    assert all(check(w, trace) == [] for check in LLAMA_CHECKS.values())
    # the pristine 0.3.36 builds a new scheduler at every reservation and tells nothing itself
    pristine = _run(_pristine_lib(), w)
    assert scheduler_reuses(pristine) == [] and not any(s.observed for _, s in pristine.sched_calls())


@pytest.mark.engine
def test_a_can_reuse_that_ignores_max_nodes_fails_llama_reuse_sound() -> None:
    """The same patches with the planted fault: a sampler chain that needs more nodes keeps the
    smaller scheduler. llama-reuse-sound names the kept and the asked max_nodes."""
    from pytest_schedfuzz.model.llama_workload import Call
    from pytest_schedfuzz.properties.llama_properties import llama_reuse_sound

    w = _sampler_workload(_decode((0, 8, "last")), Call("set_sampler", seq=0, on=True, chain="top_p-min_p-temp-dist"), _decode((0, 1, "last")))
    mutant = build_llama_seed((CAN_REUSE_IGNORES_MAX_NODES,))
    (v,) = llama_reuse_sound(w, _run(mutant, w))
    assert v.signature() == "llama-reuse-sound[why=max_nodes]" and v.step == 2
    assert "kept scheduler #0 (max_nodes 1248" in v.message and "can_reuse is false (max_nodes)" in v.message
    assert llama_reuse_sound(w, _run(build_llama_seed(), w)) == []


@pytest.mark.engine
def test_the_graph_engine_on_the_seed_ggml_reads_every_scheduler_realloc_from_the_callback() -> None:
    """ggml-0.25.3-seed as a graph engine: each re-reservation of the scheduler comes with ggml's
    own decision, and the engine still agrees with the reference."""
    from pytest_schedfuzz.ggml.graph_target import GgmlTarget
    from pytest_schedfuzz.properties import matches_reference
    from reference.predict import predict

    sys.path.insert(0, str(Path(__file__).parents[1] / "cases"))
    from test_corpus import topology_switch_case

    scenario = topology_switch_case(2).scenario
    with GgmlTarget(lib=SEED_GGML) as target:
        assert target.start()["realloc_callback"] == "observed"
        trace = graph_trace(target.run(scenario))
    events = [e for e in trace.events if e.via == "sched"]
    assert events and all(e.observed for e in events) and any(e.same_size for e in events)
    assert matches_reference(scenario, trace, predict(scenario)) == []


def test_git_apply_takes_the_patch_set_where_patch_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI image without patch(1): the build falls back on git's applier, which takes the same
    files exactly."""
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "patch" else "/usr/bin/" + name)
    assert patch_command()[:2] == ["git", "apply"]
    tree = _patched_copy(tmp_path)
    assert CALLBACK in (tree / "ggml/include/ggml-backend.h").read_text()
    assert "params.can_reuse(sched_params_cur)" in (tree / "src/llama-context.cpp").read_text()


@pytest.mark.engine
def test_generated_workloads_reach_scheduler_reuses_on_the_seed_build(seed_lib: Path) -> None:
    """What the ci run's figure rests on: drawn server workloads (sampler chains switched,
    LoRA adapters loaded and freed) make the seeds' sched_new keep its scheduler, and every
    reuse is judged by llama-reuse-sound without a violation."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from pytest_schedfuzz.llama.llama_target import LlamaTarget
    from pytest_schedfuzz.model.llama_workload import LlamaWorkload
    from pytest_schedfuzz.properties.llama_properties import llama_reuse_sound, scheduler_reuses
    from pytest_schedfuzz.strategies.llama_workloads import llama_workloads

    target, reuses = LlamaTarget(lib_dir=str(seed_lib)), []

    @seed(5)  # about 2 in 100 drawn workloads reuse (18 of 912 in a ci run)
    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.generate,))
    @given(llama_workloads())
    def run(w: LlamaWorkload) -> None:
        trace = llama_trace(target.run(w))
        reuses.extend(scheduler_reuses(trace))
        assert llama_reuse_sound(w, trace) == []

    try:
        run()
    finally:
        target.close()
    assert len(reuses) >= 3, reuses


@pytest.mark.engine
def test_the_fallback_without_pipeline_parallelism_gets_a_new_scheduler_on_the_seed(seed_lib: Path) -> None:
    """Two asynchronous GPU-like devices with room for one copy of the compute buffers, not four:
    the seed's sched_new is asked for parallel = 0 after the failed reservation, and can_reuse
    (parallel differs) must not keep the pipelined scheduler; every property holds."""
    from pytest_schedfuzz.model.layout import BackendSpec
    from pytest_schedfuzz.model.llama_model import ModelSpec
    from pytest_schedfuzz.model.llama_workload import ContextParams, Devices, LlamaWorkload
    from pytest_schedfuzz.properties.llama_properties import LLAMA_CHECKS, scheduler_reuses

    gpu = BackendSpec("gpu", asynchronous=True)
    w = LlamaWorkload(ModelSpec(n_layer=2), Devices(n_rpc=0, gpus=(gpu, gpu), gpu_free=(600_000, 600_000)), ContextParams(n_seq_max=1),
                      (_decode((0, 32, "all")), _decode((0, 1, "last"))))
    trace = _run(seed_lib, w)
    assert "sched_reserve: compute buffer allocation failed, retrying without pipeline parallelism" in trace.calls[0].log
    asked = [s for s in trace.calls[0].sched if s.kind == "sched_params"]
    assert [s.parallel for s in asked] == [True, False]
    assert [s.parallel for s in trace.calls[0].sched if s.kind == "new"] == [True, False] and scheduler_reuses(trace) == []
    assert all(check(w, trace) == [] for check in LLAMA_CHECKS.values())


@pytest.mark.engine
def test_a_cpu_only_context_re_plans_without_a_scheduler_decision_on_the_seed(seed_lib: Path) -> None:
    """With the CPU alone (llama-same-logits' reference run) the scheduler has one buffer, and
    ggml-alloc re-plans it by itself: no realloc callback is due, and none is asked for."""
    from pytest_schedfuzz.model.llama_model import ModelSpec
    from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload

    # a context shift's K-shift graph, then a decode (found by the seed's ci run)
    w = LlamaWorkload(ModelSpec(n_layer=1, n_embd=16, n_head=1, n_head_kv=1, n_ff=32), Devices(n_rpc=0, n_gpu_layers=0),
                      ContextParams(n_ctx=256, n_batch=8, n_ubatch=8, n_seq_max=3, kv_unified=False, embeddings=True),
                      (_decode((0, 1, "last")), _decode((0, 1, "last")), _decode((1, 2, "last")), _decode((0, 1, "last")), _decode((0, 1, "last")),
                       Call("seq_keep", seq=0), Call("seq_rm", seq=1, n_drop=-1), Call("seq_cp", seq=0, dst=1), Call("seq_keep", seq=0),
                       Call("shift", seq=0, n_discard=1), _decode((0, 1, "last"))))
    trace = _run(seed_lib, w)
    assert trace.abort is None and all(c.rc == 0 for c in trace.calls)
    reallocs = [s for _, s in trace.sched_calls() if s.realloc]
    assert reallocs and all(not s.observed for s in reallocs)


@pytest.mark.engine
def test_a_can_reuse_that_never_holds_fails_llama_reuse_complete(seed_lib: Path) -> None:
    """The planted can_reuse that never holds: a sampler chain dropped (fewer nodes) rebuilds the
    scheduler, its compute buffers freed and reserved again; llama-reuse-complete names both parameter
    sets. The seeds' build keeps it; the pristine 0.3.36 (no can_reuse) rebuilds and is counted, not judged."""
    from pytest_schedfuzz.model.llama_workload import Call
    from pytest_schedfuzz.properties.llama_properties import llama_reuse_complete, rebuilds

    w = _sampler_workload(_decode((0, 8, "last")), Call("set_sampler", seq=0, on=False), _decode((0, 1, "last")))
    (v,) = llama_reuse_complete(w, _run(build_llama_seed((CAN_REUSE_NEVER,)), w))
    assert v.signature() == "llama-reuse-complete[rebuilt=can_reuse held]" and v.step == 2
    assert "asked for max_nodes 1024, parallel" in v.message and "had max_nodes 1248" in v.message
    assert llama_reuse_complete(w, _run(seed_lib, w)) == []
    pristine = _run(_pristine_lib(), w)
    assert llama_reuse_complete(w, pristine) == [] and [(r.wasted, r.logged) for r in rebuilds(pristine)] == [(True, None)]

