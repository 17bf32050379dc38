"""No known bug hides another: a replay is a known bug only if nothing else shows; a kept plan's
abort is the one the reference predicts; a rerun never turns a crash into a values finding; a
predicted crash must be the crash predicted. And the ci budget goes where a property can fail."""

from __future__ import annotations

from pytest_schedfuzz.campaign.causes import causes_told_apart
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.cases.corpus import Case
from pytest_schedfuzz.cases.verdict import judge_replay
from pytest_schedfuzz.model.graph_spec import GraphBuilder, GraphSpec
from pytest_schedfuzz.model.layout import BackendLayout
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.model.trace import Abort, StepRecord, Trace
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import POLICY_PROPERTY_IDS, PROPERTIES, Violation, fuzz_units, matches_reference, no_abort
from reference.alloc import KEPT_PLAN

KNOWN = "no-same-size-realloc[reason=node embd is not valid]"
OTHER = Violation("no-abort", 3, "ggml abort during compute(g): GGML_ASSERT(x) failed", {"kind": "abort", "message": "GGML_ASSERT(x) failed"})


def known_case() -> Case:
    return Case("no-same-size-realloc", KNOWN, None, expect={"fail": "a known bug"})


def test_a_known_bug_with_another_violation_beside_it_is_a_failure_naming_the_other() -> None:
    mine = Violation("no-same-size-realloc", 2, "same-size realloc", {"reason": "node embd is not valid"})
    assert judge_replay(known_case(), [mine], "0.25.3").outcome == "known"
    verdict = judge_replay(known_case(), [mine, OTHER], "0.25.3")
    assert verdict.outcome == "fail" and not verdict.ok and OTHER.signature() in verdict.text
    # another known bug beside it is no news; the known bug gone is an XPASS, not a pass
    assert judge_replay(known_case(), [mine, OTHER], "0.25.3", known={OTHER.signature()}).outcome == "known"
    assert judge_replay(known_case(), [OTHER], "0.25.3", known={OTHER.signature()}).outcome == "xpass"
    assert judge_replay(Case("no-abort", OTHER.signature(), None), [OTHER], "0.25.3").outcome == "fail"


def kept_scenario() -> Scenario:
    b = GraphBuilder()
    b.input("x", (8, 2))
    graph = b.build(b.op("scale", "x", name="y", scale=2.0))
    steps = (Step("sched_new", params=SchedParams(64, False, True)), Step("reserve", "g"), Step("alloc", "g"))
    return Scenario(BackendLayout.of("cpu"), (("g", graph),), steps)


def test_a_kept_plan_signs_only_the_abort_the_reference_predicts_and_keeps_its_kind() -> None:
    sc = kept_scenario()
    predicted = Trace((), Abort(2, "crash", f"SIGSEGV in ggml_vbuffer_tensor_alloc: the CPU buffer planned to hold x is NULL: {KEPT_PLAN}"))
    crash = Trace((), Abort(2, "crash", "the worker was killed by SIGSEGV\nC stack: ggml_vbuffer_tensor_alloc < ggml_gallocr_init_tensor"))
    (v,) = no_abort(sc, crash, predicted)
    assert v.signature() == "no-abort[after=failed allocation,kind=crash,plan=kept]"
    # an assert at that step, or a crash elsewhere, is not the kept plan's
    for other in (Abort(2, "abort", "ggml-backend.cpp:1: GGML_ASSERT(n_inputs < GGML_SCHED_MAX_SPLIT_INPUTS) failed"),
                  Abort(2, "crash", "the worker was killed by SIGSEGV\nC stack: ggml_compute_forward_add < ggml_compute_forward")):
        (w,) = no_abort(sc, Trace((), other), predicted)
        assert "plan" not in w.facts, w.signature()


def test_a_predicted_crash_must_be_the_predicted_one() -> None:
    sc = kept_scenario()
    records = (StepRecord(0, "sched_new"), StepRecord(1, "reserve"))
    predicted = Trace(records, Abort(2, "crash", f"SIGSEGV in ggml_vbuffer_tensor_alloc: the CPU buffer planned to hold x is NULL: {KEPT_PLAN}"))
    same = Trace(records, Abort(2, "crash", "the worker was killed by SIGSEGV\nC stack: ggml_vbuffer_tensor_alloc < ggml_gallocr_init_tensor"))
    assert matches_reference(sc, same, predicted) == []
    for other in (Abort(2, "abort", "ggml-alloc.c:1: GGML_ASSERT(buffer) failed"), Abort(2, "crash", "the worker was killed by SIGABRT")):
        (v,) = matches_reference(sc, Trace(records, other), predicted)
        assert v.signature() == "matches-reference[what=abort-message]", v


def forced_view_scenario() -> Scenario:
    b = GraphBuilder()
    y = b.op("mul_mat", b.weight("w", (8, 32), device=0), b.input("x", (8, 4)), name="y")
    v = b.op("view", y, name="v", ne=[32, 4], nb=[128])
    graph = b.build(b.op("add", v, v, name="z"))
    graph = GraphSpec(graph.tensors, graph.roots, (("v", 1),))
    return Scenario(BackendLayout.of("rpc", "cpu"), (("g", graph),), (Step("sched_new", params=SchedParams(64, False, True)), Step("compute", "g")))


def test_a_rerun_never_turns_a_crash_into_a_values_finding() -> None:
    """A compute crash that goes away without the forced view is signed by that cause, and stays
    a crash (no-abort); wrong values that go away become same-values[forced=view]."""
    sc = forced_view_scenario()
    crash = Violation("no-abort", 1, "ggml crash during compute(g): the worker was killed by SIGSEGV", {"kind": "crash", "message": "x", "during": "compute"})
    values = Violation("same-values", 1, "after compute(g): z differs", {"what": "output", "op": "add"})
    ran: list[Scenario] = []

    def fine(variant: Scenario) -> Trace:
        ran.append(variant)
        return Trace((StepRecord(0, "sched_new"), StepRecord(1, "compute")))

    (c,) = causes_told_apart(sc, Trace(()), [crash], fine)
    assert c.signature() == "no-abort[forced=view]" and "aborts or crashes only while the views v are assigned" in c.message
    (w,) = causes_told_apart(sc, Trace(()), [values], fine)
    assert w.signature() == "same-values[forced=view]"
    assert len(ran) == 2 and all(not g.forced for _, g in ran[0].graphs)


def test_the_ci_budget_goes_where_a_property_can_fail() -> None:
    """Policy properties judge the driver's decisions, made by the same can_reuse: the profile's
    examples (or a share of a campaign's budget) only with a user policy, else a chunk of cheap
    rule checks; no two properties draw the same examples."""
    ids = list(PROPERTIES)
    assert dict(fuzz_units(ids))["reuse-sound"] == 0 and dict(fuzz_units(ids, policy=True))["reuse-sound"] == 1
    assert all(dict(fuzz_units(ids))[p] == 1 for p in ids if p not in POLICY_PROPERTY_IDS)
    draws = [p.draws for p in PROPERTIES.values()]
    assert len(set(draws)) == len(draws), draws
    ci = Fuzzer(FuzzConfig(profile="ci", database=None))
    assert ci.examples_for("reuse-sound") == ci.profile.chunk and ci.examples_for("no-abort") == ci.profile.examples
    mine = Fuzzer(FuzzConfig(profile="ci", database=None, policy="pytest_schedfuzz.sim.driver:can_reuse"))
    assert mine.examples_for("reuse-sound") == mine.profile.examples
    # a campaign that keeps going on a budget runs on time, the built-in policy's rule checks excepted
    timed = Fuzzer(FuzzConfig(profile="ci", database=None, keep_going=True, budget=60.0))
    assert timed.examples_for("no-abort") is None and timed.examples_for("reuse-sound") == timed.profile.chunk


def test_a_known_race_that_does_not_show_is_not_counted_as_fixed() -> None:
    """A race shows only when the threads interleave so: replays that do not show it (a loaded CI
    machine) are ``unshown``, never ``xpass``; a deterministic known bug that is gone is ``xpass``."""
    race = Case("no-abort", "no-abort[race=asynchronous]", None, expect={"fail": "a race"})
    verdict = judge_replay(race, [], "0.15.3")
    assert verdict.outcome == "unshown" and verdict.ok and "not counted as fixed" in verdict.short
    assert judge_replay(known_case(), [], "0.25.3").outcome == "xpass"
    assert judge_replay(race, [OTHER], "0.15.3").outcome == "xpass"  # something else instead: it is news
