"""One seed, one verdict, and a verdict for every way a run ends: the ci profile decides what
runs by example counts (a machine's speed or load changes nothing), a budget that cuts a run short
and a Ctrl-C are verdicts of their own (never clean), and a new finding is saved untriaged until
``schedfuzz known`` makes it a known bug."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_schedfuzz.campaign.summary import CUT_SHORT_EXIT
from pytest_schedfuzz.cli import main

TESTS = Path(__file__).resolve().parents[1]
ENV = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH"))))}
CLI = (sys.executable, "-m", "pytest_schedfuzz.cli")
# a graph property and the llama.cpp group: both kinds of unit, at the ci profile's own counts
CI_PROPERTIES = "no-same-size-realloc,llama-no-abort"


def _ci_report(folder: Path, *extra: str) -> dict:
    folder.mkdir()
    proc = subprocess.run([*CLI, "run", "--profile", "ci", "--seed", "5", "--known", "none", "--properties", CI_PROPERTIES,
                           "--report", "r.json", *extra], cwd=folder, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1) and (folder / "r.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((folder / "r.json").read_text())


@pytest.mark.engine
def test_two_ci_runs_at_one_seed_one_beside_a_cpu_hog_give_the_same_report(tmp_path: Path) -> None:
    """The ci profile used to spend a wall-clock share per property: beside a CPU hog the same
    seed ran other examples (564 against 408 llama.cpp workloads) and could reach another verdict."""
    quiet = _ci_report(tmp_path / "quiet")
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"])]  # one busy core: the run's workers share what is left
    try:
        loaded = _ci_report(tmp_path / "loaded")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    for key in ("verdict",):
        assert quiet[key] == loaded[key]
    for key in ("signatures", "findings", "examples_asked", "examples_cut"):
        assert quiet["stats"][key] == loaded["stats"][key], key
    # an unconfirmed failure's shrinking adds examples; a crash's shrink replays each candidate on fresh
    # workers under the step timeout, which a loaded machine can reach (Hypothesis's own clock on
    # shrinking is lifted: ``fuzz.shrinking_by_count``): there the examples run are the clock's
    crashed = any("kind=crash" in sig for sig in quiet["stats"]["signatures"])
    if not quiet["stats"]["unconfirmed"] and not loaded["stats"]["unconfirmed"] and not crashed:
        assert quiet["stats"]["property_examples"] == loaded["stats"]["property_examples"]
    assert quiet["stats"]["examples_asked"] > 0 and quiet["stats"]["examples_cut"] == 0
    assert [f["signature"] for f in quiet["new_findings"]] == [f["signature"] for f in loaded["new_findings"]]


def test_a_budget_that_cuts_the_run_short_is_its_own_verdict_and_exit_status(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "run", "--profile", "ci", "--seed", "1", "--known", "none", "--properties", "matches-reference,no-abort",
                           "--budget", "0.5", "--report", "r.json"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == CUT_SHORT_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    stats = report["stats"]
    assert report["verdict"] == "cut short" and 0 < stats["examples_cut"] <= stats["examples_asked"]
    assert f"CUT SHORT: {stats['examples_asked'] - stats['examples_cut']} of {stats['examples_asked']} examples ran" in proc.stdout


def test_under_pytest_a_cut_short_run_exits_with_its_own_status(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--schedfuzz", "-p", "no:cacheprovider", "--schedfuzz-profile=ci",
                           "--schedfuzz-known=none", "--schedfuzz-properties=matches-reference", "--schedfuzz-budget=0.5",
                           "--schedfuzz-report=r.json"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == CUT_SHORT_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "cut short" and "CUT SHORT: " in proc.stdout


@pytest.mark.parametrize("front", ["pytest", "cli"])
def test_ctrl_c_gives_an_interrupted_verdict_never_clean(tmp_path: Path, front: str) -> None:
    """Ctrl-C after a few seconds: "no new finding" and a clean report used to follow."""
    cmd = ([sys.executable, "-m", "pytest", "--schedfuzz", "-p", "no:cacheprovider", "--schedfuzz-profile", "nightly",
            "--schedfuzz-known=none", "--schedfuzz-properties", "matches-reference,no-abort", "--schedfuzz-report", "r.json"]
           if front == "pytest" else [*CLI, "run", "--profile", "nightly", "--known", "none", "--properties", "matches-reference,no-abort",
                                      "--report", "r.json"])
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(12)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode in (2, 130), out[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "interrupted", out[-3000:]
    assert "INTERRUPTED (Ctrl-C)" in out


def test_a_new_finding_is_saved_untriaged_and_known_makes_it_a_known_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A new finding used to be saved as a guard (``expect: pass``): every later run failed on it
    as "fails again", and no command made it known."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))
    run = ["run", "--seed", "1", "--known", "none", "--properties", "reuse-complete", "--policy", "planted:never"]
    assert main(run) == 1
    (path,) = sorted((tmp_path / "corpus").glob("*.json"))
    assert json.loads(path.read_text())["expect"] == "new"
    capsys.readouterr()
    assert main(["replay", str(path), "--policy", "planted:never"]) == 1
    assert "reproduces (a new finding, not triaged)" in capsys.readouterr().out
    assert main(["known", str(path), "--because", "never reuses: the planted policy", "--name", "planted-never"]) == 0
    known = tmp_path / "corpus" / "planted-never.json"
    assert not path.exists() and json.loads(known.read_text())["expect"] == {"fail": "never reuses: the planted policy"}
    capsys.readouterr()
    assert main(["replay", str(known), "--policy", "planted:never"]) == 0
    assert "still fails (known bug)" in capsys.readouterr().out
    assert main(["known", str(known), "--because", "again"]) == 2  # not a new finding any more: said, not rewritten
    assert "not a new finding" in capsys.readouterr().err
