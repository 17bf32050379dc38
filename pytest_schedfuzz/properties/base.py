"""What every property is made of: its entry (``PropertyEntry``: id, docs text, needs, draws,
judge, export), declared in its family's module and collected by ``registry.REGISTRY``, from
which every list of ids derives; ``Violation`` (a finding and its signature), what a graph
property needs observed (``Observed``) and which strategy draws its examples (``Draws``), how a
reproducer shows it (``Export``), and the helpers that name tensors and reasons by role in
signatures."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..model.scenario import Scenario
from ..model.trace import UNOBSERVABLE, Trace

# the llama.cpp properties are fuzzed as one unit: each workload runs once, judged by all of them
LLAMA_GROUP = "llama.cpp"


@dataclass(frozen=True)
class Violation:
    property: str
    step: int
    message: str
    facts: Mapping[str, object] = field(default_factory=dict)
    # the llama.cpp switch call a lost reservation's signature names (``after set_…``): a rerun
    # without it tells whether it is the cause (``campaign.causes.switches_told_apart``)
    switch: int | None = None
    # the call whose re-plan replaced the worst-case reservation's plan (a lost reservation's): a
    # rerun without a switch shows the same cause only where the same call loses it
    lost_at: int | None = None

    def signature(self) -> str:
        """Property id plus the minimal distinguishing facts: what a corpus case must keep."""
        keys = ",".join(f"{k}={self.facts[k]}" for k in sorted(self.facts))
        return f"{self.property}[{keys}]"

    def __str__(self) -> str:
        return f"[{self.property}] step {self.step}: {self.message}"


# what a property needs observed; VALUES: its compute steps' values compared with the CPU alone's
# (``ggml.cpu_values``: a run without it computes on zeros, with no seed and no CPU-only computation)
ENGINE, REFERENCE, FRESH, VALUES = "engine", "reference", "fresh", "values"
# what a llama.cpp property needs beside the workload's run: the same workload's run on the CPU
# alone (``llama_logits.cpu_only``), the run's graphs captured (``cases.capture``)
CPU_ONLY, CAPTURED = "cpu-only", "captured"
# ... those that cost more than the run they judge (the capture predicted by the reference, a second
# run): a campaign on time has them judge one workload in SAMPLE, the others judging every one
# (``campaign.judging``); a replay, a shrink and a confirmation judge with every judge
COSTLY = frozenset({CPU_ONLY, CAPTURED})
SAMPLE = 4


@dataclass(frozen=True)
class Observed:
    """What a property judges; a part its ``needs`` did not ask for is an empty trace."""

    trace: Trace = Trace(())  # the engine's run of the scenario
    prediction: Trace = Trace(())  # the reference's prediction for it
    fresh: Trace = Trace(())  # the engine's run of ``fresh_variant(scenario)``


@dataclass(frozen=True)
class Draws:
    """Which strategy draws a property's examples (``campaign.fuzz.Fuzzer.strategy`` builds it
    with the profile's sizes): raw ``scenarios``, driver ``workloads`` (played by the simulated
    ``llama_context``, with at most ``max_ubatches`` ubatches and at least ``min_reconfigures``
    reconfigurations), or ``both``; with ``captured``, llama.cpp's own graphs too
    (``strategies.captured_graphs``: layouts, forced assignments and parameters drawn anew), in drawn
    ``scenarios`` of steps or in llama.cpp's own order (``workloads``: its reservation, then its
    ubatches)."""

    kind: str  # scenarios | workloads | both
    max_ubatches: int = 4
    min_reconfigures: int = 1
    captured: str = ""  # "" | scenarios | workloads


@dataclass(frozen=True)
class Export:
    """How a C reproducer (``schedfuzz export``) shows a property's finding: which of the
    exporter's C verdicts decides that it reproduces (``verdict``: for a graph property
    ``realloc``, ggml's own ``GGML_SCHED_DEBUG_REALLOC`` check; ``death``, an abort or a signal;
    ``values``, bytes that differ from the CPU alone's; ``reference``, what ggml did against the
    reference's prediction; ``fresh``, a reused scheduler against a fresh one; for a llama.cpp
    property ``realloc``, ``death`` or ``logits``, the logits against the CPU-only run's), what
    ``REPORT.md`` says shows it (``shown_by``: for a llama.cpp property a format string of the
    case's ``step`` and the logits' ``tolerance``), and, for a comparing verdict, which of the
    findings' ``what`` ggml's public API lets a program observe (``observable``)."""

    verdict: str
    shown_by: str
    observable: tuple[str, ...] = ()


@dataclass(frozen=True)
class PropertyEntry:
    """One property, whole: its id, what it checks (``doc``: one line, for help and the docs),
    what it needs observed (``needs``: of ``ENGINE``, ``REFERENCE``, ``FRESH``, ``VALUES`` for a
    graph property; ``CPU_ONLY``, ``CAPTURED`` for a llama.cpp one), which strategy draws its
    examples (``draws``: a graph property's), its judgement (``judge``: a graph property's
    ``judge(scenario, observed)``, a llama.cpp property's ``judge(workload, trace)``; None where
    the fuzzer judges it, with a second run or the captured graphs), its family (``llama``: a
    property of the real llama.cpp, fuzzed as one unit, ``LLAMA_GROUP``), whether it judges the
    driver's reuse policy alone (``policy``: with the built-in policy, the very ``can_reuse`` it
    judges by, it cannot fail, so it takes a share of the time budget only with a user's
    ``--schedfuzz-policy`` and runs as a few cheap rule checks otherwise), how a C reproducer
    shows its findings (``export``; None: none does), and, for a llama.cpp property, the graph
    property its findings are seen by at the ggml level, on its captured graphs (``seen_as``;
    "": matches-reference).

    Each family module declares its entries beside its judges (``ENTRIES``); ``registry.REGISTRY``
    collects them in a fixed order, and every list of ids is a view of it."""

    id: str
    doc: str
    needs: frozenset[str] = frozenset()
    draws: Draws | None = None
    judge: Callable[..., list[Violation]] | None = None
    llama: bool = False
    policy: bool = False
    export: Export | None = None
    seen_as: str = ""

    @property
    def exported(self) -> bool:
        return self.export is not None


@dataclass(frozen=True)
class Property:
    """A graph property as the fuzzer runs it (``properties.PROPERTIES``, a view of the graph
    entries of the registry): its id, what it needs observed, the strategy that draws its
    examples, and its judgement, none of them missing."""

    id: str
    needs: frozenset[str]
    draws: Draws
    judge: Callable[[Scenario, Observed], list[Violation]]


def role(name: str) -> str:
    """A tensor's name without its layer or copy numbers, and without the backend that holds a
    scheduler's input copy (engine and reference name backends differently):
    ``ffn_moe_gate-1`` -> ``ffn_moe_gate-N``, ``RPC0[127.0.0.1:5]#kv1#2`` -> ``copy of kvN``."""
    m = re.match(r".*#(.+)#\d+$", name)
    if m:
        return f"copy of {role(m.group(1))}"
    return re.sub(r"\d+", "N", name)


def reason_kind(reason: str) -> str:
    """ggml's reallocation reason reduced to what separates root causes.

    >>> reason_kind("src 1 (CPU#inp_pos#0) of node rope-3 is not valid")
    'src copy of inp_pos of rope-N'
    """
    if reason in ("different number of nodes", "different number of leafs", "backend ids changed"):
        return reason.split()[-1]
    m = re.match(r"node (.+) is not valid$", reason)
    if m:
        return f"node {role(m.group(1))}"
    m = re.match(r"src (\d+) \((.+)\) of node (.+) is not valid$", reason)
    if m:
        return f"src {role(m.group(2))} of {role(m.group(3))}"
    return reason or "unknown"


# BACKEND#tensor#copy: a backend's name (``RPC0[host:port]`` on the engine), a tensor name (llama.cpp's
# have spaces and parentheses: ``rs_s_copy (view)``), the copy's index
_COPY = re.compile(r"[A-Z][A-Za-z0-9_]*(?:\[[^\]\s]*\])?#(.+?)#(\d+)")


def normalize_reason(reason: str) -> str:
    """Input copies are named ``BACKEND#src#copy``; backend names differ between the engine
    (``RPC[host:port]``) and the reference, so compare them without the backend."""
    return _COPY.sub(r"*#\1#\2", reason)


def reasons_agree(engine: str, reference: str) -> bool:
    """The engine's and the reference's reasons for one re-plan agree: equal without the backend
    names, or the engine's unobservable (a Release build logs none: its callback tells the decision
    alone, which is compared on its own)."""
    return engine == UNOBSERVABLE or normalize_reason(engine) == normalize_reason(reference)


def told_reason(engine: str, reference: str | None) -> str:
    """The reason a signature names a re-plan by: the engine's, or, where a Release build cannot
    tell it, the reference's prediction for the same re-plan (derived: ``reasons_agree`` held)."""
    return reference if engine == UNOBSERVABLE and reference is not None else engine
