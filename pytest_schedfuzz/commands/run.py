"""``schedfuzz run``: ``pytest --schedfuzz`` outside pytest. The same ``Campaign`` does the work
(the corpus replayed first, each property's share of the budget, findings saved, the summary and
the report); this only prints what each step gave."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..campaign.campaign import Campaign
from ..campaign.summary import CUT_SHORT_EXIT, short_path, verdict
from ..cases.corpus import case_files
from ..options import from_argparse
from . import UsageError


def run(args: argparse.Namespace) -> int:
    try:
        campaign = Campaign(from_argparse(args), Path.cwd(), lambda o: o.cli_flag)
    except ValueError as e:  # a ConfigError, or an options.OptionError (a value that is not a number)
        raise UsageError(str(e)) from None
    fuzzer = campaign.fuzzer
    with fuzzer.ctrl_c_noted():  # a Ctrl-C between Hypothesis runs (printing or saving a case, closing) too
        try:
            for line in campaign.header_lines(args.verbose):
                print(f"schedfuzz: {line}", flush=True)
            for path in case_files(campaign.corpus):
                replayed = campaign.replay(path)
                campaign.record(case=(str(path), replayed.outcome))
                if replayed.outcome == "fail" or args.verbose:
                    print(f"corpus/{path.stem}: {replayed.outcome}" + (f"\n  {replayed.text}".replace("\n", "\n  ") if replayed.outcome == "fail" else ""))
            for unit in campaign.plan():
                try:
                    fuzzed = campaign.fuzz(unit)
                except KeyboardInterrupt:  # Ctrl-C with nothing found to save: the verdict says so below
                    fuzzer.interrupted = True
                    print(f"{unit.name}: interrupted (Ctrl-C)", flush=True)
                    break
                campaign.record(fuzzed.stats, fuzzed.found)
                if fuzzed.reports:
                    print(f"{unit.name}: FAIL")
                    print("\n\n".join("  " + r.replace("\n", "\n  ") for r in fuzzed.reports), flush=True)
                if fuzzer.interrupted:
                    print(f"{unit.name}: interrupted (Ctrl-C)", flush=True)
                    break
                if not fuzzed.reports:
                    said = f"not run: {fuzzed.unjudged}" if fuzzed.unjudged else "ok" if fuzzed.short is None else f"not passed: {fuzzed.short[2]}"
                    print(f"{unit.name}: {said}", flush=True)
        finally:
            campaign.close()
    if fuzzer.interrupted:  # pressed while fuzzing, a case was saved or the engines closed: the verdict says so
        campaign.stats.interrupted = max(1, campaign.stats.interrupted)
    print("\n".join(campaign.summary_lines(args.verbose)))
    written = campaign.write_report()
    if written is not None:
        print(f"report: {short_path(str(written))}")
    said = verdict(campaign.stats, campaign.found, campaign.corpus_outcomes)
    return {"findings": 1, "interrupted": 130, "cut short": CUT_SHORT_EXIT}.get(said, 0)
