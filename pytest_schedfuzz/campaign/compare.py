"""Two llama.cpp builds on the same workloads, compared on what both tell: a port against upstream
(``llama.cpp-0.3.36-seed`` against ``llama.cpp-b11739``), a branch against master.

Not a property: two builds may differ by design. Each difference is put down to its cause, from
what the two runs observed (``Difference.cause``):

* ``graphs differ``: llama.cpp handed the scheduler graphs of other sizes (nodes, leafs) in that
  call: the builds' graph code differs, and so may their decisions;
* ``decision differs``: the same graphs, another realloc decision from ggml's callback (or one
  made on one build only): ggml's scheduler or allocator, or what llama.cpp reserved, differs;
* ``counting differs``: the same decisions, other same/changed counts from llama.cpp: the
  builds' callbacks count otherwise (which events they ignore);
* ``outcome differs``: one build aborted, crashed or failed a call the other made.

Workloads are drawn within what both builds have: RPC devices only where either has no GPU-like
device (``gpu_device``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..model.llama_trace import LlamaTrace, SchedCall
from ..model.llama_workload import LlamaWorkload
from ..properties.derived import llama_trace


@dataclass(frozen=True)
class Step:
    """What one build's scheduler did in one call: each reserve and alloc's graph (nodes, leafs)
    and realloc decision as ggml's callback told it (``-`` none, ``ids`` backend ids changed,
    ``same``/``changed`` graph size), and llama.cpp's counts after the call."""

    graphs: tuple[tuple[int, int], ...]
    decisions: tuple[str, ...]
    counted: tuple[int, int] | None


@dataclass(frozen=True)
class Difference:
    workload: int
    call: int
    cause: str
    a: str
    b: str


def _decision(s: SchedCall) -> str:
    if not s.realloc:
        return "-"
    if not s.observed:
        return "derived-ids" if s.backend_ids_changed else "derived-same" if s.same_size else "derived-changed"
    return "ids" if s.ggml_ids_changed else "same" if s.same_size else "changed"


def steps(trace: LlamaTrace) -> dict[int, Step]:
    """Each call's ``Step``, by call index (-1: creating the context)."""
    out = {}
    for c in trace.calls:
        sched = [s for s in c.sched if s.kind in ("reserve", "alloc")]
        counted = next(((s.llama_n_same, s.llama_n_diff) for s in reversed(c.sched) if s.llama_n_same is not None), None)
        out[c.index] = Step(tuple((s.n_nodes, s.n_leafs) for s in sched), tuple(_decision(s) for s in sched), counted)
    return out


def _outcome(trace: LlamaTrace) -> str:
    if trace.abort is not None:
        return f"{trace.abort.kind} in call {trace.abort.call}"
    failed = [f"call {c.index} rc {c.rc}" for c in trace.calls if c.rc not in (0, "0")]
    return ", ".join(failed) or "ok"


def differences(k: int, a: LlamaTrace, b: LlamaTrace) -> list[Difference]:
    """Where the two runs of workload ``k`` differ, first difference of each call, with its cause."""
    if _outcome(a) != _outcome(b):
        return [Difference(k, -1, "outcome differs", _outcome(a), _outcome(b))]
    sa, sb = steps(a), steps(b)
    out = []
    for call in sorted(set(sa) | set(sb)):
        x, y = sa.get(call), sb.get(call)
        if x is None or y is None:
            out.append(Difference(k, call, "outcome differs", str(x), str(y)))
        elif x.graphs != y.graphs:
            if x.decisions != y.decisions:
                out.append(Difference(k, call, "graphs differ", f"{x.graphs} {x.decisions}", f"{y.graphs} {y.decisions}"))
        elif x.decisions != y.decisions:
            out.append(Difference(k, call, "decision differs", f"{x.graphs} {x.decisions}", f"{y.graphs} {y.decisions}"))
        elif x.counted is not None and y.counted is not None and x.counted != y.counted:
            out.append(Difference(k, call, "counting differs", f"n_same, n_diff = {x.counted}", f"n_same, n_diff = {y.counted}"))
    return out


@dataclass(frozen=True)
class Comparison:
    builds: tuple[str, str]
    workloads: int
    decisions: tuple[Counter[str], Counter[str]]  # realloc decisions over all workloads, per build
    found: tuple[Difference, ...]

    def summary(self) -> list[str]:
        a, b = self.builds
        causes = Counter(d.cause for d in self.found)
        lines = [f"compared {self.workloads} workloads on {a} (A) and {b} (B)",
                 f"realloc decisions A: {dict(sorted(self.decisions[0].items()))}",
                 f"realloc decisions B: {dict(sorted(self.decisions[1].items()))}",
                 f"differences: {len(self.found)} in {len({d.workload for d in self.found})} workloads; by cause: {dict(sorted(causes.items()))}"]
        for d in self.found[:20]:
            lines.append(f"  workload {d.workload} call {d.call}: {d.cause}\n    A: {d.a}\n    B: {d.b}")
        return lines


def compare(targets: tuple[object, object], names: tuple[str, str], workloads: Iterable[LlamaWorkload]) -> Comparison:
    """Run each workload on both targets (``LlamaTarget``) and compare."""
    found: list[Difference] = []
    decisions: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    n = 0
    for k, w in enumerate(workloads):
        runs = [llama_trace(t.run(w)) for t in targets]  # type: ignore[attr-defined]
        for tally, trace in zip(decisions, runs):
            tally.update(d for s in steps(trace).values() for d in s.decisions if d != "-")
        found += differences(k, *runs)
        n += 1
    return Comparison(names, n, decisions, tuple(found))


def drawn(strategy: object, n: int, seed: int) -> Iterator[LlamaWorkload]:
    """``n`` workloads of a Hypothesis strategy, reproducibly from ``seed`` (no shrinking: the
    comparison is a survey, not a search)."""
    import random

    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as with_seed

    out: list[LlamaWorkload] = []

    @with_seed(seed)
    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck), phases=("generate",))
    @given(strategy)  # type: ignore[arg-type]
    def collect(w: LlamaWorkload) -> None:
        out.append(w)

    random.seed(seed)
    collect()
    return iter(out[:n])
