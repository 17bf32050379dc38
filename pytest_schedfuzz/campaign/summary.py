"""The end of a run, verdict first: new findings (each with its case file and the command that
turns it into a C reproducer), known bugs seen again by component, what ran, the seed; at most a
dozen lines of at most ``WIDTH`` characters. The statistics follow only when asked (``-v``) and
go, with everything else, into the JSON report (``write_report``), whose schema is
``pytest_schedfuzz/report.schema.json`` (docs/findings.md describes it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..files import atomic_write
from .stats import Stats

WIDTH = 120
# exit statuses beside pytest's own (1: a finding or a failed case, 2: interrupted): a run the time
# budget cut short, with no finding in what ran (``verdict``: "cut short")
CUT_SHORT_EXIT = 6
SHOWN = 3  # new findings shown in full by default (the rest: -v, the report, the corpus)
SCHEMA = Path(__file__).resolve().parent.parent / "report.schema.json"
REPORT_VERSION = 1


@dataclass(frozen=True)
class Found:
    """A new finding: its property, signature, where its bug is, and the case it was saved to
    (None: it could not be written; its item's report has it in full)."""

    property: str
    signature: str
    component: str
    case: str | None

    def check(self) -> str | None:
        """The command that exports it as a C reproducer, builds it and says whether it reproduces."""
        if self.case is None:
            return None
        return f"schedfuzz export {short_path(self.case)} -o repro-{Path(self.case).stem.rsplit('-', 1)[-1]} --check"


@dataclass(frozen=True)
class Facts:
    """What ran: the profile and seed, the engines' own descriptions (``engine``, ``llama``: what
    they said when started; empty or None if they never ran), the reference, the options given."""

    profile: str
    seed: int
    lib: str
    llama_lib: str
    engine: Mapping[str, str]
    llama: Mapping[str, str] | None
    reference: str
    rules_note: str | None
    options: Mapping[str, Mapping[str, Any]]
    shards: int  # per property, under pytest-xdist (1 without)
    seed_flag: str  # how this front end names the seed option, for the rerun line
    report_flag: str
    budget_flag: str = "--schedfuzz-budget"


def short_path(path: str) -> str:
    """A path as short as it reads unambiguously: relative below the current folder, ``~`` below home."""
    p = Path(path)
    if not p.is_absolute():
        return path
    here, home = Path.cwd(), Path.home()
    for base, prefix in ((here, ""), (home, "~/")):
        if base in p.parents:
            return prefix + str(p.relative_to(base))
    return path


def fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def decisions(observed: int, derived: int, allocator: int = 0) -> str:
    """How the reallocations' same-size decisions were known: read from ggml's realloc callback
    (observed), or derived from ggml's graph-size formula; and how many of the derived ones were
    re-plans told by ggml-alloc's interposed calls alone (a Release build without the callback)."""
    told = f"; {allocator} of them re-plans told by ggml-alloc's calls" if allocator else ""
    return f"reallocs: {observed} observed (ggml's callback), {derived} derived (graph-size formula{told})"


def ran_lines(facts: Facts, stats: Stats) -> list[str]:
    """Which engines and which reference judged, one line each."""
    e = facts.engine
    if "ggml_version" in e:
        engine = f"ggml {e['ggml_version']} ({short_path(facts.lib)}); {decisions(stats.realloc_observed, stats.realloc_derived + stats.realloc_by_gallocr)}"
    else:
        engine = e.get("name", "ggml (never started: no graph property ran)")
    lines = [f"ran: {engine}"]
    if facts.llama is not None:
        build = facts.llama.get("build", "?").split(" (")[0]
        lines.append(f"ran: {short_path(facts.llama_lib)} ({build}, ggml {facts.llama.get('ggml_version', '?')}); "
                     f"{decisions(stats.llama_realloc_observed, stats.llama_realloc_derived, stats.llama_realloc_allocator)}")
    lines.append(f"reference: {facts.reference}")
    return lines


def verdict(stats: Stats, found: Sequence[Found], corpus: Mapping[str, Sequence[str]]) -> str:
    """The run's verdict: ``findings`` (a new finding, or a corpus case that failed), else
    ``interrupted`` (Ctrl-C), else ``cut short`` (the time budget left examples the run was asked
    for unrun: what did not run was not judged), else ``clean``."""
    if found or corpus.get("fail"):
        return "findings"
    if stats.interrupted:
        return "interrupted"
    return "cut short" if stats.examples_cut else "clean"


def lines(facts: Facts, stats: Stats, found: Sequence[Found], corpus: Mapping[str, Sequence[str]], verbose: bool) -> list[str]:
    """The summary: the verdict, what ran, the seed; with ``verbose`` the statistics too."""
    out: list[str] = []
    commands: list[int] = []  # the lines that are commands
    failed = corpus.get("fail", [])
    if found:
        out.append(f"NEW FINDINGS: {len(found)} (shrunk and saved; the command below each makes it a C reproducer and runs it)")
        for f in found if verbose else found[:SHOWN]:
            out.append(f"  {f.property} [{f.component}]" + ("" if f.case else ": NOT SAVED (its item's report has it in full)"))
            # the command names the case file; it is never cut (it is there to be copied)
            commands += [len(out)] if f.check() else []
            out += [f"    {f.check()}"] if f.check() else []
        if not verbose and len(found) > SHOWN:
            out.append(f"  and {len(found) - SHOWN} more (-v lists them; their cases are in the corpus)")
    else:
        out.append(f"no new finding ({stats.examples} examples, {len(stats.property_examples)} properties fuzzed)")
    if stats.interrupted:
        out.insert(0, "INTERRUPTED (Ctrl-C): what did not run was not judged")
    elif stats.examples_cut:
        ran = stats.examples_asked - stats.examples_cut
        out.insert(0, f"CUT SHORT: {ran} of {stats.examples_asked} examples ran in the time budget (raise {facts.budget_flag}); "
                      "the rest were not judged")
    if corpus:
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted((o, len(c)) for o, c in corpus.items()))
        out.append(f"corpus replayed: {counts}" + (f"; FAILED: {short_path(failed[0])}" + (" and more" if len(failed) > 1 else "") if failed else ""))
    if stats.seen_again:
        by: dict[str, int] = {}
        for sig, n in stats.seen_again.items():
            where = stats.components.get(sig, "found by this run")
            by[where] = by.get(where, 0) + n
        groups = ", ".join(f"{where} {n}" for where, n in sorted(by.items()))
        out.append(f"known bugs seen again: {stats.known} times, {len(stats.seen_again)} signatures ({groups})")
    else:
        out.append("known bugs seen again: none")
    if stats.short_items:
        out.append(f"below their floor of examples, not passed: {', '.join(sorted(stats.short_items))}")
    if stats.unjudged:
        out.append(f"not run, not passed (they do not judge this build): {'; '.join(sorted(stats.unjudged))}")
    if stats.rpc_servers_lost:
        out.append(f"RPC servers found dead that no workload was charged for: {sum(stats.rpc_servers_lost.values())} (-v lists their last clients)")
    if stats.unconfirmed:
        out.append(f"unconfirmed failures (not shown again on a fresh worker: kept in .schedfuzz/unconfirmed/, not findings): {stats.unconfirmed}")
    out += ran_lines(facts, stats)
    out.append(f"seed {facts.seed}: rerun with {facts.seed_flag} {facts.seed}"
               + (f" and the same -n ({facts.shards} shards a property: shard k draws under seed + k)" if facts.shards > 1 else ""))
    if not verbose:
        out.append(f"statistics: -v, or {facts.report_flag} FILE.json")
    out = [line if i in commands else fit(line) for i, line in enumerate(out)]
    if not verbose:
        return out
    details = [f"{k} = {v}" for k, v in sorted(facts.engine.items())] + [f"llama.cpp {k} = {v}" for k, v in sorted((facts.llama or {}).items())]
    details += [facts.rules_note] if facts.rules_note else []
    details += [f"new finding: {f.signature}" for f in found]
    # one line each, however long: what a user or a script greps for is never split (the report has them all too)
    return out + ["statistics:", *stats.summary_lines(), "engines:", *details]


def report(facts: Facts, stats: Stats, found: Sequence[Found], corpus: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The machine-readable report (its schema: ``SCHEMA``)."""
    return {
        "version": REPORT_VERSION,
        "verdict": verdict(stats, found, corpus),
        "profile": facts.profile,
        "seed": facts.seed,
        "options": {k: dict(v) for k, v in facts.options.items()},
        "ran": {"ggml": {**facts.engine, "chosen": facts.lib}, "llama.cpp": None if facts.llama is None else {**facts.llama, "chosen": facts.llama_lib},
                "reference": facts.reference, "shards": facts.shards},
        "new_findings": [asdict(f) | {"check": f.check()} for f in found],
        "known_seen_again": [{"signature": sig, "component": stats.components.get(sig, "found by this run"), "violations": n}
                             for sig, n in sorted(stats.seen_again.items())],
        "corpus": {outcome: list(paths) for outcome, paths in corpus.items()},
        "stats": stats.as_dict(),
    }


def write_report(path: Path, facts: Facts, stats: Stats, found: Sequence[Found], corpus: Mapping[str, Sequence[str]]) -> None:
    text = json.dumps(report(facts, stats, found, corpus), indent=1, sort_keys=True, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        tmp.write_text(text)

    atomic_write(path, write)
