"""The graph engine on a Release build of ggml that has ggml's realloc callback (upstream master:
b11739's ggml 0.27.0, as users run it): it used to refuse to start ("its debug logging is compiled
out (NDEBUG)"). It starts once a start-up probe shows the callback telling a re-plan, and judges
by what the build tells: the scheduler's re-plans and their decisions, read from the callback, not
ggml-alloc's reasons or its own single-buffer re-plans, which a Release build does not log."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.corpus import STARTER_CORPUS, load_case
from pytest_schedfuzz.files import cache_dir
from pytest_schedfuzz.llama.upstream import upstream_lib_dir
from pytest_schedfuzz.model.trace import RELEASE, UNOBSERVABLE, ReallocEvent, StepRecord
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties.agreement import _compare_record

pytest_plugins = ["pytester"]
CACHE = cache_dir()  # read at import, before pytester moves HOME (and with it the default cache)


@pytest.mark.engine
def test_the_graph_properties_run_on_b11739s_ggml_with_decisions_observed() -> None:
    fuzzer = Fuzzer(FuzzConfig(database=None, lib=str(upstream_lib_dir()), examples=40, seed=1))
    fuzzer.known.learn(STARTER_CORPUS)
    try:
        info = fuzzer.engines.info()
        assert info["ggml_version"] == "0.27.0" and info["realloc_log"] == RELEASE
        for prop in ("no-same-size-realloc", "no-abort"):
            assert fuzzer.fuzz(prop) is None, prop
        # the reference has no rules of 0.27.0 (its source is not published): matches-reference does not judge it
        assert fuzzer.unjudged("matches-reference") == ("matches-reference does not judge this ggml: the reference does not model "
                                                        "ggml 0.27.0: it uses the rules of ggml 0.26.0, the nearest it knows")
        assert fuzzer.unjudged("no-abort") is None
        assert fuzzer.stats.realloc_observed > 0  # the scheduler's decisions, from the callback
        # the known reserve_size crash: a Release build inlines ggml_vbuffer_tensor_alloc, so its C stack
        # starts at ggml_gallocr_alloc_graph; the reference names that caller too: the same signature as on Debug
        case = load_case(next(Path(STARTER_CORPUS).glob("*-f0d6a9b758.json")))
        assert case.signature in {v.signature() for v in fuzzer.replay(case)}
    finally:
        fuzzer.close()


def test_a_release_builds_replans_are_compared_by_what_its_callback_tells() -> None:
    """Where ggml logs no re-plan, matches-reference compares the scheduler's re-plans by step,
    backend ids and same size alone; ggml-alloc's own re-plans (via gallocr) are not expected."""
    sched = ReallocEvent(1, "sched", False, 2, "node x is not valid", graph_size=10, prev_graph_size=10)
    own = ReallocEvent(1, "gallocr", False, 1, "different number of nodes", graph_size=12, prev_graph_size=10)
    told = ReallocEvent(1, "sched", False, 2, UNOBSERVABLE, ggml_size_changed=False)
    name = str
    engine, reference = StepRecord(1, "alloc", events=(told,)), StepRecord(1, "alloc", events=(sched, own))
    assert _compare_record(engine, reference, name, logged=False) is None
    assert _compare_record(engine, reference, name, logged=True) is not None  # a Debug build logs both, reasons too
    moved = StepRecord(1, "alloc", events=(ReallocEvent(1, "sched", True, 2, UNOBSERVABLE, ggml_size_changed=False),))
    diff = _compare_record(moved, reference, name, logged=False)
    assert diff is not None and diff[0] == "events"  # the backend ids the callback says changed


@pytest.mark.engine
def test_matches_reference_is_not_run_on_a_ggml_the_reference_has_no_rules_for(pytester: pytest.Pytester,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """ggml 0.27.0's source is not published, so the reference has no rules of it: its item is
    skipped with the reason (neither a pass nor a verdict by 0.26.0's rules), the header says so,
    and the other properties run."""
    monkeypatch.setenv("SCHEDFUZZ_CACHE", str(CACHE))
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--schedfuzz-seed=1", "-rs",
                                           f"--schedfuzz-lib={upstream_lib_dir()}", "--schedfuzz-properties=matches-reference,no-abort",
                                           timeout=600)
    out = result.stdout.str()
    result.assert_outcomes(passed=1, skipped=1)
    assert "matches-reference does not judge this ggml: the reference does not model ggml 0.27.0" in out
    assert "the nearest it knows; matches-reference does not judge it (not run)" in out
    assert "not run, not passed (they do not judge this build): matches-reference does not judge this ggml" in out  # the summary too
