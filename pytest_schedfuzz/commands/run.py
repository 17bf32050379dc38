"""``schedfuzz run``: the plugin's fuzzing run outside pytest."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..campaign.fuzz import Finding, Fuzzer
from ..campaign.profiles import FuzzConfig
from ..cases.corpus import STARTER_CORPUS
from ..properties import fuzz_units, is_llama
from . import cli_words, properties_arg


def run(args: argparse.Namespace) -> int:
    props = properties_arg(args.properties)
    if props is None:
        return 2
    try:
        fuzzer = Fuzzer(
            FuzzConfig(
                profile=args.profile, examples=args.examples, seed=args.seed, budget=args.budget, target=args.target,
                lib=args.lib, llama_lib=args.llama_lib, policy=args.policy, rereserve=args.rereserve, reference=args.reference,
                keep_going=args.keep_going, shared=args.db,
            )
        )
    except ValueError as e:
        print(f"schedfuzz: {cli_words(e)}", file=sys.stderr)
        return 2
    if args.known == "builtin":
        fuzzer.known.learn(STARTER_CORPUS)
    if fuzzer.shared is not None:  # the cases other hosts of the campaign saved, into this corpus
        fuzzer.shared.pull(Path(args.corpus))
    fuzzer.known.learn(Path(args.corpus))
    print(f"schedfuzz: profile={args.profile} seed={fuzzer.seed}; known upstream bugs: {len(fuzzer.known.cases)}")
    findings = []
    with fuzzer.ctrl_c_noted():  # a Ctrl-C between Hypothesis runs (printing or saving a case, closing) too
        try:
            budget = args.budget if args.budget is not None else fuzzer.profile.budget
            fuzzer.llama_judged = tuple(p for p in props if is_llama(p))
            units = fuzz_units(props, policy=args.policy is not None)
            pending = sum(w for _, w in units)
            for prop, weight in units:
                # a profile that fuzzes on time shares what is left of the budget by weight
                share = None if budget is None else max(0.0, budget - (time.monotonic() - fuzzer.started)) * weight / max(pending, 1)
                pending -= weight
                def record(finding: Finding) -> None:
                    findings.append(finding)
                    print(f"{prop}: FAIL")
                    print("  " + finding.report().replace("\n", "\n  "))
                    # as the plugin does: a finding printed is a finding saved
                    try:
                        print(f"  saved to {fuzzer.save_finding(args.corpus, finding)}", flush=True)
                    except OSError as e:
                        print(f"  NOT SAVED: cannot write to {args.corpus}: {e.strerror or e}", flush=True)

                before = len(findings)
                if fuzzer.config.keeps_going():
                    fuzzer.campaign(prop, seconds=share, on_finding=record)
                else:
                    finding = fuzzer.fuzz(prop, seconds=share)
                    if finding is not None:
                        record(finding)
                if fuzzer.interrupted:
                    print(f"{prop}: interrupted (Ctrl-C)", flush=True)
                    return 130
                if len(findings) == before:
                    print(f"{prop}: ok", flush=True)
        finally:
            fuzzer.close()
    if fuzzer.interrupted:  # pressed while a case was saved or the engines closed
        print("schedfuzz: interrupted (Ctrl-C)", flush=True)
        return 130
    print("\n".join(fuzzer.stats.summary_lines()))
    return 1 if findings else 0
