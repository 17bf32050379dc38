"""The CI recipes (``ci/github/*.yml``, shown verbatim in docs/ci.md) run as GitHub runs them:
each ``run:`` step under ``bash -e {0}`` (GitHub's default shell: no pipefail), in a workspace laid
out as the checkout steps leave it. The build and install steps are the only ones replaced (by
links to builds and to this interpreter's schedfuzz). A planted head fault must fail the job, and
the report, its JSON and the cases must be where the upload step looks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_schedfuzz.builds.compile import build_ggml_base
from pytest_schedfuzz.ggml.lib import resolve_lib
from pytest_schedfuzz.tools.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / "ci" / "github"
REPLACED = ("build", "build base and head", "install schedfuzz")  # what the test lays out itself
CPU_EXPANDS_DOWN = next(m.patch for m in MUTANTS if m.name == "cpu-expands-down")


def run_steps(workflow: Path, workspace: Path, env: dict[str, str]) -> tuple[int, str]:
    """The workflow's job's ``run:`` steps in order, each under ``bash -e``, stopping at the first
    that fails (as GitHub does); its exit status and the output."""
    (job,) = yaml.safe_load(workflow.read_text())["jobs"].values()
    job_env = {k: str(v).replace("${{ github.workspace }}", str(workspace)) for k, v in job.get("env", {}).items()}
    out = []
    for k, step in enumerate(job["steps"]):
        if "run" not in step or step.get("name") in REPLACED:
            continue
        script = workspace / f".step-{k}.sh"
        script.write_text(step["run"])
        proc = subprocess.run(["bash", "-e", str(script)], cwd=workspace, capture_output=True, text=True, timeout=1800,
                              env=os.environ | job_env | {"GITHUB_WORKSPACE": str(workspace)} | env)
        out.append(proc.stdout + proc.stderr)
        if proc.returncode:
            return proc.returncode, "\n".join(out)
    return 0, "\n".join(out)


def upload_path(workflow: Path, workspace: Path) -> Path:
    """Where the ``if: failure()`` upload step looks."""
    (job,) = yaml.safe_load(workflow.read_text())["jobs"].values()
    (upload,) = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact") and s.get("if") == "failure()"]
    return workspace / upload["with"]["path"]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """The checkout steps' layout: schedfuzz/ with its venv's entry points (this interpreter's)."""
    bin_dir = tmp_path / "schedfuzz" / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, runs in (("python", ""), ("schedfuzz", " -m pytest_schedfuzz.cli")):  # a symlink would lose the venv
        (bin_dir / name).write_text(f"#!/bin/sh\nexec {sys.executable}{runs} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    return tmp_path


def test_the_gate_job_fails_on_a_planted_head_fault_and_uploads_the_reports_and_cases(workspace: Path) -> None:
    workflow = WORKFLOWS / "schedfuzz-gate.yml"
    (workspace / "base").symlink_to(resolve_lib("ggml-0.25.3"))
    (workspace / "head").symlink_to(build_ggml_base("ggml-0.25.3", (CPU_EXPANDS_DOWN,)))
    status, out = run_steps(workflow, workspace, {"SCHEDFUZZ_GATE_OPTIONS": "--examples 200 --properties matches-reference"})
    assert status != 0, out[-4000:]
    kept = upload_path(workflow, workspace)
    report = json.loads((kept / "gate.json").read_text())
    assert report["verdict"] == "new failures on head" and any(n.startswith("fuzz/matches-reference: ") for n in report["new"]), report
    (case,) = sorted((kept / "corpus").glob("matches-reference-*.json"))  # head's new case, saved where the upload looks
    assert json.loads(case.read_text())["expect"] == "new"
    assert f"schedfuzz export corpus/{case.name} -o repro-" in (kept / "gate.txt").read_text()


def test_the_fuzz_job_fails_on_a_planted_fault_and_uploads_the_reports_and_cases(workspace: Path) -> None:
    workflow = WORKFLOWS / "schedfuzz-fuzz.yml"
    (workspace / "tree").symlink_to(build_ggml_base("ggml-0.25.3", (CPU_EXPANDS_DOWN,)))
    options = "--schedfuzz-examples=40 --schedfuzz-seed=1 --schedfuzz-properties=matches-reference --schedfuzz-known=none"
    status, out = run_steps(workflow, workspace, {"SCHEDFUZZ_OPTIONS": options})
    assert status != 0, out[-4000:]
    kept = upload_path(workflow, workspace)
    report = json.loads((kept / "schedfuzz.json").read_text())
    # the planted fault shows as the engine's disagreement with the reference, and may crash a step too
    assert report["verdict"] == "findings" and "matches-reference" in {f["property"] for f in report["new_findings"]}
    assert (kept / "schedfuzz.xml").is_file() and "NEW FINDINGS" in (kept / "schedfuzz.txt").read_text()
    saved = [json.loads(p.read_text()) for p in (kept / "corpus").glob("*.json")]
    assert {c["expect"] for c in saved} == {"new"} and any(c["property"] == "matches-reference" for c in saved)


@pytest.mark.parametrize("name", ["schedfuzz-gate.yml", "schedfuzz-fuzz.yml"])
def test_docs_ci_shows_each_workflow_as_it_is_in_the_repository(name: str) -> None:
    text = (ROOT / "docs" / "ci.md").read_text()
    assert f"```yaml\n{(WORKFLOWS / name).read_text()}```" in text, f"docs/ci.md does not show ci/github/{name} as it is"
