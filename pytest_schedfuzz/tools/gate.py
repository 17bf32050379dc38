"""``schedfuzz gate``: the pre-merge check of a scheduler change. The corpus is replayed and every
property fuzzed with the same seed on a base build and on a head build; the report is what
changed between them. Only failures new on head fail the gate; fixes are listed.

Both builds see the same examples: the profile's count per property (or ``--examples``) without
a time budget (a budget would cut the two runs at different points), under one seed. After their
first different failure the two example streams part, so every claim is replayed on the other
side before it is said (``check_claims``); head's new cases are saved as new findings, each with
the command that makes it a C reproducer (``save_new``). The llama.cpp properties
run on a build whose library folder also holds ``libllama.so`` (a llama.cpp checkout's
``build/bin``, or ``ggml-0.25.3``: llama-cpp-python's build); elsewhere they are ``n/a``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..campaign.fuzz import Fuzzer
from ..cases.corpus import STARTER_CORPUS, Case, save_case
from ..profiles import FuzzConfig
from ..properties import LLAMA_PROPERTY_IDS, PROPERTY_IDS, fuzz_units, is_llama, without_c_stack

PASS, NA = "pass", "n/a"


@dataclass(frozen=True)
class Side:
    """What one build did: per row (``corpus/<case>`` or ``fuzz/<property>``) the sorted failure
    signatures (``()``: passed; ``None``: not run), and the first violation's text."""

    label: str
    engine: str
    results: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    cases: dict[str, Case] = field(default_factory=dict)  # a fuzzing row's finding, shrunk: replayed on the other side
    llama: bool = False  # the build has its own libllama: the llama.cpp rows run on it


def _llama_lib(lib_dir: str | None) -> str | None:
    """The build's own libllama folder, if it has one."""
    return lib_dir if lib_dir and Path(lib_dir, "libllama.so").exists() else None


def open_side(label: str, lib: str, config: FuzzConfig, log: Callable[[str], None]) -> tuple[Side, Fuzzer]:
    """A side of the gate and the engines it runs on, the build ``lib`` (a ``--schedfuzz-lib``
    value), kept open until the gate has replayed the other side's findings on it."""
    from ..ggml.lib import resolve_lib

    lib_dir = resolve_lib(lib)
    fuzzer = Fuzzer(FuzzConfig(**{**config.__dict__, "lib": lib, "llama_lib": _llama_lib(lib_dir), "database": None}))
    try:
        info = fuzzer.engines.info()
    except BaseException:
        fuzzer.close()
        raise
    side = Side(label, f"ggml {info.get('ggml_version', '?')} ({lib_dir or 'ggml-python'})", llama=_llama_lib(lib_dir) is not None)
    log(f"{label}: {side.engine}")
    return side, fuzzer


def run_side(side: Side, fuzzer: Fuzzer, cases: Sequence[Case], properties: Sequence[str], log: Callable[[str], None]) -> None:
    """Replay ``cases`` and fuzz ``properties`` on one side; each finding's case is kept (``Side.cases``)."""
    label = side.label
    # the known bugs: the starter corpus's (as pytest --schedfuzz knows them) and the corpus's own
    fuzzer.known.learn(STARTER_CORPUS)
    learnt = {c.path.resolve() for c in fuzzer.known.cases if c.path is not None}
    fuzzer.known.cases += [c for c in cases if c.expected_failure is not None and (c.path is None or c.path.resolve() not in learnt)]
    for case in cases:
        row = f"corpus/{case.path.stem if case.path else case.signature}"
        if case.llama is not None and not side.llama:
            side.results[row] = None
            continue
        found = fuzzer.replay(case)
        side.results[row] = tuple(sorted({v.signature() for v in found}))
        if found:
            side.details[row] = str(found[0])
        log(f"{label}: {row}: {_cell(side.results[row])}")
    fuzzer.llama_judged = tuple(p for p in properties if p in LLAMA_PROPERTY_IDS)
    for prop, _ in fuzz_units(properties):
        row = f"fuzz/{prop}"
        if is_llama(prop) and not side.llama or fuzzer.unjudged(prop):  # not run on this side: a cell of its own
            side.results[row] = None
            continue
        finding = fuzzer.fuzz(prop)
        side.results[row] = (finding.violation.signature(),) if finding else ()
        if finding:
            side.details[row] = finding.report()
            side.cases[row] = finding.to_case(fuzzer)
        log(f"{label}: {row}: {_cell(side.results[row])}")


def _cell(result: tuple[str, ...] | None) -> str:
    if result is None:
        return NA
    return "; ".join(result) if result else PASS


@dataclass(frozen=True)
class Comparison:
    rows: list[tuple[str, str, str, str]]  # row, base, head, change
    new: list[str]
    fixed: list[str]
    new_rows: tuple[str, ...] = ()  # the rows of ``new`` and ``fixed``, in order
    fixed_rows: tuple[str, ...] = ()
    saved: tuple[str, ...] = ()  # head's new cases as saved (``save_new``): each with its export command


def compare(base: Side, head: Side) -> Comparison:
    """Per row: what head fails that base did not (new), what base failed and head does not
    (fixed). A fuzzing finding on head whose signature base showed anywhere is not new. These
    are claims from one run of each side: ``check_claims`` replays them before they are said."""
    seen_on_base = {s for r in base.results.values() if r for s in r}
    rows, new, fixed, new_rows, fixed_rows = [], [], [], [], []
    for row in list(dict.fromkeys([*base.results, *head.results])):
        b, h = base.results.get(row), head.results.get(row)
        change = ""
        if b is not None and h is not None:
            # one corpus case crashing on both sides is one bug, whatever its functions are called there
            same = without_c_stack if row.startswith("corpus/") else (lambda sig: sig)
            b_same, h_same = {same(s) for s in b}, {same(s) for s in h}
            added = [s for s in h if same(s) not in b_same and not (row.startswith("fuzz/") and s in seen_on_base)]
            removed = [s for s in b if same(s) not in h_same]
            if added:
                change = "NEW on head"
                new.append(f"{row}: {'; '.join(added)}\n    {head.details.get(row, '').splitlines()[0] if head.details.get(row) else ''}")
                new_rows.append(row)
            elif removed:
                change = "fixed on head"
                fixed.append(f"{row}: {'; '.join(removed)}")
                fixed_rows.append(row)
        rows.append((row, _cell(b), _cell(h), change))
    return Comparison(rows, new, fixed, tuple(new_rows), tuple(fixed_rows))


def shows(fuzzer: Fuzzer, case: Case, runs: int) -> int:
    """In how many of up to ``runs`` replays of ``case`` on ``fuzzer``'s build its signature
    showed: the replays stop at the first that shows it (0: none of ``runs`` did)."""
    for k in range(runs):
        if any(v.signature() == case.signature for v in fuzzer.replay(case)):
            return k + 1
    return 0


def check_claims(cmp: Comparison, base: Side, head: Side, fuzzers: tuple[Fuzzer, Fuzzer], cases: Sequence[Case], runs: int,
                 log: Callable[[str], None]) -> Comparison:
    """Each claim replayed on the other side before it is said: a head-only failure's case (the
    corpus case, or the fuzzing finding's shrunk case) on base, a base-only one on head, up to
    ``runs`` times. A failure the other side shows too is neither new nor fixed (the two runs'
    example streams part after their first different failure, so one side may just not have
    drawn it): its row says so, with the replay that showed it."""
    by_row = {f"corpus/{c.path.stem if c.path else c.signature}": c for c in cases}
    change: dict[str, str] = {}
    for rows, side, other, fuzzer, word in ((cmp.new_rows, head, base, fuzzers[0], "base"), (cmp.fixed_rows, base, head, fuzzers[1], "head")):
        for row in rows:
            case = side.cases.get(row) or by_row.get(row)
            if case is None:
                continue
            if row.startswith("corpus/"):  # the case's own signature is what it is judged by; what failed is what is replayed
                failed = next(iter(side.results.get(row) or ()), None)
                case = replace(case, signature=failed) if failed else case
            k = shows(fuzzer, case, runs)
            log(f"gate: {row}: {side.label}'s failure replayed on {word}: " + (f"shown (replay {k} of up to {runs})" if k else f"not shown in {runs} replays"))
            if k:
                change[row] = f"on {word} too (replay {k} of {runs})"
    if not change:
        return cmp
    rows = [(r, b, h, change.get(r, c)) for r, b, h, c in cmp.rows]
    new = [(r, text) for r, text in zip(cmp.new_rows, cmp.new, strict=True) if r not in change]
    fixed = [(r, text) for r, text in zip(cmp.fixed_rows, cmp.fixed, strict=True) if r not in change]
    return Comparison(rows, [t for _, t in new], [t for _, t in fixed], tuple(r for r, _ in new), tuple(r for r, _ in fixed))


def save_new(cmp: Comparison, head: Side, corpus: Path | None) -> Comparison:
    """Head's new fuzzing findings saved in ``corpus`` (as new, untriaged cases), each with the
    command that exports it as a C reproducer and checks it."""
    from ..campaign.summary import Found

    if corpus is None:
        return cmp
    saved = []
    for row in cmp.new_rows:
        case = head.cases.get(row)
        if case is None:
            continue
        try:
            path = save_case(corpus, case)
        except OSError as e:
            saved.append(f"{row}: NOT SAVED: cannot write to {corpus}: {e.strerror or e}")
            continue
        saved.append(f"{row}: saved to {path}\n    {Found(case.property, case.signature, '', str(path)).check()}")
    return replace(cmp, saved=tuple(saved))


def render(base: Side, head: Side, cmp: Comparison) -> str:
    width = max([len(r[0]) for r in cmp.rows] + [10])
    cell = 48
    short = lambda s: s if len(s) <= cell else s[: cell - 1] + "…"
    out = [f"base: {base.engine}", f"head: {head.engine}", "",
           f"{'case / property':<{width}}  {'base':<{cell}}  {'head':<{cell}}  change"]
    out += [f"{row:<{width}}  {short(b):<{cell}}  {short(h):<{cell}}  {change}".rstrip() for row, b, h, change in cmp.rows]
    out.append("")
    out.append(f"fixed on head ({len(cmp.fixed)}):" + ("" if cmp.fixed else " none"))
    out += [f"  {f}" for f in cmp.fixed]
    out.append(f"new failures on head ({len(cmp.new)}):" + ("" if cmp.new else " none"))
    out += [f"  {n}" for n in cmp.new]
    if cmp.saved:
        out.append("head's new cases (saved as new findings; each command builds its C reproducer and runs it):")
        out += [f"  {s}" for s in cmp.saved]
    return "\n".join(out)


def gate(base: str, head: str, cases: Sequence[Case], config: FuzzConfig, properties: Sequence[str] = PROPERTY_IDS,
         log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True), save: Path | None = None) -> tuple[int, str, dict[str, Any]]:
    """Run both builds, replay each side's claims on the other (``check_claims``) and save head's
    new cases in ``save``; the exit status (1 only for failures new on head), the report, and
    the report as data (``report``: the JSON of ``--report``). A build that cannot be found is a
    ``ValueError`` before anything runs."""
    from ..ggml.lib import resolve_lib

    for option, lib in (("--base", base), ("--head", head)):
        try:
            resolve_lib(lib)
        except ValueError as e:
            raise ValueError(str(e).replace("--schedfuzz-lib", option, 1)) from None
    # the same examples on both: the profile's counts (or the user's), no budget
    config = FuzzConfig(**{**config.__dict__, "budget": float("inf")})
    opened: list[tuple[Side, Fuzzer]] = []
    try:
        for label, lib in (("base", base), ("head", head)):
            opened.append(open_side(label, lib, config, log))
            run_side(*opened[-1], cases, properties, log)
        (b, bf), (h, hf) = opened
        cmp = check_claims(compare(b, h), b, h, (bf, hf), cases, config.confirm_runs, log)
    finally:
        for _, fuzzer in opened:
            fuzzer.close()
    cmp = save_new(cmp, h, save)
    return (1 if cmp.new else 0), render(b, h, cmp), report(b, h, cmp, config)


def report(base: Side, head: Side, cmp: Comparison, config: FuzzConfig) -> dict[str, Any]:
    """The gate's JSON report: the verdict, what ran, every row, what is new and fixed, the cases saved."""
    return {
        "version": 1,
        "verdict": "new failures on head" if cmp.new else "no new failure",
        "profile": config.profile, "seed": config.seed, "examples": config.examples,
        "base": base.engine, "head": head.engine,
        "rows": [{"row": r, "base": b, "head": h, "change": c} for r, b, h, c in cmp.rows],
        "new": list(cmp.new), "fixed": list(cmp.fixed), "saved": list(cmp.saved),
    }
