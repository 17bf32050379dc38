"""``schedfuzz bench``: speed figures measured side by side in one run, reported as ratios.

1. reference ÷ engine, scheduling the same llama-like graph (reserve + alloc) at about 1k,
   2k, 4k and 8k nodes, against the Debug engine the harness runs and, when given or built, a
   Release build of the same ggml; per-node cost from 1k to 8k for each;
2. harness overhead: a full fuzzing step ÷ the bare engine calls it contains, and where the
   step's time goes, phase by phase (``_phases``);
3. examples per second of each property under the dev and ci profiles;
4. time to the first failure of each planted fault of the plugin's tests (median of seeds);
5. examples per second with pytest-xdist ``-n 1`` against ``-n 2`` (500 examples per property
   by default: each worker starts its own engine and RPC servers, which short runs do not
   amortize);
6. ``ci`` (only when named): the ci job as ``.ci/run`` runs it, in a folder of its own with a
   copy of the starter corpus, and its examples per CPU-second: the CPU time of pytest and of
   every process under it (xdist workers, ggml and llama.cpp workers, RPC servers), as the
   kernel accounts it when they are reaped. Run it on two checkouts one after the other to
   compare them (docs/benchmarks.md);
7. ``flake`` (only when named): ci jobs at fixed seeds, compared run by run;
8. ``rediscovery`` (only when named): from an empty known list, how many of the starter
   corpus's causes the ci profile finds again within a CPU budget, and how soon
   (``tools/rediscovery.py``).

The engine is timed inside its worker (``StepRecord.seconds``: the ggml calls alone), with
``GGML_SCHED_DEBUG`` off. Flash attention stays off the RPC devices: each FA node there costs
an RPC round trip per allocation-size query, which has nothing to do with scheduling.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reference.graph import CGraph
from reference.predict import predict
from reference.sched import Scheduler

from .. import compiled
from ..campaign.fuzz import Fuzzer
from ..engine import gc_paused
from ..ggml.graph_target import GgmlTarget
from ..model.graph_spec import GraphSpec
from ..model.layout import BackendLayout
from ..model.scenario import Scenario, SchedParams, Step
from ..model.versions import BINDING_OWN
from ..profiles import FuzzConfig
from ..properties import LLAMA_GROUP, LLAMA_PROPERTY_IDS, PROPERTY_IDS
from ..sim.models import ModelShape, llama_graph
from .flake import flake
from .flake import report_lines as flake_lines
from .rediscovery import against_lines, load_rediscovery, rediscovery
from .rediscovery import report_lines as rediscovery_lines

LAYERS = (4, 8, 16, 32)  # about 1k, 2k, 4k and 8k nodes
PLANTED = {
    "policy ignores op_offload": ({"policy": "planted:ignore_op_offload"}, "reuse-sound"),
    "policy never reuses": ({"policy": "planted:never"}, "reuse-complete"),
    "policy ignores max_nodes": ({"policy": "planted:ignore_max_nodes"}, "reuse-sound"),
    "driver without re-reservation": ({"rereserve": False}, "no-same-size-realloc"),
    "reference without pass 2": ({"reference": "planted:predict_without_pass2"}, "matches-reference"),
}


def scaling_scenario(n_layer: int) -> Scenario:
    """A llama-like graph of ``n_layer`` layers: attention weights on two RPC devices (half the
    layers each), FFN weights on the CPU (two splits per layer, like ``-ncmoe``), 215 extra
    elementwise ops per layer: 32 layers give about 8,000 nodes and 66 splits."""
    layers = tuple(0 if i < n_layer // 2 else 1 for i in range(n_layer))
    m = ModelShape(layer_devices=layers, output_device=1, cpu_device=2, ffn_devices=(2,) * n_layer, extra_ops=215)
    g = llama_graph(m, 32, 256)
    steps = (Step("sched_new", params=SchedParams(65536)), Step("reserve", "g"), Step("alloc", "g"))
    return Scenario(BackendLayout.of("rpc", "rpc", "cpu"), (("g", g),), steps)


def _engine_seconds(target: GgmlTarget, sc: Scenario) -> float:
    trace = target.run(sc)
    if trace.abort:
        raise RuntimeError(f"the engine aborted while benchmarking: {trace.abort.message}")
    return sum(r.seconds for r in trace.records)


def _reference_seconds(sc: Scenario) -> float:
    """``predict`` of the whole scenario: building the graph, then reserve and alloc (of a fresh
    copy: the reference keeps a spec's graph with the spec)."""
    fresh = _as_drawn(sc)
    t = time.perf_counter()
    predict(fresh)
    return time.perf_counter() - t


def _reference_schedule_seconds(sc: Scenario) -> float:
    """The reference's reserve + alloc of an already built graph: what the engine is timed on
    (its graph is built before the timer starts too)."""
    g = CGraph.build(sc.graph("g"))
    step = sc.steps[0]
    assert step.params is not None
    with gc_paused():  # as predict does
        t = time.perf_counter()
        sched = Scheduler(sc.layout, step.params)
        sched.reserve(g)
        sched.alloc_graph(g, 2)
        return time.perf_counter() - t


def build_release(dest: Path) -> Path:
    """Build ggml-python 0.0.45 (same ggml) as a Release library into ``dest``; its lib dir."""
    lib = dest / "ggml" / "lib"
    if not (lib / "libggml-base.so").exists():
        subprocess.run(
            # --no-cache-dir: pip would reuse a cached wheel of another build type
            [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-deps", "--no-binary", "ggml-python", "--target", str(dest),
             "ggml-python==0.0.45", "--config-settings=cmake.build-type=Release", "--config-settings=cmake.define.GGML_RPC=ON"],
            check=True,
        )
    return lib


def scaling(repeats: int, release_lib: str | None) -> dict[str, Any]:
    # the Release build is ggml-python's (0.15.3): time it against the same ggml in Debug
    engines = {"debug": GgmlTarget(lib=BINDING_OWN if release_lib else None, bare=True)}
    if release_lib:
        engines["release"] = GgmlTarget(lib=release_lib, bare=True)
    rows = []
    try:
        for n_layer in LAYERS:
            sc = scaling_scenario(n_layer)
            g = sc.graph("g")
            for target in engines.values():
                _engine_seconds(target, sc)  # warm up: servers, worker, persistent tensors
            # each repetition times the reference and then every engine, so that the machine's
            # slower and faster moments fall on all of them alike
            timed: dict[str, list[float]] = {"reference_predict": [], "reference": [], **{name: [] for name in engines}}
            for _ in range(repeats):
                timed["reference_predict"].append(_reference_seconds(sc))
                timed["reference"].append(_reference_schedule_seconds(sc))
                for name, target in engines.items():
                    timed[name].append(_engine_seconds(target, sc))
            row: dict[str, Any] = {"layers": n_layer, "nodes": g.n_ops, "splits": predict(sc).records[1].n_splits}
            row.update({f"{name}_s": statistics.median(times) for name, times in timed.items()})
            for name in engines:
                row[f"ratio_{name}"] = row["reference_s"] / row[f"{name}_s"]
            rows.append(row)
    finally:
        for t in engines.values():
            t.close()
    out: dict[str, Any] = {"rows": rows, "release": release_lib}
    first, last = rows[0], rows[-1]
    for name in ["reference", *engines]:
        key = f"{name}_s"
        out[f"per_node_growth_{name}"] = (last[key] / last["nodes"]) / (first[key] / first["nodes"])
    return out


def overhead(repeats: int) -> dict[str, Any]:
    """A full fuzzing step (engine with observation + reference + properties, in the pytest
    process) against the bare engine calls of the same scenario."""
    m = ModelShape(layer_devices=(0, 0, 1, 1), output_device=1, cpu_device=1)
    graphs = tuple((f"T{t}", llama_graph(m, t, 64)) for t in (32, 8, 1))
    steps = (Step("sched_new", params=SchedParams(4096)), Step("reserve", "T32"), Step("alloc", "T8"), Step("alloc", "T1"), Step("alloc", "T32"))
    sc = Scenario(BackendLayout.of("rpc", "cpu"), graphs, steps)
    fuzzer = Fuzzer(FuzzConfig(database=None))
    bare = GgmlTarget(bare=True)
    try:
        fuzzer.check("matches-reference", sc)
        _engine_seconds(bare, sc)

        def full() -> float:
            fresh = _as_drawn(sc)
            t = time.perf_counter()
            fuzzer.check("matches-reference", fresh)
            return time.perf_counter() - t

        # alternately, as the scaling rows are timed
        steps, engines = zip(*((full(), _engine_seconds(bare, sc)) for _ in range(repeats)))
        step, engine = statistics.median(steps), statistics.median(engines)
        parts = [_phases(fuzzer, _as_drawn(sc)) for _ in range(repeats)]
    finally:
        fuzzer.close()
        bare.close()
    phases = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    phases["properties, ggml's figures and reruns"] = max(0.0, step - phases.pop("round trip") - phases["reference"])
    return {"step_s": step, "engine_s": engine, "ratio": step / engine, "nodes": sum(g.n_ops for _, g in graphs), "phases_s": phases}


def _as_drawn(sc: Scenario) -> Scenario:
    """A new scenario equal to ``sc``, as Hypothesis draws one: its graphs' geometry inferred (as
    ``GraphBuilder`` does while drawing), nothing else computed yet (no validation, JSON, program,
    reference graph), so that a timed step pays for all of it as every example does."""
    graphs = []
    for name, g in sc.graphs:
        copy = GraphSpec(g.tensors, g.roots, g.forced, g.label)
        copy.__dict__["geometry"] = g.geometry
        graphs.append((name, copy))
    return Scenario(sc.layout, tuple(graphs), sc.steps)


def _phases(fuzzer: Fuzzer, sc: Scenario) -> dict[str, float]:
    """Where a full step's time goes: the worker's round trip (its ggml calls, with ggml's debug
    log parsed as it is printed; building the graphs (their programs encoded, graph.c); the rest: reading the
    assignments and splits, the values check, the pipe and JSON both ways), and the reference.
    What a full step spends beyond these is the properties' judging and ggml's own figures."""
    t0 = time.perf_counter()
    trace = fuzzer.engines.run(sc, values=False)  # as matches-reference runs it
    t1 = time.perf_counter()
    fuzzer.predict(sc)
    t2 = time.perf_counter()
    ggml = sum(r.seconds for r in trace.records)
    build = sum(r.build_seconds for r in trace.records)
    return {"round trip": t1 - t0, "ggml calls (debug log parsed as printed)": ggml, "graph build (program encoding, graph.c)": build,
            "worker's observation, values check, pipe and JSON": max(0.0, t1 - t0 - ggml - build), "reference": t2 - t1}


def examples_per_second(examples: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for profile in ("dev", "ci"):
        fuzzer = Fuzzer(FuzzConfig(profile=profile, database=None, budget=1e9))
        # as under pytest: known engine bugs of the corpus are counted, not shrunk again
        fuzzer.known.learn(Path(__file__).resolve().parents[2] / "corpus")
        row = {}
        try:
            for prop in PROPERTY_IDS:
                before = fuzzer.stats.examples
                t = time.perf_counter()
                fuzzer.fuzz(prop, examples)
                row[prop] = (fuzzer.stats.examples - before) / (time.perf_counter() - t)
        finally:
            fuzzer.close()
        out[profile] = row
    return out


def time_to_failure(seeds: int) -> dict[str, dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    out = {}
    for name, (kw, prop) in PLANTED.items():
        times = []
        for s in range(1, seeds + 1):
            fuzzer = Fuzzer(FuzzConfig(seed=s, database=None, examples=500, **kw))
            try:
                finding = fuzzer.fuzz(prop)
            finally:
                fuzzer.close()
            times.append(fuzzer.first_failure if finding is not None and fuzzer.first_failure is not None else float("inf"))
        out[name] = {"property": prop, "median_s": statistics.median(times), "found": sum(t != float("inf") for t in times), "seeds": seeds}
    return out


def llama(examples: int, seeds: int) -> dict[str, Any]:
    """The llama.cpp properties: workloads and decodes per second with the corpus's known bugs
    (as under pytest), each alone and all at once (``LLAMA_GROUP``, as the ci profile runs them),
    and the time to the first same-size finding from nothing known."""
    fuzzer = Fuzzer(FuzzConfig(profile="ci", database=None, budget=1e9))
    fuzzer.known.learn(Path(__file__).resolve().parents[2] / "corpus")
    rates: dict[str, dict[str, float]] = {}
    try:
        # and the unit the ci profile runs: one run of each workload judged by every property
        for prop in (*LLAMA_PROPERTY_IDS, LLAMA_GROUP):
            before = fuzzer.stats.as_dict()
            t = time.perf_counter()
            fuzzer.fuzz(prop, examples)
            wall = time.perf_counter() - t
            d = fuzzer.stats.delta(before)
            rates[prop] = {"workloads_per_s": d["llama_workloads"] / wall, "decodes_per_s": d["llama_decodes"] / wall}
    finally:
        fuzzer.close()
    times = []
    for seed in range(1, seeds + 1):
        fuzzer = Fuzzer(FuzzConfig(profile="ci", seed=seed, database=None, budget=1e9, examples=1000))
        try:
            finding = fuzzer.fuzz("llama-no-same-size-realloc")
        finally:
            fuzzer.close()
        times.append(fuzzer.first_failure if finding is not None and fuzzer.first_failure is not None else float("inf"))
    return {"rates": rates, "first_same_size_median_s": statistics.median(times), "found": sum(t != float("inf") for t in times), "seeds": seeds}


def xdist(examples: int) -> dict[str, Any]:
    # no-abort is left out: it finds the known RPC server crash, and shrinking that (one worker
    # restart per abort) would dominate the figure
    props = "matches-reference,no-same-size-realloc,reuse-equivalent"
    out: dict[str, Any] = {}
    for n in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "pytest", "--schedfuzz", "-p", "no:cacheprovider", "-n", str(n), "-q", "--schedfuzz-seed", "5",
                 "--schedfuzz-examples", str(examples), "--schedfuzz-properties", props, "--schedfuzz-corpus", "corpus",
                 "--schedfuzz-report", "report.json"],
                cwd=d, capture_output=True, text=True,
            )
            wall = time.perf_counter() - t
            report = Path(d) / "report.json"
            done = json.loads(report.read_text())["stats"]["examples"] if report.is_file() else 0
            out[f"n{n}"] = {"examples": done, "wall_s": wall, "examples_per_s": done / wall}
    out["speedup"] = out["n2"]["examples_per_s"] / out["n1"]["examples_per_s"]
    return out


CI_FOLDER = ".schedfuzz/bench-ci"  # the ci section's run: its corpus (new findings saved there) and report


def ci_rate(budget: float, lib: str | None) -> dict[str, Any]:
    """The ci job (seed 0, ``-n 2``; its counts, capped at ``budget`` seconds): examples, llama.cpp
    workloads, CPU seconds of the whole process tree, and what it found (new signatures, known
    ones seen again)."""
    corpus = Path(__file__).resolve().parents[2] / "corpus"
    d = Path(CI_FOLDER)  # kept: a new finding's case is in its corpus/ (and the run's report)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copytree(corpus, d / "corpus")
    (d / "pytest.ini").write_text("[pytest]\n")  # its own rootdir, not the checkout's (``flake.ci_job``)
    cmd = [sys.executable, "-m", "pytest", "--schedfuzz", "--schedfuzz-profile=ci", f"--schedfuzz-budget={budget:g}", "--schedfuzz-seed=0",
           "-m", "schedfuzz", "-n", "2", "-q", "-p", "no:cacheprovider", "--schedfuzz-corpus", "corpus", "--schedfuzz-report", "report.json",
           *([f"--schedfuzz-lib={lib}"] if lib else [])]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    report = d / "report.json"
    if not report.is_file():
        raise RuntimeError(f"the ci run ({' '.join(cmd)}) wrote no report (exit status {os.waitstatus_to_exitcode(status)})")
    r = json.loads(report.read_text())
    cpu = usage.ru_utime + usage.ru_stime
    stats = r["stats"]
    return {"budget_s": budget, "wall_s": wall, "cpu_s": cpu, "examples": stats["examples"], "llama_workloads": stats["llama_workloads"],
            "examples_per_cpu_s": stats["examples"] / cpu, "new": sorted(f["signature"] for f in r["new_findings"]),
            "known": sorted(k["signature"] for k in r["known_seen_again"])}


SECTIONS = ("scaling", "overhead", "examples", "failure", "xdist", "llama", "ci", "flake", "rediscovery")
ALL = SECTIONS[:-3]  # "all": ci, flake and rediscovery only when named, they run whole ci jobs


def run(
    repeats: int = 5, release_lib: str | None = None, examples: int = 20, seeds: int = 5, sections: str = "all", xdist_examples: int = 500,
    ci_budget: float = 600.0, lib: str | None = None, flake_seeds: tuple[int, ...] = (0, 0, 1, 2, 3),
    cpu_seconds: float = 600.0, llama_libs: tuple[str | None, ...] = (None,),
) -> dict[str, Any]:
    chosen = set(sections.split(",")) if sections != "all" else set(ALL)
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise ValueError(f"--sections: unknown {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
    results: dict[str, Any] = {}
    if "llama" in chosen:
        results["llama"] = llama(max(examples, 100), seeds)
    if "scaling" in chosen:
        results["scaling"] = scaling(repeats, release_lib)
    if "overhead" in chosen:
        results["overhead"] = overhead(repeats)
    if "examples" in chosen:
        results["examples_per_s"] = examples_per_second(examples)
    if "failure" in chosen:
        results["time_to_first_failure"] = time_to_failure(seeds)
    if "xdist" in chosen:
        results["xdist"] = xdist(xdist_examples)
    if "ci" in chosen:
        results["ci"] = ci_rate(ci_budget, lib)
    if "flake" in chosen:
        results["flake"] = flake(flake_seeds, ci_budget)
    if "rediscovery" in chosen:
        results["rediscovery"] = rediscovery(tuple(range(seeds)), cpu_seconds, lib, llama_libs)
    return results


def report(r: dict[str, Any]) -> str:
    lines = [f"reference = {compiled.status}"]
    if "scaling" in r:
        s = r["scaling"]
        lines.append("reference / engine, reserve + alloc of a built llama-like graph (median; predict = build + reserve + alloc):")
        lines.append(f"  {'layers':>6} {'nodes':>6} {'splits':>6} {'predict':>9} {'reference':>10} {'debug':>9} {'ref/debug':>9}" + (f" {'release':>9} {'ref/rel':>8}" if s["release"] else ""))
        for row in s["rows"]:
            line = (f"  {row['layers']:>6} {row['nodes']:>6} {row['splits']:>6} {row['reference_predict_s'] * 1e3:>7.1f}ms {row['reference_s'] * 1e3:>8.1f}ms "
                    f"{row['debug_s'] * 1e3:>7.1f}ms {row['ratio_debug']:>8.1f}x")
            if s["release"]:
                line += f" {row['release_s'] * 1e3:>7.1f}ms {row['ratio_release']:>7.1f}x"
            lines.append(line)
        growth = ", ".join(f"{k.removeprefix('per_node_growth_')} {v:.2f}x" for k, v in s.items() if k.startswith("per_node_growth_"))
        lines.append(f"  per-node cost, {LAYERS[-1]} layers vs {LAYERS[0]}: {growth}")
    if "overhead" in r:
        o = r["overhead"]
        lines.append(f"harness overhead: full step {o['step_s'] * 1e3:.1f} ms / bare engine calls {o['engine_s'] * 1e3:.1f} ms = {o['ratio']:.1f}x ({o['nodes']} nodes)")
        lines += [f"  {name:<52} {s * 1e3:7.1f} ms  {s / o['engine_s']:6.1f}x the bare calls" for name, s in o.get("phases_s", {}).items()]
    if "examples_per_s" in r:
        lines.append("examples per second:")
        for profile, row in r["examples_per_s"].items():
            lines.append(f"  {profile:>4}: " + ", ".join(f"{p} {v:.1f}" for p, v in row.items()))
    if "time_to_first_failure" in r:
        lines.append("time to first failure (median over seeds):")
        for name, v in r["time_to_first_failure"].items():
            lines.append(f"  {name:<32} {v['property']:<22} {v['median_s']:.2f} s ({v['found']}/{v['seeds']} seeds)")
    if "llama" in r:
        ll = r["llama"]
        lines.append("llama.cpp properties (ci profile, known bugs of the corpus loaded):")
        for prop, v in ll["rates"].items():
            lines.append(f"  {prop:<28} {v['workloads_per_s']:.1f} workloads/s, {v['decodes_per_s']:.1f} decodes/s")
        lines.append(f"  first same-size finding, nothing known: median {ll['first_same_size_median_s']:.2f} s ({ll['found']}/{ll['seeds']} seeds)")
    if "xdist" in r:
        x = r["xdist"]
        lines.append(f"xdist: -n 1 {x['n1']['examples_per_s']:.1f} ex/s, -n 2 {x['n2']['examples_per_s']:.1f} ex/s: {x['speedup']:.2f}x")
    if "ci" in r:
        c = r["ci"]
        lines.append(f"ci job ({c['budget_s']:g} s cap, -n 2, seed 0): {c['examples']} examples ({c['llama_workloads']} llama.cpp workloads) "
                     f"in {c['cpu_s']:.0f} CPU-s ({c['wall_s']:.0f} s wall): {c['examples_per_cpu_s']:.2f} examples per CPU-second")
        lines.append(f"  new: {len(c['new'])} " + " ".join(c["new"]) + (f" (saved in {CI_FOLDER}/corpus)" if c["new"] else ""))
        lines.append(f"  known seen again: {len(c['known'])} signatures")
    if "flake" in r:
        lines += flake_lines(r["flake"])
    if "rediscovery" in r:
        lines += rediscovery_lines(r["rediscovery"])
    return "\n".join(lines)


def main(args: Any) -> int:
    release = args.release_lib
    if args.build_release:
        release = str(build_release(Path(args.build_release)))
    try:
        seeds = tuple(int(s) for s in args.flake_seeds.split(","))
        results = run(args.repeats, release, args.examples, args.seeds, args.sections, args.xdist_examples, args.ci_budget, args.lib, seeds,
                      args.cpu_seconds, tuple(args.llama_lib or (None,)))
    except ValueError as e:
        print(f"schedfuzz bench: {e}", file=sys.stderr)
        return 2
    text = report(results)
    if args.against and "rediscovery" in results:
        try:
            text += "\n" + "\n".join(against_lines(results["rediscovery"], load_rediscovery(Path(args.against))))
        except ValueError as e:
            print(f"schedfuzz bench: --against {args.against}: {e}", file=sys.stderr)
            return 2
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0
