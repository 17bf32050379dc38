"""The ``schedfuzz`` command: the plugin's fuzzing run outside pytest (and, later, the corpus)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .fuzz import PROFILES, FuzzConfig, Fuzzer
from .properties import PROPERTY_IDS


def _run(args: argparse.Namespace) -> int:
    props = args.properties.split(",") if args.properties else list(PROPERTY_IDS)
    unknown = [p for p in props if p not in PROPERTY_IDS]
    if unknown:
        print(f"schedfuzz: --properties: unknown {', '.join(unknown)} (known: {', '.join(PROPERTY_IDS)})", file=sys.stderr)
        return 2
    try:
        fuzzer = Fuzzer(
            FuzzConfig(
                profile=args.profile, examples=args.examples, seed=args.seed, budget=args.budget, target=args.target,
                lib=args.lib, policy=args.policy, rereserve=args.rereserve, reference=args.reference,
            )
        )
    except ValueError as e:
        print(f"schedfuzz: {e}", file=sys.stderr)
        return 2
    print(f"schedfuzz: profile={args.profile} seed={fuzzer.seed}")
    findings = []
    try:
        for prop in props:
            finding = fuzzer.fuzz(prop)
            print(f"{prop}: {'FAIL' if finding else 'ok'}")
            if finding:
                findings.append(finding)
                print("  " + finding.report().replace("\n", "\n  "))
    finally:
        fuzzer.close()
    print("\n".join(fuzzer.stats.summary_lines()))
    return 1 if findings else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="schedfuzz", description="fuzz ggml's backend scheduler against a reference model")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="fuzz every property (like pytest --schedfuzz); exit 1 on findings")
    run.add_argument("--profile", choices=sorted(PROFILES), default="dev")
    run.add_argument("--examples", type=int)
    run.add_argument("--seed", type=int)
    run.add_argument("--budget", type=float, help="seconds for the whole run")
    run.add_argument("--target", help="MODULE:FACTORY (default: the real ggml engine)")
    run.add_argument("--lib", help="directory with your own ggml shared libraries")
    run.add_argument("--policy", help="reuse policy MODULE:CALLABLE(new, cur) -> bool")
    run.add_argument("--reference", help="replace the reference's predict with MODULE:CALLABLE")
    run.add_argument("--rereserve", action=argparse.BooleanOptionalAction, default=True)
    run.add_argument("--properties", help="comma-separated property ids")
    run.set_defaults(func=_run)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
