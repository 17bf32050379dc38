"""The rediscovery benchmark's parts: the process tree's CPU clock, the causes of a build and
which the ci profile can draw, and the table it prints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_schedfuzz.cases.corpus import STARTER_CORPUS, load_case, save_case
from pytest_schedfuzz.profiles import PROFILES
from pytest_schedfuzz.tools.rediscovery import (
    TAG_ENV,
    TreeClock,
    against_lines,
    causes,
    load_rediscovery,
    report_lines,
    undrawable,
)

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"


def test_the_clock_counts_a_child_in_a_session_of_its_own_and_one_that_exited():
    """A run's RPC servers and workers live in sessions of their own, and some exit before the
    run does: the clock finds them by their tag or by parentage, and keeps what they used."""
    script = ("import subprocess, sys, time\n"
              f"subprocess.run([sys.executable, '-c', {BURN!r}], start_new_session=True)\n"  # a child that has exited
              f"child = subprocess.Popen([sys.executable, '-c', {BURN!r} + 'time.sleep(5)'], start_new_session=True, env={{}})\n"  # untagged
              f"{BURN}time.sleep(5)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env={TAG_ENV: "t"}, start_new_session=True)
    clock = TreeClock("t", proc.pid)
    try:
        deadline = time.time() + 30
        while clock.sample() < 1.7 and time.time() < deadline:
            time.sleep(0.02)
    finally:
        for pid, _ in clock.used:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    assert clock.samples[-1][1] >= 1.7, clock.used  # three processes of 0.6 s each, less what a sample misses
    assert len({pid for pid, _ in clock.used}) >= 3
    t, cpu = clock.samples[len(clock.samples) // 2]
    assert clock.at(t) == cpu and clock.at(t + 3600) == clock.samples[-1][1]


def test_a_builds_causes_are_its_known_bugs_and_those_past_the_profiles_bounds_are_apart(tmp_path: Path):
    """On ggml 0.25.3 with llama.cpp 0.3.36 the causes are the starter corpus's signatures known
    there (several cases may hold one); a case with more layers than the ci profile draws is not
    drawable, named with why."""
    profile = PROFILES["ci"]
    found = causes("0.25.3", "0.25.3", "llama.cpp-0.3.36", profile)
    known = {c.signature for p in STARTER_CORPUS.glob("*.json") if (c := load_case(p)).expected_failure_on("0.25.3", "llama.cpp-0.3.36" if c.llama else None)}
    assert {c.signature for c in found} == known and len(found) >= 40
    assert all(c.cases for c in found) and len({c.signature for c in found}) == len(found)
    on_b11739 = {c.signature for c in causes("0.25.3", "0.27.0", "llama.cpp-b11739", profile)}
    assert on_b11739 != {c.signature for c in found}  # builds know other llama.cpp bugs
    llama_case = next(c for p in sorted(STARTER_CORPUS.glob("llama-*.json")) if (c := load_case(p)).expected_failure_on("0.25.3", "llama.cpp-0.3.36"))
    deep = replace(llama_case, llama=replace(llama_case.llama, model=replace(llama_case.llama.model, n_layer=profile.llama_layers + 1)))
    assert undrawable(deep, profile) == f"{profile.llama_layers + 1} layers (the profile draws up to {profile.llama_layers})"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    load_case(save_case(corpus, replace(deep, path=None)))
    only = causes("0.25.3", "0.25.3", "llama.cpp-0.3.36", profile, corpus)
    assert [(c.signature, c.undrawable) for c in only] == [(deep.signature, undrawable(deep, profile))]


def test_the_table_says_k_of_n_the_median_and_what_was_never_seen():
    r = {"cpu_seconds": 600.0, "seeds": [0, 1], "builds": {"llama.cpp-b11739": {
        "ggml": "0.25.3", "llama_build": "llama.cpp-b11739", "n": 3, "k_median": 1.5, "k_per_seed": [1, 2], "k_any_seed": 2,
        "k_per_cpu_hour": 9.0, "median_cpu_s_to_first_sight": 600.0, "never_seen": ["c"], "undrawable": {"d": "3 RPC devices"},
        "seeds": [{"seed": 0, "cpu_s": 598.0, "wall_s": 310.0, "rediscovered": 1, "other_signatures": []},
                  {"seed": 1, "cpu_s": 601.0, "wall_s": 305.0, "rediscovered": 2, "other_signatures": ["x"]}]}}}
    text = "\n".join(report_lines(json.loads(json.dumps(r))))
    assert "causes rediscovered 1.5 of 3 (median over seeds; per seed [1, 2]; 2 on any seed), 9.0 per CPU-hour" in text
    assert "never seen: c" in text and "not drawable by ci (3 RPC devices): d" in text and "other signatures: 1" in text


def test_a_run_beside_an_earlier_one_gives_the_ratio_and_what_each_found_alone(tmp_path: Path):
    def run(k: list[int], seen: list[list[str]], seeds: list[int] | None = None) -> dict:
        return {"cpu_seconds": 600.0, "seeds": seeds or [0, 1], "builds": {"llama.cpp-0.3.36": {
            "n": 5, "k_median": sorted(k)[len(k) // 2], "k_per_seed": k, "k_any_seed": len({s for row in seen for s in row}),
            "k_per_cpu_hour": sorted(k)[len(k) // 2] * 6.0, "seeds": [{"first_seen": {s: 1.0 for s in row}} for row in seen]}}}

    before, now = run([1, 2], [["a"], ["a", "b"]]), run([4, 4], [["a", "c", "d", "e"], ["a", "c", "d", "e"]])
    text = "\n".join(against_lines(now, before))
    assert "llama.cpp-0.3.36: 24.0 causes per CPU-hour (median 4 of 5) against 12.0 (2 of 5): 2.00x" in text
    assert "found only now: c" in text and "found only before: b" in text and "found only now: a" not in text
    with pytest.raises(ValueError, match="seeds \\[0, 1, 2\\]"):
        against_lines(now, run([1, 1, 1], [[], [], []], seeds=[0, 1, 2]))
    (tmp_path / "bench.json").write_text(json.dumps({"overhead": {}}))
    with pytest.raises(ValueError, match="no.* rediscovery section|not a bench --json file"):
        load_rediscovery(tmp_path / "bench.json")
    assert load_rediscovery(_written(tmp_path / "ok.json", {"rediscovery": before}))["seeds"] == [0, 1]


def _written(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path
