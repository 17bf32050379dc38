"""``bench --sections flake``: one seed, one verdict, measured. The runs are the ci job's (each
a fresh folder); here they are stood in for, to show what the section counts and says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_schedfuzz.tools import flake


def _run(seed: int, verdict: str = "clean", new: tuple[str, ...] = (), unconfirmed: int = 0) -> dict[str, Any]:
    return {"seed": seed, "exit": 0 if verdict == "clean" else 1, "verdict": verdict, "new": list(new), "corpus_failed": [],
            "unconfirmed": unconfirmed, "unconfirmed_cases": [], "examples": 100, "wall_s": 120.0, "cpu_s": 230.0}


def test_the_section_counts_the_seeds_whose_runs_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {("a", 0): [_run(0), _run(0, "findings", ("no-abort[kind=crash]",), 1)], ("a", 1): [_run(1, unconfirmed=2)],
               ("b", 0): [_run(0), _run(0)], ("b", 1): [_run(1)]}

    def ci_job(job: flake.CiJob, seed: int, budget: float, folder: Path) -> dict[str, Any]:
        assert budget == 60 and folder.name.startswith(f"seed-{seed}-run-")
        return answers[(job.name, seed)].pop(0)

    monkeypatch.setattr(flake, "ci_job", ci_job)
    jobs = (flake.CiJob("a", ()), flake.CiJob("b", ()))
    r = flake.flake((0, 0, 1), 60, jobs)
    assert r["a"]["differing_seeds"] == [0] and r["b"]["differing_seeds"] == []
    text = "\n".join(flake.report_lines(r))
    assert "a: 3 runs (seeds 0, 0, 1); runs differing at one seed: 1 (seeds 0); unconfirmed failures 3 (1.0 a run)" in text
    assert "b: 3 runs (seeds 0, 0, 1); runs differing at one seed: 0; unconfirmed failures 0 (0.0 a run)" in text
    assert "new: no-abort[kind=crash]" in text


def test_the_jobs_are_the_ci_jobs_of_the_ci_script() -> None:
    """Each built-in's ci job, with the options ``.ci/run`` gives it."""
    script = (Path(__file__).parents[2] / ".ci" / "run").read_text().replace("\\\n", " ")
    runs = [line for line in script.splitlines() if line.startswith("pytest --schedfuzz --schedfuzz-profile=ci")]
    assert len(runs) == len(flake.CI_JOBS)
    for job, line in zip(flake.CI_JOBS, runs, strict=True):
        assert all(option in line.split() for option in job.options), (job, line)
