"""A finding you can stake a merge on (issue 60): a red run means a real, new bug, and a green
run hides none. Here: a known bug never masks another cause with the same words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_schedfuzz.cases.corpus import case_files, load_case

SCHEDFUZZ = [sys.executable, "-m", "pytest_schedfuzz.cli"]
DRIVER_RUN = ["run", "--profile", "dev", "--examples", "30", "--properties", "no-same-size-realloc"]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 1599050638])
def test_a_driver_that_never_rereserves_is_a_new_finding(tmp_path: Path, seed: int):
    """The planted driver (``--no-rereserve``) loses the worst case at every topology switch. The
    starter corpus knows a lost reservation by op offload (``lost_by=compute changed``: another
    assignment at the reservation's topology, which no re-reservation on topology changes
    catches); the driver's own fault is the same step kind and reason at another topology, so
    the signature says which (``topology=``) and the driver's is new, never "seen again"."""
    run = subprocess.run([*SCHEDFUZZ, *DRIVER_RUN, "--no-rereserve", "--seed", str(seed)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 1 and "NEW FINDINGS" in run.stdout, run.stdout + run.stderr
    signatures = {load_case(p).signature for p in case_files(tmp_path / "corpus")}
    assert signatures and all("explained=lost" in s and "topology=switch" in s for s in signatures), signatures


def test_the_driver_that_rereserves_shows_only_the_known_assignment_change(tmp_path: Path):
    run = subprocess.run([*SCHEDFUZZ, *DRIVER_RUN, "--seed", "0", "--report", "report.json"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0 and "NEW FINDINGS" not in run.stdout, run.stdout + run.stderr
    assert not list(case_files(tmp_path / "corpus"))
    seen = json.loads((tmp_path / "report.json").read_text())["stats"]
    assert "topology=switch" not in json.dumps(seen)


def _fuzzer_with_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replays: list[str]):
    """A fuzzer of the planted reuse policy (``planted:never``: reuse-complete fails at once)
    whose confirmation replays answer in turn with ``replays``: ``same`` (the real check),
    ``other`` (another violation) or ``pass``."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.profiles import FuzzConfig
    from pytest_schedfuzz.properties import Violation

    fuzzer = Fuzzer(FuzzConfig(policy="planted:never", database=tmp_path / ".schedfuzz" / "examples", examples=20, seed=1))
    real, state = fuzzer.check, {"replay": -1}

    def fresh() -> None:
        state["replay"] += 1

    def check(prop: str, scenario: object) -> list:
        if state["replay"] < 0:
            return real(prop, scenario)
        answer = replays[state["replay"]]
        if answer == "same":
            return real(prop, scenario)
        return [Violation(prop, 0, "another failure on the replay", {"what": "other"})] if answer == "other" else []

    monkeypatch.setattr(fuzzer.engines, "fresh", fresh)
    monkeypatch.setattr(fuzzer, "check", check)
    return fuzzer, state


def _unconfirmed(tmp_path: Path) -> list:
    return [load_case(p) for p in case_files(tmp_path / ".schedfuzz" / "unconfirmed")]


def test_a_failure_that_comes_back_at_once_is_confirmed_by_one_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fuzzer, state = _fuzzer_with_replays(tmp_path, monkeypatch, ["same"])
    finding = fuzzer.fuzz("reuse-complete")
    assert finding is not None and state["replay"] == 0
    assert finding.confirmation == "confirmed: the same signature on a fresh worker and fresh RPC servers"
    assert finding.confirmation in finding.report() and fuzzer.stats.unconfirmed == 0


def test_a_failure_that_comes_back_only_sometimes_is_a_finding_reproduced_k_of_n(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fuzzer, state = _fuzzer_with_replays(tmp_path, monkeypatch, ["pass", "pass", "same", "pass", "pass"])
    finding = fuzzer.fuzz("reuse-complete")
    assert finding is not None and state["replay"] == 4
    assert finding.confirmation == "confirmed: reproduced 1 of 5 replays on fresh workers and fresh RPC servers"


def test_a_confirmation_that_fails_with_another_signature_keeps_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fuzzer, _ = _fuzzer_with_replays(tmp_path, monkeypatch, ["other"] * 5)
    assert fuzzer.fuzz("reuse-complete") is None
    assert fuzzer.stats.unconfirmed == 1 and sum(fuzzer.stats.findings.values()) == 0
    (kept,) = _unconfirmed(tmp_path)
    assert kept.property == "reuse-complete" and "unconfirmed: reproduced 0 of 5" in kept.message
    first = kept.message.split("\n\n")[0]
    assert first and "another failure" not in first  # the first run's own message
    assert kept.message.count("replay ") == 5 and "reuse-complete[what=other]: [reuse-complete] step 0: another failure on the replay" in kept.message


def test_a_flaky_failure_is_unconfirmed_not_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Found once and not again on Hypothesis's own replay of the example (its FlakyFailure):
    kept with its message, counted, never a finding."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.profiles import FuzzConfig

    fuzzer = Fuzzer(FuzzConfig(policy="planted:never", database=tmp_path / ".schedfuzz" / "examples", examples=20, seed=1))
    real, calls = fuzzer.check, {"n": 0}

    def once(prop: str, scenario: object) -> list:
        calls["n"] += 1
        found = real(prop, scenario)
        return found if found and calls["n"] == 1 else []

    monkeypatch.setattr(fuzzer, "check", once)
    assert fuzzer.fuzz("reuse-complete") is None
    assert fuzzer.stats.unconfirmed == 1 and sum(fuzzer.stats.findings.values()) == 0
    (kept,) = _unconfirmed(tmp_path)
    assert "FlakyFailure" in kept.message and kept.expect == {"fail": kept.message.split("\n\n")[1].split(":\n")[0]}


def _llama_case(signature: str, engine: dict[str, str], expect: object) -> object:
    from pytest_schedfuzz.cases.corpus import Case
    from pytest_schedfuzz.model.llama_workload import LlamaWorkload

    corpus = Path(__file__).parents[2] / "corpus"
    w: LlamaWorkload | None = next(load_case(p).llama for p in case_files(corpus) if load_case(p).llama is not None)
    return Case("llama-no-same-size-realloc", signature, None, "m", 1, 0, engine, expect, llama=w)


def test_a_llama_cpp_bug_is_known_on_its_builds_only():
    """A case's builds come from its ``known_on``, else from its engine record (version-1 files,
    unchanged); a bug known on b11739 only does not silence the same words on 0.3.36, where a
    replay that shows it is "known on X, seen on Y", and one that does not is no fix."""
    from pytest_schedfuzz.campaign.known import KnownBugs
    from pytest_schedfuzz.campaign.stats import Stats
    from pytest_schedfuzz.cases.verdict import judge_replay
    from pytest_schedfuzz.properties import Violation

    upstream = {"lib": "/c/schedfuzz/builds/llama.cpp-b11739-66a72b2e95a9aca1/libllama.so", "ggml_version": "0.27.0"}
    old = _llama_case("llama-no-same-size-realloc[x=1]", upstream, {"fail": "known upstream"})
    named = _llama_case("llama-no-same-size-realloc[x=2]", {}, {"fail": "known on two", "known_on": ["llama.cpp-0.3.36", "llama.cpp-0.3.36-seed"]})
    assert old.known_builds() == ("llama.cpp-b11739",) and named.known_builds() == ("llama.cpp-0.3.36", "llama.cpp-0.3.36-seed")
    assert old.expected_failure_on("0.27.0", "llama.cpp-b11739") == "known upstream" and old.expected_failure_on("0.25.3", "llama.cpp-0.3.36") is None
    for build, here, elsewhere in (("llama.cpp-b11739", {"llama-no-same-size-realloc[x=1]"}, {"llama-no-same-size-realloc[x=2]"}),
                                   ("llama.cpp-0.3.36", {"llama-no-same-size-realloc[x=2]"}, {"llama-no-same-size-realloc[x=1]"})):
        known = KnownBugs(Stats(), lambda llama: None, lambda b=build: b)
        known.cases = [old, named]
        assert known.expected(True) == here and set(known.elsewhere(True)) == elsewhere
    shown = Violation("llama-no-same-size-realloc", 1, "again", {"x": "1"})
    verdict = judge_replay(old, [shown], "0.25.3", build="llama.cpp-0.3.36")
    assert verdict.outcome == "elsewhere" and verdict.ok and verdict.short == "known on llama.cpp-b11739, seen on llama.cpp-0.3.36"
    assert judge_replay(old, [], "0.25.3", build="llama.cpp-0.3.36").outcome == "pass"  # never known there: not an XPASS
    assert judge_replay(old, [], "0.27.0", build="llama.cpp-b11739").outcome == "xpass"
    other = Violation("llama-no-same-size-realloc", 1, "new", {"x": "3"})
    assert judge_replay(old, [shown, other], "0.25.3", build="llama.cpp-0.3.36").outcome == "fail"  # a known bug never hides another


@pytest.mark.engine
def test_the_norm_reservation_loss_of_0336_is_the_known_cause_seen_on_b11739(tmp_path: Path):
    """The starter corpus's lost reservation of llama.cpp 0.3.36 (the output norm moves between the
    two RPC devices from the worst case to a 1-token batch) replayed on upstream b11739, a Release
    build that prints no allocator reason: one cause, one signature, so the replay names it as the
    cause known on 0.3.36 and seen on b11739, never an XPASS."""
    case = next(p for p in case_files(Path(__file__).parents[2] / "corpus") if p.stem.endswith("4d6247404c"))
    run = subprocess.run([*SCHEDFUZZ, "replay", str(case), "--llama-lib", "llama.cpp-b11739"], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verdict: known on llama.cpp-0.3.36, seen on llama.cpp-b11739" in run.stdout and "XPASS" not in run.stdout, run.stdout
    assert load_case(case).signature == "llama-no-same-size-realloc[explained=lost,lost_by=decode: changed (node RMS_NORM),topology=same]"
