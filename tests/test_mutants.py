"""The mutation score's machinery: every mutant applies to ggml 0.25.3's source exactly once,
and a run on a mutant the properties see is a kill."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_schedfuzz.build import source_tree
from pytest_schedfuzz.cli import main
from pytest_schedfuzz.mutants import MUTANTS

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def test_every_mutant_applies_once() -> None:
    src = source_tree("ggml-0.25.3")
    assert len(MUTANTS) >= 10 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        assert (src / m.patch.file).read_text().count(m.patch.old) == 1, m.name


def test_a_mutant_the_properties_see_is_killed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["mutate", "--mutants", "cpu-expands-down", "--budget", "30", "--corpus", str(CORPUS), "--logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpu-expands-down" in out and "KILLED" in out and "kill score: 1/1 = 100%" in out
    assert "matches-reference" in (tmp_path / "cpu-expands-down.log").read_text()


def test_an_unknown_mutant_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutate", "--mutants", "nosuch", "--corpus", str(CORPUS)]) == 2
    assert "unknown mutants nosuch" in capsys.readouterr().err
