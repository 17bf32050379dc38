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
