"""What every property is made of: its entry in ``REGISTRY`` (the ids and every list of them
derive from it), ``Violation`` (a finding and its signature), what a
graph property needs observed (``Observed``) and which strategy draws its examples (``Draws``),
and the helpers that name tensors and reasons by role in signatures."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..model.scenario import Scenario
from ..model.trace import Trace


@dataclass(frozen=True)
class PropertyEntry:
    """One property as the rest of the harness knows it: its id, what it checks (one line, for
    help and the docs), its family (``llama``: a property of the real llama.cpp, fuzzed as one
    unit, ``LLAMA_GROUP``), whether it judges the driver's reuse policy alone (``policy``: with
    the built-in policy, the very ``can_reuse`` it judges by, it cannot fail, so it takes a share
    of the time budget only with a user's ``--schedfuzz-policy`` and runs as a few cheap rule
    checks otherwise), and whether a C reproducer shows its findings (``exported``). How a graph
    property is judged and drawn is ``properties.PROPERTIES``; a llama property's judgement
    ``properties.llama.LLAMA_CHECKS`` (or, for the two that need a second run or the captured
    graphs, the fuzzer's)."""

    id: str
    doc: str
    llama: bool = False
    policy: bool = False
    exported: bool = False


REGISTRY: tuple[PropertyEntry, ...] = (
    PropertyEntry("reuse-sound", "the driver reuses a scheduler only where can_reuse(new, current) holds", policy=True),
    PropertyEntry("reuse-complete", "the driver rebuilds no scheduler where can_reuse held", policy=True),
    PropertyEntry("reuse-equivalent", "a reused scheduler behaves like a fresh one with the new parameters", exported=True),
    PropertyEntry("no-same-size-realloc", "no alloc re-plans at an unchanged graph size and backend ids after a sufficient reservation",
                  exported=True),
    PropertyEntry("matches-reference", "ggml's assignment, splits, sizes, events and buffers are the reference's", exported=True),
    PropertyEntry("same-values", "every compute step's values are the CPU backend's alone", exported=True),
    PropertyEntry("no-abort", "valid scenarios never abort, crash or hang ggml", exported=True),
    PropertyEntry("llama-no-same-size-realloc", "no llama.cpp call re-plans at the same size after the context's reservation",
                  llama=True, exported=True),
    PropertyEntry("llama-reuse-sound", "llama.cpp keeps its scheduler only where can_reuse held", llama=True),
    PropertyEntry("llama-reuse-complete", "llama.cpp rebuilds no scheduler where can_reuse held", llama=True),
    PropertyEntry("llama-no-abort", "the context initializes; no abort, crash, hang or decode failure below -1", llama=True, exported=True),
    PropertyEntry("llama-counters-agree", "llama.cpp's n_same/n_diff and ggml's realloc callback agree with the harness", llama=True),
    PropertyEntry("llama-same-logits", "the devices decode the logits the CPU alone decodes", llama=True, exported=True),
    PropertyEntry("llama-matches-reference", "the scheduler inside llama.cpp does what the reference predicts for its captured graphs",
                  llama=True),
)
ENTRIES = {p.id: p for p in REGISTRY}
GRAPH_PROPERTY_IDS = tuple(p.id for p in REGISTRY if not p.llama)
# properties of the real llama.cpp (``llama_properties``): server-like workloads on a llama_context
LLAMA_PROPERTY_IDS = tuple(p.id for p in REGISTRY if p.llama)
PROPERTY_IDS = GRAPH_PROPERTY_IDS + LLAMA_PROPERTY_IDS
POLICY_PROPERTY_IDS = tuple(p.id for p in REGISTRY if p.policy)
EXPORTED_IDS = tuple(p.id for p in REGISTRY if p.exported)


# the llama.cpp properties are fuzzed as one unit: each workload runs once, judged by all of them
LLAMA_GROUP = "llama.cpp"


def is_llama(prop: str) -> bool:
    return prop == LLAMA_GROUP or prop in LLAMA_PROPERTY_IDS


def fuzz_units(properties: Sequence[str], policy: bool = False) -> list[tuple[str, int]]:
    """What to fuzz for ``properties``, each with its weight in a shared time budget: every graph
    property alone (a policy property only with a user's ``policy``, else weight 0), and the
    llama.cpp properties as one ``LLAMA_GROUP`` worth as many shares as it judges properties."""
    graph = [(p, 0 if p in POLICY_PROPERTY_IDS and not policy else 1) for p in properties if not is_llama(p)]
    n_llama = sum(1 for p in properties if p in LLAMA_PROPERTY_IDS)
    return graph + ([(LLAMA_GROUP, n_llama)] if n_llama else [])


@dataclass(frozen=True)
class Violation:
    property: str
    step: int
    message: str
    facts: Mapping[str, object] = field(default_factory=dict)
    # the llama.cpp switch call a lost reservation's signature names (``after set_…``): a rerun
    # without it tells whether it is the cause (``campaign.causes.switches_told_apart``)
    switch: int | None = None

    def signature(self) -> str:
        """Property id plus the minimal distinguishing facts: what a corpus case must keep."""
        keys = ",".join(f"{k}={self.facts[k]}" for k in sorted(self.facts))
        return f"{self.property}[{keys}]"

    def __str__(self) -> str:
        return f"[{self.property}] step {self.step}: {self.message}"


# what a property needs observed; VALUES: its compute steps' values compared with the CPU alone's
# (``ggml.values``: a run without it computes on zeros, with no seed and no CPU-only computation)
ENGINE, REFERENCE, FRESH, VALUES = "engine", "reference", "fresh", "values"


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
    (``strategies.captured``: layouts, forced assignments and parameters drawn anew), in drawn
    ``scenarios`` of steps or in llama.cpp's own order (``workloads``: its reservation, then its
    ubatches)."""

    kind: str  # scenarios | workloads | both
    max_ubatches: int = 4
    min_reconfigures: int = 1
    captured: str = ""  # "" | scenarios | workloads


@dataclass(frozen=True)
class Property:
    """A graph property: its id, what it needs observed, the strategy that draws its examples,
    and its judgement."""

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
