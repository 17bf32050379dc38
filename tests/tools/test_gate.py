"""``schedfuzz gate`` between two builds: what head fixed is listed, what head broke fails it.

The broken head is ggml 0.25.3 rebuilt from its vendored source with a scheduler bug planted
(``builds.compile.build_ggml_base``): pass 2's "expand gpu down" no longer skips the CPU, so CPU
assignments spread down the graph before the other backends' do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_schedfuzz.builds.compile import build_ggml_base
from pytest_schedfuzz.cases.corpus import Case, load_case
from pytest_schedfuzz.cli import main
from pytest_schedfuzz.properties.base import Violation
from pytest_schedfuzz.tools.gate import Side, check_claims, compare
from pytest_schedfuzz.tools.mutants import MUTANTS

# pass 2's "expand gpu down" lets the CPU expand too (the mutation score's first mutant)
CPU_EXPANDS_DOWN = next(m.patch for m in MUTANTS if m.name == "cpu-expands-down")


@pytest.fixture(scope="module")
def planted_head() -> str:
    return str(build_ggml_base("ggml-0.25.3", (CPU_EXPANDS_DOWN,)))


def test_compare_lists_fixed_and_new() -> None:
    base = Side("base", "b", {"corpus/a": ("no-abort[x]",), "corpus/b": (), "fuzz/p": ("p[1]",), "fuzz/q": (), "fuzz/l": None})
    head = Side("head", "h", {"corpus/a": (), "corpus/b": ("no-abort[y]",), "fuzz/p": ("p[1]",), "fuzz/q": ("no-abort[x]",), "fuzz/l": ("l[1]",)})
    cmp = compare(base, head)
    assert [f.split(":")[0] for f in cmp.fixed] == ["corpus/a"]
    # fuzz/q found on head what base showed in its corpus: not new; fuzz/l did not run on base
    assert [n.split(":")[0] for n in cmp.new] == ["corpus/b"]


class Replays:
    """A side's engines as ``check_claims`` uses them: ``replay(case)`` gives the violations its
    build shows, here the signatures given, from the ``at``-th replay on (a flaky bug)."""

    def __init__(self, shows: set[str], at: int = 1) -> None:
        self.shows, self.at, self.replays = shows, at, 0

    def replay(self, case: Case) -> list[Violation]:
        self.replays += 1
        prop, _, facts = case.signature.partition("[")
        shown = case.signature in self.shows and self.replays >= self.at
        return [Violation(prop, 0, "shown", dict(f.split("=") for f in facts.rstrip("]").split(",")))] if shown else []


def test_a_head_only_failure_that_base_shows_on_its_replay_is_not_new() -> None:
    """The two sides' example streams part after their first different failure: a head-only
    signature is replayed from head's case on base (up to n times: a flaky one shows on the third)
    and, shown there, is "on base too", not new; likewise a base-only one replayed on head is not fixed."""
    head_case = Case("no-abort", "no-abort[kind=x]", None)
    base_case = Case("no-abort", "no-abort[kind=y]", None)
    base = Side("base", "b", results={"fuzz/no-abort": ("no-abort[kind=y]",), "fuzz/p": ()}, cases={"fuzz/no-abort": base_case})
    head = Side("head", "h", results={"fuzz/no-abort": ("no-abort[kind=x]",), "fuzz/p": ()}, cases={"fuzz/no-abort": head_case})
    claimed = compare(base, head)
    assert claimed.new_rows == ("fuzz/no-abort",)
    on_base = Replays({"no-abort[kind=x]"}, at=3)
    checked = check_claims(claimed, base, head, (on_base, Replays(set())), [], 5, lambda s: None)  # type: ignore[arg-type]
    assert checked.new == [] and on_base.replays == 3
    assert {r: c for r, _, _, c in checked.rows}["fuzz/no-abort"] == "on base too (replay 3 of 5)"
    # base never shows head's failure in its 5 replays: new
    never = check_claims(claimed, base, head, (Replays(set()), Replays(set())), [], 5, lambda s: None)  # type: ignore[arg-type]
    assert never.new_rows == ("fuzz/no-abort",)
    # a base-only failure that head shows on its replay is not fixed
    fixed = compare(Side("base", "b", results={"fuzz/q": ("no-abort[kind=y]",)}, cases={"fuzz/q": base_case}),
                    Side("head", "h", results={"fuzz/q": ()}))
    assert fixed.fixed_rows == ("fuzz/q",)
    kept = check_claims(fixed, Side("base", "b", cases={"fuzz/q": base_case}), Side("head", "h"),
                        (Replays(set()), Replays({"no-abort[kind=y]"})), [], 5, lambda s: None)  # type: ignore[arg-type]
    assert kept.fixed == []


def test_gate_lists_what_0_25_3_fixed_and_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = Path(__file__).resolve().parents[2] / "corpus"
    fixed = [p.stem for p in sorted(corpus.glob("*.json")) if "fixed_in" in str(load_case(p).expect)]
    assert fixed  # the starter corpus holds bugs fixed in 0.25.3
    status = main(["gate", "--base", "ggml-0.15.3", "--head", "ggml-0.25.3", "--corpus", str(corpus), "--examples", "5",
                   "--properties", "matches-reference,no-abort", "--save", str(tmp_path / "saved")])
    out = capsys.readouterr().out
    assert status == 0, out
    listed = out.split("fixed on head", 1)[1].split("new failures on head", 1)[0]
    assert all(f"corpus/{stem}" in listed for stem in fixed), out
    assert "new failures on head (0): none" in out


def test_gate_fails_on_a_planted_scheduler_bug_and_names_it(planted_head: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "no-cases"  # a corpus named must exist (as pytest --schedfuzz's); one without cases
    empty.mkdir()
    # (the starter corpus's known bugs are known on both sides: 200 examples reach the planted one)
    status = main(["gate", "--base", "ggml-0.25.3", "--head", planted_head, "--corpus", str(empty), "--examples", "200",
                   "--properties", "matches-reference", "--save", str(tmp_path / "saved")])
    out = capsys.readouterr().out
    assert status == 1, out
    new = out.split("new failures on head", 1)[1]
    assert "fuzz/matches-reference: matches-reference[what=" in new, out


def test_gate_rejects_an_unknown_build(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["gate", "--base", "ggml-0.25.3", "--head", str(tmp_path / "nosuch"), "--corpus", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--head" in err and "nosuch" in err and "not a folder" in err


@pytest.mark.parametrize("tree", ["ggml", "llama.cpp"])
def test_the_ci_recipes_cmake_line_configures_a_vendored_ggml(tree: str, tmp_path: Path) -> None:
    """The pre-merge recipe's cmake line, verbatim from the docs (docs/ci.md), on a ggml checkout
    (ggml-python's vendored ggml 0.15.3) and on a llama.cpp checkout without its tests/ and
    examples/ (llama-cpp-python's vendored llama.cpp)."""
    import shlex
    import subprocess

    from pytest_schedfuzz.builds.compile import source_tree

    lines = (Path(__file__).parents[2] / "docs" / "ci.md").read_text().splitlines()
    i = next(k for k, x in enumerate(lines) if x.strip().startswith("cmake -S $tree -B $tree/build"))
    line = lines[i].strip()
    while line.endswith("\\"):
        i += 1
        line = line[:-1] + " " + lines[i].strip()
    src = source_tree("ggml-0.15.3") if tree == "ggml" else source_tree("ggml-0.25.3").parent
    args = [a.replace("$tree/build", str(tmp_path / "build")).replace("$tree", str(src)) for a in shlex.split(line)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
