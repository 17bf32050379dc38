"""What the ``schedfuzz`` subcommands share: usage errors, the engine for a replay, loading cases."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..campaign.fuzz import Fuzzer
from ..cases.corpus import STARTER_CORPUS, Case, CaseError, case_files, load_case
from ..options import from_argparse, in_user_words
from ..profiles import FuzzConfig
from ..properties import PROPERTY_IDS


def cli_words(e: Exception) -> str:
    """An option error in the words of this command (``--policy``, not ``--schedfuzz-policy``)."""
    return str(e).replace("--schedfuzz-", "--")


def properties_arg(arg: str | None) -> list[str] | None:
    """The ``--properties`` ids (default: all); None, after saying why, if one is unknown."""
    props = arg.split(",") if arg else list(PROPERTY_IDS)
    unknown = [p for p in props if p not in PROPERTY_IDS]
    if unknown:
        print(f"schedfuzz: --properties: unknown {', '.join(unknown)} (known: {', '.join(PROPERTY_IDS)})", file=sys.stderr)
        return None
    return props


CANNOT_RUN = 3  # exit status: a case could not run on the build under test (a device, a call or a build it lacks): no verdict


class UsageError(Exception):
    """A bad option or input: one line on stderr, exit status 2."""


def fuzzer_for(args: argparse.Namespace) -> Fuzzer:
    """The engines for a command that runs cases (``cli.ENGINE``'s options, the environment's too)."""
    try:
        given = from_argparse(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    value = {name: g.value for name, g in given.items()}
    try:
        return Fuzzer(FuzzConfig(target=value.get("target"), lib=value.get("lib"), llama_lib=value.get("llama-lib"), policy=value.get("policy"),
                                 rereserve=value.get("rereserve", True), database=None, reference=getattr(args, "reference", None)))
    except ValueError as e:
        raise UsageError(in_user_words(str(e), given, lambda o: o.cli_flag)) from None


def replaying_fuzzer(args: argparse.Namespace) -> Fuzzer:
    """``fuzzer_for`` a command that replays ``args.cases``, knowing the known bugs a replay is
    judged with: the starter corpus's and the replayed folders' (another known bug beside a
    case's own is no news, and a switch before a known signature's re-plan is not re-run:
    ``causes.switches_told_apart``)."""
    fuzzer = fuzzer_for(args)
    for folder in [STARTER_CORPUS, *(p for p in args.cases if Path(p).is_dir())]:
        fuzzer.known.learn(Path(folder))
    return fuzzer


def bad_case(e: CaseError, suffix: str = "") -> int:
    """A corpus file that cannot be used: its error on stderr, exit status 2."""
    print(f"schedfuzz: {e}{suffix}", file=sys.stderr)
    return 2


def load_all(paths: Sequence[str]) -> list[Case]:
    """Every case named (files or corpus directories); a bad one raises CaseError."""
    cases = []
    for p in paths:
        files = list(case_files(p)) if Path(p).is_dir() else [Path(p)]
        if Path(p).is_dir() and not files:
            raise UsageError(f"{p}: no case files (*.json) in this folder")
        cases += [load_case(f) for f in files]
    return cases
