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
