"""Corpus files: bad input gets one clear error naming the file, nothing is changed; saves are
atomic under concurrency; a saved finding replays alone in a fresh process; minimize shrinks."""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.cases.corpus import Case, CaseError, case_files, load_case, save_case
from pytest_schedfuzz.model.graph_spec import GraphBuilder
from pytest_schedfuzz.model.layout import BackendLayout
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.sim.models import ModelShape, llama_graph

pytest_plugins = ["pytester"]
SCHEDFUZZ = [sys.executable, "-m", "pytest_schedfuzz.cli"]


def small_case(prop: str = "matches-reference", tag: int = 0) -> Case:
    b = GraphBuilder()
    w = b.weight("w", (8, 8), device=0)
    y = b.op("mul_mat", w, b.input("x", (8, 2 + tag)), name="y")
    sc = Scenario(BackendLayout.of("rpc", "cpu"), (("g", b.build(y)),), (Step("sched_new", params=SchedParams(64)), Step("alloc", "g")))
    return Case(prop, f"{prop}[what=assignment]", sc, "a message", 1)


def topology_switch_case(n_layers: int) -> Case:
    """reserve(A, 32 tokens) -> alloc(B) -> alloc(A, 2) -> alloc(A, 32), weights on RPC and CPU."""
    m = ModelShape(layer_devices=tuple(0 if i < n_layers // 2 else 1 for i in range(n_layers)), output_device=1, cpu_device=1)
    graphs = (("A32", llama_graph(m, 32, 64, 32)), ("B", llama_graph(m, 32, 64, 1)), ("A2", llama_graph(m, 2, 64, 2)))
    steps = (Step("sched_new", params=SchedParams(8192)), Step("reserve", "A32"), Step("alloc", "B"), Step("alloc", "A2"), Step("alloc", "A32"))
    sig = "no-same-size-realloc[explained=lost,lost_by=alloc changed,topology=switch]"
    return Case("no-same-size-realloc", sig, Scenario(BackendLayout.of("rpc", "cpu"), graphs, steps), "", 4)


def test_round_trip(tmp_path: Path):
    case = small_case()
    path = save_case(tmp_path, case)
    loaded = load_case(path)
    assert loaded.scenario == case.scenario and loaded.signature == case.signature and loaded.expect == "pass"


def test_a_case_under_the_same_name_is_kept_and_the_same_case_replaced(tmp_path: Path):
    """Two signatures of one workload that differ past the name's 60 characters (a check site,
    another build's abort) are two files; the same case saved again replaces its own."""
    case = small_case()
    first = save_case(tmp_path, replace(case, signature=case.signature[:-1] + ",site=" + "s" * 60 + "x]"))
    other = save_case(tmp_path, replace(case, signature=case.signature[:-1] + ",site=" + "s" * 60 + "y]"))
    assert first != other and first.stem == other.stem[:len(first.stem)]
    assert load_case(first).signature.endswith("x]") and load_case(other).signature.endswith("y]")
    assert save_case(tmp_path, load_case(first)) == first and len(list(case_files(tmp_path))) == 2


def _corrupt(data: dict, how: str) -> str:
    g = data["scenario"]["graphs"]["g"]
    if how == "unknown op":
        g["tensors"][-1]["op"] = "frobnicate"
    elif how == "bad shape":
        g["tensors"][-1]["ne"] = [9, 2, 1, 1]
    elif how == "cycle":
        g["tensors"][-1]["args"] = ["w", "y"]
    elif how == "backend missing":
        g["tensors"][0]["device"] = 5
    elif how == "future version":
        data["version"] = 99
    elif how == "schema":
        data["property"] = "no-such-property"
    elif how == "huge tensor":  # w and x: 2**40 elements each, y 2**22
        g["tensors"][0]["ne"] = [2**20, 2**20]
        g["tensors"][1]["ne"] = [2**20, 2**20]
        g["tensors"][2]["ne"] = [2**20, 2**20]
    elif how == "max_nodes":
        data["scenario"]["steps"][0]["params"]["max_nodes"] = 10**30
    elif how == "negative dim":
        g["tensors"][1]["ne"] = [8, -2]
    elif how == "bad version scope":
        data["expect"] = {"fail": "x", "fixed_in": "soon"}
    return json.dumps(data)


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("unknown op", "unknown op 'frobnicate'"),
        ("bad shape", "stored shape [9, 2, 1, 1]"),
        ("cycle", "not defined before it (or forms a cycle)"),
        ("backend missing", "device 5 is not in the layout"),
        ("future version", "newer than this schedfuzz reads"),
        ("schema", "does not match the case schema at property"),
        ("truncated", "not valid JSON (truncated?)"),
        ("malformed", "not valid JSON"),
        ("huge tensor", "over the limit of 67,108,864 (2**26) per tensor"),
        ("max_nodes", "max_nodes 1000000000000000000000000000000 is outside 1 .. 16,777,216"),
        ("negative dim", "has a negative dimension"),
        ("bad version scope", "does not match the case schema at expect"),
        ("not utf-8", "not UTF-8 text: byte 0xff"),
        ("deep nesting", "nested too deeply"),
        ("empty", "not valid JSON"),
    ],
)
def test_bad_input_gets_one_clear_error_and_nothing_changes(tmp_path: Path, how: str, needle: str):
    good = save_case(tmp_path, small_case())
    text = good.read_text()
    if how == "truncated":
        bad_text = text[: len(text) // 2]
    elif how == "malformed":
        bad_text = "{not json"
    elif how == "not utf-8":
        bad_text = text.replace("a message", "a \udcff message")
    elif how == "deep nesting":
        bad_text = "[" * 100_000 + "]" * 100_000
    elif how == "empty":
        bad_text = ""
    else:
        bad_text = _corrupt(json.loads(text), how)
    bad = tmp_path / "bad.json"
    bad.write_bytes(bad_text.encode("utf-8", "surrogateescape"))
    with pytest.raises(CaseError) as e:
        load_case(bad)
    assert str(bad) in str(e.value) and needle in str(e.value)
    # the CLI: exit status 2, the file named, nothing changed
    run = subprocess.run([*SCHEDFUZZ, "replay", str(bad)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and str(bad) in run.stderr and needle in run.stderr
    mini = subprocess.run([*SCHEDFUZZ, "minimize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert mini.returncode == 2 and "nothing was changed" in mini.stderr
    assert bad.read_bytes() == bad_text.encode("utf-8", "surrogateescape") and good.read_text() == text


def test_bad_corpus_file_is_a_failed_item_and_the_rest_runs(pytester: pytest.Pytester):
    corpus = pytester.path / "corpus"
    save_case(corpus, small_case())
    (corpus / "broken.json").write_text('{"format": "schedfuzz-case", "version": 1')
    result = pytester.runpytest_subprocess("--schedfuzz", "--schedfuzz-properties", "reuse-sound", "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*bad corpus file: */corpus/broken.json: not valid JSON (truncated?)*"])
    assert (corpus / "broken.json").read_text() == '{"format": "schedfuzz-case", "version": 1'


def _writer(args: tuple[str, int]) -> None:
    directory, k = args
    for j in range(20):
        save_case(directory, small_case(tag=k * 20 + j))


def test_concurrent_saves_lose_nothing(tmp_path: Path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_writer, [(str(tmp_path), k) for k in range(4)])
    files = list(case_files(tmp_path))
    assert len(files) == 80
    assert all(load_case(f) for f in files)
    assert not list(tmp_path.glob(".tmp-*"))


def test_xdist_workers_write_findings_concurrently(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))
    result = pytester.runpytest_subprocess(
        "--schedfuzz", "-n", "2", "-p", "no:cacheprovider", "--schedfuzz-seed", "3",
        "--schedfuzz-policy", "planted:ignore_op_offload", "--no-schedfuzz-rereserve",
        "--schedfuzz-reference", "planted:predict_without_pass2",
        "--schedfuzz-properties", "reuse-sound,no-same-size-realloc,matches-reference", "--schedfuzz-report", "report.json", timeout=600,
    )
    # each property is split into four shards per worker, each may find and save its own case
    failed = result.parseoutcomes()["failed"]
    assert failed >= 3
    saved = set(re.findall(r"saved to (\S+\.json)", result.stdout.str()))
    assert saved and all(load_case(p) for p in saved)  # every finding written is there, whole
    assert saved == {str(p) for p in case_files(pytester.path / "corpus")}
    props = {load_case(p).property for p in saved}
    # which planted fault a seed's draws reach first varies with the generators: findings of
    # two properties at least, written by different workers
    assert props <= {"matches-reference", "no-same-size-realloc", "reuse-sound"} and len(props) >= 2
    # the report adds up the workers' statistics
    assert sum(json.loads((pytester.path / "report.json").read_text())["stats"]["findings"].values()) == failed


def test_saved_finding_replays_from_its_file_alone_in_a_fresh_process(tmp_path: Path):
    path = save_case(tmp_path, topology_switch_case(2))
    run = subprocess.run([*SCHEDFUZZ, "replay", str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "same size, via sched" in run.stdout
    assert "verdict: FAIL: [no-same-size-realloc] step 4" in run.stdout and "a topology switch" in run.stdout


def test_replay_fails_a_case_that_now_fails_with_another_signature(tmp_path: Path):
    """Like the plugin's corpus item: a guard case is judged by every violation, not only its own
    signature, so a different failure is never printed as a pass."""
    case = topology_switch_case(2)
    path = save_case(tmp_path, Case(case.property, case.property + "[explained=an older explanation]", case.scenario, "old", case.step))
    run = subprocess.run([*SCHEDFUZZ, "replay", str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 1 and "verdict: FAIL: [no-same-size-realloc] step 4" in run.stdout, run.stdout + run.stderr


def test_minimize_shrinks_a_several_hundred_node_case(tmp_path: Path):
    case = topology_switch_case(8)
    assert case.size()[1] > 600
    save_case(tmp_path, case)
    run = subprocess.run([*SCHEDFUZZ, "minimize", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    (path,) = case_files(tmp_path)
    small = load_case(path)
    assert small.signature == case.signature
    assert small.size()[1] <= 36
    assert "-> " in run.stdout
    replay = subprocess.run([*SCHEDFUZZ, "replay", str(path)], capture_output=True, text=True, timeout=300)
    assert replay.returncode == 1 and "same size" in replay.stdout
    # the file states the smaller case's own step and message, not the original's
    assert f"step {small.step}: {small.message}" in replay.stdout


def test_show_draws_the_realloc_step_with_splits_and_the_named_node(tmp_path: Path):
    path = save_case(tmp_path, topology_switch_case(2))
    out = tmp_path / "case.dot"
    run = subprocess.run([*SCHEDFUZZ, "show", str(path), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "## SPLIT #0: CPU" in run.stdout and "step 4: alloc(A32)" in run.stdout
    dot = out.read_text()
    assert "cluster_split0" in dot and "cluster_split1" in dot  # one box per split
    assert "label=copy" in dot  # a copy between devices
    assert '"inp_embd" [label=' in dot and "penwidth=4, color=red" in dot  # the node ggml's reason names
    bad = subprocess.run([*SCHEDFUZZ, "show", str(path), "-o", str(tmp_path / "case.gif")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "must be .svg, .png or .dot" in bad.stderr


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("n_ubatch", -3, "n_ubatch -3: must be in 1 .. 65536"),
        ("n_head", 0, "model.n_head = 0: must be in 1 .. 65536"),
        ("layer_devices", [0, 7], "model.layer_devices: device 7 is not in the layout (2 backends)"),
        ("ubatch", [9, 1, 16], "events[1]: ubatch (9, 1, 16) needs 1 <= tokens <= n_ubatch"),
    ],
)
def test_bad_workload_fields_are_named(tmp_path: Path, field: str, value: object, needle: str):
    from pytest_schedfuzz.sim.driver import Driver, Reconfigure, Ubatch, Workload

    w = Workload(BackendLayout.of("rpc", "cpu"), ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1), 8,
                 (Reconfigure(SchedParams(4096)), Ubatch(8, 1, 16)))
    case = Case("no-same-size-realloc", "no-same-size-realloc[explained=lost]", Driver().scenario(w), "m", 1, workload=w)
    data = json.loads(save_case(tmp_path, case).read_text())
    if field == "n_ubatch":
        data["workload"]["n_ubatch"] = value
    elif field == "ubatch":
        data["workload"]["events"][1]["ubatch"] = value
    else:
        data["workload"]["model"][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(CaseError, match=re.escape(needle)):
        load_case(bad)
    run = subprocess.run([*SCHEDFUZZ, "replay", str(bad)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and needle in run.stderr and "Traceback" not in run.stderr


def test_replay_of_an_empty_folder_is_an_error(tmp_path: Path):
    run = subprocess.run([*SCHEDFUZZ, "replay", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no case files" in run.stderr


def test_saved_cases_keep_the_folders_normal_permissions(tmp_path: Path):
    import os

    mask = os.umask(0o022)
    try:
        path = save_case(tmp_path, small_case())
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--policy", "nosuch:x"], "--policy 'nosuch:x': No module named 'nosuch'"),
        (["run", "--examples", "0"], "--examples 0: must be at least 1"),
        (["run", "--lib", "/nonexistent"], "--lib /nonexistent: not a folder"),
        (["replay", "--target", "nosuch", "x.json"], "x.json"),
        (["bench", "--sections", "bogus"], "bogus"),
        (["gate", "--base", "ggml-0.25.3", "--head", "ggml-0.25.3", "--properties", "fast"], "--properties: unknown fast"),
    ],
)
def test_cli_bad_options_exit_2_with_one_line(args: list[str], needle: str):
    run = subprocess.run([*SCHEDFUZZ, *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and needle in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert "--schedfuzz-" not in run.stderr


def test_show_draws_a_compute_step_that_crashed_the_engine(tmp_path: Path):
    """The RPC server crash of the starter corpus: the engine leaves no record of the compute
    step it died in, so show draws the reference's plan of that step, and says so."""
    case = next((Path(__file__).resolve().parents[2] / "corpus").glob("no-abort-*-4257100ce1.json"))
    out = tmp_path / "case.dot"
    run = subprocess.run([*SCHEDFUZZ, "show", str(case), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "step 1: compute(g0), as scheduled by the reference's prediction" in run.stdout
    assert "## SPLIT #0: RPC0 # 2 inputs: x, dst1" in run.stdout and "cpy1" in out.read_text()


def test_a_flash_attention_mask_shorter_than_the_kv_is_rejected():
    """ggml builds it, and its kernels then read past the mask (garbage, a NaN assert later)."""
    from pytest_schedfuzz.model.shapes import SpecError

    b = GraphBuilder()
    q, k, v = b.input("q", (16, 4, 2)), b.input("k", (16, 8, 2), "f16"), b.input("v", (16, 8, 2), "f16")
    with pytest.raises(SpecError, match="mask smaller than kv length"):
        b.op("flash_attn_ext", q, k, v, b.input("mask", (4, 4), "f16"), name="fa", scale=0.25)


CORPUS = Path(__file__).resolve().parents[2] / "corpus"


def _corpus_copy(tmp_path: Path, pattern: str) -> Path:
    (case,) = CORPUS.glob(pattern)
    path = tmp_path / case.name
    path.write_text(case.read_text())
    return path


def _minimized(tmp_path: Path, pattern: str) -> tuple[Case, Case, subprocess.CompletedProcess[str]]:
    """A starter-corpus case minimized alone in ``tmp_path``: (before, after, the run); the
    smaller case keeps the signature."""
    before = load_case(_corpus_copy(tmp_path, pattern))
    run = subprocess.run([*SCHEDFUZZ, "minimize", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    (small,) = [load_case(p) for p in case_files(tmp_path)]
    assert small.signature == before.signature
    # it says what it wrote, and what it removed: the original, where the shrunk case's name differs
    assert f"wrote {small.path}" in run.stdout and (small.path == before.path or f"removed {before.path}" in run.stdout), run.stdout
    return before, small, run


def test_minimize_stops_at_its_time_limit_and_leaves_the_rest_as_it_is(tmp_path: Path):
    path = _corpus_copy(tmp_path, "no-same-size-realloc-*-06a0cc7a62.json")
    text = path.read_text()
    run = subprocess.run([*SCHEDFUZZ, "minimize", str(tmp_path), "--time-limit", "0.001"], capture_output=True, text=True, timeout=120)
    # the limit is past before the first candidate replays: no smaller case, nothing written
    assert run.returncode == 0 and f"{path}: no smaller case found" in run.stdout and "(stopped by --time-limit); left as it is" in run.stdout, \
        run.stdout + run.stderr
    assert "wrote" not in run.stdout and "removed" not in run.stdout
    assert [p.name for p in case_files(tmp_path)] == [path.name] and path.read_text() == text


def test_minimize_shrinks_a_driver_workload_case_by_its_model_sizes(tmp_path: Path):
    """A driver case (a simulated llama_context workload) with its events already minimal
    still shrinks: the model's sizes halve while the signature holds."""
    before, small, run = _minimized(tmp_path, "no-same-size-realloc-*-06a0cc7a62.json")
    assert small.workload is not None
    assert small.size()[3] < before.size()[3] // 4  # elements
    assert small.workload.model.n_embd < before.workload.model.n_embd  # type: ignore[union-attr]
    assert re.search(r"\(\d+ replays of \d+ smaller candidates; \d+ ruled out by the reference", run.stdout), run.stdout


@pytest.mark.engine
def test_minimize_shrinks_a_llama_case_and_counts_it_in_calls_and_tokens(tmp_path: Path):
    before, small, run = _minimized(tmp_path, "llama-no-same-size-realloc-*-7c476aeac4.json")
    assert small.llama is not None
    assert small.size()[1] < before.size()[1]  # batch tokens
    assert "2 calls, 9 batch tokens, 1 layers" in run.stdout and " nodes" not in run.stdout


@pytest.mark.engine
def test_show_draws_a_llama_case_to_the_file_asked_for(tmp_path: Path):
    case = next(CORPUS.glob("llama-no-same-size-realloc-*-7c476aeac4.json"))
    out = tmp_path / "llama.dot"
    run = subprocess.run([*SCHEDFUZZ, "show", str(case), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    dot = out.read_text()
    # the calls in order, the failing one red, its same-size realloc with ggml's reason
    assert "llama_init_from_model" in dot and "llama_decode([seq 0: 1 tok, out last])" in dot
    assert "SAME-SIZE REALLOC: node node_29 is not valid" in dot and "penwidth=3" in dot
    assert f"wrote {out}" in run.stdout


def test_show_of_a_failed_reservation_names_the_buffer_sizes_and_device_limits(tmp_path: Path):
    """The plan-kept crash is about a GPU buffer over its device's max_size: the drawing and the
    text give the limit and ggml's own requested sizes."""
    case = next(CORPUS.glob("no-abort-after-failed-allocation-kind-crash-plan-kept-5a2e452570.json"))
    out = tmp_path / "kept.dot"
    run = subprocess.run([*SCHEDFUZZ, "show", str(case), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    for text in (run.stdout, out.read_text()):
        assert "GPU0: compute buffer 0 B (max_size 16.0 KiB" in text
        assert "ggml: GPU0: 20480 bytes requested, over the maximum buffer size 16384" in text
        assert "failed to allocate GPU0 buffer of size 262784" in text


def test_show_draws_a_driver_case_at_the_step_that_failed(tmp_path: Path):
    case = next(CORPUS.glob("no-same-size-realloc-*-06a0cc7a62.json"))
    step = load_case(case).step
    out = tmp_path / "driver.dot"
    run = subprocess.run([*SCHEDFUZZ, "show", str(case), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"step {step}: compute(" in run.stdout and f"graph reallocation at step {step} (same size" in run.stdout
    assert f"step {step}: compute(" in out.read_text()


def _children_of(pid: int) -> list[int]:
    """Processes the harness started for ``pid`` (workers, RPC servers): they carry its pid."""
    from pytest_schedfuzz.process.children import PARENT_ENV

    mine = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if f"{PARENT_ENV}={pid}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    mine.append(int(proc.name))
            except OSError:
                pass
    return mine


def test_ctrl_c_during_a_shrink_stops_within_seconds_saves_the_case_and_leaves_nothing_running(tmp_path: Path):
    """A real SIGINT to the whole process group, as a terminal's Ctrl-C sends it, once the run
    says it is shrinking a finding: the CLI exits 130 within seconds, the smallest case so far
    is kept whole (unconfirmed: it was not replayed on a fresh worker, so not a finding, and not
    in the corpus), the run says where, no half-written file and no worker or RPC server is left."""
    import os
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    (tmp_path / "corpus").mkdir()
    proc = subprocess.Popen(
        [*SCHEDFUZZ, "run", "--policy", "planted:never_slowly", "--properties", "reuse-complete", "--examples", "300", "--seed", "1",
         "--corpus", "corpus", "--known", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True, cwd=tmp_path,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "shrinking it (Ctrl-C stops" in line:
            break
    else:
        pytest.fail(f"the run never said it was shrinking: {proc.communicate()}")
    time.sleep(0.2)  # inside the shrink (it takes seconds on this finding)
    children = _children_of(proc.pid)
    assert children, "the engine's worker should be running"
    pressed = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - pressed
    assert proc.returncode == 130, out + err
    assert took < 15, f"Ctrl-C took {took:.1f} s"
    assert "reuse-complete: interrupted (Ctrl-C)" in out, out
    (kept,) = case_files(tmp_path / ".schedfuzz" / "unconfirmed")
    assert f"not a finding: kept in {kept.relative_to(tmp_path)}" in err or f"kept in {kept}" in err, err
    assert load_case(kept).property == "reuse-complete" and not list(case_files(tmp_path / "corpus"))
    assert not list(tmp_path.rglob(".tmp-*"))
    time.sleep(1.0)
    assert not [p for p in children if Path(f"/proc/{p}").exists() and "zombie" not in (Path(f"/proc/{p}/status").read_text())]
    assert "Traceback" not in err, err


def test_an_abort_finding_names_the_file_line_and_function_of_the_check_that_fired():
    """ggml prints the check's file and line (from its build folder, which pip deleted); the
    function is read from that line of the cached source distribution."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.profiles import FuzzConfig

    case = load_case(next(CORPUS.glob("no-abort-kind-abort-message-ggml-backend-cpp-ggml-assert-n-g-9523a46d7b.json")))
    fuzzer = Fuzzer(FuzzConfig(database=None, lib="ggml-0.15.3"))
    try:
        (found,) = [v for v in fuzzer.replay(case) if v.signature() == case.signature]
    finally:
        fuzzer.close()
    assert "(check: ggml-backend.cpp:1347, in ggml_backend_sched_split_graph)" in found.message


def test_check_site_reads_the_function_from_the_source_on_disk(tmp_path: Path):
    from pytest_schedfuzz.properties.sites import check_site

    src = tmp_path / "ggml-alloc.c"
    src.write_text("static void helper(int x) {\n}\n\nbool ggml_gallocr_reserve_n(\n        ggml_gallocr_t galloc) {\n    if (x) {\n        GGML_ASSERT(x);\n")
    assert check_site(f"{src}:7: GGML_ASSERT(x) failed") == "ggml-alloc.c:7, in ggml_gallocr_reserve_n"
    assert check_site("/gone/ggml-alloc.c:7: GGML_ASSERT(x) failed") == "ggml-alloc.c:7"
    assert check_site("Remote RPC server crashed") == ""


def test_minimize_drops_the_gpu_like_devices_and_placement_a_llama_finding_does_not_need() -> None:
    """Judged by a stand-in replay (the finding needs one device with offload_op): minimize removes
    the second GPU-like device, the overrides, the memory limit and the device's other settings."""
    from pytest_schedfuzz.cases.minimize import minimize_case
    from pytest_schedfuzz.model.layout import BackendSpec
    from pytest_schedfuzz.model.llama_model import ModelSpec
    from pytest_schedfuzz.model.llama_workload import CPU_DEVICE, Call, ContextParams, Devices, LlamaWorkload, Part

    busy = BackendSpec("gpu", offload_min_batch=8, asynchronous=True, host_buffer=True, unsupported=("ROPE",), graph_optimize=True)
    dv = Devices(n_rpc=1, gpus=(busy, BackendSpec("gpu")), gpu_free=(1 << 20, 0), tensor_split=(1.0, 2.0, 1.0), overrides=(("token_embd", CPU_DEVICE),))
    w = LlamaWorkload(ModelSpec(n_layer=2), dv, ContextParams(), (Call("decode", (Part(0, 8, "last"),)), Call("decode", (Part(0, 1, "last"),))))
    case = Case("llama-no-same-size-realloc", "sig", None, llama=w)

    def replay(c: Case) -> list[str]:
        return ["sig"] if c.llama is not None and any(g.offload_min_batch for g in c.llama.devices.gpus) else []

    small, _ = minimize_case(case, replay, lambda w: None, progress=False)  # type: ignore[arg-type, return-value]
    assert small.llama is not None
    assert small.llama.devices.gpus == (BackendSpec("gpu", offload_min_batch=8, asynchronous=True),)
    assert not small.llama.devices.overrides and not small.llama.devices.gpu_free and not small.llama.devices.tensor_split


def test_the_commands_that_replay_a_corpus_find_one_as_pytest_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gate``, ``mutate`` and ``coverage``: the corpus named (which must exist), else ./corpus,
    else the built-in one, so that each works in an empty folder."""
    from pytest_schedfuzz.cases.corpus import STARTER_CORPUS
    from pytest_schedfuzz.commands import UsageError
    from pytest_schedfuzz.commands.tools import corpus_arg

    monkeypatch.chdir(tmp_path)
    assert corpus_arg(None) == STARTER_CORPUS
    (tmp_path / "corpus").mkdir()
    assert corpus_arg(None) == Path("corpus")
    with pytest.raises(UsageError, match="--corpus nosuch: no such folder"):
        corpus_arg("nosuch")


def test_resign_names_the_cause_in_todays_words_and_keeps_the_old_ones(tmp_path: Path):
    case = topology_switch_case(2)
    old = "no-same-size-realloc[explained=lost,lost_by=alloc changed]"  # before the topology was signed
    path = save_case(tmp_path, replace(case, signature=old, expect={"fail": "a known bug, saved under older words"}))
    text_before = path.read_text()
    run = subprocess.run([*SCHEDFUZZ, "resign", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    resigned = load_case(path)
    assert resigned.signature == case.signature and resigned.signed_as == (old,)
    assert resigned.scenario is not None and case.scenario is not None and resigned.scenario.dumps() == case.scenario.dumps()
    assert (resigned.expect, resigned.message, resigned.step) == ({"fail": "a known bug, saved under older words"}, "", case.step)
    assert "1 case(s) signed again; distinct signatures shown on this build: 1 before, 1 after" in run.stdout
    assert text_before != path.read_text() and [p.name for p in tmp_path.glob("*.json")] == [path.name]
    # run again: the case shows its own signature now, and nothing changes
    again = subprocess.run([*SCHEDFUZZ, "resign", str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "kept" in again.stdout and "0 case(s) signed again" in again.stdout and load_case(path) == resigned


def _as_format1(data: dict) -> dict:
    """A case of today's format as format 1 wrote it: a call's count or index in ``n``, its switch in ``flag``."""
    calls = []
    for c in data["llama"]["calls"]:
        c = {("n" if k in ("n_drop", "n_discard", "adapter", "adapters", "n_draft") else "flag" if k == "on" else k): v for k, v in c.items()}
        calls.append(c)
    return {**data, "version": 1, "llama": {**data["llama"], "calls": calls}}


def test_a_format_1_case_loads_as_today_and_migrate_rewrites_only_what_it_must(tmp_path: Path):
    """Format 1 named five counts ``n`` and two switches ``flag``; a file of it still loads as the
    same case, and ``schedfuzz migrate`` rewrites it, under its name, as the starter corpus holds it
    now; a current file and a bad one are left as they are."""
    starter = Path(__file__).resolve().parents[2] / "corpus"
    kinds: set[str] = set()
    for name in ("2a9936e1c8", "84199f84a5", "0fcd848bd0.json", "39761028ac"):
        today = next(starter.glob(f"*{name}*"))
        data = json.loads(today.read_text())
        kinds |= {c["kind"] for c in data["llama"]["calls"]}
        old = tmp_path / today.name
        old.write_text(json.dumps(_as_format1(data), indent=1, sort_keys=True) + "\n")
        assert replace(load_case(old), path=None) == replace(load_case(today), path=None)
    assert {"lora_load", "lora_set", "shift", "spec", "set_warmup"} <= kinds, kinds
    current = tmp_path / "current.json"
    current.write_text(today.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_as_format1(json.loads(today.read_text())), "llama": {"model": {}, "ctx": {}, "calls": [{"kind": "decode", "n": 3}]}}))
    bad_before, current_before = bad.read_bytes(), current.stat().st_mtime_ns
    run = subprocess.run([*SCHEDFUZZ, "migrate", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "bad.json" in run.stderr and "'decode' call has no field n" in run.stderr, run.stderr
    assert "migrated 4 case file(s) to format version 2; 1 already were; 1 could not be read" in run.stdout, run.stdout
    assert bad.read_bytes() == bad_before and current.stat().st_mtime_ns == current_before
    for name in ("2a9936e1c8", "84199f84a5", "0fcd848bd0.json", "39761028ac"):
        today = next(starter.glob(f"*{name}*"))
        assert (tmp_path / today.name).read_text() == today.read_text()


def test_the_starter_corpus_is_in_todays_format():
    from pytest_schedfuzz.cases.corpus import CASE_VERSION

    starter = Path(__file__).resolve().parents[2] / "corpus"
    assert {json.loads(p.read_text())["version"] for p in [*case_files(starter), *case_files(starter / "unconfirmed")]} == {CASE_VERSION}
