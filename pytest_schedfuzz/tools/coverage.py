"""``schedfuzz coverage``: how much of ggml's scheduler and allocator a run reaches.

A built-in ggml's ``libggml-base`` is rebuilt with gcc's ``--coverage`` (``builds.compile.build_ggml_base``:
Debug, as the install builds it, its source and ``.gcno`` kept), the chosen profile runs on it in a
fresh folder with a copy of the corpus (as ``schedfuzz mutate`` runs it; the graph properties and
the llama.cpp properties' captured graphs run on the instrumented library, llama.cpp's own
workloads on llama.cpp's), and every process that loaded it leaves its counts (``.gcda``) when it
exits. ``gcov --json-format`` then gives, per function of ``ggml-backend.cpp`` whose name says
``sched`` and of ``ggml-alloc.c``, the lines and branches reached; every branch not taken is
listed by source line, and those no caller of the public API can take without a bug (the failing
side of a ``GGML_ASSERT``/``GGML_ABORT``, an allocation that fails) are told apart, so that the
figure that counts is of the branches reachable from the public API.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..builds.compile import build_ggml_base, coverage_build
from .ci_run import run_ci_profile

SOURCES = ("ggml-backend.cpp", "ggml-alloc.c")
# a branch whose line says one of these is taken only when ggml is wrong or a buffer cannot be had
_UNREACHABLE = (
    (re.compile(r"GGML_ASSERT|GGML_ABORT|\bassert\s*\("), "an assertion's failing side: taken only by a bug"),
    (re.compile(r"GGML_LOG_ERROR|return false;|return NULL;"), "an error path (a buffer or an allocation refused, bad input)"),
)
# ... and so is the side of an ``if`` that enters a body doing one of these (the error is reported
# or passed on there, not on the ``if`` line): a failed allocation, a backend's failed status
_ERROR_BODY = re.compile(r"GGML_ABORT|GGML_LOG_ERROR|return false;|return NULL;|return nullptr;|return GGML_STATUS_\w*FAILED|return ec;")
_ERROR_BODY_WHY = "the side of an if that enters an error path (a failed allocation, a backend's failed status)"


def _guarded_body(text: list[str], line: int) -> str:
    """The statements an ``if`` on ``line`` (1-based) guards, up to its closing brace (a few
    lines at most): where a branch's error handling is written."""
    head = text[line - 1].strip()
    if not head.startswith(("if ", "if(", "} else if")) or not head.endswith("{"):
        return ""
    body = []
    for row in text[line : line + 6]:
        if row.strip().startswith("}"):
            break
        body.append(row)
    return "\n".join(body)


def unreachable_why(text: list[str], line: int) -> str:
    """Why no caller of the public API can take the missed side of a branch on ``line``
    (1-based), or "" if one could: an assertion's failing side, an error path on the line, or an
    ``if`` whose body is an error path."""
    source = text[line - 1] if line <= len(text) else ""
    why = next((w for pattern, w in _UNREACHABLE if pattern.search(source)), "")
    return why or (_ERROR_BODY_WHY if _ERROR_BODY.search(_guarded_body(text, line)) else "")


@dataclass
class Function:
    """One function's reach: lines executed of lines, branches taken of branches, and each branch
    not taken as (line, its source, why none can take it: "" if a caller could)."""

    name: str
    source: str
    line: int
    lines: int = 0
    lines_hit: int = 0
    branches: int = 0
    branches_hit: int = 0
    missed: list[tuple[int, str, str]] = field(default_factory=list)
    reached_lines: set[int] = field(default_factory=set)

    @property
    def reachable(self) -> int:
        return self.branches - sum(1 for _, _, why in self.missed if why)

    @property
    def reachable_hit(self) -> int:
        return self.branches_hit


def _in_scope(source: str, name: str) -> bool:
    return source == "ggml-alloc.c" or "sched" in name


def zero_counts(build: Path) -> None:
    """Delete the counts (``.gcda``) under ``build``, so that those measured next are of one run."""
    for gcda in build.rglob("*.gcda"):
        gcda.unlink()


@contextmanager
def own_counts(build: Path) -> Iterator[None]:
    """Exclusive use of ``build``'s counts for the block, zeroed on entry: two processes measuring
    one coverage build at once (two workers of one test run, two ``schedfuzz coverage``) would
    delete and add to each other's ``.gcda`` files."""
    with (build / ".counts.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        zero_counts(build)
        yield


def measure(build: Path, src: Path) -> list[Function]:
    """The reach of every function in scope from the ``.gcda`` counts under ``build``."""
    out: list[Function] = []
    for name in SOURCES:
        gcda = next(build.rglob(f"{name}.gcda"), None)
        if gcda is None:
            raise RuntimeError(f"no {name}.gcda under {build}: no process that loaded the library exited normally")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["gcov", "--json-format", "--branch-probabilities", "--object-directory", str(gcda.parent), str(gcda)],
                           cwd=tmp, check=True, capture_output=True)
            report = json.loads(gzip.open(next(Path(tmp).glob(f"{name}.gcov.json.gz"))).read())
        text = next(src.rglob(name)).read_text().splitlines()
        for f in report["files"]:
            if not f["file"].endswith(name):
                continue
            fns = {fn["name"]: Function(fn.get("demangled_name", fn["name"]), name, fn["start_line"])
                   for fn in f["functions"] if _in_scope(name, fn.get("demangled_name", fn["name"]))}
            for ln in f["lines"]:
                fn = fns.get(ln.get("function_name", ""))
                if fn is None:
                    continue
                fn.lines += 1
                fn.lines_hit += ln["count"] > 0
                if ln["count"] > 0:
                    fn.reached_lines.add(ln["line_number"])
                source = text[ln["line_number"] - 1].strip() if ln["line_number"] <= len(text) else ""
                branches = [b for b in ln.get("branches", ()) if not b.get("throw")]  # C++ exception edges: no code path of ggml's
                fn.branches += len(branches)
                fn.branches_hit += sum(b["count"] > 0 for b in branches)
                missed = sum(b["count"] == 0 for b in branches)
                why = unreachable_why(text, ln["line_number"])
                # each condition is a pair of sides, of which only one is the failing one: a line
                # whose both sides no example took (its function never ran) keeps one reachable
                unreachable = min(missed, len(branches) // 2) if why else 0
                fn.missed += [(ln["line_number"], source, why if k < unreachable else "") for k in range(missed)]
            out.extend(fns.values())
    return sorted(out, key=lambda f: (f.source, f.line))


def lines(functions: Sequence[Function], unreached: bool = True) -> list[str]:
    """The report: per function its lines and branches reached, the totals, then the branches
    a caller of the public API could take that no example took, by source line."""
    rows = [f"{'function':<48} {'lines':>12} {'branches':>12} {'reachable':>12}"]
    for f in functions:
        if f.lines == 0:
            continue
        rows.append(f"{f.name[:48]:<48} {f.lines_hit:>5}/{f.lines:<6} {f.branches_hit:>5}/{f.branches:<6} {f.reachable_hit:>5}/{f.reachable:<6}")
    lt, lh = sum(f.lines for f in functions), sum(f.lines_hit for f in functions)
    bt, bh = sum(f.branches for f in functions), sum(f.branches_hit for f in functions)
    rt = sum(f.reachable for f in functions)
    rows.append(f"{'total':<48} {lh:>5}/{lt:<6} {bh:>5}/{bt:<6} {bh:>5}/{rt:<6}")
    rows.append(f"lines {lh / max(1, lt):.1%}, branches {bh / max(1, bt):.1%}, branches reachable from the public API {bh / max(1, rt):.1%} "
                f"({bt - rt} not: the failing sides of assertions and error paths)")
    if unreached:
        rows.append("\nbranches reachable from the public API that no example took:")
        for f in functions:
            for line, source, why in f.missed:
                if not why:
                    rows.append(f"  {f.source}:{line} ({f.name}): {source[:110]}")
    return rows


def main(lib: str, profile: str, budget: float | None, corpus: Path, out: Path | None) -> int:
    """Build the coverage library, run ``profile`` on it, print the reach (and write it as JSON to ``out``)."""
    folder = build_ggml_base(lib, coverage=True)
    build = coverage_build(folder)
    with own_counts(build):  # counts of this run only
        proc = run_ci_profile(folder, corpus, budget, profile=profile)
        if not any(build.rglob("ggml-backend.cpp.gcda")):
            print(f"schedfuzz coverage: the run left no counts (pytest exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}",
                  file=sys.stderr)
            return 1
        functions = measure(build, folder.parent / "ggml")
    print(f"{lib} (coverage build {folder}), profile {profile}" + (f", budget {budget:g} s" if budget else "")
          + f": pytest exit {proc.returncode}")
    print("\n".join(lines(functions)))
    if out is not None:
        out.write_text(json.dumps([{"function": f.name, "source": f.source, "line": f.line, "lines": [f.lines_hit, f.lines],
                                    "branches": [f.branches_hit, f.branches], "reachable": [f.reachable_hit, f.reachable],
                                    "missed": [{"line": ln, "source": s, "unreachable": why} for ln, s, why in f.missed]}
                                   for f in functions], indent=1) + "\n")
    return 0
