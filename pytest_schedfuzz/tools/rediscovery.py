"""The rediscovery benchmark (``schedfuzz bench --sections rediscovery``): from an empty known
list, how soon the ci profile finds the starter corpus's causes again, in CPU-seconds of the whole
process tree, seed by seed, as fuzzing benchmarks measure time to each known bug.

A cause is a signature of a starter-corpus case known on the build (the rule known bugs are
learnt by: ``Case.expected_failure_on`` at the ggml version that runs the case, and for a
llama.cpp case its builds). The causes the ci profile cannot draw (``undrawable``: more devices,
calls or layers than its bounds) are listed apart and not counted in N.

Each seed is one ``pytest --schedfuzz --schedfuzz-profile=ci --schedfuzz-known=none
--schedfuzz-keep-going`` in an empty folder, with ``-n 2``, on a wall budget of its CPU budget
over the two workers (keep-going on a budget is the mode that runs on time). Every process appends
each signature it sees first to a sightings file (``--schedfuzz-sightings``); ``TreeClock`` samples
the CPU time of every process the run started (workers, fork servers, RPC servers: in sessions of
their own, so found by parentage and by an environment tag, not by process group) and gives each
sighting the tree's CPU-seconds at that moment. A cause seen after the CPU budget, or never,
counts as the whole budget.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cases.corpus import STARTER_CORPUS, Case, CaseError, case_files, load_case
from ..profiles import PROFILES, Profile

TAG_ENV = "SCHEDFUZZ_BENCH_TAG"
WORKERS = 2  # -n 2: the wall budget is the CPU budget over them
TICK = os.sysconf("SC_CLK_TCK")


class TreeClock:
    """The CPU-seconds (user and system) of every process of one run: those whose environment
    holds the run's tag and their descendants, each counted at the most it was seen to have used
    (a process that has exited keeps its last sample; one shorter than a sample is missed)."""

    def __init__(self, tag: str, root: int) -> None:
        self.marker = f"{TAG_ENV}={tag}".encode()
        self.root = root
        self.used: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU-seconds
        self.samples: list[tuple[float, float]] = []  # (wall time, the tree's CPU-seconds)

    def sample(self) -> float:
        stats: dict[int, tuple[int, int, float]] = {}  # pid -> (parent, start, CPU-seconds)
        tagged: set[int] = {self.root}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if self.marker in Path(f"/proc/{pid}/environ").read_bytes():
                    tagged.add(pid)
            except OSError:  # gone, or not ours to read
                continue
            # after the command's name: state, ppid, ... utime (14th field of the line), stime, ..., starttime (22nd)
            stats[pid] = (int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICK)
        inside = set(tagged) & set(stats)
        grew = True
        while grew:
            more = {pid for pid, (parent, _, _) in stats.items() if parent in inside} - inside
            inside |= more
            grew = bool(more)
        for pid in inside:
            _, start, cpu = stats[pid]
            self.used[(pid, start)] = max(self.used.get((pid, start), 0.0), cpu)
        total = sum(self.used.values())
        self.samples.append((time.time(), total))
        return total

    def at(self, wall: float) -> float:
        """The tree's CPU-seconds at the first sample taken at or after ``wall``."""
        i = bisect_left(self.samples, (wall, -1.0))
        return self.samples[min(i, len(self.samples) - 1)][1]


@dataclass(frozen=True)
class Cause:
    """A root cause of the starter corpus on one build: its signature and the cases that hold it."""

    signature: str
    cases: tuple[str, ...]
    undrawable: str = ""  # why the ci profile cannot draw any of its cases ("": it can)


def undrawable(case: Case, profile: Profile) -> str:
    """Why ``profile``'s strategies cannot draw ``case`` ("" where they can): a layout with more
    devices of a kind than its limits, or a llama.cpp workload with more calls or layers than it
    draws (its devices are within what any workload may hold, which is what the profile draws)."""
    if case.llama is not None:
        w = case.llama
        if len(w.calls) > profile.llama_calls:
            return f"{len(w.calls)} calls (the profile draws up to {profile.llama_calls})"
        if w.model.n_layer > profile.llama_layers:
            return f"{w.model.n_layer} layers (the profile draws up to {profile.llama_layers})"
        return ""
    if case.scenario is not None:
        for kind, n in Counter(b.kind for b in case.scenario.layout.backends if not b.device.host).items():
            if n > profile.devices[kind]:
                return f"{n} {kind} devices (the profile draws up to {profile.devices[kind]})"
    return ""


def causes(graph_version: str | None, llama_version: str | None, llama_build: str | None, profile: Profile,
           corpus: Path = STARTER_CORPUS) -> list[Cause]:
    """The starter corpus's causes known on this build, in signature order."""
    by_sig: dict[str, list[Case]] = {}
    for path in case_files(corpus):
        try:
            case = load_case(path)
        except CaseError:
            continue
        llama = case.llama is not None
        if case.expected_failure_on(llama_version if llama else graph_version, llama_build if llama else None) is not None:
            by_sig.setdefault(case.signature, []).append(case)
    out = []
    for sig, cases in sorted(by_sig.items()):
        why = [undrawable(c, profile) for c in cases]
        out.append(Cause(sig, tuple(c.path.name for c in cases if c.path is not None), "" if "" in why else why[0]))
    return out


@dataclass
class SeedRun:
    """One seed's run: the CPU-seconds it used, when each signature was first seen, its facts."""

    seed: int
    cpu_s: float
    wall_s: float
    first_seen: dict[str, float] = field(default_factory=dict)  # signature -> CPU-seconds
    ran: dict[str, Any] = field(default_factory=dict)  # the report's "ran"
    exit_status: int = 0


def run_seed(seed: int, cpu_seconds: float, lib: str | None, llama_lib: str | None) -> SeedRun:
    """One ci-profile campaign from an empty known list, stopped at ``cpu_seconds`` of its tree."""
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="schedfuzz-rediscovery-") as tmp:
        d = Path(tmp)
        (d / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: no checkout's corpus or conftest
        sightings = d / "sightings.jsonl"
        cmd = [sys.executable, "-m", "pytest", "--schedfuzz", "--schedfuzz-profile=ci", "--schedfuzz-known=none", "--schedfuzz-keep-going",
               f"--schedfuzz-seed={seed}", f"--schedfuzz-budget={cpu_seconds / WORKERS:g}", f"--schedfuzz-sightings={sightings}",
               "--schedfuzz-report=report.json", "-m", "schedfuzz", "-n", str(WORKERS), "-q", "-p", "no:cacheprovider",
               *([f"--schedfuzz-lib={lib}"] if lib else []), *([f"--schedfuzz-llama-lib={llama_lib}"] if llama_lib else [])]
        start = time.time()
        proc = subprocess.Popen(cmd, cwd=d, env={**os.environ, TAG_ENV: tag}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        clock = TreeClock(tag, proc.pid)
        stop = threading.Event()

        def sampler() -> None:
            while not stop.wait(0.25):
                if clock.sample() >= cpu_seconds * 1.1:  # past the budget (a slow end): stopped, as a user's Ctrl-C would
                    os.killpg(proc.pid, signal.SIGINT)
                    return

        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        status = proc.wait()
        stop.set()
        thread.join()
        total = clock.sample()
        first: dict[str, float] = {}
        if sightings.is_file():
            for line in sightings.read_text().splitlines():
                seen = json.loads(line)
                cpu = clock.at(seen["t"])
                first[seen["signature"]] = min(first.get(seen["signature"], cpu), cpu)
        report = d / "report.json"
        ran = json.loads(report.read_text())["ran"] if report.is_file() else {}
        return SeedRun(seed, total, time.time() - start, first, ran, status)


def rediscovery(seeds: Sequence[int], cpu_seconds: float, lib: str | None, llama_libs: Sequence[str | None]) -> dict[str, Any]:
    """Each build's table: causes rediscovered K of N, the median CPU-seconds to first sight (a
    cause never seen within the budget counts as the budget), those never seen, and the causes
    the profile cannot draw."""
    profile = PROFILES["ci"]
    out: dict[str, Any] = {"cpu_seconds": cpu_seconds, "seeds": list(seeds), "builds": {}}
    for llama_lib in llama_libs:
        runs = [run_seed(s, cpu_seconds, lib, llama_lib) for s in seeds]
        ran = next((r.ran for r in runs if r.ran), {})
        llama = ran.get("llama.cpp") or {}
        found = causes(ran.get("ggml", {}).get("ggml_version"), llama.get("ggml_version"), llama.get("llama_build"), profile)
        counted = [c for c in found if not c.undrawable]
        per_seed = []
        for r in runs:
            times = {c.signature: t for c in counted if (t := r.first_seen.get(c.signature, cpu_seconds + 1)) <= cpu_seconds}
            per_seed.append({"seed": r.seed, "cpu_s": r.cpu_s, "wall_s": r.wall_s, "exit_status": r.exit_status, "rediscovered": len(times),
                             "first_seen": times, "other_signatures": sorted(set(r.first_seen) - {c.signature for c in found})})
        ever = {sig for row in per_seed for sig in row["first_seen"]}
        ks = [row["rediscovered"] for row in per_seed]
        to_first = [row["first_seen"].get(c.signature, cpu_seconds) for row in per_seed for c in counted]
        out["builds"][llama_lib or "default"] = {
            "ggml": ran.get("ggml", {}).get("ggml_version"), "llama_build": llama.get("llama_build"), "n": len(counted),
            "k_median": statistics.median(ks) if ks else 0, "k_per_seed": ks, "k_any_seed": len(ever),
            "k_per_cpu_hour": statistics.median(ks) * 3600 / cpu_seconds if ks else 0.0,
            "median_cpu_s_to_first_sight": statistics.median(to_first) if to_first else None,
            "never_seen": sorted(c.signature for c in counted if c.signature not in ever),
            "undrawable": {c.signature: c.undrawable for c in found if c.undrawable}, "seeds": per_seed}
    return out


def report_lines(r: dict[str, Any]) -> list[str]:
    lines = [f"rediscovery: the ci profile from an empty known list, {r['cpu_seconds']:g} CPU-seconds a seed, seeds {r['seeds']}:"]
    for name, b in r["builds"].items():
        lines.append(f"  {name} (ggml {b['ggml']}, llama.cpp {b['llama_build']}): causes rediscovered {b['k_median']:g} of {b['n']} "
                     f"(median over seeds; per seed {b['k_per_seed']}; {b['k_any_seed']} on any seed), {b['k_per_cpu_hour']:.1f} per CPU-hour; "
                     f"median CPU-seconds to first sight {b['median_cpu_s_to_first_sight']:.0f}")
        for row in b["seeds"]:
            lines.append(f"    seed {row['seed']}: {row['rediscovered']} in {row['cpu_s']:.0f} CPU-s ({row['wall_s']:.0f} s wall)"
                         + (f"; other signatures: {len(row['other_signatures'])}" if row["other_signatures"] else ""))
        lines += [f"    never seen: {sig}" for sig in b["never_seen"]]
        lines += [f"    not drawable by ci ({why}): {sig}" for sig, why in b["undrawable"].items()]
    return lines


def load_rediscovery(path: Path) -> dict[str, Any]:
    """The rediscovery section of an earlier ``bench --json`` file; a clear error for anything else."""
    try:
        r = json.loads(path.read_text())["rediscovery"]
        r["builds"], r["seeds"], r["cpu_seconds"]  # noqa: B018 -- what the comparison reads
    except OSError as e:
        raise ValueError(f"cannot read it: {e.strerror or e}") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"not a bench --json file with a rediscovery section ({type(e).__name__}: {e})") from None
    return r


def against_lines(r: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """This run beside ``base`` (an earlier one of the same seeds and budget, another code), build
    by build: the causes per CPU-hour and their ratio, and the causes each found on some seed
    that the other never did."""
    if (base["seeds"], base["cpu_seconds"]) != (r["seeds"], r["cpu_seconds"]):
        raise ValueError(f"seeds {base['seeds']} at {base['cpu_seconds']:g} CPU-seconds, not this run's seeds {r['seeds']} at {r['cpu_seconds']:g}")
    lines = [f"rediscovery beside the earlier run (same seeds {r['seeds']}, {r['cpu_seconds']:g} CPU-seconds a seed):"]
    for name, b in r["builds"].items():
        old = base["builds"].get(name)
        if old is None:
            lines.append(f"  {name}: not in the earlier run")
            continue
        ratio = b["k_per_cpu_hour"] / old["k_per_cpu_hour"] if old["k_per_cpu_hour"] else float("inf")
        lines.append(f"  {name}: {b['k_per_cpu_hour']:.1f} causes per CPU-hour (median {b['k_median']:g} of {b['n']}) against "
                     f"{old['k_per_cpu_hour']:.1f} ({old['k_median']:g} of {old['n']}): {ratio:.2f}x; on any seed {b['k_any_seed']} against {old['k_any_seed']}")
        ever = {sig for row in b["seeds"] for sig in row["first_seen"]}
        before = {sig for row in old["seeds"] for sig in row["first_seen"]}
        lines += [f"    found only now: {sig}" for sig in sorted(ever - before)]
        lines += [f"    found only before: {sig}" for sig in sorted(before - ever)]
    return lines
