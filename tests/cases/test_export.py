"""``schedfuzz export``: the starter corpus's graph findings, one of each kind, as standalone C
reproducers built with cmake against the built-in ggmls; each exits 1 exactly where its finding
reproduces (the version it was found on) and 0 where it is fixed (``expect: fixed_in``) or was
never a bug (``expect: pass``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.builds.compile import ggml_source_for
from pytest_schedfuzz.builds.installed import base_library
from pytest_schedfuzz.cases.corpus import Case, load_case
from pytest_schedfuzz.cases.export import ExportError, build_and_run, export_case
from pytest_schedfuzz.cases.export_llama import devices_said, export_llama_case
from pytest_schedfuzz.ggml.lib import library_folder

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
SCHEDFUZZ = [sys.executable, "-m", "pytest_schedfuzz.cli"]
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake builds the reproducers")

# (case, the ggml its reproducer is built against, its exit status there)
KINDS = [
    ("06a0cc7a62", "ggml-0.25.3", 1),  # a same-size realloc the scheduler decides (ggml's GGML_SCHED_DEBUG_REALLOC check), on a GPU-like device
    ("06a0cc7a62", "ggml-0.15.3", 1),  # ... the same bug in the other version
    ("dd819fd105", "ggml-0.15.3", 1),  # a same-size re-plan of ggml-alloc by itself (one buffer), by its reason
    ("d17a91e675", "ggml-0.15.3", 0),  # expect: pass (the driver re-reserves): a guard
    ("9523a46d7b", "ggml-0.15.3", 1),  # an abort: GGML_ASSERT(n_graph_inputs < GGML_SCHED_MAX_SPLIT_INPUTS)
    ("9523a46d7b", "ggml-0.25.3", 0),  # ... fixed in 0.25.3 (expect: fixed_in)
    ("01b07046ee", "ggml-0.25.3", 1),  # a crash: the CPU writes through an RPC buffer's address (SIGSEGV)
    ("0120db39a9", "ggml-0.15.3", 1),  # an RPC server that drops the connection: the client aborts
    ("78ea0a7792", "ggml-0.25.3", 1),  # wrong values: a forced view copied before its source is computed
]


def _case(digest: str) -> Case:
    return load_case(next(CORPUS.glob(f"*-{digest}.json")))


def _export(case: Case, out: Path) -> None:
    """``schedfuzz export`` of the case, on the version it was found on."""
    version = case.engine["ggml_version"]
    r = subprocess.run([*SCHEDFUZZ, "export", str(case.path), "-o", str(out), "--lib", "ggml-0.15.3" if version == "0.15.3" else "ggml-0.25.3"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.engine
@pytest.mark.parametrize("digest, lib, code", KINDS, ids=[f"{d}-{lib}" for d, lib, _ in KINDS])
def test_an_exported_reproducer_exits_1_exactly_where_its_finding_reproduces(tmp_path: Path, digest: str, lib: str, code: int) -> None:
    case = _case(digest)
    _export(case, tmp_path / "repro")
    folder = library_folder(lib)
    built = build_and_run(tmp_path / "repro", folder, ggml_source_for(str(base_library(folder))))
    assert built.code == code, built.output[-3000:]
    first = case.message.splitlines()[0]
    assert (f"REPRODUCED: [{case.property}] step {case.step}" if code else "not reproduced:") in built.output
    assert first[:80] in built.output  # in the case's own words
    if case.property == "no-same-size-realloc" and code and "lost_by=alloc leafs" in case.signature:
        assert "reallocating buffers automatically" in built.output  # ggml-alloc by itself, which no check of ggml's sees
    elif case.property == "no-same-size-realloc" and code:
        assert "unexpected graph reallocation" in built.output  # ggml's own GGML_SCHED_DEBUG_REALLOC check


@pytest.mark.engine
def test_the_export_is_self_contained_and_its_report_says_the_finding_in_ggmls_terms(tmp_path: Path) -> None:
    """The folder holds the program, its data, the GPU-like device's source, the RPC server, the
    CMakeLists and the case; REPORT.md names the signature, the explanation, the versions, the
    steps with the failing one marked, the command lines and the engine's splits of the step."""
    case = _case("06a0cc7a62")
    out = tmp_path / "repro"
    _export(case, out)
    assert {p.name for p in out.iterdir()} == {"repro.c", "data.bin", "fake_gpu.c", "rpc_server.c", "CMakeLists.txt", "REPORT.md", "case.json", "graph.dot"}
    report = (out / "REPORT.md").read_text()
    for said in (case.signature, case.expected_failure or "", "Found on ggml 0.25.3", f"{case.step:3d}. compute(T1-out1-kv2)   <- the finding",
                 "cmake -S . -B build && cmake --build build && build/repro", "-DGGML_DIR=", "## SPLIT #0: CPU", "offload_op batch >= 8"):
        assert said in report, said
    source = (out / "repro.c").read_text()
    assert "ggml_mul_mat(ctx, T[" in source and "ggml_backend_rpc_start_server" in (out / "rpc_server.c").read_text()
    assert source.count("/* GGML_SCHED_DEBUG_REALLOC */ true") == 1  # only the scheduler in force at the finding's step is checked
    assert load_case(out / "case.json").signature == case.signature  # the case itself, unchanged


# llama.cpp cases: (case, what shows it)
LLAMA_KINDS = [
    ("4e6374f1c3", "unexpected graph reallocation"),  # a same-size reallocation: ggml's GGML_SCHED_DEBUG_REALLOC check
    ("21a6c03d81", "REPRODUCED"),  # ... after another same-size reallocation in call 5, which would abort first: ggml's log
    ("be71aa4ab0", "unexpected graph reallocation"),  # op offload on two asynchronous GPU-like devices
    ("97dfe7600a", "cannot run the operation (ROPE)"),  # an abort in split_graph, a KV cache on a GPU-like device
    ("0603feb841", "Segmentation fault"),  # a crash: SIGSEGV in llama_mul_mat_hadamard (a context shift)
    ("525922f4eb", "GGML_ASSERT(ggml_can_mul_mat(a, b))"),  # an abort in llama_init_from_model (the violation's call 0)
    ("34b0a02ef6", "unexpected graph reallocation"),  # an MTP model's target beside its draft context (draft-mtp), catching up
]


@pytest.mark.engine
@pytest.mark.parametrize("digest, said", LLAMA_KINDS, ids=[d for d, _ in LLAMA_KINDS])
def test_an_exported_llama_cpp_reproducer_replays_the_calls_through_llama_h_and_reproduces(tmp_path: Path, digest: str, said: str) -> None:
    """The export carries the tiny GGUF model (nothing is written at run time), starts the RPC
    servers, registers the GPU-like devices, loads the model and makes the context as the worker
    does, replays every call, and exits 1 in the case's call."""
    case = _case(digest)
    out = tmp_path / "repro"
    _export(case, out)
    assert (out / "model.gguf").stat().st_size > 0 and "llama_model_load_from_file" in (out / "repro.c").read_text()
    built = build_and_run(out)
    assert built.code == 1, built.output[-3000:]
    assert said in built.output and f"REPRODUCED: [{case.property}] call {case.step}" in built.output, built.output[-3000:]
    if digest == "be71aa4ab0":  # GPU-like devices: fake_gpu.c, whose graph_optimize takes the parameters struct of this ggml
        # GCC 14's default errors, made errors on any compiler: fake_gpu.c used to declare graph_optimize without
        # its parameters (SCHEDFUZZ_OPTIMIZE_PARAMS came only from the harness's own build): an incompatible pointer
        assert "-Werror=incompatible-pointer-types -Werror=implicit-function-declaration -Werror=int-conversion" in (out / "CMakeLists.txt").read_text()
    if digest == "21a6c03d81":
        report = (out / "REPORT.md").read_text()
        assert "the same-size reallocation of call 5 before it" in report  # ggml's check would abort there
        assert 'if (false) setenv("GGML_SCHED_DEBUG_REALLOC"' in (out / "repro.c").read_text()


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([*SCHEDFUZZ, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.engine
def test_a_matches_reference_reproducer_carries_the_prediction_and_exits_0_once_ggml_and_the_reference_agree(tmp_path: Path) -> None:
    """A matches-reference finding against a planted reference fault (no pass 2), on a captured
    MoE graph: exported with that reference, the program shows ggml's assignment of the node
    against the prediction it carries and exits 1; exported with the true reference, 0."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.cases.capture import capture
    from pytest_schedfuzz.cases.corpus import save_case
    from pytest_schedfuzz.profiles import FuzzConfig

    llama = _case("4d6247404c")
    assert llama.llama is not None
    f = Fuzzer(FuzzConfig(database=None, reference="planted:predict_without_pass2"))
    try:
        sc = capture(llama.llama, f.engines.run_llama(llama.llama, capture=True)).scenario
        v = f.check("matches-reference", sc)[0]
    finally:
        f.close()
    assert v.signature() == "matches-reference[what=assignment]"
    path = save_case(tmp_path, Case(v.property, v.signature(), sc, v.message, v.step, engine={"name": "ggml", "ggml_version": "0.25.3"},
                                    expect={"fail": "planted: the reference without pass 2"}))
    for reference, code in (("planted:predict_without_pass2", 1), (None, 0)):
        out = tmp_path / f"repro-{code}"
        r = _cli("export", str(path), "-o", str(out), *(["--reference", reference] if reference else []))
        assert r.returncode == 0, r.stdout + r.stderr
        built = build_and_run(out)
        assert built.code == code, built.output[-3000:]
        if code:
            assert "assignment: node #36 l_out-0: ggml puts it on RPC0, the reference predicts CPU" in built.output


@pytest.mark.engine
def test_a_reuse_equivalent_reproducer_runs_the_steps_again_with_fresh_schedulers(tmp_path: Path) -> None:
    """A scheduler kept across a change of ``parallel`` (the harness's own finding, once): the
    reused one's buffers are smaller than a fresh one's; the program runs both and says so."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.cases.corpus import save_case
    from pytest_schedfuzz.model.graph_spec import GraphBuilder
    from pytest_schedfuzz.model.layout import BackendLayout
    from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
    from pytest_schedfuzz.profiles import FuzzConfig

    b = GraphBuilder()
    y = b.op("mul_mat", b.weight("w", (16, 16), device=0), b.input("x", (16, 8)), name="y")
    g = b.build(b.op("add", y, b.input("b", (16, 8)), name="z"))
    sc = Scenario(BackendLayout.of("rpc", "cpu"), (("g", g),), (Step("sched_new", params=SchedParams(64, False, False)), Step("reserve", "g"),
                                                                 Step("sched_new", params=SchedParams(64, True, False), reuse=True), Step("alloc", "g")))
    f = Fuzzer(FuzzConfig(database=None))
    try:
        v = f.check("reuse-equivalent", sc)[0]
    finally:
        f.close()
    path = save_case(tmp_path, Case(v.property, v.signature(), sc, v.message, v.step, engine={"name": "ggml", "ggml_version": "0.25.3"},
                                    expect={"fail": "a scheduler kept across a change of parallel"}))
    r = _cli("export", str(path), "-o", str(tmp_path / "repro"), "--check")
    assert r.returncode == 0 and "check on ggml-0.25.3: reproduces (exit 1); expected: reproduces" in r.stdout, r.stdout + r.stderr
    report = (tmp_path / "repro" / "REPORT.md").read_text()
    assert "RPC0 compute buffer: reused 1536 bytes, fresh 4608" in report and "a fresh scheduler at every sched_new" in report


@pytest.mark.engine
def test_a_llama_same_logits_reproducer_runs_the_calls_again_on_the_cpu_alone(tmp_path: Path) -> None:
    """The starter corpus's same-logits case (expect: pass, a guard) exits 0; the same workload
    with GPU-like devices whose MUL_MAT results are off by one (a planted fault) exits 1,
    naming the token whose logit differs from the CPU-only run's."""
    from pytest_schedfuzz.cases.corpus import save_case

    # the guard (the corpus holds known same-logits bugs too)
    case = next(c for c in map(load_case, sorted(CORPUS.glob("llama-same-logits-*.json"))) if c.expect == "pass")
    w = case.llama
    assert w is not None
    planted = replace(case, llama=replace(w, devices=replace(w.devices, gpus=tuple(replace(g, corrupt_op="MUL_MAT") for g in w.devices.gpus))),
                      expect={"fail": "planted: MUL_MAT results off by one"}, path=None)
    for c, code in ((case, 0), (load_case(save_case(tmp_path, planted)), 1)):
        out = tmp_path / f"repro-{code}"
        _export(c, out)
        built = build_and_run(out)
        assert built.code == code, built.output[-3000:]
        assert "-- the same calls on the CPU alone --" in built.output
        if code:
            assert "output's logits: token " in built.output and ", on the CPU alone " in built.output


def test_a_case_no_program_can_show_alone_gets_a_clear_error(tmp_path: Path) -> None:
    """A truncated case file (left as it is), a policy-only finding (reuse-sound: no ggml call), a
    figure ggml's API does not tell, a llama.cpp counter of the seeds' build."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"property": ')
    r = _cli("export", str(bad), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{bad}: not valid JSON (truncated?)" in r.stderr and bad.read_text() == '{"property": '
    counters = replace(_case("4e6374f1c3"), property="llama-counters-agree")
    with pytest.raises(ExportError, match="compares two runs or counters"):
        export_llama_case(counters, tmp_path, None)
    graph = _case("06a0cc7a62")
    with pytest.raises(ExportError, match="judges the reuse policy alone"):
        export_case(replace(graph, property="reuse-sound"), graph.scenario, tmp_path, None, "0.25.3")  # type: ignore[arg-type]
    with pytest.raises(ExportError, match="does not tell a program the split inputs or the graph copy"):
        export_case(replace(graph, property="matches-reference", signature="matches-reference[what=graph_size]"), graph.scenario, tmp_path, None, "0.25.3")  # type: ignore[arg-type]


@pytest.mark.engine
def test_schedfuzz_export_of_a_corpus_folder_writes_one_reproducer_per_graph_case_and_says_why_not_the_rest(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for digest in ("78ea0a7792", "9523a46d7b"):
        shutil.copy(_case(digest).path, corpus)  # type: ignore[arg-type]
    shutil.copy(next(CORPUS.glob("llama-no-abort-*-97dfe7600a.json")), corpus)
    r = subprocess.run([*SCHEDFUZZ, "export", str(corpus), "-o", str(tmp_path / "out"), "--check"], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.stem for p in corpus.glob("*.json"))
    assert "check on ggml-0.25.3: reproduces (exit 1); expected: reproduces" in r.stdout
    assert "check on ggml-0.15.3: reproduces (exit 1); expected: reproduces" in r.stdout
    # the llama.cpp case on the build its record names: the seeds' (it was found there)
    assert "check on llama.cpp-0.3.36-seed: reproduces (exit 1); expected: reproduces (a known bug)" in r.stdout and "not exported" not in r.stdout


# b11739 cases on RPC devices: (case, what shows it)
B11739_KINDS = [
    ("02cc370507", "the run died in call 2: Segmentation fault"),  # a crash in ggml_gallocr_alloc_graph after llama_set_embeddings(true)
    ("f7c73566ca", "unexpected graph reallocation"),  # a same-size reallocation: ggml 0.27.0's own GGML_SCHED_DEBUG_REALLOC check
]


@pytest.mark.engine
@pytest.mark.parametrize("digest, said", B11739_KINDS, ids=[d for d, _ in B11739_KINDS])
def test_a_b11739_reproducer_builds_against_b11739s_libraries_with_its_own_declarations(tmp_path: Path, digest: str, said: str) -> None:
    """b11739 ships no headers and its source is not published: the reproducer links b11739's
    libraries (made again where the recorded folder is gone), never 0.3.36's llama.h, whose
    structs differ (declarations.py), and includes llama_declared.h: the binding's cdef, the
    declarations the harness itself reads b11739's structs from, and the few ggml functions it
    lacks, each checked against the libraries' exports. It builds, runs and reproduces."""
    from pytest_schedfuzz.llama.upstream import upstream_lib_dir

    case = _case(digest)
    assert case.llama is not None and not case.llama.devices.gpus and case.llama.devices.n_rpc
    gone = replace(case, engine={**case.engine, "lib": "/nonexistent/builds/llama.cpp-b11739-0000/libllama.so.0"})
    out = tmp_path / "repro"
    export_llama_case(gone, out, None)
    cmake = (out / "CMakeLists.txt").read_text()
    assert f'set(LLAMA_DIR "{upstream_lib_dir().resolve()}"' in cmake
    assert "set(REPRO_DECLARED ON)" in cmake and "FATAL_ERROR \"" + str(upstream_lib_dir().resolve()) not in cmake
    assert "llama-cpp-python-0.3.36" not in cmake
    header = (out / "llama_declared.h").read_text()
    assert (upstream_lib_dir() / "llama.cdef").read_text().rstrip() in header  # the binding's declarations, as they are
    for said_in_header in ("/* ggml-backend.h, ggml's public API as of ggml 0.26.0; exported by libggml.so */\n"
                           "ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);",
                           "/* ggml.h, ggml's public API as of ggml 0.26.0; exported by libggml-base.so */\n"
                           "ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback);"):
        assert said_in_header in header
    assert '#include "llama_declared.h"' in (out / "repro.c").read_text()
    built = build_and_run(out)
    assert built.code == 1, built.output[-3000:]
    assert said in built.output and f"REPRODUCED: [{case.property}] call {case.step}" in built.output, built.output[-3000:]


@pytest.mark.engine
def test_a_case_is_exported_and_replayed_on_the_build_it_was_found_on_and_says_when_it_cannot_run(tmp_path: Path) -> None:
    """The MoE cache's case was found on b11739: without --llama-lib, export and replay used to run
    it on 0.3.36 (a traceback: ``Unsupported: ctx.moe_cache_size``); a GPU-like case named onto
    b11739 exited 1, the code of a reproduction. Now each runs where its record says, and a case
    that cannot run on the build named exits CANNOT_RUN (3), saying so."""
    moe = next(CORPUS.glob("*-398fc80683.json"))
    out = _cli("export", str(moe), "-o", str(tmp_path / "moe"))
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    report = (tmp_path / "moe" / "REPORT.md").read_text()
    assert "- Found on llama.cpp-b11739 (ggml 0.27.0)." in report  # the build, not the machine's cache folder
    gpu = next(CORPUS.glob("*-be71aa4ab0.json"))  # GPU-like devices: b11739 ships no ggml headers for the device
    cannot = _cli("replay", str(gpu), "--llama-lib", "llama.cpp-b11739")
    assert cannot.returncode == 3 and "cannot replay it on this build" in cannot.stdout, cannot.stdout + cannot.stderr


@pytest.mark.engine
def test_a_report_names_the_trigger_without_noise(tmp_path: Path) -> None:
    """An abort in llama_init_from_model is the finding's call -1 (its violation says call 0); the
    devices' free memory is said; an untriaged case says so rather than "no explanation yet"; the
    model's loading dots are not 20 lines of "log: .". The reproducer still reproduces."""
    case = _case("525922f4eb")
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case.to_json() | {"expect": "new"}))
    out = tmp_path / "repro"
    assert _cli("export", str(path), "-o", str(out)).returncode == 0
    report = (out / "REPORT.md").read_text()
    assert " -1. llama_init_from_model (it reserves the worst case)   <- the finding" in report
    assert "the finding is in `llama_init_from_model`" in report and "Not triaged yet" in report and "no explanation yet" not in report
    assert "- The devices: 1 RPC" in report
    built = build_and_run(out)
    assert built.code == 1 and "log: ." not in built.output, built.output[-3000:]
    gpu = _case("be71aa4ab0")
    assert gpu.llama is not None and gpu.llama.devices.gpus
    squeezed = replace(gpu, llama=replace(gpu.llama, devices=replace(gpu.llama.devices, gpu_free=(123_456, 7_890))))
    assert devices_said(squeezed.llama).startswith("2 GPU-like, left 123,456, 7,890 bytes free")  # type: ignore[arg-type]


def test_a_reproducer_with_gpu_like_devices_is_refused_on_a_headerless_build(tmp_path: Path) -> None:
    """The GPU-like device (fake_gpu.c) is built from ggml's private headers, which b11739 does
    not ship: such a workload is refused there, saying why; nothing is written."""
    case = _case("be71aa4ab0")
    assert case.llama is not None and case.llama.devices.gpus
    with pytest.raises(ExportError, match="the workload has GPU-like devices, which the reproducer builds from ggml's private headers"):
        export_llama_case(case, tmp_path / "repro", "llama.cpp-b11739")
    assert not (tmp_path / "repro").exists()


def test_what_neither_the_binding_nor_the_libraries_give_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name the reproducer needs that the cdef lacks and no public declaration gives, and a
    function the libraries do not export, are refused rather than declared."""
    from pytest_schedfuzz.cases import export_llama
    from pytest_schedfuzz.llama.declarations import from_binding
    from pytest_schedfuzz.llama.upstream import upstream_lib_dir

    folder = upstream_lib_dir()
    decl = from_binding(folder)
    assert decl is not None
    assert "ggml_backend_dev_by_type(enum" in export_llama.declared_header(folder, decl, "ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);")
    with pytest.raises(ExportError, match="lack ggml_backend_sched_new, which the reproducer names"):
        export_llama.declared_header(folder, decl, "ggml_backend_sched_new(NULL);")
    monkeypatch.setattr(export_llama, "_exported", lambda _: {})
    with pytest.raises(ExportError, match="its libraries export no ggml_backend_dev_by_type"):
        export_llama.declared_header(folder, decl, "ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);")


def test_every_template_field_is_filled_and_the_templates_are_package_data(tmp_path: Path) -> None:
    """The exporters' C and CMake come from template files beside them (``cases/*.in``): the
    export of a graph case, a llama.cpp case with a draft model of its own, the same-logits
    guard (two runs) and an RPC-only case on the headerless b11739 (``llama_declared.h``) leaves
    no ``@{field}`` unfilled; and pyproject ships the templates with the package."""
    import tomllib

    from pytest_schedfuzz.cases import templates

    graph = _case("06a0cc7a62")
    export_case(graph, graph.scenario, tmp_path / "graph", None, "0.25.3")  # type: ignore[arg-type]
    export_llama_case(_case("ca3710d217"), tmp_path / "draft", None)
    export_llama_case(load_case(next(CORPUS.glob("llama-same-logits-*.json"))), tmp_path / "logits", None)
    export_llama_case(_case("02cc370507"), tmp_path / "declared", "llama.cpp-b11739")
    written = [p for p in tmp_path.rglob("*") if p.suffix in (".c", ".h", ".txt")]
    assert {p.name for p in written} >= {"repro.c", "CMakeLists.txt", "llama_declared.h"}
    for path in written:
        assert "@{" not in path.read_text(), path
    folder = Path(templates.__file__).parent
    shipped = tomllib.loads((CORPUS.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["pytest_schedfuzz.cases"]
    assert sorted(p.name for p in folder.glob("*.in")) == sorted(p.name for pattern in shipped for p in folder.glob(pattern))
    with pytest.raises(ValueError, match="has no field nonesuch"):
        templates.fill("repro_new_gpu.c.in", nonesuch=1)
