"""The ``schedfuzz`` command: its arguments; each subcommand lives in ``commands/``."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from .builds.names import SEED_LLAMA, UPSTREAM
from .commands import UsageError
from .engine import TargetError
from .model.versions import BUILT_IN
from .options import add_to_argparse, did_you_mean
from .profiles import PROFILES

ENGINE = ("target", "lib", "llama-lib", "policy", "rereserve")  # the options of the commands that run cases


def _engine_args(p: argparse.ArgumentParser) -> None:
    add_to_argparse(p, ENGINE)


class SuggestingParser(argparse.ArgumentParser):
    """argparse with "did you mean" for a misspelled option or command (Python 3.14's
    ``suggest_on_error``, which 3.11 lacks)."""

    def error(self, message: str) -> NoReturn:
        bad = re.search(r"unrecognized arguments: (\S+)|invalid choice: '([^']+)'", message)
        if bad:
            word = bad.group(1) or bad.group(2)
            known = [s for a in self._actions for s in a.option_strings] if bad.group(1) else \
                [c for a in self._actions if a.choices for c in a.choices]
            message += did_you_mean(word.split("=", 1)[0], known)
        super().error(message)


def build_parser() -> tuple[SuggestingParser, dict[str, SuggestingParser]]:
    """The ``schedfuzz`` command's parser, and each subcommand's by name."""
    parser = SuggestingParser(prog="schedfuzz", description="fuzz ggml's backend scheduler against a reference model")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="fuzz every property (like pytest --schedfuzz); exit 1 on findings",
                         description="pytest --schedfuzz outside pytest: the same options (without the schedfuzz- prefix), run and summary")
    add_to_argparse(run)  # the options pytest --schedfuzz has: ``options.OPTIONS``
    run.add_argument("-v", "--verbose", action="store_true", help="the engines in full, and the statistics after the summary")
    run.set_defaults(func="run:run")
    cg = sub.add_parser("campaign", help="a campaign shared on Redis (run --db): its hosts, examples and findings")
    cg_sub = cg.add_subparsers(dest="campaign_command", required=True, help="what to do with the campaign")
    cs = cg_sub.add_parser("status", help="the hosts, the examples in the shared database, the findings by signature")
    cs.add_argument("--db", required=True, help="the campaign's Redis: redis[s]://[USER:PASSWORD@]HOST:PORT/N (or the password in SCHEDFUZZ_DB_PASSWORD)")
    cs.add_argument("--db-ca", default=os.environ.get("SCHEDFUZZ_DB_CA"), metavar="FILE",
                    help="the CA certificate a rediss:// Redis's certificate is checked against (env SCHEDFUZZ_DB_CA)")
    cs.set_defaults(func="shared_status:status")
    rp = sub.add_parser("replay", help="replay cases: steps, realloc events and the verdict")
    rp.add_argument("cases", nargs="+", help="case files or corpus directories")
    rp.add_argument("--capture", action="store_true", help="llama.cpp cases: capture their graphs and compare the reference with what ggml did")
    _engine_args(rp)
    rp.set_defaults(func="cases:replay")
    mn = sub.add_parser("minimize", help="shrink every case keeping its signature; keep the smallest per signature")
    mn.add_argument("dir", nargs="?", default="corpus", help="the corpus folder to shrink in place (default: ./corpus)")
    mn.add_argument("--time-limit", type=float, metavar="SECONDS",
                    help="stop shrinking after this long; cases not reached yet are left as they are (default: none)")
    _engine_args(mn)
    mn.set_defaults(func="cases:minimize")
    rs = sub.add_parser("resign", help="sign the known bugs of cases again with today's judges, on this build (the old signature is kept in signed_as)")
    rs.add_argument("cases", nargs="+", help="case files or corpus directories")
    _engine_args(rs)
    rs.set_defaults(func="resign:resign")
    mg = sub.add_parser("migrate", help="rewrite case files of an earlier format in today's, in place (a file that cannot be read is left as it is)")
    mg.add_argument("cases", nargs="*", default=["corpus"], help="case files or corpus directories (default: ./corpus)")
    mg.set_defaults(func="cases:migrate")
    kn = sub.add_parser("known", help="triage a new finding: make it a known upstream bug, with its explanation and the builds it was seen on",
                        description="turn a case saved as a new finding (expect: new) into a known bug (expect: {fail: ...}): later runs count it "
                                    "as seen again, not as a failure; a llama.cpp case is known on the build it was found on (and --on)")
    kn.add_argument("case", help="the case file")
    kn.add_argument("--because", required=True, metavar="TEXT", help="the explanation: what the bug is, in a maintainer's terms")
    kn.add_argument("--name", metavar="NAME", help="rename the case file to NAME.json in its folder (default: keep its name)")
    kn.add_argument("--on", action="append", default=[], metavar="BUILD",
                    help="llama.cpp cases: another build it is known on (a --llama-lib name such as llama.cpp-b11739); repeatable")
    kn.set_defaults(func="cases:known")
    sh = sub.add_parser("show", help="draw a case's graph (SVG, PNG or DOT) and print its splits")
    sh.add_argument("case", help="a case file")
    sh.add_argument("-o", "--output", help="output file: .svg, .png or .dot (default: CASE.svg here)")
    _engine_args(sh)
    sh.set_defaults(func="cases:show")
    cp = sub.add_parser("capture", help="a llama.cpp case's graphs, captured inside llama.cpp, as a graph case replayed on ggml")
    cp.add_argument("case", help="a llama.cpp case file")
    cp.add_argument("-o", "--output", required=True, help="the graph case to write (a .json file, or a corpus folder)")
    _engine_args(cp)
    cp.set_defaults(func="cases:capture_case")
    ex = sub.add_parser("export", help="graph cases as standalone C reproducers (repro.c, CMakeLists.txt, REPORT.md)")
    ex.add_argument("cases", nargs="+", help="case files or corpus directories")
    ex.add_argument("-o", "--output", required=True, help="the reproducer's folder (for a corpus folder: one below it per case)")
    ex.add_argument("--check", action="store_true", help="build each against the ggml it was found on, run it, and say whether it reproduces")
    ex.add_argument("--reference", help="matches-reference cases: the prediction from this MODULE:CALLABLE's predict (as the run that found it)")
    _engine_args(ex)
    ex.set_defaults(func="cases:export")
    gt = sub.add_parser("gate", help="pre-merge: the corpus and the same fuzzing on a base and a head build; exit 1 only for failures new on head")
    gt.add_argument("--base", required=True, help=f"the base build: {', '.join(BUILT_IN)} or a library folder")
    gt.add_argument("--head", required=True, help="the head build, likewise")
    gt.add_argument("--profile", default="ci", help="how much to fuzz on each build: " + ", ".join(PROFILES) + " (default: ci)")
    gt.add_argument("--examples", type=int, help="examples per property (default: the profile's)")
    gt.add_argument("--seed", type=int, help="seed of both runs (default: the profile's: 0 under ci)")
    gt.add_argument("--properties", help="comma-separated property ids (default: all)")
    gt.add_argument("--corpus", help="the cases replayed on both builds (default: ./corpus, else the built-in one)")
    gt.add_argument("--save", default="corpus", metavar="DIR", help="where head's new cases are saved, as new findings (default: ./corpus)")
    gt.add_argument("--report", metavar="FILE.json", help="write the gate's report as JSON too: the verdict, every row, what is new and fixed, the cases saved")
    gt.add_argument("--rereserve", action=argparse.BooleanOptionalAction, default=True,
                    help="the driver re-reserves the worst case on topology changes (default: on)")
    gt.set_defaults(func="tools:gate_")
    mu = sub.add_parser("mutate", help="mutation score: the ci profile on ggml 0.25.3 with each scheduler mutant; the kill score")
    mu.add_argument("--mutants", help="comma-separated mutant names (default: all)")
    mu.add_argument("--budget", type=float, help="the most seconds the ci profile may run per mutant (default: the profile's cap, 600; it runs by count)")
    mu.add_argument("--corpus", help="the corpus each run replays (a copy; default: ./corpus, else the built-in one)")
    mu.add_argument("--logs", help="write each mutant's pytest output to this folder")
    mu.add_argument("--size-oracle", action="store_true", help="run the ci profile with --schedfuzz-size-oracle")
    mu.set_defaults(func="tools:mutate")
    cv = sub.add_parser("coverage", help="line and branch coverage of ggml's scheduler and allocator reached by a profile's run")
    cv.add_argument("--lib", default=BUILT_IN[0], choices=BUILT_IN, help=f"the built-in ggml to instrument (default: {BUILT_IN[0]})")
    cv.add_argument("--profile", default="ci", help="the profile of the run: " + ", ".join(PROFILES) + " (default: ci)")
    cv.add_argument("--budget", type=float, help="seconds of the run (default: the profile's)")
    cv.add_argument("--corpus", help="the corpus the run replays (a copy; default: ./corpus, else the built-in one)")
    cv.add_argument("--json", help="write each function's reach and unreached branches to this file")
    cv.set_defaults(func="tools:coverage")
    dv = sub.add_parser("device", help="build the GPU-like device (fake_gpu.c) against each ggml (default: both built-ins); compile the reference with mypyc")
    dv.add_argument("--lib", action="append", help=f"a built-in ({', '.join(BUILT_IN)}) or a build's library folder; repeatable")
    dv.set_defaults(func="tools:device")
    bn = sub.add_parser("bench", help="speed figures, measured side by side, as ratios")
    bn.add_argument("--json", help="also write the figures to this JSON file")
    bn.add_argument("--repeats", type=int, default=5, help="timings per figure (the median is reported)")
    bn.add_argument("--release-lib", help="a Release build's ggml lib directory, timed beside the Debug engine")
    bn.add_argument("--build-release", metavar="DIR", help="build ggml-python 0.0.45 in Release into DIR and time it")
    bn.add_argument("--examples", type=int, default=20, help="examples per property for the rate figures")
    bn.add_argument("--seeds", type=int, default=5, help="seeds per planted fault; the rediscovery section's seeds (0 .. N-1)")
    bn.add_argument("--xdist-examples", type=int, default=500, help="examples per property for the -n 1 / -n 2 figure")
    bn.add_argument("--sections", default="all", help="comma-separated: scaling,overhead,examples,failure,xdist,llama,ci,flake,rediscovery (all: every one but the last three)")
    bn.add_argument("--ci-budget", type=float, default=600.0, help="the ci and flake sections' cap in seconds (the ci profile's: 600; it runs by count)")
    bn.add_argument("--flake-seeds", default="0,0,1,2,3", help="the flake section's seeds, one ci job run each on each built-in (default: 0,0,1,2,3)")
    bn.add_argument("--lib", default=None, help="the ci and rediscovery sections' --schedfuzz-lib (default: the plugin's default ggml)")
    bn.add_argument("--llama-lib", action="append", metavar="NAME|DIR",
                    help="the rediscovery section's builds, one table each: --schedfuzz-llama-lib values (repeatable; default: the plugin's)")
    bn.add_argument("--cpu-seconds", type=float, default=600.0, help="the rediscovery section's budget per seed, in CPU-seconds of the run's processes")
    bn.add_argument("--against", metavar="JSON", help="the rediscovery section beside an earlier run's (its --json, the same seeds and budget): the ratio per build")
    bn.set_defaults(func="tools:bench")
    cm = sub.add_parser("compare", help="the same llama.cpp workloads on two builds (a port against upstream): each difference and its cause")
    cm.add_argument("--a", default=SEED_LLAMA, help="build A: a built-in name or a library folder (default: the seeds' port)")
    cm.add_argument("--b", default=UPSTREAM, help=f"build B (default: upstream, {UPSTREAM})")
    cm.add_argument("--workloads", type=int, default=50, help="how many generated workloads (default 50)")
    cm.add_argument("--seed", type=int, default=0, help="seed of the generated workloads (default 0)")
    cm.set_defaults(func="tools:compare_builds")
    su = sub.add_parser("seeds", help="seed 000's users' servers, scaled down, on each built-in llama.cpp: n_same/n_diff and the findings")
    su.add_argument("--llama-lib", action="append", help="a build to replay them on (repeatable; default: every built-in llama.cpp)")
    su.add_argument("--export", metavar="DIR", help="save each finding as a case and export its C reproducer into DIR")
    su.add_argument("--check", action="store_true", help="with --export: build each reproducer and run it")
    su.set_defaults(func="tools:seed_users")
    for name, helps in (("bisect", "the first (or last) llama.cpp build whose replay of a case shows its bug: published builds by range, or your builds"),
                        ("matrix", "the corpus's known llama.cpp bugs on each build: a Markdown table of what reproduces where")):
        hp = sub.add_parser(name, help=helps)
        if name == "bisect":
            hp.add_argument("case", help="a llama.cpp case file")
        else:
            hp.add_argument("cases", nargs="*", default=["corpus"], help="case files or corpus folders (default: ./corpus)")
            hp.add_argument("-o", "--output", metavar="FILE.md", help="write the table to this Markdown file too")
            hp.add_argument("--title", help="a first line for --output (a page heading and its introduction)")
        hp.add_argument("--from", dest="first", metavar="bNNNN", help="the oldest published build of the range (llama.cpp-bNNNN or bNNNN)")
        hp.add_argument("--to", dest="last", default=UPSTREAM, metavar="bNNNN", help=f"the newest (default: {UPSTREAM})")
        hp.add_argument("--builds", action="append", metavar="BUILD[,BUILD...]",
                        help="the builds instead, the oldest first: published names, built-ins or library folders; repeatable")
        hp.add_argument("--runs", type=int, default=3, help="replays of a case before it counts as not reproduced on a build (default 3)")
        hp.set_defaults(func=f"upstream_history:{name}")
    return parser, sub.choices


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage and suggestion, not the top level's
        commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        module, name = args.func.split(":")
        return int(getattr(importlib.import_module(f".commands.{module}", __package__), name)(args))
    except UsageError as e:
        print(f"schedfuzz: {e}", file=sys.stderr)
        return 2
    except TargetError as e:  # what the build under test cannot do for these cases (a GPU-like device on a headerless build)
        print(f"schedfuzz {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
