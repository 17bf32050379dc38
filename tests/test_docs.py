"""The front door: a README a maintainer reads in two minutes, whose links and options are real,
and the documentation site, built as CI builds it (``mkdocs build --strict``: a broken link or
anchor fails)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_links_only_to_pages_that_exist() -> None:
    assert len(README.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#]+)\)", README)
    assert links and [link for link in links if not (ROOT / link).is_file()] == []
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {page for entry in nav for page in entry.values()}
    assert {link.removeprefix("docs/") for link in links} <= pages
    assert pages == {p.name for p in (ROOT / "docs").glob("*.md")}, "every page is in the site's navigation"


def test_the_readmes_options_and_commands_exist() -> None:
    """Every ``--schedfuzz-*`` option the README names is one pytest has, and every
    ``schedfuzz`` command it names is one the CLI has."""
    helped = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120).stdout
    named = set(re.findall(r"--schedfuzz(?:-[a-z]+)*", README))
    assert named and [o for o in named if o not in helped] == []
    commands = subprocess.run([sys.executable, "-m", "pytest_schedfuzz.cli", "--help"], capture_output=True, text=True, cwd=ROOT,
                              timeout=120).stdout
    said = set(re.findall(r"`(run|replay|minimize|show|export|gate|compare|seeds|coverage|bench|capture|mutate|device)`", README))
    assert said and [c for c in said if c not in commands] == []


def test_the_documentation_builds_in_strict_mode(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _readme_commands() -> list[str]:
    """The commands of the README's ``sh`` blocks, one per ``&&``-joined part."""
    blocks = re.findall(r"```sh\n(.*?)```", README, re.S)
    return [part.strip() for block in blocks for line in block.splitlines() if line.strip() for part in line.split("&&")]


def test_the_readmes_commands_run_as_written_in_an_empty_folder(tmp_path: Path) -> None:
    """The README's install line is the venv, pip's install of requirements.txt and the project,
    ``schedfuzz device`` and ``pytest --schedfuzz``: the last two run here as written, in an empty
    folder whose ini file only caps the budget (``schedfuzz_budget``, as a user's would), and end
    with the verdict; its test command is the one ``.ci/run`` runs."""
    commands = _readme_commands()
    install = ["python3 -m venv .venv", ". .venv/bin/activate", "pip install -r requirements.txt -e .", "schedfuzz device", "pytest --schedfuzz"]
    assert commands == [*install, "pytest -n 2"], commands
    assert "\npytest -q -n 2\n" in (ROOT / ".ci" / "run").read_text()
    bin_dir = Path(sys.executable).parent
    device = subprocess.run([str(bin_dir / "schedfuzz"), "device"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert device.returncode == 0, device.stdout[-2000:] + device.stderr[-2000:]
    (tmp_path / "pytest.ini").write_text("[pytest]\nschedfuzz_budget = 45\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "--schedfuzz", "-p", "no:cacheprovider"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=900)
    out = run.stdout
    assert run.returncode in (0, 1), out[-3000:] + run.stderr[-3000:]  # 1: a new finding, saved (said below)
    verdict = out.split("= schedfuzz =")[-1].split("short test summary")[0].strip("= \n").splitlines()
    assert 3 <= len(verdict) <= 12 and any(line.startswith("seed ") for line in verdict), verdict
    assert (run.returncode == 1) == any(line.startswith("NEW FINDINGS") for line in verdict), verdict
    assert not (tmp_path / ".hypothesis").exists() and (tmp_path / ".schedfuzz").is_dir()
