"""``schedfuzz replay``, ``minimize``, ``show``, ``capture`` and ``export``: what a maintainer does with a saved case."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from reference.rules import rules_for

from ..builds.names import BUILT_IN as LLAMA_BUILT_IN
from ..builds.names import recorded_build
from ..campaign.fuzz import Fuzzer
from ..cases.capture import CaptureError, capture
from ..cases.corpus import CASE_VERSION, Case, CaseError, case_files, load_case, save_case, upgraded
from ..cases.verdict import judge_replay
from ..engine import TargetError, Unsupported
from ..files import atomic_write
from ..model.captured import Captured
from ..model.llama_trace import LlamaTrace
from ..model.scenario import Scenario
from ..model.trace import StepRecord, Trace
from ..model.versions import version_of
from ..properties.agreement import MATCHES_REFERENCE
from ..properties.captured_reference import llama_matches_reference
from ..properties.registry import ENTRIES
from . import CANNOT_RUN, UsageError, bad_case, fuzzer_for, load_all, replaying_fuzzer


def print_llama_run(fuzzer: Fuzzer, case: Case, capture: bool = False) -> LlamaTrace:
    """A llama case's calls, each with the scheduler calls it caused: reallocations and reasons
    (with ``capture``, its graphs are captured too). Returns the trace it printed."""
    assert case.llama is not None
    w = case.llama
    print(f"  {w.describe()}")
    trace: LlamaTrace = fuzzer.engines.run_llama(w, capture=capture)
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


def found_on(case: Case, args: argparse.Namespace) -> tuple[str | None, str | None] | str:
    """The builds to replay ``case`` on, ``(lib, llama_lib)``: those the user named, else the one
    its record says it was found on (a built-in); a str where that build cannot be had here: what
    to pass instead."""
    if case.llama is None:
        return (args.lib or version_of(str(case.engine.get("ggml_version", "0.25.3"))).built_in), args.llama_lib
    if args.llama_lib:
        return args.lib, args.llama_lib
    build = recorded_build(case.engine)
    if build in LLAMA_BUILT_IN:
        return args.lib, build
    where = case.engine.get("lib", "a build not recorded")
    return (f"it was found on {build or where}, which is not a built-in: pass --llama-lib with that build's library folder "
            f"(or a built-in: {', '.join(LLAMA_BUILT_IN)})")


def replay(args: argparse.Namespace) -> int:
    """Each case replayed on the build it was found on (or the one named), judged, and the
    verdict said plainly. Exit status: 0 every case as expected, 1 one is not (it reproduces
    where it should not, or a known bug is gone), ``CANNOT_RUN`` (3) one cannot run on this
    build and none failed; 2 a usage error or a bad file."""
    try:
        cases = load_all(args.cases)
    except CaseError as e:
        return bad_case(e)
    failed = cannot = 0
    by_build: dict[tuple[str | None, str | None], list[Case]] = {}
    for case in cases:
        builds = found_on(case, args)
        if isinstance(builds, str):
            print(f"== {case.path} [{case.property}]: cannot replay it here: {builds}")
            cannot += 1
            continue
        by_build.setdefault(builds, []).append(case)
    for (lib, llama_lib), group in by_build.items():
        f, c = _replay_on(argparse.Namespace(**{**vars(args), "lib": lib, "llama_lib": llama_lib}), group)
        failed, cannot = failed + f, cannot + c
    return 1 if failed else CANNOT_RUN if cannot else 0


def _replay_on(args: argparse.Namespace, cases: list[Case]) -> tuple[int, int]:
    """``replay`` of ``cases`` on one build: how many failed, and how many could not run."""
    fuzzer = replaying_fuzzer(args)
    failed = cannot = 0
    try:
        for case in cases:
            try:
                version = fuzzer.engines.ggml_version(case.llama is not None)
                on = f"{fuzzer.engines.llama_build()} (ggml {version})" if case.llama is not None else f"ggml {version}"
                print(f"== {case.path} [{case.property}] on {on}: expect {case.expectation_on(version, fuzzer.engines.llama_build() if case.llama else None)}")
                if case.llama is not None:
                    trace_llama = print_llama_run(fuzzer, case, args.capture)
                    if args.capture:
                        _print_captured(fuzzer, case, trace_llama)
                scenario = None if case.llama is not None else fuzzer.scenario_for(case)
                trace = fuzzer.engines.run(scenario) if scenario is not None else None
                for r in trace.records if trace is not None and scenario is not None else ():
                    print(f"  {r.index:2d}: {scenario.steps[r.index].describe():<48} splits={r.n_splits} graph_size={r.graph_size}")
                    for e in r.events:
                        print(f"      {e.describe()}")
                if trace is not None and trace.abort:
                    print(f"  !! {trace.abort.kind} at step {trace.abort.step}: {trace.abort.message.strip()}")
                build = fuzzer.engines.llama_build() if case.llama is not None else None
                verdict = judge_replay(case, fuzzer.replay(case), version, fuzzer.known.tolerated(case.llama is not None), build)
                failed += not verdict.ok
                print(f"  verdict: {verdict.short}")
            except Unsupported as e:  # a case this build cannot run (a parameter, a draft or a device it lacks): not a verdict
                cannot += 1
                print(f"  cannot replay it on this build: {e}")
    finally:
        fuzzer.close()
    return failed, cannot


def _print_captured(fuzzer: Fuzzer, case: Case, trace: LlamaTrace) -> Captured | None:
    """The captured graphs of a llama case's run, step by step: what ggml did inside llama.cpp
    and what the reference predicts (llama-matches-reference); None, saying why, if no graph
    scenario can say them."""
    assert case.llama is not None
    try:
        captured = capture(case.llama, trace)
    except CaptureError as e:
        print(f"  not captured ({e.kind}): {e}")
        return None
    sc = captured.scenario
    print(f"  captured: layout [{', '.join(sc.layout.name(i) for i in range(sc.layout.n))}], {len(sc.graphs)} graphs "
          f"({', '.join(f'{g.n_ops} nodes' for _, g in sc.graphs)}), {len(sc.steps)} steps; ops: "
          + ", ".join(f"{op} {n}" for op, n in sorted(captured.ops.items())))
    for s in captured.steps:
        print(f"    step {s.step:2d} (call {s.call:2d}): {sc.steps[s.step].describe():<40} splits={s.n_splits} "
              f"buffers={list(s.buffer_sizes)}" + (" re-planned" if s.realloc else ""))
    if captured.abort is not None:
        step, call, message = captured.abort
        print(f"    step {step:2d} (call {call:2d}): {sc.steps[step].describe():<40} ggml aborted: {message.strip().splitlines()[0][-160:]}")
    rules, _ = rules_for(trace.engine.get("ggml_version"))
    found = llama_matches_reference(case.llama, captured, fuzzer.reference_for(rules)(sc))
    print("  llama-matches-reference: " + (str(found[0]) if found else
          f"the reference predicts every step ({sum(len(s.node_backends) for s in captured.steps)} node assignments)"))
    return captured


def capture_case(args: argparse.Namespace) -> int:
    """``schedfuzz capture LLAMA_CASE -o CASE``: the case's graphs, captured in llama.cpp, as a
    graph case of the graph property that sees the finding at the ggml level, replayed there."""
    try:
        case = load_case(args.case)
    except CaseError as e:
        return bad_case(e)
    if case.llama is None:
        raise UsageError(f"{args.case}: not a llama.cpp case (capture reads the graphs llama.cpp builds)")
    fuzzer = fuzzer_for(args)
    try:
        print(f"== {case.path} [{case.property}] on llama.cpp: {case.signature}")
        captured = _print_captured(fuzzer, case, print_llama_run(fuzzer, case, capture=True))
        if captured is None:
            return 1
        # the graph property a llama.cpp finding is seen by at the ggml level (its entry's seen_as; else matches-reference)
        prop = ENTRIES[case.property].seen_as or MATCHES_REFERENCE.id
        found = [v for v in fuzzer.check(prop, captured.scenario) if v.property == prop]
        version = fuzzer.engines.ggml_version(False)
    finally:
        fuzzer.close()
    at = {s.step for s in captured.steps if s.call == case.step} | ({captured.abort[0]} if captured.abort and captured.abort[1] == case.step else set())
    v = next((v for v in found if v.step in at), found[0] if found else None)
    source = f"{Path(args.case).name} (call {case.step}: {case.signature})"
    engine = {"name": "ggml", "ggml_version": version, "captured_from": source}
    if v is None:
        out = Case(prop, "-", captured.scenario, f"captured from {source}: holds at the ggml level", captured.steps[-1].step, engine=engine)
        print(f"  at the ggml level: {prop} holds on every step (the finding is not in the graphs the scheduler was given)")
    else:
        why = case.expected_failure or case.signature
        out = Case(prop, v.signature(), captured.scenario, v.message, v.step, engine=engine, expect={"fail": f"captured from {source}: {why}"})
        print(f"  at the ggml level: {v}\n  signature: {v.signature()}")
    path = save_case(args.output, out) if Path(args.output).is_dir() else _write(out, Path(args.output))
    print(f"wrote {path}")
    return 0


def _write(case: Case, path: Path) -> Path:
    text = json.dumps(case.to_json(), indent=1, sort_keys=True) + "\n"
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def minimize(args: argparse.Namespace) -> int:
    from ..cases.minimize import minimize_case, simplest

    paths = [args.dir] if Path(args.dir).is_dir() else []
    if not paths:
        print(f"schedfuzz: {args.dir}: not a corpus directory", file=sys.stderr)
        return 2
    try:
        cases = load_all(paths)
    except CaseError as e:
        return bad_case(e, " (nothing was changed)")
    fuzzer = fuzzer_for(args)
    kept: list[Case] = []
    unchanged: set[int] = set()  # ids of the kept cases no smaller case was found for
    deadline = time.monotonic() + args.time_limit if args.time_limit else None

    def late() -> bool:
        return deadline is not None and time.monotonic() > deadline

    def signatures(c: Case) -> list[str]:
        # past the time limit no candidate replays: the shrink ends at once with the smallest so far
        return [] if late() else [v.signature() for v in fuzzer.replay(c)]

    try:
        for case in cases:
            if late():
                print(f"{case.path}: not reached within --time-limit {args.time_limit:g}; left as it is")
                continue
            if not any(v.signature() == case.signature for v in fuzzer.replay(case)):
                print(f"{case.path}: does not replay to {case.signature}; left as it is")
                continue
            small, tries = minimize_case(case, signatures, fuzzer.driver.scenario, fuzzer.reference_signatures)
            stopped = " (stopped by --time-limit)" if late() else ""
            if small.size_text() == case.size_text():
                print(f"{case.path}: no smaller case found ({tries.replays} replays of {tries.candidates} candidates){stopped}; left as it is")
                kept.append(case)  # not written again; removed only where a smaller case keeps its signature
                unchanged.add(id(case))
                continue
            # the smaller case's own step and message, as its replay states them
            found = next((v for v in fuzzer.replay(small) if v.signature() == case.signature), None)
            if found is None:
                print(f"{case.path}: the smaller case did not replay to {case.signature} again (flaky); left as it is")
                continue
            small = replace(small, step=found.step, message=found.message)
            print(f"{case.path}: {case.size_text()} -> {small.size_text()} ({tries.replays} replays of {tries.candidates} smaller candidates; "
                  f"{tries.screened} ruled out by the reference without replaying){stopped}")
            kept.append(small)
    finally:
        fuzzer.close()
    best = simplest(kept)
    for case in kept:
        if best[case.signature] is case and id(case) in unchanged:
            continue  # not shrunk: its file stays as it was
        if best[case.signature] is case:
            path = save_case(args.dir, case)
            if case.path is not None and case.path.resolve() != path.resolve():
                case.path.unlink()
                print(f"wrote {path}, and removed {case.path} (the same case, shrunk: its file name follows its content)")
            else:
                print(f"wrote {path} (shrunk in place)")
        elif case.path is not None:
            # a smaller case keeps this signature; this one was replayed, so it can go
            case.path.unlink()
            print(f"removed {case.path}: a smaller case keeps its signature ({case.signature})")
    print(f"{len(best)} signature(s) kept in {args.dir}")
    return 0


def show(args: argparse.Namespace) -> int:
    from ..cases.draw import buffer_lines, buffers_text, llama_to_dot, named_tensors, splits_text, to_dot, write

    try:
        case = load_case(args.case)
    except CaseError as e:
        return bad_case(e)
    out = Path(args.output or Path(args.case).with_suffix(".svg").name)
    if out.suffix.lower() not in (".svg", ".png", ".dot"):
        print(f"schedfuzz: -o {out}: the suffix must be .svg, .png or .dot", file=sys.stderr)
        return 2
    fuzzer = fuzzer_for(args)
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
        trace, record, source = _step_record(fuzzer, case, scenario)
    finally:
        fuzzer.close()
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


def _step_record(fuzzer: Fuzzer, case: Case, scenario: Scenario) -> tuple[Trace, StepRecord | None, str]:
    """The engine's run of a graph case, the record of the case's step to draw and whose it is:
    the engine's; where the engine died in the step, the reference's plan; where the step
    scheduled no graph of its own (an alloc that crashed), the last step before it that did."""
    trace = fuzzer.engines.run(scenario)
    record = next((r for r in trace.records if r.splits and r.index == case.step), None)
    source = "the engine"
    if record is None and trace.abort is not None:
        record = next((r for r in fuzzer.predict(scenario).records if r.splits and r.index == case.step), None)
        source = f"the reference's prediction (the engine's {trace.abort.kind} at step {trace.abort.step} left no record)"
    if record is None:
        graph_steps = [r for r in trace.records if r.splits and r.index <= case.step] or [r for r in trace.records if r.splits]
        record = graph_steps[-1] if graph_steps else None
        source = f"the engine, the last step with a graph before step {case.step}, where the finding is"
    return trace, record, source


def export(args: argparse.Namespace) -> int:
    """``schedfuzz export CASE|DIR -o DIR``: each case as a standalone C reproducer with its
    CMakeLists and REPORT.md (a folder: one reproducer per case, in DIR/CASE-NAME), made on the
    build it was found on (or the one named: ``found_on``); with ``--check``, each built against
    that build and run. Exit status as ``replay``'s: 1 a case not as expected (or not exported),
    ``CANNOT_RUN`` one that cannot be made or run on that build."""
    from ..cases.export import ExportError, build_and_run

    try:
        cases = load_all(args.cases)
    except CaseError as e:
        return bad_case(e)
    single = len(args.cases) == 1 and not Path(args.cases[0]).is_dir()
    failed = cannot = 0
    for case in cases:
        assert case.path is not None
        out = Path(args.output) if single else Path(args.output) / case.path.stem
        version = str(case.engine.get("ggml_version", "0.25.3"))
        builds = found_on(case, args)
        if isinstance(builds, str):
            print(f"{case.path.name}: cannot export it here: {builds}")
            cannot += 1
            continue
        lib, llama_lib = builds[0] or version_of(version).built_in, builds[1]
        fuzzer = fuzzer_for(argparse.Namespace(**{**vars(args), "lib": lib, "llama_lib": llama_lib}))
        try:
            _export_one(fuzzer, case, out, lib, version, llama_lib)
        except ExportError as e:
            print(f"{case.path.name}: not exported: {e}")
            failed += single
            continue
        except (Unsupported, TargetError) as e:  # a device, a call or a parameter that build lacks
            print(f"{case.path.name}: cannot export it on {llama_lib or lib}: {str(e).splitlines()[0]}")
            cannot += 1
            continue
        finally:
            fuzzer.close()
        print(f"{case.path.name}: wrote {out}/ (repro.c, CMakeLists.txt, REPORT.md)")
        if args.check:
            try:
                built = build_and_run(out)
            except ExportError as e:
                print(f"  check: {e}")
                failed += 1
                continue
            built_on = (llama_lib or LLAMA_BUILT_IN[0]) if case.llama is not None else lib
            known = case.expected_failure_on(version, built_on if case.llama is not None else None) is not None
            expected = known or case.untriaged
            said = ("reproduces (a known bug)" if known else "reproduces (a new finding, not triaged)" if expected
                    else "does not reproduce (a guard: its bug was fixed)")
            print(f"  check on {built_on}: {built.verdict} (exit {built.code}); expected: {said}")
            with (out / "REPORT.md").open("a") as f:
                f.write(f"\n## Checked\n`schedfuzz export --check` built it against {built_on} (ggml {version}) and ran it: "
                        f"it {built.verdict} (exit {built.code}).\n```\n{built.output[-4000:]}\n```\n")
            failed += built.code != (1 if expected else 0)
    return 1 if failed else CANNOT_RUN if cannot else 0


def _export_one(fuzzer: Fuzzer, case: Case, out: Path, lib: str, version: str, llama_lib: str | None) -> None:
    """One case's reproducer, with what the harness's own run of it says in REPORT.md: a llama.cpp
    case's replay, a graph case's splits and buffers at its step (and the ``show`` drawing)."""
    from ..cases.draw import buffers_text, splits_text, to_dot
    from ..cases.export import StepRecords, export_case
    from ..cases.export_llama import export_llama_case
    from ..llama.llama_target import resolve_lib_dir
    from ..properties import fresh_variant

    if case.llama is not None:
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            trace = print_llama_run(fuzzer, case)
        export_llama_case(case, out, llama_lib and str(resolve_lib_dir(llama_lib)), said.getvalue(), trace)
        return
    scenario = fuzzer.scenario_for(case)
    trace, record, source = _step_record(fuzzer, case, scenario)
    at = {r.index: r for r in trace.records}
    seen = StepRecords(at.get(case.step), next((r for r in fuzzer.predict(scenario).records if r.index == case.step), None),
                next((r for r in fuzzer.engines.run(fresh_variant(scenario)).records if r.index == case.step), None)
                if case.property == "reuse-equivalent" else None)
    if record is None:
        export_case(case, scenario, out, lib, version, seen=seen)
        return
    drawing = f"step {record.index}: {scenario.steps[record.index].describe()}, as scheduled by {source}\n{splits_text(scenario, record)}\n{buffers_text(scenario, record)}"
    title = f"{case.signature} — step {record.index}: {scenario.steps[record.index].describe()}"
    export_case(case, scenario, out, lib, version, drawing, to_dot(scenario, record, set(), title).to_string(), seen)


def _wrote(dot: Any, out: Path, write: Callable[[Any, Path], Path]) -> int:
    try:
        write(dot, out)
    except (RuntimeError, ValueError) as e:
        print(f"schedfuzz: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def known(args: argparse.Namespace) -> int:
    """``schedfuzz known CASE --because TEXT``: a new finding (``expect: new``) made a known bug,
    ``{"fail": TEXT}``, for a llama.cpp case with ``known_on``: the build its record names and
    ``--on``'s. The file is rewritten atomically (renamed with ``--name``); nothing else changes."""
    path = Path(args.case)
    try:
        case = load_case(path)
    except CaseError as e:
        return bad_case(e)
    because = args.because.strip()
    if not because:
        raise UsageError("--because: say what the bug is (an empty explanation helps no one)")
    if not case.untriaged:
        said = f"known: {case.expected_failure}" if case.expected_failure is not None else "a guard (expect: pass): its bug was fixed"
        raise UsageError(f"{path}: not a new finding (it is {said}); edit its expect by hand to change it")
    expect: dict[str, Any] = {"fail": because}
    if case.llama is not None:
        found_on = recorded_build(case.engine)
        builds = list(dict.fromkeys([*([found_on] if found_on else []), *args.on]))
        if not builds:
            raise UsageError(f"{path}: its record names no llama.cpp build: name the builds it is known on with --on")
        expect["known_on"] = builds
    target = path if not args.name else path.with_name(f"{args.name.removesuffix('.json')}.json")
    if target != path and target.exists():
        raise UsageError(f"--name {args.name}: {target} exists already")
    data = json.loads(path.read_text(encoding="utf-8"))  # as it is on disk: only its expect changes
    text = json.dumps(data | {"expect": expect}, indent=1, sort_keys=True) + "\n"
    atomic_write(target, lambda tmp: tmp.write_text(text))
    if target != path:
        path.unlink()
    print(f"{target}: known bug ({because})" + (f", known on {', '.join(expect['known_on'])}" if "known_on" in expect else ""))
    return 0


def migrate(args: argparse.Namespace) -> int:
    """``schedfuzz migrate [PATH...]``: case files of an earlier format rewritten in today's
    (``corpus.UPGRADES``), each in place under its name, atomically, once its new form is read
    back as the same case; nothing else in a file changes. A file that cannot be read is named
    and left as it is (exit status 2)."""
    moved = current = 0
    bad: list[CaseError] = []
    for p in args.cases:
        for path in list(case_files(p)) if Path(p).is_dir() else [Path(p)]:
            try:
                before = load_case(path)
                data = json.loads(path.read_text(encoding="utf-8"))
                if data["version"] == CASE_VERSION:
                    current += 1
                    continue
                text = json.dumps(upgraded(path, data), indent=1, sort_keys=True) + "\n"

                def write(tmp: Path, text: str = text, before: Case = before) -> None:
                    tmp.write_text(text)
                    if replace(load_case(tmp), path=before.path) != before:
                        raise CaseError(path, "its upgraded form reads as another case: left as it is")

                atomic_write(path, write)
                moved += 1
            except CaseError as e:
                bad.append(e)
    for e in bad:
        print(f"schedfuzz: {e}", file=sys.stderr)
    print(f"migrated {moved} case file(s) to format version {CASE_VERSION}; {current} already were; {len(bad)} could not be read")
    return 2 if bad else 0
