"""The reference compiled with mypyc (``pytest_schedfuzz.compiled``) predicts what its source
predicts. The suite itself imports the source (``tests/conftest.py``); here a child process
imports the compiled modules and predicts drawn scenarios and the starter corpus's, under the
rules of both ggml versions."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_schedfuzz import compiled
from pytest_schedfuzz.cases.corpus import case_files, load_case
from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.scenario import Scenario
from pytest_schedfuzz.strategies import scenarios
from reference.predict import predict
from reference.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import pickle, sys
sys.path.insert(0, {tests!r})
import reference.sched
from reference.predict import predict
from reference.rules import RULES
if sys.argv[3] == "planted":
    from planted import WithoutPass2 as scheduler
else:
    scheduler = reference.sched.Scheduler
cases = pickle.load(open(sys.argv[1], "rb"))
out = [predict(sc, scheduler, RULES[v]) for sc, v in cases]
pickle.dump((reference.sched.__file__, out), open(sys.argv[2], "wb"))
"""


def _cases() -> list[tuple[Scenario, str]]:
    """Scenarios drawn by the project's strategy (with GPU-like devices and compute steps), and
    the starter corpus's graph cases (aborts among them), each under both versions' rules."""
    drawn: list[Scenario] = []

    @settings(max_examples=150, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.one_of(scenarios(), scenarios(DeviceLimits.of(rpc=2, gpu=2), compute=True, max_extra_ops=8)))
    def draw(sc: Scenario) -> None:
        drawn.append(sc)

    draw()
    corpus = [c.scenario for c in map(load_case, case_files(ROOT / "corpus")) if c.scenario is not None]
    assert len(corpus) > 10, "the starter corpus's graph cases are missing"
    for sc in drawn + corpus:
        sc.validate()
    return [(sc, v) for sc in drawn + corpus for v in RULES]


def _predict_compiled(tmp_path: Path, cases: list[tuple[Scenario, str]], planted: bool = False) -> tuple[str, list]:
    src, out = tmp_path / "cases.pkl", tmp_path / "traces.pkl"
    src.write_bytes(pickle.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k != compiled.ENV}
    code = CHILD.format(tests=str(ROOT / "tests"))
    run = subprocess.run([sys.executable, "-c", code, str(src), str(out), "planted" if planted else "-"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return pickle.loads(out.read_bytes())  # type: ignore[no-any-return]


def test_compiled_reference_predicts_what_the_source_predicts(tmp_path: Path) -> None:
    status = compiled.compile_reference()
    assert status.startswith("compiled"), status
    cases = _cases()
    where, traces = _predict_compiled(tmp_path, cases)
    assert where.endswith(".so") and str(compiled.build_dir()) in where, f"the child imported {where}, not the compiled module"
    differ = [i for i, ((sc, v), trace) in enumerate(zip(cases, traces)) if predict(sc, rules=RULES[v]) != trace]
    assert not differ, f"{len(differ)} of {len(cases)} predictions differ, first: {cases[differ[0]]}"
    assert sum(t.abort is not None for t in traces) > 5, "the comparison must cover predicted aborts"

    # planted: the same comparison finds a compiled reference whose pass 2 does nothing (a
    # subclass of the compiled Scheduler, as tests plant faults)
    _, planted = _predict_compiled(tmp_path, cases, planted=True)
    assert sum(predict(sc, rules=RULES[v]) != t for (sc, v), t in zip(cases, planted)) > 10


def test_an_edited_source_is_not_compiled_yet(tmp_path: Path) -> None:
    """The build is named by the sources: one edit, and the old build is not found for them."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "reference", root / "reference", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "pytest_schedfuzz" / "model", root / "pytest_schedfuzz" / "model", ignore=shutil.ignore_patterns("__pycache__"))
    before = compiled.digest(root / "reference")
    assert compiled.digest(root / "reference") == before
    for path in (root / "reference" / "alloc.py", root / "pytest_schedfuzz" / "model" / "shapes.py"):
        text = path.read_text()
        path.write_text(text + "\n# edited\n")
        assert compiled.digest(root / "reference") != before, path
        path.write_text(text)
    assert compiled.digest(root / "reference") == before


def test_the_suite_imports_the_source() -> None:
    import reference.sched

    assert reference.sched.__file__.endswith("sched.py"), reference.sched.__file__
    assert compiled.status.startswith("source")
