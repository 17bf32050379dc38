"""Where a campaign that keeps going on a budget spends its time: a unit that has found nothing new
for its patience gives the rest of its share on to the units after it (``campaign.patience``,
``Fuzzer.campaign``), and the llama.cpp judges that cost more than the run judge a sample
(``properties.COSTLY``, ``campaign.judging``), never while a failure is shrunk or replayed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_schedfuzz.campaign import fuzz as fuzz_module
from pytest_schedfuzz.campaign.campaign import PATIENCE, Campaign, patience
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.campaign.judging import in_sample
from pytest_schedfuzz.model.layout import BackendSpec
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_trace import CallRecord, LlamaTrace, SchedCall
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, Part
from pytest_schedfuzz.options import Given
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.properties import COSTLY, ENTRIES, LLAMA_GROUP, LLAMA_PROPERTY_IDS, SAMPLE

# a slot's prompt and two tokens, on a GPU-like device: llama-same-logits and llama-matches-reference both judge it
ON_GPU = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=0, n_gpu_layers=99, gpus=(BackendSpec("gpu"),)), ContextParams(),
                       (Call("decode", (Part(0, 7, "last"),)), Call("decode", (Part(0, 1, "last"),)), Call("decode", (Part(0, 1, "last"),))))


class Clock:
    """``time`` as ``fuzz`` reads it, moved on by the fake fuzzing alone."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def _finding(sig: str, llama: LlamaWorkload | None = None) -> Any:
    return SimpleNamespace(violation=SimpleNamespace(signature=lambda: sig), llama=llama)


def _timed(monkeypatch: pytest.MonkeyPatch, found_at: list[float]) -> tuple[Fuzzer, Clock, list[float | None]]:
    """A ci-profile fuzzer on a 600 s budget whose rounds find something new ``found_at`` seconds
    into each round (one entry per finding), and nothing after them."""
    fuzzer = Fuzzer(FuzzConfig(profile="ci", database=None, keep_going=True, budget=600.0))
    clock = Clock(fuzzer.started)
    monkeypatch.setattr(fuzz_module, "time", clock)
    asked: list[float | None] = []

    def fuzz(prop: str, shard: int = 0, shards: int = 1, seconds: float | None = None, round_: int = 0) -> Any:
        asked.append(seconds)
        if round_ < len(found_at) and (seconds is None or found_at[round_] < seconds):
            clock.now += found_at[round_]
            return _finding(f"sig-{round_}", ON_GPU if prop == LLAMA_GROUP else None)
        clock.now += seconds or 0.0
        return None

    monkeypatch.setattr(fuzzer, "fuzz", fuzz)
    return fuzzer, clock, asked


def test_a_unit_that_finds_nothing_new_gives_the_rest_of_its_share_on(monkeypatch: pytest.MonkeyPatch) -> None:
    fuzzer, clock, asked = _timed(monkeypatch, [])
    start = clock.now
    assert fuzzer.campaign("no-abort", seconds=90.0, patience=30.0) == []
    assert clock.now - start == pytest.approx(30.0) and asked == [pytest.approx(30.0)]
    assert fuzzer.stats.quiet_ends == {"no-abort": 60}
    # without patience (the last property) it runs its whole share
    fuzzer, clock, asked = _timed(monkeypatch, [])
    start = clock.now
    fuzzer.campaign("no-abort", seconds=90.0)
    assert clock.now - start == pytest.approx(90.0) and fuzzer.stats.quiet_ends == {}


def test_each_new_finding_renews_the_units_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    fuzzer, clock, asked = _timed(monkeypatch, [20.0, 25.0])
    start = clock.now
    found = fuzzer.campaign("no-abort", seconds=90.0, patience=30.0)
    assert [f.violation.signature() for f in found] == ["sig-0", "sig-1"]
    # found at 20 and 45 s; then 30 s more without a new one: ends at 75 s, 15 s given on
    assert clock.now - start == pytest.approx(75.0)
    assert asked == [pytest.approx(30.0), pytest.approx(30.0), pytest.approx(30.0)]
    assert fuzzer.stats.quiet_ends == {"no-abort": 15} and fuzzer.favoured == []
    # a llama.cpp workload that found a cause is favoured: the group's next draws go next to it too (``strategies.neighbours``)
    fuzzer, _, _ = _timed(monkeypatch, [20.0])
    fuzzer.campaign(LLAMA_GROUP, seconds=90.0)
    assert fuzzer.favoured == [ON_GPU]
    # a finding that comes just before the share ends: nothing is given on
    fuzzer, clock, _ = _timed(monkeypatch, [29.0, 29.0, 29.0])
    fuzzer.campaign("no-abort", seconds=90.0, patience=30.0)
    assert fuzzer.stats.quiet_ends == {}


def _campaign(tmp_path: Path, keep_going: bool, budget: float | None) -> Campaign:
    given = {"profile": Given("ci", "--schedfuzz-profile"), "keep-going": Given(keep_going, "--schedfuzz-keep-going")}
    if budget is not None:
        given["budget"] = Given(budget, "--schedfuzz-budget")
    return Campaign(given, tmp_path, lambda option: f"--schedfuzz-{option.name}")


def test_patience_is_for_units_before_the_last_property_of_a_campaign_on_time(tmp_path: Path) -> None:
    on_time = _campaign(tmp_path, True, 600.0)
    units = on_time.plan(workers=2)
    assert units[-1].prop == LLAMA_GROUP
    first, last = next(u for u in units if u.weight), units[-1]  # the built-in policy's rule checks run by count
    assert on_time.time_share(units[0]) is None and patience(units[0], None, True, on_time.last_prop) is None
    share = on_time.time_share(first)
    assert share is not None and patience(first, share, True, on_time.last_prop) == pytest.approx(share * PATIENCE)
    # the llama.cpp group's shards are the plan's last property: another shard is only another seed
    assert patience(last, on_time.time_share(last), True, on_time.last_prop) is None
    # by count (the ci job), or not keeping going: every unit runs what it was asked
    by_count = _campaign(tmp_path, False, None)
    by_count.plan(workers=2)
    assert patience(first, by_count.time_share(first), False, by_count.last_prop) is None


class Recording:
    """A llama.cpp target that says what it was asked to run: (logits, capture) per run."""

    def __init__(self) -> None:
        self.runs: list[tuple[bool, bool]] = []

    def run(self, workload: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile: Any = None, on_graph: Any = None) -> LlamaTrace:
        self.runs.append((logits, capture))
        if meanwhile is not None:
            meanwhile()
        return LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "decode", 0), CallRecord(1, "decode", 0)),
                          engine={"ggml_version": "0.25.3"})

    def close(self) -> None:
        pass


def _workloads() -> tuple[LlamaWorkload, LlamaWorkload]:
    """A workload in the costly judges' sample and one out of it, each judged by llama-same-logits
    (on a GPU-like device) and llama-matches-reference."""
    drawn = [replace(ON_GPU, ctx=replace(ON_GPU.ctx, n_ctx=ON_GPU.ctx.n_ctx + 16 * k)) for k in range(4 * SAMPLE)]
    inside = next(w for w in drawn if in_sample(w))
    outside = next(w for w in drawn if not in_sample(w))
    return inside, outside


def test_the_costly_llama_judges_judge_a_sample_while_a_campaign_on_time_generates() -> None:
    costly = {p for p in LLAMA_PROPERTY_IDS if ENTRIES[p].needs & COSTLY}
    assert costly == {"llama-same-logits", "llama-matches-reference"}
    inside, outside = _workloads()
    assert in_sample(inside) and in_sample(inside) and not in_sample(outside)  # by the workload alone
    fuzzer = Fuzzer(FuzzConfig(database=None))
    fuzzer.engines._llama = target = Recording()
    try:
        fuzzer.judges.sampling = True
        fuzzer.check_llama(LLAMA_GROUP, outside)
        assert target.runs == [(False, False)] and fuzzer.stats.llama_sampled_out == 1  # one run, judged by the cheap judges
        target.runs.clear()
        fuzzer.check_llama(LLAMA_GROUP, inside)
        assert target.runs == [(True, True), (True, False)]  # captured, then its CPU-only run
        target.runs.clear()
        # a replay, and a run not on time (sampling off: by count, shrinking, confirming) judge with every judge
        fuzzer.check_llama(LLAMA_GROUP, outside, replayed=True)
        assert target.runs == [(True, True), (True, False)]
        target.runs.clear()
        fuzzer.judges.sampling = False
        fuzzer.check_llama(LLAMA_GROUP, outside)
        assert target.runs[0] == (True, True) and fuzzer.stats.llama_sampled_out == 1  # its CPU-only run kept from the replay
        target.runs.clear()
        # a costly property fuzzed alone is never left without its workloads
        fuzzer.judges.sampling = True
        fuzzer.check_llama("llama-same-logits", replace(outside, calls=outside.calls[:2]))
        assert target.runs == [(True, False), (True, False)]
    finally:
        fuzzer.engines._llama = None


def test_a_llama_build_the_reference_has_no_rules_for_is_captured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-matches-reference cannot judge a ggml the reference has no rules for: after the first
    run says so, the workloads are counted unjudged without capturing their graphs."""
    inside, _ = _workloads()
    fuzzer = Fuzzer(FuzzConfig(database=None))
    target = Recording()
    newer = LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), CallRecord(0, "decode", 0)), engine={"ggml_version": "9.99.0"})
    monkeypatch.setattr(target, "run", lambda w, logits=False, capture=False, meanwhile=None, on_graph=None: (target.runs.append((logits, capture)), meanwhile and meanwhile(), newer)[2])
    fuzzer.engines._llama = target
    try:
        fuzzer.check_llama("llama-matches-reference", inside)
        fuzzer.check_llama("llama-matches-reference", inside)
    finally:
        fuzzer.engines._llama = None
    assert target.runs == [(False, True), (False, False)]
    assert fuzzer.stats.llama_not_captured == {"ggml 9.99.0: no reference rules": 2}


def test_a_shrink_judges_its_failures_property_alone() -> None:
    """Hypothesis keeps a shrunk candidate only for the failure's signature: llama.cpp runs it once,
    for that property's judge (no capture, no CPU-only run), unless the failure was found in the
    CPU-only run, which is then made again; a replay still judges with every judge it asks for."""
    inside, _ = _workloads()
    fuzzer = Fuzzer(FuzzConfig(database=None))
    fuzzer.engines._llama = target = Recording()
    try:
        fuzzer.judges.shrinking = "llama-no-same-size-realloc[explained=lost,lost_by=decode: nodes,topology=switch by outputs]"
        assert fuzzer.check_llama(LLAMA_GROUP, inside) == []
        assert target.runs == [(False, False)]
        target.runs.clear()
        fuzzer.judges.shrinking = "llama-no-abort[call=decode,kind=abort,run=cpu-only]"
        fuzzer.check_llama(LLAMA_GROUP, inside)
        assert target.runs == [(True, False), (True, False)]
        target.runs.clear()
        fuzzer.check_llama(LLAMA_GROUP, inside, replayed=True)
        assert target.runs[0] == (True, True)
    finally:
        fuzzer.engines._llama = None


class Failing(Recording):
    """A llama.cpp whose decodes fail (-3: llama-no-abort) in workloads of 8 calls or more, so that
    a failure has calls to shrink away; ``first``: the run that failed first."""

    first: int | None = None

    def start(self) -> dict[str, str]:
        return {"gpu_device": "available", "absent_calls": "", "absent_params": "moe_cache_size,n_rs_seq"}

    def run(self, workload: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile: Any = None, on_graph: Any = None) -> LlamaTrace:
        self.runs.append((logits, capture))
        if meanwhile is not None:
            meanwhile()
        fails = len(workload.calls) >= 8
        if fails and self.first is None:
            self.first = len(self.runs)
        calls = tuple(CallRecord(i, c.kind, -3 if fails and c.kind in ("decode", "spec") else 0) for i, c in enumerate(workload.calls))
        return LlamaTrace((CallRecord(-1, "init", 0, (SchedCall("reserve", 0),)), *calls), engine={"ggml_version": "0.25.3"})


def _shrink_runs(monkeypatch: pytest.MonkeyPatch, on_time: bool) -> tuple[int, Any]:
    """llama.cpp runs a failure's shrink made, on time (a keep-going campaign's chunk) or by count."""
    fuzzer = Fuzzer(FuzzConfig(profile="ci", database=None, keep_going=True, budget=600.0, confirm_runs=1))
    fuzzer.engines._llama = target = Failing()
    monkeypatch.setattr(fuzzer.engines, "llama_confirmed", lambda w, trace, *a: trace)
    try:
        finding = fuzzer._fuzz_run(LLAMA_GROUP, 200, 3, fuzz_module.time.monotonic(), None, counted=not on_time)
    finally:
        fuzzer.engines._llama = None
    assert finding is not None and finding.violation.property == "llama-no-abort" and target.first is not None
    return len(target.runs) - target.first, finding


def test_a_shrink_on_time_spends_a_bounded_number_of_llama_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every candidate of a llama.cpp shrink is a run: on time, at most ``LLAMA_SHRINK_RUNS`` of
    them, then the smallest case so far is the finding (Hypothesis's last replay of it included,
    without a run); by count the shrink goes on as Hypothesis decides."""
    from pytest_schedfuzz.campaign.fuzz import LLAMA_SHRINK_RUNS

    bounded, found = _shrink_runs(monkeypatch, True)
    unbounded, full = _shrink_runs(monkeypatch, False)
    assert bounded <= LLAMA_SHRINK_RUNS + 4 < unbounded, (bounded, unbounded)  # + the first failure and its confirmation's replays
    found.llama.validate()
    assert len(found.llama.calls) >= len(full.llama.calls) == 8  # the smallest the bounded shrink reached, and the smallest
