"""``schedfuzz bench --sections flake``: how often the ci job's verdict is chance.

The ci job (``--schedfuzz-profile=ci``, ``-n 2``, the starter corpus) runs on each built-in at
the seeds given (default 0, 0, 1, 2, 3: seed 0 twice, so that one seed's two verdicts can be
compared), each in a fresh folder with a copy of the corpus. Per build it prints the seeds whose
runs differ (the goal is none: one seed, one verdict): in verdict, new signatures, corpus failures,
or the examples that ran of those asked for (the ci profile runs by count; the examples an
unconfirmed failure's shrinking tried are not counted), the unconfirmed failures
of every run and their rate per run (failures a fresh worker did not show again: kept, not
findings), and the new findings beside the corpus's known bugs (a real bug found, or a flake
that confirmation let through: each is named, to be looked at).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..builds.names import SEED_GGML, SEED_LLAMA, UPSTREAM


@dataclass(frozen=True)
class CiJob:
    """One ci job of ``.ci/run``: its name and the options that pick its builds."""

    name: str
    options: tuple[str, ...]


# the ci jobs of .ci/run, one per built-in
CI_JOBS = (
    CiJob("ggml-0.25.3", ("--schedfuzz-lib=ggml-0.25.3",)),
    CiJob("ggml-0.15.3", ("--schedfuzz-lib=ggml-0.15.3",)),
    CiJob(SEED_LLAMA, (f"--schedfuzz-lib={SEED_GGML}", f"--schedfuzz-llama-lib={SEED_LLAMA}")),
    CiJob(UPSTREAM, (f"--schedfuzz-llama-lib={UPSTREAM}",)),
)
FOLDER = Path(".schedfuzz/bench-flake")  # each run's folder: its corpus (new findings), unconfirmed cases and report


def ci_job(job: CiJob, seed: int, budget: float, folder: Path) -> dict[str, Any]:
    """One run of ``job`` at ``seed`` in ``folder`` (made afresh, with the starter corpus): its
    verdict, new signatures, corpus failures, unconfirmed failures, examples and times."""
    corpus = Path(__file__).resolve().parents[2] / "corpus"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copytree(corpus, folder / "corpus")
    # its own rootdir: inside a checkout, pytest would take the checkout's (its pyproject.toml), and the
    # run would save its findings in the checkout's corpus, which the next run copies
    (folder / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "--schedfuzz", "--schedfuzz-profile=ci", f"--schedfuzz-budget={budget:g}", f"--schedfuzz-seed={seed}",
           "-m", "schedfuzz", "-n", "2", "-q", "-p", "no:cacheprovider", "--schedfuzz-corpus", "corpus", "--schedfuzz-report", "report.json",
           *job.options]
    t = time.perf_counter()
    with open(folder / "output.txt", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=folder, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    report = folder / "report.json"
    if not report.is_file():
        raise RuntimeError(f"{job.name} at seed {seed}: the ci job wrote no report (exit status {os.waitstatus_to_exitcode(status)}; "
                           f"its output: {folder / 'output.txt'})")
    r = json.loads(report.read_text())
    failed = sorted(r.get("corpus", {}).get("fail", []))
    return {"seed": seed, "exit": os.waitstatus_to_exitcode(status), "verdict": r["verdict"], "new": sorted(f["signature"] for f in r["new_findings"]),
            "corpus_failed": failed, "unconfirmed": r["stats"]["unconfirmed"], "unconfirmed_cases": sorted(r["stats"]["unconfirmed_cases"]),
            "examples": r["stats"]["examples"], "ran": r["stats"]["examples_asked"] - r["stats"]["examples_cut"],
            "property_examples": r["stats"]["property_examples"], "wall_s": time.perf_counter() - t,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def flake(seeds: tuple[int, ...], budget: float, jobs: tuple[CiJob, ...] = CI_JOBS) -> dict[str, Any]:
    """Every job at every seed; per job, the runs and which seeds gave two verdicts."""
    out: dict[str, Any] = {}
    for job in jobs:
        runs = [ci_job(job, seed, budget, FOLDER / job.name / f"seed-{seed}-run-{k}") for k, seed in enumerate(seeds)]
        by_seed: dict[int, set[tuple[object, ...]]] = {}
        for r in runs:
            by_seed.setdefault(r["seed"], set()).add((r["verdict"], tuple(r["new"]), tuple(r["corpus_failed"]), r.get("ran")))
        out[job.name] = {"runs": runs, "differing_seeds": sorted(s for s, verdicts in by_seed.items() if len(verdicts) > 1)}
    return out


def report_lines(r: dict[str, Any]) -> list[str]:
    lines = ["flake: the ci job's runs at the same seed (verdict, signatures, examples run of those asked), unconfirmed failures, new findings (per build):"]
    for name, v in r.items():
        runs = v["runs"]
        unconfirmed = sum(x["unconfirmed"] for x in runs)
        lines.append(f"  {name}: {len(runs)} runs (seeds {', '.join(str(x['seed']) for x in runs)}); runs differing at one seed: "
                     f"{len(v['differing_seeds'])}" + (f" (seeds {', '.join(map(str, v['differing_seeds']))})" if v["differing_seeds"] else "")
                     + f"; unconfirmed failures {unconfirmed} ({unconfirmed / len(runs):.1f} a run)")
        for x in runs:
            lines.append(f"    seed {x['seed']}: {x['verdict']}, {x['examples']} examples, {x['cpu_s']:.0f} CPU-s, {x['wall_s']:.0f} s; "
                         f"unconfirmed {x['unconfirmed']}; new {len(x['new'])}" + "".join(f"\n      new: {s}" for s in x["new"])
                         + "".join(f"\n      corpus failed: {c}" for c in x["corpus_failed"]))
    return lines
