"""The mutation score's machinery: every mutant applies to ggml 0.25.3's source exactly once,
and a run on a mutant the properties see is a kill."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_schedfuzz.builds.compile import source_tree
from pytest_schedfuzz.cli import main
from pytest_schedfuzz.properties.derived import graph_trace
from pytest_schedfuzz.tools.mutants import MUTANTS

CORPUS = Path(__file__).resolve().parents[2] / "corpus"


def test_every_mutant_applies_once() -> None:
    src = source_tree("ggml-0.25.3")
    assert len(MUTANTS) >= 10 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        assert (src / m.patch.file).read_text().count(m.patch.old) == 1, m.name


def test_a_mutant_the_properties_see_is_killed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["mutate", "--mutants", "cpu-expands-down", "--budget", "90", "--corpus", str(CORPUS), "--logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpu-expands-down" in out and "KILLED" in out and "kill score: 1/1 = 100%" in out
    assert "matches-reference" in (tmp_path / "cpu-expands-down.log").read_text()


def test_a_corpus_case_the_mutant_changes_is_a_kill() -> None:
    """The corpus replays first: a known bug that no longer reproduces on the mutant (strict
    XPASS, listed without a message) is the ci run seeing it, as a property's finding is."""
    from pytest_schedfuzz.tools.mutants import _FINDING

    assert _FINDING.match("schedfuzz::corpus/no-abort-after-failed-allocation-kind-crash-plan-kept-5a2e452570")
    assert _FINDING.match("schedfuzz::matches-reference - [matches-reference] step 1: reserve(g0): ...")
    assert not _FINDING.match("tests/test_x.py::test_y - AssertionError")


def test_an_unknown_mutant_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutate", "--mutants", "nosuch", "--corpus", str(CORPUS)]) == 2
    assert "unknown mutants nosuch" in capsys.readouterr().err


def test_pass3_ignoring_unreadable_srcs_is_caught_where_the_graph_has_it() -> None:
    """The ci profile lets ``pass3-ignores-srcs`` survive: it needs a node on the CPU, a device of
    higher priority sharing the CPU's buffer type, and a src that device cannot read (on an RPC
    device), which its graphs almost never combine. Where a graph does, matches-reference
    catches it: the add forced to the CPU reads the RPC matmul, and the mutant upgrades it to
    the device, which cannot read it."""
    from pytest_schedfuzz.builds.compile import build_ggml_base
    from pytest_schedfuzz.ggml.graph_target import GgmlTarget
    from pytest_schedfuzz.model.graph_spec import GraphBuilder
    from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
    from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
    from pytest_schedfuzz.properties import matches_reference
    from pytest_schedfuzz.tools.mutants import mutant
    from reference.predict import predict

    b = GraphBuilder()
    h = b.op("mul_mat", b.weight("w", (32, 32), device=1), b.input("x", (32, 8)), name="h")
    b.force(b.op("add", h, b.input("x2", (32, 8)), name="z"), 2)
    layout = BackendLayout((BackendSpec("gpu", shared_buft=True), BackendSpec("rpc"), BackendSpec("cpu")))
    sc = Scenario(layout, (("g", b.build("z")),), (Step("sched_new", params=SchedParams(64, False, True)), Step("compute", "g")))
    prediction = predict(sc)
    for lib, found in (("ggml-0.25.3", []), (str(build_ggml_base("ggml-0.25.3", (mutant("pass3-ignores-srcs").patch,))),
                                             ["[matches-reference] step 1: compute(g): node #1 z: engine GPU0, reference CPU"])):
        with GgmlTarget(lib=lib) as engine:
            assert [str(v) for v in matches_reference(sc, graph_trace(engine.run(sc)), prediction)] == found
