"""``schedfuzz gate``, ``mutate``, ``bench`` and ``device`` (with the compiled reference): the tools around the fuzzer."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..cases.corpus import CaseError, case_files
from ..profiles import PROFILES, FuzzConfig
from . import UsageError, bad_case, cli_words, load_all, properties_arg


def corpus_arg(given: str | None) -> Path:
    """The corpus a command's run replays, as ``pytest --schedfuzz`` chooses it: the one named
    (which must exist), else ./corpus, else the built-in starter corpus (an empty folder works)."""
    from ..cases.corpus import STARTER_CORPUS

    if given is not None:
        if not Path(given).is_dir():
            raise UsageError(f"--corpus {given}: no such folder")
        return Path(given)
    return Path("corpus") if Path("corpus").is_dir() else STARTER_CORPUS


def gate_(args: argparse.Namespace) -> int:
    from ..profiles import new_seed
    from ..tools.gate import gate

    props = properties_arg(args.properties)
    if props is None:
        return 2
    if args.profile not in PROFILES:
        print(f"schedfuzz gate: --profile {args.profile!r}: choose one of {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    corpus = corpus_arg(args.corpus)
    try:
        cases = load_all([str(corpus)]) if any(case_files(corpus)) else []
    except CaseError as e:
        return bad_case(e)
    seed = args.seed if args.seed is not None else (0 if PROFILES[args.profile].derandomize else new_seed())
    print(f"schedfuzz gate: profile={args.profile} seed={seed} corpus={corpus} ({len(cases)} cases)", flush=True)
    config = FuzzConfig(profile=args.profile, examples=args.examples, seed=seed, rereserve=args.rereserve)
    try:
        config.validate()  # --examples 0 and the like, before anything is built
    except ValueError as e:
        print(f"schedfuzz gate: {cli_words(e)}", file=sys.stderr)
        return 2
    try:
        status, report, data = gate(args.base, args.head, cases, config, props, save=Path(args.save))
    except ValueError as e:
        print(f"schedfuzz gate: {e}", file=sys.stderr)
        return 2
    print(report)
    if args.report:
        from ..files import atomic_write

        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(Path(args.report), lambda tmp: tmp.write_text(text))
        print(f"report: {args.report}")
    return status


def mutate(args: argparse.Namespace) -> int:
    from ..tools.mutants import main as mutate_main

    return mutate_main(args.mutants.split(",") if args.mutants else None, corpus_arg(args.corpus), args.budget, Path(args.logs) if args.logs else None,
                       args.size_oracle)


def bench(args: argparse.Namespace) -> int:
    from ..tools.bench import main as bench_main

    return bench_main(args)


def device(args: argparse.Namespace) -> int:
    """Build the GPU-like device for each ggml named (a built-in, or a build's library folder)."""
    from ..builds.compile import BuildError
    from ..builds.installed import LibError, base_library
    from ..ggml.build import build_fake_gpu
    from ..ggml.lib import BUILT_IN, library_folder

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
    from ..compiled import compile_reference

    t0 = time.perf_counter()
    done = compile_reference()  # not a device, but the same once-per-install step (its failure leaves the source in use)
    print(f"schedfuzz device: reference: {done} ({time.perf_counter() - t0:.1f} s)", file=sys.stdout if done.startswith("compiled") else sys.stderr)
    return 0


def coverage(args: argparse.Namespace) -> int:
    from ..tools.coverage import main as coverage_main

    return coverage_main(args.lib, args.profile, args.budget, corpus_arg(args.corpus), Path(args.json) if args.json else None)


def compare_builds(args: argparse.Namespace) -> int:
    """``schedfuzz compare``: the same generated workloads on two llama.cpp builds, each difference
    with its cause (``campaign.compare``); exit 0 (a survey, not a verdict)."""
    from ..campaign.compare import compare, drawn
    from ..engine import TargetError
    from ..llama.llama_target import LlamaTarget
    from ..model.llama_workload import LLAMA_DEVICES
    from ..strategies.llama_workloads import FAMILIES, llama_workloads

    targets = []
    try:
        for lib in (args.a, args.b):
            targets.append(LlamaTarget(lib))
        gpus = all(t.start().get("gpu_device", "available") == "available" for t in targets)
        print(f"schedfuzz compare: A = {args.a} (ggml {targets[0].engine.get('ggml_version')}), B = {args.b} "
              f"(ggml {targets[1].engine.get('ggml_version')}); seed={args.seed}; GPU-like devices: {'yes' if gpus else 'no (RPC only)'}", flush=True)
        workloads = drawn(llama_workloads(limits=LLAMA_DEVICES if gpus else LLAMA_DEVICES.without(lambda k: k.fake_gpu), families=FAMILIES, draft_models=True), args.workloads, args.seed)
        result = compare((targets[0], targets[1]), (args.a, args.b), workloads)
    except TargetError as e:
        print(f"schedfuzz compare: {e}", file=sys.stderr)
        return 2
    finally:
        for t in targets:
            t.close()
    print("\n".join(result.summary()))
    return 0


def seed_users(args: argparse.Namespace) -> int:
    """``schedfuzz seeds``: seed 000's users' servers (``campaign.seed_users``) on each build, with
    every llama.cpp property; exit 0 (a report: the findings are in it, and in the corpus's run)."""
    from ..builds.names import BUILT_IN
    from ..campaign.fuzz import Fuzzer
    from ..campaign.seed_users import USERS, lines, replay
    from ..properties.base import LLAMA_GROUP

    rows = []
    for build in args.llama_lib or BUILT_IN:
        f = Fuzzer(FuzzConfig(database=None, llama_lib=build))
        try:
            info = f.engines.llama_target.start()
            gpu_like = info.get("gpu_device", "available") == "available"
            has_moe_cache = "moe_cache_size" not in info.get("absent_params", "").split(",")

            def check(w):  # type: ignore[no-untyped-def]
                return f.engines.run_llama(w), f.check_llama(LLAMA_GROUP, w)

            for user in USERS:
                rows.append(replay(user, build, check, gpu_like, has_moe_cache))
                print("\n".join(lines(rows[-1:])), flush=True)
                if args.export:
                    _export_seed_findings(rows[-1], Path(args.export), USERS.index(user) + 1, args.check)
        finally:
            f.close()
    return 0


def _export_seed_findings(row: Any, out: Path, user: int, check: bool) -> None:
    """Each distinct finding of one user's server on one build, saved as a case and exported as a
    C reproducer (``out/user<N>-<build>-<k>/``) against that build; with ``check``, built and run."""
    from ..cases.corpus import Case, load_case, save_case
    from ..cases.export import ExportError, build_and_run
    from ..cases.export_llama import EXPORTED, export_llama_case

    assert row.trace is not None or not row.findings
    firsts = {v.signature(): v for v in reversed(row.findings)}  # the earliest call of each signature
    for k, v in enumerate(x for x in firsts.values() if x.property in EXPORTED):
        case = load_case(save_case(out / "cases", Case(v.property, v.signature(), None, v.message, v.step, engine=dict(row.trace.engine),
                                                       llama=row.workload)))
        folder = out / f"user{user}-{row.build}-{k}"
        try:
            export_llama_case(case, folder, row.build, trace=row.trace)
            said = ""
            if check:
                built = build_and_run(folder)
                said = " (built and run: " + ("it reproduces" if built.code == 1 else f"exit {built.code}, it does not reproduce") + ")"
            print(f"  reproducer of {v.signature()}: {folder}{said}", flush=True)
        except ExportError as e:
            print(f"  no reproducer of {v.signature()}: {str(e).splitlines()[0]}", flush=True)

