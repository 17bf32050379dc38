"""The properties: pure functions from what was observed of a scenario to violations.

Each violation carries a stable property id, the step where it broke, a one-line message in
the scheduler's own terms, and the facts that make up its failure signature. ``PROPERTIES``
gives every graph property one interface: ``judge(scenario, observed)``, where ``observed``
holds what its ``needs`` asked for (the engine's trace, the reference's prediction, the
engine's run with fresh schedulers). Every property that runs the engine also reports the
run's aborts as ``no-abort`` violations: a crash is a finding whatever was being checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from reference.alloc import KEPT_PLAN
from reference.params import can_reuse

from ..model.scenario import Scenario, SchedParams, Step
from ..model.shapes import VIEW_OPS
from ..model.trace import ReallocEvent, StepRecord, Trace
from ..sim.driver import topology
from .sites import check_site

GRAPH_PROPERTY_IDS = ("reuse-sound", "reuse-complete", "reuse-equivalent", "no-same-size-realloc", "matches-reference", "same-values", "no-abort")
# properties of the real llama.cpp (``llama_properties``): server-like workloads on a llama_context
LLAMA_PROPERTY_IDS = ("llama-no-same-size-realloc", "llama-reuse-sound", "llama-no-abort", "llama-counters-agree", "llama-same-logits")
PROPERTY_IDS = GRAPH_PROPERTY_IDS + LLAMA_PROPERTY_IDS
# the llama.cpp properties are fuzzed as one unit: each workload runs once, judged by all of them
LLAMA_GROUP = "llama.cpp"


def is_llama(prop: str) -> bool:
    return prop == LLAMA_GROUP or prop in LLAMA_PROPERTY_IDS


def fuzz_units(properties: Sequence[str]) -> list[tuple[str, int]]:
    """What to fuzz for ``properties``, each with its weight in a shared time budget: every graph
    property alone, and the llama.cpp properties as one ``LLAMA_GROUP`` worth as many shares as
    it judges properties."""
    graph = [(p, 1) for p in properties if not is_llama(p)]
    n_llama = sum(1 for p in properties if p in LLAMA_PROPERTY_IDS)
    return graph + ([(LLAMA_GROUP, n_llama)] if n_llama else [])


@dataclass(frozen=True)
class Violation:
    property: str
    step: int
    message: str
    facts: Mapping[str, object] = field(default_factory=dict)

    def signature(self) -> str:
        """Property id plus the minimal distinguishing facts: what a corpus case must keep."""
        keys = ",".join(f"{k}={self.facts[k]}" for k in sorted(self.facts))
        return f"{self.property}[{keys}]"

    def __str__(self) -> str:
        return f"[{self.property}] step {self.step}: {self.message}"


ENGINE, REFERENCE, FRESH = "engine", "reference", "fresh"  # what a property needs observed


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
    reconfigurations), or ``both``."""

    kind: str  # scenarios | workloads | both
    max_ubatches: int = 4
    min_reconfigures: int = 1


SCENARIOS = Draws("scenarios")


@dataclass(frozen=True)
class Property:
    """A graph property: its id, what it needs observed, the strategy that draws its examples,
    and its judgement."""

    id: str
    needs: frozenset[str]
    draws: Draws
    judge: Callable[[Scenario, Observed], list[Violation]]


def _schedulers(scenario: Scenario):
    """Yield (index, step, params the current scheduler was built with) for sched_new steps."""
    cur: SchedParams | None = None
    for i, s in enumerate(scenario.steps):
        if s.kind == "sched_new":
            assert s.params is not None
            yield i, s, cur
            if not (s.reuse and cur is not None):
                cur = s.params


def _why_not(new: SchedParams, cur: SchedParams) -> str:
    why = []
    if new.parallel != cur.parallel:
        why.append(f"parallel {cur.parallel} -> {new.parallel}")
    if new.op_offload != cur.op_offload:
        why.append(f"op_offload {cur.op_offload} -> {new.op_offload}")
    if new.max_nodes > cur.max_nodes:
        why.append(f"max_nodes {new.max_nodes} > current {cur.max_nodes}")
    return ", ".join(why)


def reuse_sound(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Every reuse happens only when ``can_reuse(new, cur)`` holds."""
    out = []
    for i, s, cur in _schedulers(scenario):
        assert s.params is not None
        if s.reuse and cur is not None and not can_reuse(s.params, cur):
            why = _why_not(s.params, cur)
            out.append(Violation("reuse-sound", i, f"scheduler reused although can_reuse is false: {why}", {"why": why.split(" ")[0]}))
    return out


def reuse_complete(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """No scheduler is rebuilt when ``can_reuse`` held; the dropped buffers are reported."""
    out = []
    for i, s, cur in _schedulers(scenario):
        assert s.params is not None
        if not s.reuse and cur is not None and can_reuse(s.params, cur):
            sizes = next((r.buffer_sizes for r in reversed(trace.records[:i]) if r.buffer_sizes), ())
            dropped = ", ".join(f"{scenario.layout.name(b)} {n / 2**20:.2f} MiB" for b, n in enumerate(sizes)) or "unknown"
            out.append(
                Violation(
                    "reuse-complete", i,
                    f"scheduler rebuilt for max_nodes={s.params.max_nodes} although the current one "
                    f"(max_nodes={cur.max_nodes}) could be reused; dropped compute buffers: {dropped}",
                    {"rebuilt": True},
                )
            )
    return out


def synchronous_variant(scenario: Scenario) -> Scenario:
    """The same scenario with every GPU-like device computing synchronously: a difference that
    goes away is a race (a missing synchronisation with an asynchronous backend)."""
    backends = tuple(replace(b, asynchronous=False, delay_us=0) if b.asynchronous else b for b in scenario.layout.backends)
    return replace(scenario, layout=replace(scenario.layout, backends=backends))


def _by_cause(v: Violation, scenario: Scenario, only_while: str, cause: str, facts: dict[str, object]) -> Violation:
    """``v`` (wrong values, or a kernel that failed on them) re-signed under same-values by a
    cause a rerun proved: what such a bug hits varies from run to run, so neither the signature
    nor the message keeps it."""
    step = scenario.steps[v.step].describe() if v.step < len(scenario.steps) else f"step {v.step}"
    return Violation("same-values", v.step, f"after {step}: results differ from the CPU-only computation (or a kernel fails on them) "
                     f"only while {only_while}: {cause}", facts)


def as_race(v: Violation, scenario: Scenario) -> Violation:
    """``v`` re-signed as a race: it needs asynchronous execution."""
    return _by_cause(v, scenario, "a device runs asynchronously", "a missing synchronisation with an asynchronous backend", {"race": "asynchronous"})


def forced_views(scenario: Scenario) -> list[str]:
    """The view tensors a graph of ``scenario`` assigns a backend to (``forced``)."""
    return sorted({name for _, g in scenario.graphs for name, _ in g.forced if g.by_name[name].op in VIEW_OPS})


def unforced_views_variant(scenario: Scenario) -> Scenario:
    """The same scenario without the backend assignments of view tensors."""
    graphs = tuple((n, replace(g, forced=tuple(f for f in g.forced if g.by_name[f[0]].op not in VIEW_OPS))) for n, g in scenario.graphs)
    return replace(scenario, graphs=graphs)


def as_forced_view(v: Violation, scenario: Scenario) -> Violation:
    """``v`` re-signed: the results are right once no view is assigned a backend of its own."""
    return _by_cause(v, scenario, f"the views {', '.join(forced_views(scenario))} are assigned a backend (ggml_backend_sched_set_tensor_backend)",
                     "a view put on another backend than its source's is copied as a split input before its source is computed", {"forced": "view"})


def fresh_variant(scenario: Scenario) -> Scenario:
    """The same scenario with every reuse replaced by a fresh ``sched_new`` of the new params."""
    steps = tuple(replace(s, reuse=False) if s.kind == "sched_new" else s for s in scenario.steps)
    return replace(scenario, steps=steps)


def reuse_equivalent(scenario: Scenario, reused: Trace, fresh: Trace) -> list[Violation]:
    """A reused scheduler behaves like a fresh one built with the new parameters on the same
    graphs: same assignment, same splits, no abort; its buffers may only be larger."""
    out: list[Violation] = []
    if reused.abort and not fresh.abort:
        a = reused.abort
        return [Violation("reuse-equivalent", a.step, f"the reused scheduler aborted where a fresh one did not: {a.message}", {"abort": True})]
    reusing = False
    for r, f in zip(reused.records, fresh.records):
        if r.kind == "sched_new":
            reusing = r.reused
            continue
        if not reusing or not r.node_backends:
            continue
        if r.node_backends != f.node_backends:
            k = next(j for j, (x, y) in enumerate(zip(r.node_backends, f.node_backends)) if x != y)
            out.append(Violation("reuse-equivalent", r.index, f"node {r.node_names[k]} on backend {r.node_backends[k]} in the reused scheduler, {f.node_backends[k]} in a fresh one", {"what": "assignment"}))
        elif [(s.backend, s.i_start) for s in r.splits] != [(s.backend, s.i_start) for s in f.splits]:
            out.append(Violation("reuse-equivalent", r.index, f"{r.n_splits} splits in the reused scheduler, {f.n_splits} in a fresh one", {"what": "splits"}))
        elif r.buffer_sizes and f.buffer_sizes and any(a < b for a, b in zip(r.buffer_sizes, f.buffer_sizes)):
            out.append(Violation("reuse-equivalent", r.index, f"reused buffers {list(r.buffer_sizes)} smaller than fresh {list(f.buffer_sizes)}", {"what": "buffers"}))
    return out


def _last_claim(scenario: Scenario, step: int) -> int | None:
    """The driver's last reservation for the current scheduler before ``step``."""
    for i in range(step - 1, -1, -1):
        s = scenario.steps[i]
        if s.kind == "reserve":
            return i
        if s.kind == "sched_new" and not s.reuse:
            return None
    return None


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


def no_same_size_realloc(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """After the driver's reservation for the current configuration, no alloc causes a
    same-size realloc. Each violation is explained by the reference: ``engine`` where the
    reference predicts no event, or another event, at that step; ``lost`` where a re-plan
    between the reservation and this step replaced the reserved plan; ``not-dominating`` where
    the reservation's graph did not cover this one. The signature adds, for ``lost``, the step
    kind and reason of the re-plan that lost it, and otherwise the invalid tensor."""
    out = []
    predicted = {e.step: e for e in prediction.events}
    for ev in trace.events:
        if not ev.same_size or scenario.steps[ev.step].kind == "reserve":
            continue
        claim = _last_claim(scenario, ev.step)
        if claim is None:
            continue
        graph = scenario.steps[ev.step].graph
        claimed = scenario.steps[claim].graph
        head = f"same-size realloc on {scenario.steps[ev.step].kind}({graph}): nodes = {ev.n_nodes}, splits = {ev.n_splits}, graph_size = {ev.graph_size}; reason: {ev.reason}"
        replans = [e for e in prediction.events if claim < e.step < ev.step]
        p = predicted.get(ev.step)
        lost_by = "-"
        if p is None:
            why, kind = "the engine re-planned although the reference says the plan was still valid (engine bug)", "engine"
        elif (normalize_reason(p.reason), p.same_size) != (normalize_reason(ev.reason), ev.same_size):
            why, kind = f"engine and reference disagree about this step's event (engine bug): the reference predicts {p.describe()}", "engine"
        elif replans:
            k = replans[0].step
            # the same op program with other assignments (op offload by batch size), or another graph
            same = topology(scenario.graph(scenario.steps[k].graph or "")) == topology(scenario.graph(claimed or ""))
            switch = "an assignment change" if same else "a topology switch"
            why = (f"the reservation of step {claim} ({claimed}) was lost: step {k} re-planned for "
                   f"{scenario.steps[k].graph} ({replans[0].reason}), {switch}")
            kind = "lost"
            lost_by = f"{scenario.steps[k].kind} {reason_kind(replans[0].reason)}"
        else:
            why = f"the reservation of step {claim} ({claimed}) does not dominate {graph}: {p.reason}"
            kind = "not-dominating"
        facts = {"explained": kind, "invalid": reason_kind(ev.reason), "lost_by": lost_by}
        if kind == "lost":
            # the re-plan that lost the reservation is the cause; which tensor then shows it
            # invalid depends on the graphs (kept in the message)
            del facts["invalid"]
        out.append(Violation("no-same-size-realloc", ev.step, f"{head} — {why}", facts))
    return out


_COPY = re.compile(r"[^\s(#]+#([^#\s]+)#(\d+)")


def normalize_reason(reason: str) -> str:
    """Input copies are named ``BACKEND#src#copy``; backend names differ between the engine
    (``RPC[host:port]``) and the reference, so compare them without the backend."""
    return _COPY.sub(r"*#\1#\2", reason)


def _event_key(e: ReallocEvent) -> tuple:
    return (e.step, e.via, e.backend_ids_changed, e.same_size, normalize_reason(e.reason))


def _first_diff(a: tuple, b: tuple) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _compare_record(r: StepRecord, p: StepRecord, layout_name: Callable[[int], str]) -> tuple[str, str] | None:
    if r.node_backends and p.node_backends and r.node_backends != p.node_backends:
        k = _first_diff(r.node_backends, p.node_backends)
        name = p.node_names[k] if k < len(p.node_names) else "?"
        eb = r.node_backends[k] if k < len(r.node_backends) else "-"
        pb = p.node_backends[k] if k < len(p.node_backends) else "-"
        return "assignment", f"node #{k} {name}: engine {layout_name(eb) if isinstance(eb, int) and eb >= 0 else eb}, reference {layout_name(pb) if isinstance(pb, int) and pb >= 0 else pb}"
    if r.leaf_backends and p.leaf_backends and r.leaf_backends != p.leaf_backends:
        k = _first_diff(r.leaf_backends, p.leaf_backends)
        return "leaf-assignment", f"leaf #{k} {p.leaf_names[k] if k < len(p.leaf_names) else '?'}: engine {r.leaf_backends[k:k+1]}, reference {p.leaf_backends[k:k+1]}"
    if r.splits and tuple(r.splits) != tuple(p.splits):
        k = _first_diff(tuple(r.splits), tuple(p.splits))
        es = r.splits[k] if k < len(r.splits) else None
        ps = p.splits[k] if k < len(p.splits) else None
        return "splits", f"split #{k}: engine {es}, reference {ps} ({r.n_splits} vs {p.n_splits} splits)"
    if (r.counts is not None or r.graph_size) and r.graph_size != p.graph_size:
        return "graph_size", f"graph_size engine {r.graph_size}, reference {p.graph_size}"
    if r.kind in ("reserve", "alloc", "compute") and (r.n_copies, r.n_nodes, r.n_leafs) != (p.n_copies, p.n_nodes, p.n_leafs):
        return "graph-copy", (f"the scheduled graph copy: engine n_copies {r.n_copies}, {r.n_nodes} nodes, {r.n_leafs} leafs; "
                              f"reference n_copies {p.n_copies}, {p.n_nodes} nodes, {p.n_leafs} leafs")
    ek, pk = [_event_key(e) for e in r.events], [_event_key(e) for e in p.events]
    if ek != pk:
        return "events", f"realloc events: engine {[e.describe() for e in r.events]}, reference {[e.describe() for e in p.events]}"
    if r.kind in ("reserve", "alloc", "compute") and r.ok != p.ok:
        return "allocation", f"engine {'allocated' if r.ok else 'failed to allocate'}, reference predicts {'success' if p.ok else 'a refused buffer'}"
    if r.buffer_sizes and r.buffer_sizes != p.buffer_sizes:
        k = _first_diff(r.buffer_sizes, p.buffer_sizes)
        return "buffers", (f"{layout_name(k)}'s compute buffer: engine {r.buffer_sizes[k]} bytes, reference {p.buffer_sizes[k] if k < len(p.buffer_sizes) else '-'} "
                           f"(all: engine {list(r.buffer_sizes)}, reference {list(p.buffer_sizes)})")
    return None


def matches_reference(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Assignment, splits, graph_size, the graph copy, realloc events, whether allocation
    succeeded and each backend's compute buffer size equal the reference's prediction."""
    for r, p in zip(trace.records, prediction.records):
        diff = _compare_record(r, p, scenario.layout.name)
        if diff:
            what, msg = diff
            return [Violation("matches-reference", r.index, f"{scenario.steps[r.index].describe()}: {msg}", {"what": what})]
    ta, pa = trace.abort, prediction.abort
    if ta is not None and pa is None:
        return []  # an abort the reference does not predict is no-abort's finding (every check runs it)
    if (ta is None) != (pa is None) or (ta and pa and ta.step != pa.step):
        step = (ta or pa).step  # type: ignore[union-attr]
        msg = f"engine {'aborted: ' + ta.message if ta else 'did not abort'}; reference {'predicts abort: ' + pa.message if pa else 'predicts no abort'}"
        return [Violation("matches-reference", step, msg, {"what": "abort"})]
    if ta and pa:
        # the same step, and the same assert where the reference names one
        expected = re.search(r"GGML_ASSERT\(.*?\) failed", pa.message)
        if expected and expected.group(0).split(" (")[0] not in ta.message:
            return [Violation("matches-reference", ta.step, f"engine aborted with {ta.message.strip().splitlines()[0][:200]}; reference predicts {pa.message}",
                              {"what": "abort-message"})]
    if ta is None and len(trace.records) != len(prediction.records):
        return [Violation("matches-reference", min(len(trace.records), len(prediction.records)), "engine and reference ran a different number of steps", {"what": "steps"})]
    return []


def with_c_stack(cause: str, message: str, depth: int = 3) -> str:
    """A signal's cause with the top ``depth`` functions of the C stack the worker printed
    (``ggml/crash.py``): two segfaults in different functions are two findings. A function's
    type- or implementation-specialized variants are one function (ggml 0.15.3's
    ``ggml_compute_forward_set_rows_f32`` is 0.25.3's ``..._set_rows_impl``), so one bug keeps
    one signature across ggml versions.

    >>> with_c_stack("SIGSEGV", "C stack: ggml_cpu_fp32_to_fp32 < ggml_compute_forward_set_rows_f32 < ggml_compute_forward_set_rows < ggml_compute_forward")
    'SIGSEGV in ggml_cpu_fp32_to_fp32 < ggml_compute_forward_set_rows < ggml_compute_forward'
    """
    m = re.search(r"^C stack: (.+)$", message, re.MULTILINE)
    if not m:
        return cause
    frames: list[str] = []
    for f in m.group(1).split(" < "):
        f = re.sub(r"_(impl|f32|f16|bf16|q\d_[\dK]|[a-z]?\d+)$", "", f)
        if not frames or frames[-1] != f:
            frames.append(f)
    return f"{cause} in {' < '.join(frames[:depth])}"


def without_c_stack(signature: str) -> str:
    """A signature with a crash's C stack left out: the same case crashing in functions of
    other names (another build of the same bug) compares equal."""
    return re.sub(r"(killed by SIG\w+) in [^,\]]+", r"\1", signature)


def no_abort(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Valid scenarios never abort the engine."""
    a = trace.abort
    if a is None:
        return []
    step: Step = scenario.steps[a.step] if a.step < len(scenario.steps) else Step("?")
    predicted = " (the reference predicts it: " + prediction.abort.message + ")" if prediction.abort else ""
    first = a.message.strip().splitlines()[0] if a.message.strip() else a.kind
    # ggml prefixes its source path (a build directory): keep the file name, drop line numbers
    first = re.sub(r"\S*/(\w[\w.-]*\.(?:c|cpp|h)):\d+", r"\1", first)
    kind = re.sub(r"\d+", "N", first)[:100]
    if a.kind == "crash":
        first = with_c_stack(first, a.message)
        kind = with_c_stack(kind, a.message)
    facts = {"kind": a.kind, "message": kind}
    # the RPC client reports every server failure alike: a server that died (and how) is what
    # separates a crash in the server from a graph it rejected
    died = re.search(r"RPC server \S+ (was killed by \w+|exited with status \d+)", a.message)
    if died:
        facts["server"] = died.group(1)
    if a.kind == "crash":  # a signal says less than an assert: add the kind of step it hit
        facts["during"] = step.kind
    # the reference's ggml-alloc explains it: a failed reservation kept its new plan, and its
    # buffers (NULL, or older and smaller) cannot hold it. Whether that shows as a crash or an
    # assert depends on which buffer the first misplaced tensor is in
    kept = prediction.abort is not None and prediction.abort.step == a.step and KEPT_PLAN in prediction.abort.message
    if kept or "failed to allocate" in a.message or any(not r.ok for r in trace.records if r.kind in ("reserve", "alloc", "compute")):
        # ggml could not allocate a buffer (it logged so, said no to an earlier step, or the
        # reference says so) and went on: a different story, whichever step then fails
        facts["after"] = "failed allocation"
        facts.pop("during", None)
        if kept:
            facts = {"after": "failed allocation", "plan": "kept"}
    # a crash has no assert text: its last output (ggml's, the C library's) is the explanation
    tail = "\n".join(a.message.strip().splitlines()[-12:]) if a.kind == "crash" else ""
    detail = f"\nlast output:\n{tail}" if tail and tail != first else ""
    return [Violation("no-abort", a.step, f"ggml {a.kind} during {step.describe()}: {first}{at_site(a.message)}{predicted}{detail}", facts)]


def at_site(message: str) -> str:
    """`` (check: file:line, in function)`` for an abort whose site ggml printed, else ""."""
    site = check_site(message)
    return f" (check: {site})" if site else ""


def same_values(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Every compute step's roots, outputs and caches hold what the same graph computes on the
    CPU backend alone, from the same leaf contents (``ggml/values.py``): bitwise, or within
    the BLAS tolerance. The signature names what was wrong (a cache, or an output) and its op."""
    for r in trace.records:
        if r.values:
            name = r.values.split(" ", 1)[0]
            graph = scenario.graph(scenario.steps[r.index].graph or "")
            t = graph.by_name.get(name)
            what = "cache" if t is not None and t.role == "cache" else "output"
            op = t.op if t is not None and not t.is_leaf else "none"
            return [Violation("same-values", r.index, f"after {scenario.steps[r.index].describe()}: {r.values}", {"what": what, "op": op})]
    return []


def _property(id: str, needs: set[str], draws: Draws, judge: Callable[[Scenario, Observed], list[Violation]]) -> Property:
    return Property(id, frozenset(needs), draws, judge)


PROPERTIES: dict[str, Property] = {p.id: p for p in (
    # decisions of the driver's reuse policy, read from the scenario: no engine needed
    _property("reuse-sound", set(), Draws("workloads"), lambda sc, o: reuse_sound(sc, o.trace, o.prediction)),
    _property("reuse-complete", set(), Draws("workloads"), lambda sc, o: reuse_complete(sc, o.trace, o.prediction)),
    # the reference explains its aborts (no-abort signs them), as for every property that runs the engine
    _property("reuse-equivalent", {ENGINE, REFERENCE, FRESH}, Draws("workloads"), lambda sc, o: reuse_equivalent(sc, o.trace, o.fresh)),
    # many ubatches of one shape, no reconfiguration: the server's steady state, where same-size reallocs hide
    _property("no-same-size-realloc", {ENGINE, REFERENCE}, Draws("workloads", max_ubatches=8, min_reconfigures=0),
              lambda sc, o: no_same_size_realloc(sc, o.trace, o.prediction)),
    # driver workloads too: same-topology growth and re-plans within a reservation happen there
    _property("matches-reference", {ENGINE, REFERENCE}, Draws("both", max_ubatches=8, min_reconfigures=0),
              lambda sc, o: matches_reference(sc, o.trace, o.prediction)),
    _property("same-values", {ENGINE, REFERENCE}, SCENARIOS, lambda sc, o: same_values(sc, o.trace, o.prediction)),
    _property("no-abort", {ENGINE, REFERENCE}, SCENARIOS, lambda sc, o: no_abort(sc, o.trace, o.prediction)),
)}
assert tuple(PROPERTIES) == GRAPH_PROPERTY_IDS
