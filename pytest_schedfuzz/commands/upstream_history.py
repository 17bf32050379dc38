"""``schedfuzz bisect`` and ``schedfuzz matrix``: a case's upstream history (``tools.history``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cases.corpus import CaseError
from ..tools.history import HAS, Builds, builds_between, known_bugs, render_matrix
from ..tools.history import bisect as bisect_builds
from ..tools.history import matrix as make_matrix
from . import UsageError, bad_case, load_all


def _builds(args: argparse.Namespace) -> list[str]:
    """The builds named: ``--builds`` (in the order given, the oldest first), else the published
    ones from ``--from`` to ``--to``."""
    if args.builds:
        return [b for arg in args.builds for b in arg.split(",") if b]
    if not args.first:
        raise UsageError("--from (and --to) name published builds (llama.cpp-bNNNN); or --builds lists the builds, the oldest first")
    return builds_between(_name(args.first), _name(args.last))


def _name(build: str) -> str:
    """``b11327`` or ``llama.cpp-b11327`` as the published build's name."""
    return build if build.startswith("llama.cpp-") else f"llama.cpp-{build}"


def _log(line: str) -> None:
    print(f"schedfuzz: {line}", file=sys.stderr, flush=True)


def bisect(args: argparse.Namespace) -> int:
    """Where a case's bug came (or went) along a range of builds. Exit status 0 with a
    conclusion, 3 when no build could judge it, 2 for a usage error or a bad file."""
    try:
        [case] = load_all([args.case])
    except CaseError as e:
        return bad_case(e)
    if case.llama is None:
        raise UsageError(f"{args.case}: a graph case: bisect runs llama.cpp cases on llama.cpp builds")
    builds = _builds(args)
    print(f"== {case.path} [{case.signature}]: {len(builds)} builds, {builds[0]} .. {builds[-1]}, {args.runs} replays each at most")
    engines = Builds(args.runs, _log, [Path(args.case).parent])
    try:
        result = bisect_builds(builds, lambda b: engines.judge(case, b))
    finally:
        engines.close()
    for j in result.judged:
        print(f"  {j.line()}")
    print(f"  {result.conclusion}")
    return 0 if any(j.verdict == HAS or j.verdict == "does not" for j in result.judged) else 3


def matrix(args: argparse.Namespace) -> int:
    """The known llama.cpp bugs of the corpus (by signature) on each build, as a
    Markdown page (``--output``) and on stdout."""
    try:
        bugs = known_bugs(load_all(args.cases))
    except CaseError as e:
        return bad_case(e)
    if not bugs:
        raise UsageError(f"{', '.join(args.cases)}: no llama.cpp case with a known bug (expect: fail)")
    builds = _builds(args)
    engines = Builds(args.runs, _log, [Path(p) for p in args.cases if Path(p).is_dir()])
    try:
        m = make_matrix(bugs, builds, engines, _log)
    finally:
        engines.close()
    made_by = "schedfuzz matrix " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "schedfuzz matrix"
    page = render_matrix(m, made_by)
    if args.output:
        Path(args.output).write_text(args.title.rstrip() + "\n\n" + page if args.title else page)
    print(page)
    return 0
