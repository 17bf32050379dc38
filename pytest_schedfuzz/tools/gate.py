"""``schedfuzz gate``: the pre-merge check of a scheduler change. The corpus is replayed and every
property fuzzed with the same seed on a base build and on a head build; the report is what
changed between them. Only failures new on head fail the gate; fixes are listed.

Both builds see the same examples: a fixed count per property (the profile's, or
``GATE_EXAMPLES`` where the profile fuzzes on time) without a time budget (a budget would cut
the two runs at different points), under one seed. The llama.cpp properties
run on a build whose library folder also holds ``libllama.so`` (a llama.cpp checkout's
``build/bin``, or ``ggml-0.25.3``: llama-cpp-python's build); elsewhere they are ``n/a``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..campaign.fuzz import Fuzzer
from ..campaign.profiles import FuzzConfig
from ..cases.corpus import Case
from ..properties import LLAMA_PROPERTY_IDS, PROPERTY_IDS, fuzz_units, is_llama, without_c_stack

PASS, NA = "pass", "n/a"
GATE_EXAMPLES = 25  # per property, where the profile fuzzes on time (ci)


@dataclass(frozen=True)
class Side:
    """What one build did: per row (``corpus/<case>`` or ``fuzz/<property>``) the sorted failure
    signatures (``()``: passed; ``None``: not run), and the first violation's text."""

    label: str
    engine: str
    results: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)


def _llama_lib(lib_dir: str | None) -> str | None:
    """The build's own libllama folder, if it has one."""
    return lib_dir if lib_dir and Path(lib_dir, "libllama.so").exists() else None


def run_side(label: str, lib: str, cases: Sequence[Case], config: FuzzConfig, properties: Sequence[str],
             log: Callable[[str], None]) -> Side:
    """Replay ``cases`` and fuzz ``properties`` on the build ``lib`` (a ``--schedfuzz-lib`` value)."""
    from ..ggml.lib import resolve_lib

    lib_dir = resolve_lib(lib)
    llama_lib = _llama_lib(lib_dir)
    fuzzer = Fuzzer(FuzzConfig(**{**config.__dict__, "lib": lib, "llama_lib": llama_lib, "database": None}))
    try:
        info = fuzzer.engines.info()
        side = Side(label, f"ggml {info.get('ggml_version', '?')} ({lib_dir or 'ggml-python'})")
        log(f"{label}: {side.engine}")
        fuzzer.known.cases = [c for c in cases if c.expected_failure is not None]
        for case in cases:
            row = f"corpus/{case.path.stem if case.path else case.signature}"
            if case.llama is not None and llama_lib is None:
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
            if is_llama(prop) and llama_lib is None:
                side.results[row] = None
                continue
            finding = fuzzer.fuzz(prop)
            side.results[row] = (finding.violation.signature(),) if finding else ()
            if finding:
                side.details[row] = finding.report()
            log(f"{label}: {row}: {_cell(side.results[row])}")
    finally:
        fuzzer.close()
    return side


def _cell(result: tuple[str, ...] | None) -> str:
    if result is None:
        return NA
    return "; ".join(result) if result else PASS


@dataclass(frozen=True)
class Comparison:
    rows: list[tuple[str, str, str, str]]  # row, base, head, change
    new: list[str]
    fixed: list[str]


def compare(base: Side, head: Side) -> Comparison:
    """Per row: what head fails that base did not (new), what base failed and head does not
    (fixed). A fuzzing finding on head whose signature base showed anywhere is not new."""
    seen_on_base = {s for r in base.results.values() if r for s in r}
    rows, new, fixed = [], [], []
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
            elif removed:
                change = "fixed on head"
                fixed.append(f"{row}: {'; '.join(removed)}")
        rows.append((row, _cell(b), _cell(h), change))
    return Comparison(rows, new, fixed)


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
    return "\n".join(out)


def gate(base: str, head: str, cases: Sequence[Case], config: FuzzConfig, properties: Sequence[str] = PROPERTY_IDS,
         log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> tuple[int, str]:
    """Run both builds; the exit status (1 only for failures new on head) and the report. A
    build that cannot be found is a ``ValueError`` before anything runs."""
    from ..ggml.lib import resolve_lib

    for option, lib in (("--base", base), ("--head", head)):
        try:
            resolve_lib(lib)
        except ValueError as e:
            raise ValueError(str(e).replace("--schedfuzz-lib", option, 1)) from None
    # the same examples on both: a count (the profile's, or 25 where it fuzzes on time), no budget
    examples = config.examples or config.resolved_profile().examples or GATE_EXAMPLES
    config = FuzzConfig(**{**config.__dict__, "budget": float("inf"), "examples": examples})
    sides = [run_side(label, lib, cases, config, properties, log) for label, lib in (("base", base), ("head", head))]
    cmp = compare(*sides)
    return (1 if cmp.new else 0), render(*sides, cmp)
