"""The ``schedfuzz`` command: the plugin's fuzzing run outside pytest (and, later, the corpus)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .campaign.fuzz import Finding, Fuzzer
from .campaign.profiles import PROFILES, FuzzConfig
from .cases.corpus import STARTER_CORPUS, Case, CaseError, case_files, load_case, save_case
from .cases.verdict import judge_replay
from .model.llama_trace import LlamaTrace
from .properties import PROPERTY_IDS, fuzz_units


def cli_words(e: Exception) -> str:
    """An option error in the words of this command (``--policy``, not ``--schedfuzz-policy``)."""
    return str(e).replace("--schedfuzz-", "--")


def _properties(arg: str | None) -> list[str] | None:
    """The ``--properties`` ids (default: all); None, after saying why, if one is unknown."""
    props = arg.split(",") if arg else list(PROPERTY_IDS)
    unknown = [p for p in props if p not in PROPERTY_IDS]
    if unknown:
        print(f"schedfuzz: --properties: unknown {', '.join(unknown)} (known: {', '.join(PROPERTY_IDS)})", file=sys.stderr)
        return None
    return props


def _run(args: argparse.Namespace) -> int:
    props = _properties(args.properties)
    if props is None:
        return 2
    try:
        fuzzer = Fuzzer(
            FuzzConfig(
                profile=args.profile, examples=args.examples, seed=args.seed, budget=args.budget, target=args.target,
                lib=args.lib, llama_lib=args.llama_lib, policy=args.policy, rereserve=args.rereserve, reference=args.reference,
                keep_going=args.keep_going,
            )
        )
    except ValueError as e:
        print(f"schedfuzz: {cli_words(e)}", file=sys.stderr)
        return 2
    if args.known == "builtin":
        fuzzer.known.learn(STARTER_CORPUS)
    fuzzer.known.learn(Path(args.corpus))
    print(f"schedfuzz: profile={args.profile} seed={fuzzer.seed}; known upstream bugs: {len(fuzzer.known.cases)}")
    findings = []
    try:
        budget = args.budget if args.budget is not None else fuzzer.profile.budget
        fuzzer.llama_judged = tuple(p for p in props if p.startswith("llama-"))
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
                    print(f"  saved to {save_case(args.corpus, finding.to_case(fuzzer))}", flush=True)
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
    print("\n".join(fuzzer.stats.summary_lines()))
    return 1 if findings else 0


class UsageError(Exception):
    """A bad option or input: one line on stderr, exit status 2."""


def _fuzzer(args: argparse.Namespace) -> Fuzzer:
    try:
        return Fuzzer(FuzzConfig(target=args.target, lib=args.lib, llama_lib=args.llama_lib, policy=args.policy, rereserve=args.rereserve, database=None))
    except ValueError as e:
        raise UsageError(cli_words(e)) from None


def print_llama_run(fuzzer: Fuzzer, case: Case) -> LlamaTrace:
    """A llama case's calls, each with the scheduler calls it caused: reallocations and reasons.
    Returns the trace it printed."""
    assert case.llama is not None
    w = case.llama
    print(f"  {w.describe()}")
    trace: LlamaTrace = fuzzer.engines.run_llama(w)
    names = {-1: "llama_init_from_model"} | {i: c.describe() for i, c in enumerate(w.calls)}
    for c in trace.calls:
        print(f"  {c.index:2d}: {names.get(c.index, c.kind):<60} rc={c.rc}")
        for s in c.sched:
            if s.kind in ("reserve", "alloc"):
                mark = ("SAME-SIZE REALLOC" if s.same_size else "realloc") if s.realloc else ""
                print(f"        {s.kind:<7} nodes={s.n_nodes} leafs={s.n_leafs} splits={s.n_splits} copies={s.n_copies} "
                      f"graph_size={s.graph_size} (prev {s.prev_graph_size}) {mark}" + (f": {s.realloc_reason}" if s.realloc else ""))
            elif s.kind == "new":
                print(f"        ggml_backend_sched_new #{s.sched}: max_nodes={s.max_nodes} parallel={s.parallel} op_offload={s.op_offload}")
    if trace.abort:
        print(f"  !! {trace.abort.kind} in call {trace.abort.call}: {trace.abort.message.strip()[:2000]}")
    return trace


def _bad(e: CaseError, suffix: str = "") -> int:
    """A corpus file that cannot be used: its error on stderr, exit status 2."""
    print(f"schedfuzz: {e}{suffix}", file=sys.stderr)
    return 2


def _load_all(paths: Sequence[str]) -> list[Case]:
    """Every case named (files or corpus directories); a bad one raises CaseError."""
    cases = []
    for p in paths:
        files = list(case_files(p)) if Path(p).is_dir() else [Path(p)]
        if Path(p).is_dir() and not files:
            raise UsageError(f"{p}: no case files (*.json) in this folder")
        cases += [load_case(f) for f in files]
    return cases


def _replay(args: argparse.Namespace) -> int:
    try:
        cases = _load_all(args.cases)
    except CaseError as e:
        return _bad(e)
    fuzzer = _fuzzer(args)
    # known bugs: the starter corpus's and the replayed folders' (another known bug beside a case's own is no news)
    for folder in [STARTER_CORPUS, *(p for p in args.cases if Path(p).is_dir())]:
        fuzzer.known.learn(Path(folder))
    failed = 0
    try:
        for case in cases:
            version = fuzzer.engines.ggml_version(case.llama is not None)
            print(f"== {case.path} [{case.property}] on ggml {version}: expect {case.expectation_on(version)}")
            if case.llama is not None:
                print_llama_run(fuzzer, case)
            scenario = None if case.llama is not None else fuzzer.scenario_for(case)
            trace = fuzzer.engines.run(scenario) if scenario is not None else None
            for r in trace.records if trace is not None and scenario is not None else ():
                print(f"  {r.index:2d}: {scenario.steps[r.index].describe():<48} splits={r.n_splits} graph_size={r.graph_size}")
                for e in r.events:
                    print(f"      {e.describe()}")
            if trace is not None and trace.abort:
                print(f"  !! {trace.abort.kind} at step {trace.abort.step}: {trace.abort.message.strip()}")
            verdict = judge_replay(case, fuzzer.replay(case), version, fuzzer.known.expected(case.llama is not None))
            failed += not verdict.ok
            print(f"  verdict: {verdict.short}")
    finally:
        fuzzer.close()
    return 1 if failed else 0


def _minimize(args: argparse.Namespace) -> int:
    from .cases.minimize import minimize_case, simplest

    paths = [args.dir] if Path(args.dir).is_dir() else []
    if not paths:
        print(f"schedfuzz: {args.dir}: not a corpus directory", file=sys.stderr)
        return 2
    try:
        cases = _load_all(paths)
    except CaseError as e:
        return _bad(e, " (nothing was changed)")
    fuzzer = _fuzzer(args)
    kept: list[Case] = []
    try:
        for case in cases:
            if not any(v.signature() == case.signature for v in fuzzer.replay(case)):
                print(f"{case.path}: does not replay to {case.signature}; left as it is")
                continue
            small, tries = minimize_case(case, lambda c: [v.signature() for v in fuzzer.replay(c)], fuzzer.driver.scenario, fuzzer.screen)
            # the smaller case's own step and message, as its replay states them
            found = next((v for v in fuzzer.replay(small) if v.signature() == case.signature), None)
            if found is None:
                print(f"{case.path}: the smaller case did not replay to {case.signature} again (flaky); left as it is")
                continue
            small = replace(small, step=found.step, message=found.message)
            print(f"{case.path}: {case.size_text()} -> {small.size_text()} ({tries.replays} replays of {tries.candidates} smaller candidates; "
                  f"{tries.screened} ruled out by the reference without replaying)")
            kept.append(small)
    finally:
        fuzzer.close()
    best = simplest(kept)
    for case in kept:
        if best[case.signature] is case:
            path = save_case(args.dir, case)
            if case.path is not None and case.path.resolve() != path.resolve():
                case.path.unlink()
        elif case.path is not None:
            # a smaller case keeps this signature; this one was replayed, so it can go
            case.path.unlink()
    print(f"{len(best)} signature(s) kept in {args.dir}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from .cases.draw import buffer_lines, buffers_text, llama_to_dot, named_tensors, splits_text, to_dot, write

    try:
        case = load_case(args.case)
    except CaseError as e:
        return _bad(e)
    out = Path(args.output or Path(args.case).with_suffix(".svg").name)
    if out.suffix.lower() not in (".svg", ".png", ".dot"):
        print(f"schedfuzz: -o {out}: the suffix must be .svg, .png or .dot", file=sys.stderr)
        return 2
    fuzzer = _fuzzer(args)
    if case.llama is not None:  # a llama.cpp case: its calls, with the reallocations they caused
        try:
            print(f"{case.signature}: {case.message}")
            trace = print_llama_run(fuzzer, case)
        finally:
            fuzzer.close()
        dot = llama_to_dot(case.llama, trace, case.step, f"{case.signature} — call {case.step}")
        return _wrote(dot, out, write)
    try:
        scenario = fuzzer.scenario_for(case)
        trace = fuzzer.engines.run(scenario)
        record = next((r for r in trace.records if r.splits and r.index == case.step), None)
        source = "the engine"
        if record is None and trace.abort is not None:
            # the engine died in this step (a compute, an abort): draw what the reference plans
            record = next((r for r in fuzzer.predict(scenario).records if r.splits and r.index == case.step), None)
            source = f"the reference's prediction (the engine's {trace.abort.kind} at step {trace.abort.step} left no record)"
    finally:
        fuzzer.close()
    if record is None:
        # the failing step scheduled no graph of its own (an alloc that crashed): the last one before it
        graph_steps = [r for r in trace.records if r.splits and r.index <= case.step] or [r for r in trace.records if r.splits]
        record = graph_steps[-1] if graph_steps else None
        source = f"the engine, the last step with a graph before step {case.step}, where the finding is"
    if record is None:
        print(f"schedfuzz: {args.case}: no step with a graph to draw (neither the engine nor the reference scheduled one)", file=sys.stderr)
        return 2
    highlight = set().union(*(named_tensors(e.reason) for e in record.events)) if record.events else set()
    print(f"{case.signature}: {case.message}")
    print(f"step {record.index}: {scenario.steps[record.index].describe()}, as scheduled by {source}")
    print(splits_text(scenario, record))
    print(buffers_text(scenario, record))
    # ggml's output below the finding's headline, and the replay's
    said = buffer_lines("\n".join(case.message.splitlines()[1:]) + "\n" + (trace.abort.message if trace.abort else ""))
    for line in said:
        print(f"ggml: {line}")
    for e in record.events:
        print(e.describe())
    title = f"{case.signature} — step {record.index}: {scenario.steps[record.index].describe()}"
    return _wrote(to_dot(scenario, record, highlight, title, said), out, write)


def _wrote(dot: Any, out: Path, write: Callable[[Any, Path], Path]) -> int:
    try:
        write(dot, out)
    except (RuntimeError, ValueError) as e:
        print(f"schedfuzz: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def _gate(args: argparse.Namespace) -> int:
    from .campaign.profiles import new_seed
    from .tools.gate import gate

    props = _properties(args.properties)
    if props is None:
        return 2
    if args.profile not in PROFILES:
        print(f"schedfuzz gate: --profile {args.profile!r}: choose one of {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    try:
        cases = _load_all([args.corpus]) if any(case_files(args.corpus)) else []
    except CaseError as e:
        return _bad(e)
    seed = args.seed if args.seed is not None else (0 if PROFILES[args.profile].derandomize else new_seed())
    print(f"schedfuzz gate: profile={args.profile} seed={seed} corpus={args.corpus} ({len(cases)} cases)", flush=True)
    config = FuzzConfig(profile=args.profile, examples=args.examples, seed=seed, rereserve=args.rereserve)
    try:
        config.validate()  # --examples 0 and the like, before anything is built
    except ValueError as e:
        print(f"schedfuzz gate: {cli_words(e)}", file=sys.stderr)
        return 2
    try:
        status, report = gate(args.base, args.head, cases, config, props)
    except ValueError as e:
        print(f"schedfuzz gate: {e}", file=sys.stderr)
        return 2
    print(report)
    return status


def _mutate(args: argparse.Namespace) -> int:
    from .tools.mutants import main as mutate_main

    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise UsageError(f"--corpus {args.corpus}: no such folder")
    return mutate_main(args.mutants.split(",") if args.mutants else None, corpus, args.budget, Path(args.logs) if args.logs else None,
                       args.size_oracle)


def _bench(args: argparse.Namespace) -> int:
    from .tools.bench import main as bench_main

    return bench_main(args)


def _device(args: argparse.Namespace) -> int:
    """Build the GPU-like device for each ggml named (a built-in, or a build's library folder)."""
    from .ggml.build import BuildError, build_fake_gpu
    from .ggml.lib import BUILT_IN, LibError, base_library, library_folder

    for name in args.lib or BUILT_IN:
        try:
            base = base_library(library_folder(name))
        except LibError as e:
            raise UsageError(str(e)) from None
        t0 = time.perf_counter()
        try:
            out = build_fake_gpu(str(base))
        except BuildError as e:
            print(f"schedfuzz device: {name}: {e}", file=sys.stderr)
            return 1
        print(f"schedfuzz device: {name}: {out} ({time.perf_counter() - t0:.1f} s, sources included)")
    return 0


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="MODULE:FACTORY (default: the real ggml engine)")
    p.add_argument("--lib", help="the ggml under test: ggml-0.25.3 (default), ggml-0.15.3, ggml-0.25.3-seed (the seeds' ggml), or your build's library folder")
    p.add_argument("--llama-lib", help="llama.cpp-0.3.36 (default), llama.cpp-0.3.36-seed (the seeds' system) or your build's library folder")
    p.add_argument("--policy", help="reuse policy MODULE:CALLABLE(new, cur) -> bool")
    p.add_argument("--rereserve", action=argparse.BooleanOptionalAction, default=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="schedfuzz", description="fuzz ggml's backend scheduler against a reference model")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="fuzz every property (like pytest --schedfuzz); exit 1 on findings")
    run.add_argument("--profile", choices=sorted(PROFILES), default="dev")
    run.add_argument("--examples", type=int)
    run.add_argument("--seed", type=int)
    run.add_argument("--budget", type=float, help="seconds for the whole run")
    _engine_args(run)
    run.add_argument("--reference", help="replace the reference's predict with MODULE:CALLABLE")
    run.add_argument("--keep-going", action=argparse.BooleanOptionalAction, default=None,
                     help="campaign: after a finding, save it and fuzz on; every distinct signature (default: on under nightly)")
    run.add_argument("--properties", help="comma-separated property ids")
    run.add_argument("--corpus", default="corpus", help="its expect-fail cases are known bugs, not reported again; findings are saved there")
    run.add_argument("--known", choices=("builtin", "none"), default="builtin",
                     help="builtin: the starter corpus's known upstream bugs are not reported again (default); none: report them too")
    run.set_defaults(func=_run)
    rp = sub.add_parser("replay", help="replay cases: steps, realloc events and the verdict")
    rp.add_argument("cases", nargs="+", help="case files or corpus directories")
    _engine_args(rp)
    rp.set_defaults(func=_replay)
    mn = sub.add_parser("minimize", help="shrink every case keeping its signature; keep the smallest per signature")
    mn.add_argument("dir", nargs="?", default="corpus")
    _engine_args(mn)
    mn.set_defaults(func=_minimize)
    sh = sub.add_parser("show", help="draw a case's graph (SVG, PNG or DOT) and print its splits")
    sh.add_argument("case")
    sh.add_argument("-o", "--output", help="output file: .svg, .png or .dot (default: CASE.svg here)")
    _engine_args(sh)
    sh.set_defaults(func=_show)
    gt = sub.add_parser("gate", help="pre-merge: the corpus and the same fuzzing on a base and a head build; exit 1 only for failures new on head")
    gt.add_argument("--base", required=True, help="the base build: ggml-0.25.3, ggml-0.15.3 or a library folder")
    gt.add_argument("--head", required=True, help="the head build, likewise")
    gt.add_argument("--profile", default="ci")
    gt.add_argument("--examples", type=int, help="examples per property (default: the profile's)")
    gt.add_argument("--seed", type=int)
    gt.add_argument("--properties", help="comma-separated property ids (default: all)")
    gt.add_argument("--corpus", default="corpus")
    gt.add_argument("--rereserve", action=argparse.BooleanOptionalAction, default=True)
    gt.set_defaults(func=_gate)
    mu = sub.add_parser("mutate", help="mutation score: the ci profile on ggml 0.25.3 with each scheduler mutant; the kill score")
    mu.add_argument("--mutants", help="comma-separated mutant names (default: all)")
    mu.add_argument("--budget", type=float, help="seconds of the ci profile per mutant (default: the profile's, 240)")
    mu.add_argument("--corpus", default="corpus", help="the corpus each run replays (a copy)")
    mu.add_argument("--logs", help="write each mutant's pytest output to this folder")
    mu.add_argument("--size-oracle", action="store_true", help="run the ci profile with --schedfuzz-size-oracle")
    mu.set_defaults(func=_mutate)
    dv = sub.add_parser("device", help="build the GPU-like device (fake_gpu.c) against each ggml (default: both built-ins)")
    dv.add_argument("--lib", action="append", help="a built-in (ggml-0.25.3, ggml-0.15.3) or a build's library folder; repeatable")
    dv.set_defaults(func=_device)
    bn = sub.add_parser("bench", help="speed figures, measured side by side, as ratios")
    bn.add_argument("--json", help="also write the figures to this JSON file")
    bn.add_argument("--repeats", type=int, default=5, help="timings per figure (the median is reported)")
    bn.add_argument("--release-lib", help="a Release build's ggml lib directory, timed beside the Debug engine")
    bn.add_argument("--build-release", metavar="DIR", help="build ggml-python 0.0.45 in Release into DIR and time it")
    bn.add_argument("--examples", type=int, default=20, help="examples per property for the rate figures")
    bn.add_argument("--seeds", type=int, default=5, help="seeds per planted fault")
    bn.add_argument("--xdist-examples", type=int, default=500, help="examples per property for the -n 1 / -n 2 figure")
    bn.add_argument("--sections", default="all", help="comma-separated: scaling,overhead,examples,failure,xdist,llama")
    bn.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as e:
        print(f"schedfuzz: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
