"""The plugin end to end (pytester, real engine): the suite passes, and each planted fault is
caught by the property meant to catch it, shrunk, and saved to the corpus."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_schedfuzz.files import cache_dir
from pytest_schedfuzz.properties import GRAPH_PROPERTY_IDS

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent

# read at import, before pytester moves HOME (and with it the default cache) to a fresh folder
CACHE = cache_dir()
# tests/ for the planted faults, before what the suite was started with (a checkout not installed)
PYTHONPATH = os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH"))))


@pytest.fixture
def fuzz(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Run ``pytest --schedfuzz ARGS`` in a fresh process, with tests/planted.py importable, and
    without the built-in known bugs (these tests find them again from nothing)."""
    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)
    # the same cache as this process (pytester gives the run another HOME): the built-ins' sources,
    # where an abort's check site is read (signatures name it), and what is built once
    monkeypatch.setenv("SCHEDFUZZ_CACHE", str(CACHE))

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--schedfuzz-seed", "1", "--schedfuzz-known=none", *args,
                                             timeout=600)

    return run


def failing_properties(result: pytest.RunResult) -> set[str]:
    return set(re.findall(r"FAILED schedfuzz::([\w.-]+)", result.stdout.str()))


def saved_cases(pytester: pytest.Pytester) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((pytester.path / "corpus").glob("*.json"))]


def test_flag_off_costs_nothing(pytester: pytest.Pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    pytester.makeconftest(
        """
        import sys
        def pytest_sessionfinish(session):
            loaded = [m for m in ("pytest_schedfuzz.campaign.fuzz", "pytest_schedfuzz.engine", "ggml", "hypothesis") if m in sys.modules]
            print("LOADED:", loaded)
        """
    )
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*LOADED: []"])
    assert "schedfuzz: profile" not in result.stdout.str() and "== schedfuzz ==" not in result.stdout.str()


def test_dev_profile_passes_and_prints_the_summary(fuzz, pytester: pytest.Pytester):
    """With the starter corpus (the known bugs) beside it, as in a checkout of this repository."""
    (pytester.path / "corpus").mkdir()
    starter = sorted((TESTS.parent / "corpus").glob("*.json"))
    for case in starter:
        (pytester.path / "corpus" / case.name).write_text(case.read_text())
    result = fuzz("--schedfuzz-properties", ",".join(GRAPH_PROPERTY_IDS), "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] >= len(GRAPH_PROPERTY_IDS), result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert "schedfuzz: profile=dev seed=1 " in out
    result.stdout.fnmatch_lines(["schedfuzz: engine = ggml 0.*.* (*libggml-base.so*); bindings: *op numbers agree*"])
    result.stdout.fnmatch_lines(["*graphs reused = *", "*graph reallocs = * / *   (same size) / (changed size)", "*splits = *", "*findings?no-same-size-realloc? = 0"])
    assert sorted((pytester.path / "corpus").glob("*.json")) == [pytester.path / "corpus" / c.name for c in starter]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--schedfuzz-policy", "planted:ignore_op_offload", "--schedfuzz-properties", "reuse-sound,reuse-complete"], {"reuse-sound"}),
        (["--schedfuzz-policy", "planted:never", "--schedfuzz-properties", "reuse-sound,reuse-complete"], {"reuse-complete"}),
        (["--schedfuzz-reference", "planted:predict_without_pass2", "--schedfuzz-properties", "matches-reference"], {"matches-reference"}),
    ],
    ids=["ignore-op-offload", "never-reuse", "reference-without-pass-2"],
)
def test_planted_fault_is_caught(fuzz, pytester: pytest.Pytester, args: list[str], expected: set[str]):
    result = fuzz(*args)
    assert failing_properties(result) == expected
    cases = saved_cases(pytester)
    assert [c["property"] for c in cases] == sorted(expected)
    assert "saved to" in result.stdout.str()


def test_the_compiled_reference_judges_and_is_named(fuzz, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Outside the suite the compiled reference judges (the header and the summary say so), and
    a fault planted in it (a subclass of its Scheduler) is caught as in the source."""
    from pytest_schedfuzz.compiled import build_dir, compile_reference

    assert compile_reference().startswith("compiled")
    monkeypatch.delenv("SCHEDFUZZ_REFERENCE")
    result = fuzz("--schedfuzz-reference", "planted:predict_without_pass2", "--schedfuzz-properties", "matches-reference")
    assert failing_properties(result) == {"matches-reference"}
    result.stdout.fnmatch_lines([f"reference: compiled with mypyc * ({build_dir()})"])
    monkeypatch.setenv("SCHEDFUZZ_REFERENCE", "source")
    result = fuzz("--schedfuzz-properties", "reuse-sound", "--schedfuzz-examples", "5")
    result.stdout.fnmatch_lines(["reference: source (SCHEDFUZZ_REFERENCE=source)"])


def test_policy_ignoring_max_nodes_is_caught_and_pytest_survives(fuzz, pytester: pytest.Pytester):
    result = fuzz("--schedfuzz-policy", "planted:ignore_max_nodes", "--schedfuzz-properties", "reuse-sound,reuse-equivalent,matches-reference")
    assert failing_properties(result) & {"reuse-sound", "no-abort"}
    assert "matches-reference" not in failing_properties(result)  # the session went on
    result.stdout.fnmatch_lines(["NEW FINDINGS: *", "  reuse-sound [[]*[]]"])


def test_driver_without_rereserve_hits_same_size_reallocs_on_the_engine(fuzz, pytester: pytest.Pytester):
    result = fuzz("--no-schedfuzz-rereserve", "--schedfuzz-properties", "no-same-size-realloc")
    assert failing_properties(result) == {"no-same-size-realloc"}
    (case,) = saved_cases(pytester)
    assert any(why in case["message"] for why in ("a topology switch", "an assignment change", "does not dominate"))
    # shrunk by Hypothesis to a one-layer model and few steps (it keeps the whole signature,
    # invalid tensor included, which leaves more steps than the explanation alone did)
    assert len(case["scenario"]["steps"]) <= 18
    assert len(case["workload"]["model"]["layer_devices"]) == 1
    # the driver mode is part of the case: replayed from its file alone, the new finding reproduces
    assert case["options"] == {"rereserve": False} and case["expect"] == "new"
    (path,) = sorted((pytester.path / "corpus").glob("*.json"))
    replay = pytester.run("schedfuzz", "replay", str(path), timeout=300)
    assert replay.ret == 1 and "verdict: reproduces (a new finding, not triaged)" in replay.stdout.str(), replay.stdout.str()


def test_saved_finding_is_replayed_first_and_judges_the_current_policy(fuzz, pytester: pytest.Pytester):
    fuzz("--schedfuzz-policy", "planted:ignore_op_offload", "--schedfuzz-properties", "reuse-sound")
    (path,) = sorted((pytester.path / "corpus").glob("*.json"))
    # the same bad policy: the case fails again, as its own item, before the fuzzing items
    again = fuzz("--schedfuzz-policy", "planted:ignore_op_offload", "--schedfuzz-properties", "reuse-sound", "-v")
    lines = [line for line in again.stdout.lines if "schedfuzz::" in line and ("PASSED" in line or "FAILED" in line)]
    assert lines[0].startswith(f"schedfuzz::corpus/{path.stem} FAILED")
    # the fixed (default) policy: the case passes
    fixed = fuzz("--schedfuzz-properties", "reuse-sound")
    fixed.assert_outcomes(passed=2)


def test_junitxml_carries_the_property_and_the_case_file(fuzz, pytester: pytest.Pytester):
    fuzz("--schedfuzz-policy", "planted:ignore_op_offload", "--schedfuzz-properties", "reuse-sound", "--junitxml=out.xml")
    xml = (pytester.path / "out.xml").read_text()
    (case,) = sorted((pytester.path / "corpus").glob("*.json"))
    assert '<property name="schedfuzz_property" value="reuse-sound"' in xml
    assert f'<property name="schedfuzz_case" value="{case}"' in xml


def test_schedfuzz_run_exits_non_zero_on_findings(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)
    cli = (sys.executable, "-m", "pytest_schedfuzz.cli", "run", "--seed", "1")
    good = pytester.run(*cli, "--properties", "reuse-complete,matches-reference", "-v", timeout=300)
    assert good.ret == 0 and "graph reallocs = " in good.stdout.str()
    bad = pytester.run(*cli, "--properties", "reuse-complete", "--policy", "planted:never", timeout=300)
    assert bad.ret == 1 and "reuse-complete: FAIL" in bad.stdout.str()
    (case,) = saved_cases(pytester)  # printed and saved, as under pytest
    assert case["property"] == "reuse-complete" and "saved to " in bad.stdout.str()


@pytest.mark.engine
def test_llama_same_size_reallocs_are_found_from_nothing_saved_and_then_known(pytester: pytest.Pytester):
    """In an empty directory, as a user runs it (the ci profile's own seed), the generic
    strategies find a same-size reallocation in llama.cpp 0.3.36, shrink it to a few calls,
    explain it and save it; replayed, it fails again. (Issue 19: generator changes once lost this.)"""
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--schedfuzz-profile", "ci", "--schedfuzz-known=none",
                                           "--schedfuzz-properties", "llama-no-same-size-realloc", "-v", timeout=600)
    assert "seed=0" in result.stdout.str()
    assert failing_properties(result) == {"llama.cpp"}
    (case,) = saved_cases(pytester)
    assert case["signature"].startswith("llama-no-same-size-realloc[") and "explained=" in case["signature"]
    # Hypothesis shrinks (within the profile's time; the first signature found at seed 0 decides how far:
    # 19 calls since lost reservations across topologies are signed by the batch class); schedfuzz minimize goes further
    assert len(case["llama"]["calls"]) <= 24
    assert "ggml_gallocr_needs_realloc:" in case["message"] and "reservation" in case["message"]
    out = result.stdout.str()
    assert "llama.cpp: graph reallocs = " in out and "llama-reuse-sound had nothing to check" in out
    again = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--schedfuzz-profile", "ci",
                                          "--schedfuzz-properties", "llama-no-abort", "--schedfuzz-examples", "3", timeout=600)
    assert again.ret != 0 and "reproduces on llama.cpp-0.3.36; nobody has triaged it" in again.stdout.str()


def test_the_llama_properties_are_collected_as_one_item(fuzz, pytester: pytest.Pytester):
    """The llama.cpp properties are one item (``properties.fuzz_units``): each workload runs once."""
    result = fuzz("--schedfuzz-properties", "llama-reuse-sound,llama-no-abort", "--schedfuzz-examples", "6", "--co", "-q")
    assert "schedfuzz::llama.cpp" in result.stdout.str() and "schedfuzz::llama-no-abort" not in result.stdout.str()


@pytest.mark.engine
def test_a_path_option_in_the_space_form_keeps_the_corpus_here(fuzz, pytester: pytest.Pytester):
    """``--schedfuzz-llama-lib DIR`` makes pytest's rootdir the project above DIR; the corpus and
    the database stay in the directory pytest was started in (this one: empty)."""
    from pytest_schedfuzz.llama.llama_target import default_lib_dir

    result = fuzz("--schedfuzz-llama-lib", str(default_lib_dir()), "--schedfuzz-properties", "llama-reuse-sound", "--schedfuzz-examples", "3")
    result.assert_outcomes(passed=1)  # the project's corpus (expected failures) was not replayed


def test_schedfuzz_lib_in_the_space_form_replays_this_corpus_and_writes_nothing_there(fuzz, pytester: pytest.Pytester):
    """``--schedfuzz-lib DIR`` (space form): the corpus of the directory pytest started in is
    replayed, a finding is saved there, and nothing is written into DIR; the header names the
    ggml that was loaded."""
    from pytest_schedfuzz.ggml.lib import resolve_lib

    lib = Path(resolve_lib("ggml-0.25.3") or "")
    before = sorted(p.name for p in lib.iterdir())
    (pytester.path / "corpus").mkdir()
    case = TESTS.parent / "corpus" / "no-abort-kind-abort-message-ggml-backend-cpp-ggml-assert-n-g-9523a46d7b.json"
    (pytester.path / "corpus" / case.name).write_text(case.read_text())
    result = fuzz("--schedfuzz-lib", str(lib), "--schedfuzz-properties", "reuse-sound", "--schedfuzz-examples", "10",
                  "--schedfuzz-policy", "planted:ignore_op_offload", "-v")
    result.assert_outcomes(passed=1, failed=1)  # the case (a guard on 0.25.3) and the planted policy
    result.stdout.fnmatch_lines([f"schedfuzz: engine = ggml 0.25.3 ({lib}/libggml-base.so*"])
    assert len(saved_cases(pytester)) == 2 and sorted(p.name for p in lib.iterdir()) == before


@pytest.mark.parametrize(("lib", "outcome"), [("ggml-0.15.3", {"xfailed": 1}), ("ggml-0.25.3", {"passed": 1})])
def test_a_bug_fixed_in_a_version_is_expected_before_it_and_guarded_from_it(fuzz, pytester: pytest.Pytester, lib: str, outcome: dict[str, int]):
    (pytester.path / "corpus").mkdir()
    case = TESTS.parent / "corpus" / "no-abort-kind-abort-message-ggml-backend-cpp-ggml-assert-n-g-9523a46d7b.json"
    assert json.loads(case.read_text())["expect"]["fixed_in"] == "0.25.3"
    (pytester.path / "corpus" / case.name).write_text(case.read_text())
    result = fuzz(f"--schedfuzz-lib={lib}", "--schedfuzz-properties", "reuse-sound", "--schedfuzz-examples", "1")
    result.assert_outcomes(passed=1 + outcome.get("passed", 0), xfailed=outcome.get("xfailed", 0))


def test_schedfuzz_lib_reaches_the_test_suite(pytester: pytest.Pytester):
    """Without --schedfuzz, --schedfuzz-lib still chooses the engine of the session's tests."""
    pytester.makepyfile(test_x="""
        from pytest_schedfuzz.ggml.graph_target import GgmlTarget

        def test_engine():
            with GgmlTarget() as t:
                print("VERSION", t.start()["ggml_version"])
    """)
    for lib, version in (("ggml-0.15.3", "0.15.3"), ("ggml-0.25.3", "0.25.3")):
        result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", f"--schedfuzz-lib={lib}")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([f"*VERSION {version}*"])
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--schedfuzz-lib=/nonexistent")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR and "--schedfuzz-lib /nonexistent: not a folder" in bad.stderr.str()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--schedfuzz-examples", "-1"], "--schedfuzz-examples -1: must be at least 1"),
        (["--schedfuzz-examples", "0"], "--schedfuzz-examples 0: must be at least 1"),
        (["--schedfuzz-budget", "-3"], "--schedfuzz-budget -3: must be a positive number of seconds"),
        (["--schedfuzz-seed", "-5"], "--schedfuzz-seed -5: must be in 0 .. 2**32-1"),
        (["--schedfuzz-examples", "many"], "argument --schedfuzz-examples: invalid int value: 'many'"),
        (["--schedfuzz-target", "nosuch:x"], "--schedfuzz-target 'nosuch:x': No module named 'nosuch' (is its folder on PYTHONPATH?)"),
        (["--schedfuzz-policy", "planted"], "--schedfuzz-policy 'planted': expected MODULE:CALLABLE"),
        (["--schedfuzz-lib", "/nonexistent"], "--schedfuzz-lib /nonexistent: not a folder, nor one of ggml-0.25.3, ggml-0.15.3"),
        (["--schedfuzz-corpus", "/nonexistent"], "--schedfuzz-corpus /nonexistent: no such folder"),
        (["--schedfuzz-profile", "weekly"], "--schedfuzz-profile 'weekly': choose one of dev, ci, nightly"),
        (["--schedfuzz-properties", "fast"], "--schedfuzz-properties: unknown property 'fast'"),
    ],
)
def test_a_bad_option_is_a_usage_error_naming_it(pytester: pytest.Pytester, args: list[str], needle: str):
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", *args, timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) <= 6, err


def test_a_finding_that_cannot_be_saved_is_still_reported_in_full(fuzz, pytester: pytest.Pytester):
    """A corpus that cannot be written (read-only; simulated: this runs as root) loses no finding."""
    pytester.makeconftest("""
        import errno
        import pytest_schedfuzz.cases.corpus as corpus

        def read_only(directory, case):
            raise PermissionError(errno.EACCES, "Permission denied")

        corpus.save_case = read_only
    """)
    result = fuzz("--schedfuzz-policy", "planted:ignore_op_offload", "--schedfuzz-properties", "reuse-sound")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "NOT SAVED: cannot write to" in out and "Permission denied" in out
    assert "scheduler reused although can_reuse is false" in out and "steps:" in out and "PermissionError" not in out


def test_a_known_bug_does_not_mask_another_of_the_same_kind(fuzz, pytester: pytest.Pytester):
    """With only the topology-switch case (lost by a leaf-count re-plan, node result_output) in
    the corpus, fuzzing with the driver's re-reservation off still reports a same-size realloc
    lost another way: signatures hold the facts that separate root causes."""
    (pytester.path / "corpus").mkdir()
    known = next((TESTS.parent / "corpus").glob("no-same-size-realloc-*dd819fd105.json"))
    (pytester.path / "corpus" / known.name).write_text(known.read_text())
    result = fuzz("--no-schedfuzz-rereserve", "--schedfuzz-properties", "no-same-size-realloc", "--schedfuzz-examples", "60")
    result.assert_outcomes(failed=1, xfailed=1)
    new = [c for c in saved_cases(pytester) if c["signature"] != json.loads(known.read_text())["signature"]]
    assert len(new) == 1 and new[0]["signature"].startswith("no-same-size-realloc[explained=")


@pytest.fixture(scope="module")
def release_lib() -> Path:
    """Built before pytester moves HOME (and with it the build cache) to a fresh folder."""
    from pytest_schedfuzz.builds.compile import build_ggml_base

    return build_ggml_base("ggml-0.25.3", build_type="Release")


def test_a_release_build_is_refused_with_the_fix(pytester: pytest.Pytester, release_lib: Path):
    """ggml 0.25.3 with libggml-base rebuilt in Release (NDEBUG: no realloc log): the engine
    refuses at startup, as a usage error that says how to rebuild, not a traceback."""
    lib = release_lib
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", f"--schedfuzz-lib={lib}", timeout=300)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert "compiled out (NDEBUG)" in out and "-DCMAKE_BUILD_TYPE=Debug" in out and "Traceback" not in out


def test_keep_going_collects_several_distinct_findings_of_one_property(fuzz, pytester: pytest.Pytester):
    """Campaign mode: after a finding it is saved, counted as known, and fuzzing goes on; the
    item reports every distinct finding and the summary lists their signatures."""
    result = fuzz("--no-schedfuzz-rereserve", "--schedfuzz-keep-going", "--schedfuzz-properties", "no-same-size-realloc", "--schedfuzz-examples", "60",
                  "--schedfuzz-sightings", "sightings.jsonl")
    result.assert_outcomes(failed=1)
    cases = saved_cases(pytester)
    signatures = {c["signature"] for c in cases}
    # each signature sighted once, when first seen (the rediscovery benchmark's clock), before the run ended
    sightings = [json.loads(line) for line in (pytester.path / "sightings.jsonl").read_text().splitlines()]
    sighted = [s["signature"] for s in sightings]
    assert len(sighted) == len(set(sighted)) and signatures <= set(sighted), (sighted, signatures)
    assert all(s["property"] == "no-same-size-realloc" and s["t"] <= time.time() for s in sightings)
    # two root causes here: a reservation lost by a topology switch, and one lost by an
    # assignment change (the invalid tensor is no longer part of a lost reservation's signature)
    assert len(cases) == len(signatures) >= 2
    out = result.stdout.str()
    assert f"{len(cases)} distinct findings:" in out and f"NEW FINDINGS: {len(cases)} " in out
    assert all(sig in out for sig in signatures)


def test_a_release_llama_build_without_the_callback_is_observed_through_the_allocator_calls(pytester: pytest.Pytester, release_lib: Path):
    """libllama over a Release libggml-base (no realloc log, no realloc callback): the worker
    sees the scheduler's calls of ggml-alloc (``llama.allocator``) and takes every re-plan from
    them, said in the header and the statistics; never a false "fixed" (XPASS) or 0 / 0 reallocs."""
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", f"--schedfuzz-llama-lib={release_lib}", "-v",
                                           "--schedfuzz-seed=1", "--schedfuzz-properties", "llama-no-abort,llama-counters-agree", timeout=300)
    out = result.stdout.str() + result.stderr.str()
    assert "allocator calls: observed" in out and "Release (NDEBUG: decisions from the interposed allocator calls" in out
    told = re.search(r"re-plans told by ggml-alloc's interposed calls, a Release build = (\d+)", out)
    assert told and int(told.group(1)) > 0 and "Traceback" not in out


@pytest.mark.parametrize("where", ["/nonexistent", "empty"])
def test_a_bad_llama_lib_is_a_usage_error(pytester: pytest.Pytester, where: str):
    path = str(pytester.mkdir("nothing_here")) if where == "empty" else where
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", f"--schedfuzz-llama-lib={path}", timeout=300)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert "--schedfuzz-llama-lib" in out and "no libllama.so" in out and "Traceback" not in out
    cli = pytester.run("schedfuzz", "run", "--llama-lib", path, "--properties", "llama-no-abort", timeout=120)
    assert cli.ret == 2 and "no libllama.so" in cli.stderr.str() and "Traceback" not in cli.stderr.str()


def test_gate_refuses_zero_examples(pytester: pytest.Pytester):
    result = pytester.run("schedfuzz", "gate", "--base", "ggml-0.25.3", "--head", "ggml-0.25.3", "--examples", "0", timeout=120)
    assert result.ret == 2 and "--examples 0: must be at least 1" in result.stderr.str()


def test_the_starter_corpus_bugs_are_known_in_an_empty_folder(pytester: pytest.Pytester):
    """A user's own folder has no corpus: the known upstream bugs are built in, listed in the
    header, and --schedfuzz-known=none turns them off."""
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--co", timeout=300)
    assert re.search(r"known upstream bugs: [1-9]\d* expected failures \(built in: \S*corpus", result.stdout.str())
    off = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--co", "--schedfuzz-known=none", timeout=300)
    assert "known upstream bugs: 0 expected failures (built in: none" in off.stdout.str()


def test_ctrl_c_while_shrinking_stops_at_once_and_keeps_the_case(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Hypothesis answers Ctrl-C during shrinking by replaying the case and reporting it, after
    which the session went on to the next property (a dev run went on for 209 s). Now the first
    KeyboardInterrupt stops: no case runs after it, the smallest so far is kept (unconfirmed: it
    was not replayed on a fresh worker, so it is not a finding), and ``interrupted`` tells the
    plugin (and the CLI) to stop there."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.cases.corpus import load_case
    from pytest_schedfuzz.profiles import FuzzConfig

    fuzzer = Fuzzer(FuzzConfig(policy="planted:never", database=tmp_path / "examples", examples=50, seed=1))
    real, seen = fuzzer.check, {"failed": False, "after": 0}

    def check(prop: str, scenario: object) -> list:
        if seen["failed"]:
            seen["after"] += 1
            raise KeyboardInterrupt  # Ctrl-C pressed during the first shrink step
        found = real(prop, scenario)
        seen["failed"] = bool(found)
        return found

    monkeypatch.setattr(fuzzer, "check", check)
    assert fuzzer.fuzz("reuse-complete") is None
    assert fuzzer.interrupted and seen["after"] == 1
    (kept,) = [load_case(p) for p in fuzzer.stats.unconfirmed_cases]
    assert kept.property == "reuse-complete" and "interrupted (Ctrl-C) before its replay" in kept.message


def test_a_library_folder_without_ggml_source_runs_without_gpu_like_devices(pytester: pytest.Pytester):
    """Only the .so files (a CI artifact, a distro library): no headers to build the GPU-like
    device against, so layouts have none, and the header says why; nothing fails for it."""
    import shutil

    from pytest_schedfuzz.ggml.lib import library_folder

    lib = pytester.mkdir("artifact")
    for f in library_folder("ggml-0.25.3").iterdir():
        if f.name.startswith("libggml") and ".so" in f.name:
            shutil.copy2(f, lib / f.name, follow_symlinks=True)
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", f"--schedfuzz-lib={lib}", "--schedfuzz-seed", "2",
                                           "--schedfuzz-properties", "matches-reference", "--schedfuzz-examples", "25", "-v", timeout=600)
    out = result.stdout.str()
    assert "GPU-like devices off, layouts run without them" in out and "no ggml source" in out
    result.assert_outcomes(passed=1)
    assert "GPU-like device" not in re.search(r"explored.*", out).group(0)


def test_a_property_item_that_ran_no_example_is_not_green(fuzz, pytester: pytest.Pytester) -> None:
    """A budget spent before an item (or a share too small for one example) leaves it with nothing
    judged: it is skipped with the reason, never passed; the summary gives examples per item."""
    result = fuzz("--schedfuzz-profile", "ci", "--schedfuzz-budget", "0.001", "--schedfuzz-properties", "matches-reference,no-abort", "-rs",
                  "--schedfuzz-report", "report.json")
    out = result.stdout.str()
    assert "ran no example" in out and "passed" not in out.splitlines()[-1], out[-3000:]
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["below their floor of examples, not passed: matches-reference, no-abort"])
    stats = json.loads((pytester.path / "report.json").read_text())["stats"]
    assert stats["property_examples"] == {"matches-reference": 0, "no-abort": 0}
    assert stats["short_items"] == {"matches-reference": 0, "no-abort": 0} and stats["short_floors"] == {"matches-reference": 10, "no-abort": 10}


def test_a_property_item_below_its_profiles_floor_is_not_green(fuzz, pytester: pytest.Pytester) -> None:
    """An item that judged some examples, but fewer than its profile's floor (``min_examples``:
    10 on the ci profile), is reported like an empty one: skipped with how many it ran, the floor
    and why it fell short, never passed; the summary names it. A policy taking 1 s a call (each
    reuse-sound example asks it at least twice) leaves a 15 s budget room for at most 8."""
    pytester.makepyfile(slow_policy="""
        import time
        from reference.params import can_reuse as reference

        def can_reuse(new, cur):
            time.sleep(1)
            return reference(new, cur)
    """)
    result = fuzz("--schedfuzz-profile", "ci", "--schedfuzz-budget", "15", "--schedfuzz-properties", "reuse-sound",
                  "--schedfuzz-policy", "slow_policy:can_reuse", "-rs", "-v")
    out = result.stdout.str()
    why = re.search(r"reuse-sound ran (\d+) examples, fewer than its floor of 10 \(ci profile\): (.*)", out)
    assert why is not None and 0 < int(why.group(1)) < 10, out[-3000:]
    assert "time budget" in why.group(2) and "raise --schedfuzz-budget" in why.group(2), why.group(0)
    result.assert_outcomes(skipped=1)
    assert f"below their floor, not passed (judged / floor): reuse-sound {why.group(1)}/10" in out


def _summary(result: pytest.RunResult) -> list[str]:
    """The lines of the run's ``schedfuzz`` section (the summary), blank ones left out."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"=+ schedfuzz =+", line))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(("===", "___")))
    return [line for line in lines[start + 1:end] if line.strip()]


def test_the_default_summary_is_a_verdict_in_at_most_12_lines_and_the_report_has_the_rest(fuzz, pytester: pytest.Pytester):
    """In an empty folder, as a user runs it: the verdict first, what ran and the seed, in at most
    12 lines of at most 120 characters, nothing the header said printed again; the statistics in
    the JSON report (valid against its schema) and under -v; Hypothesis's files in .schedfuzz/."""
    import jsonschema

    from pytest_schedfuzz.campaign.stats import COUNTERS, DICTS
    from pytest_schedfuzz.campaign.summary import SCHEMA

    args = ("--schedfuzz-properties", "reuse-sound,llama-no-abort", "--schedfuzz-examples", "5")
    result = fuzz(*args, "--schedfuzz-report", "report.json")
    result.assert_outcomes(passed=2)
    summary = _summary(result)
    assert summary[0].startswith("no new finding (") and len(summary) <= 12 and max(map(len, summary)) <= 120, summary
    result.stdout.fnmatch_lines(["ran: ggml 0.25.3 (ggml-0.25.3); *", "ran: llama.cpp-0.3.36 (Debug, ggml 0.25.3); *", "reference: *",
                                 "seed 1: rerun with --schedfuzz-seed 1"])
    said = [line for line in result.stdout.lines if line.strip() and not line.startswith(("=", "schedfuzz ."))]
    assert len(said) == len(set(said)), "a line printed twice"
    assert "examples = " not in result.stdout.str()
    assert not (pytester.path / ".hypothesis").exists() and (pytester.path / ".schedfuzz").is_dir()
    schema = json.loads(SCHEMA.read_text())
    assert set(schema["properties"]["stats"]["properties"]) == set(COUNTERS + DICTS), "the schema names every statistic"
    report = json.loads((pytester.path / "report.json").read_text())
    jsonschema.validate(report, schema)
    assert report["verdict"] == "clean" and report["seed"] == 1 and report["stats"]["examples"] >= 10
    assert report["options"]["properties"] == {"value": "reuse-sound,llama-no-abort", "source": "--schedfuzz-properties"}
    verbose = fuzz(*args, "-v")
    assert "examples = " in verbose.stdout.str() and "explored (examples with it)" in verbose.stdout.str()
    assert "== schedfuzz ==" not in fuzz(*args, "--co").stdout.str()


def test_the_summary_says_what_ran_where_only_xdist_workers_started_the_engines(fuzz):
    """Under ``-q -n 2`` the controller prints no header and starts no engine: the workers tell it
    which engines they started, with each item, and the summary names them (the CI jobs' form)."""
    result = fuzz("--schedfuzz-properties", "reuse-sound,llama-no-abort", "--schedfuzz-examples", "4", "-q", "-n", "2")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["ran: ggml 0.25.3 (ggml-0.25.3); *", "ran: llama.cpp-0.3.36 (Debug, ggml 0.25.3); *"])
    assert "never started" not in result.stdout.str()


def test_schedfuzz_run_and_the_plugin_find_and_save_the_same_cases(fuzz, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """One campaign behind both front ends: the same seed and options find the same finding,
    shrunk alike, saved under the same name with the same content, and report it alike."""
    fuzz("--schedfuzz-properties", "reuse-complete", "--schedfuzz-policy", "planted:never", "--schedfuzz-examples", "20",
         "--schedfuzz-report", "report.json")
    by_plugin = {p.name: json.loads(p.read_text()) for p in (pytester.path / "corpus").glob("*.json")}
    monkeypatch.chdir(pytester.mkdir("cli"))
    cli = pytester.run(sys.executable, "-m", "pytest_schedfuzz.cli", "run", "--seed", "1", "--known", "none", "--properties", "reuse-complete",
                       "--policy", "planted:never", "--examples", "20", "--report", "report.json", timeout=300)
    assert cli.ret == 1, cli.stdout.str()
    by_cli = {p.name: json.loads(p.read_text()) for p in (pytester.path / "cli" / "corpus").glob("*.json")}
    assert by_plugin and by_cli == by_plugin
    reports = [json.loads(p.read_text()) for p in (pytester.path / "report.json", pytester.path / "cli" / "report.json")]
    found = [[f | {"case": Path(f["case"]).name} for f in r["new_findings"]] for r in reports]
    assert found[0] == found[1] and [f["case"] for f in found[0]] == sorted(by_plugin)
    cli.stdout.fnmatch_lines(["NEW FINDINGS: 1 *", "  reuse-complete [[]*[]]", "    schedfuzz export corpus/reuse-complete-*.json -o repro-* --check",
                              "seed 1: rerun with --seed 1"])


def test_one_options_table_makes_both_front_ends_with_help_for_each() -> None:
    """pytest's schedfuzz group (with ini keys) and ``schedfuzz run`` have the options of
    ``options.OPTIONS``, no more and no fewer, each with its help (every command's every
    argument has help too); the profile's help says what each profile is."""
    from pytest_schedfuzz.cli import build_parser
    from pytest_schedfuzz.options import OPTIONS, pytest_flags
    from pytest_schedfuzz.profiles import PROFILES

    helped = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, timeout=120).stdout
    assert set(re.findall(r"(?<![\w-])(--(?:no-)?schedfuzz[\w-]*)", helped)) == set(pytest_flags())
    assert {o.dest for o in OPTIONS} <= set(re.findall(r"^  (schedfuzz\w*) \(", helped, re.M))
    assert all(o.help for o in OPTIONS)
    _, commands = build_parser()
    run = commands["run"]
    flags = {f for o in OPTIONS if o.cli for f in (o.cli_flag, *([f"--no-{o.name}"] if o.kind is bool else []))}
    assert {f for a in run._actions for f in a.option_strings if f.startswith("--")} == flags | {"--help", "--verbose"}
    assert [f"{name} {a.dest}" for name, p in commands.items() for a in p._actions if not a.help] == [], "every argument has help"
    profile = " ".join(run.format_help().split())
    assert all(f"{name}: {p.about}" in profile for name, p in PROFILES.items())


def test_a_misspelled_option_gets_a_suggestion_and_an_error_names_where_a_value_came_from(pytester: pytest.Pytester,
                                                                                        monkeypatch: pytest.MonkeyPatch):
    typo = pytester.runpytest_subprocess("--schedfuzz", "--schedfuzz-seeed=3", timeout=120)
    assert typo.ret == pytest.ExitCode.USAGE_ERROR and "did you mean --schedfuzz-seed?" in typo.stderr.str()
    cli = (sys.executable, "-m", "pytest_schedfuzz.cli")
    run = pytester.run(*cli, "run", "--seeed", "3", timeout=120)
    assert run.ret == 2 and "usage: schedfuzz run" in run.stderr.str() and "(did you mean --seed?)" in run.stderr.str()
    monkeypatch.setenv("SCHEDFUZZ_GGML_LIB", "/nonexistent")
    env = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--co", timeout=120)
    assert env.ret == pytest.ExitCode.USAGE_ERROR and "SCHEDFUZZ_GGML_LIB=/nonexistent: not a folder" in env.stderr.str()
    assert "--schedfuzz-lib" not in env.stderr.str()
    run = pytester.run(*cli, "run", timeout=120)
    assert run.ret == 2 and "SCHEDFUZZ_GGML_LIB=/nonexistent: not a folder" in run.stderr.str() and "--lib" not in run.stderr.str()


def test_the_fuzzing_job_collects_nothing_of_testpaths(pytester: pytest.Pytester):
    """``pytest --schedfuzz`` without paths, in a project whose ``testpaths`` names its own tests:
    only the suite is collected (not the project's tests, collected and then deselected), and
    counted in pytest's "collected" line."""
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    pytester.mkdir("tests").joinpath("test_x.py").write_text("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--co", "--schedfuzz-properties", "reuse-sound", timeout=300)
    out = result.stdout.str()
    assert "test_x" not in out and "deselected" not in out, out
    result.stdout.fnmatch_lines(["collected 1 item", "*<PropertyItem reuse-sound>"])
