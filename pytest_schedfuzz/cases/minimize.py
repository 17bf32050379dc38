"""Shrink a corpus case while it keeps its failure signature.

Reductions, tried greedily until none applies: drop steps; bypass op nodes (a consumer reads
one of the op's same-shaped sources instead), many at a time first, then one by one; drop
roots, forced assignments and RPC devices; halve leaf shapes (every op's shape inferred
again); for driver workloads, drop events and layers, shrink ubatches and halve the model's
sizes; for llama.cpp workloads, drop calls, batch parts and tokens, devices, layers and
sequences, and halve the model's and the context's sizes. A candidate is kept only when
replaying it still shows the same signature.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from tqdm import tqdm

from ..model.graph_spec import GraphSpec, reshaped
from ..model.layout import BackendLayout, BackendSpec
from ..model.llama_workload import LlamaWorkload
from ..model.scenario import Scenario
from ..model.shapes import SpecError
from ..sim.driver import Ubatch, Workload
from .corpus import Case

Replay = Callable[[Case], list[str]]  # the signatures a case shows when replayed
T = TypeVar("T")


@dataclass
class MinimizationCost:
    """What a minimization spent: smaller candidates tried, how many of them the reference
    ruled out without running the engine, and the engine replays."""

    candidates: int = 0
    screened: int = 0
    replays: int = 0


def halvings(obj: T, fields: Sequence[str], floor: int = 1) -> Iterator[T]:
    """``obj`` with one integer field halved (not below ``floor``), for each field in turn."""
    for name in fields:
        value: Any = getattr(obj, name)
        if value // 2 >= floor:
            yield replace(obj, **{name: value // 2})  # type: ignore[type-var]


def _valid(sc: Scenario) -> bool:
    try:
        sc.validate()
        for _, g in sc.graphs:
            _ = g.geometry
    except (SpecError, KeyError, ValueError, AssertionError):
        return False
    return True


def bypass(spec: GraphSpec, victims: Sequence[str]) -> GraphSpec | None:
    """Remove op tensors ``victims``: every use of one (as a source, a root, a forced
    assignment) goes to its nearest remaining ancestor of the same type and shape (so a whole
    layer can go: its output is replaced by its input). None if one has no such ancestor."""
    geo = spec.geometry
    gone = set(victims)
    by_name = spec.by_name
    repl: dict[str, str] = {}

    def resolve(v: str) -> str | None:
        """The nearest remaining ancestor of ``v`` (through removed ops) shaped like ``v``."""
        want = (geo[v].type, geo[v].ne)
        queue, seen = [v], {v}
        while queue:
            for a in by_name[queue.pop(0)].args:
                if a is None or a in seen:
                    continue
                seen.add(a)
                if a not in gone:
                    if (geo[a].type, geo[a].ne) == want:
                        return a
                elif not by_name[a].is_leaf:
                    queue.append(a)
        return None

    if any(by_name[v].is_leaf for v in victims):
        return None
    # only removed ops that something remaining reads need a stand-in
    used = {a for t in spec.tensors if t.name not in gone for a in t.args if a in gone}
    used |= {r for r in spec.roots if r in gone}
    for v in used:
        if (r := resolve(v)) is None:
            return None
        repl[v] = r
    tensors = [replace(t, args=tuple(repl.get(a, a) if a else a for a in t.args)) for t in spec.tensors if t.name not in gone]
    roots = tuple(dict.fromkeys(repl.get(r, r) for r in spec.roots))
    forced = tuple((n, b) for n, b in spec.forced if n not in gone)
    return _prune(GraphSpec(tuple(tensors), roots, forced, spec.label))


def _prune(spec: GraphSpec) -> GraphSpec:
    """Drop tensors no root reaches (through sources)."""
    keep: set[str] = set()
    stack = list(spec.roots)
    by_name = spec.by_name
    while stack:
        n = stack.pop()
        if n in keep:
            continue
        keep.add(n)
        stack.extend(a for a in by_name[n].args if a)
    tensors = tuple(t for t in spec.tensors if t.name in keep)
    forced = tuple(f for f in spec.forced if f[0] in keep)
    return GraphSpec(tensors, spec.roots, forced, spec.label)


def _drop_device(layout: BackendLayout, spec: GraphSpec, dev: int) -> GraphSpec:
    """Move everything on backend ``dev`` to the CPU and renumber the backends after it."""
    cpu = layout.n - 2  # the CPU's index once ``dev`` is gone

    def remap(d: int) -> int:
        return cpu if d == dev else d - (d > dev)

    tensors = tuple(replace(t, device=remap(t.device)) if t.device is not None else t for t in spec.tensors)
    return GraphSpec(tensors, spec.roots, tuple((n, remap(b)) for n, b in spec.forced), spec.label)


def _structural_candidates(sc: Scenario) -> Iterator[Scenario]:
    """Drop a step (last first), a plain device (an RPC one: ``DeviceKind.droppable``), a forced
    assignment or a root."""
    for i in range(len(sc.steps) - 1, 0, -1):
        yield replace(sc, steps=sc.steps[:i] + sc.steps[i + 1 :])
    for dev, b in enumerate(sc.layout.backends):
        if b.device.droppable:
            layout = BackendLayout(sc.layout.backends[:dev] + sc.layout.backends[dev + 1 :])
            yield Scenario(layout, tuple((n, _drop_device(sc.layout, g, dev)) for n, g in sc.graphs), sc.steps)
    for gi, (_, g) in enumerate(sc.graphs):
        for k in range(len(g.forced)):
            yield _with_graph(sc, gi, g.with_forced(g.forced[:k] + g.forced[k + 1 :]))
    # a root goes from every graph that has it (graphs of one model shrink together)
    for root in dict.fromkeys(r for _, g in sc.graphs for r in g.roots):
        graphs = tuple((n, _prune(replace(g, roots=tuple(r for r in g.roots if r != root))) if root in g.roots else g) for n, g in sc.graphs)
        if all(g.roots for _, g in graphs):
            yield replace(sc, graphs=graphs)


def _shape_candidates(sc: Scenario) -> Iterator[Scenario]:
    """Halve one dimension of one leaf, in every graph that has it."""
    leafs = dict.fromkeys(t.name for _, g in sc.graphs for t in g.tensors if t.is_leaf)
    for leaf in leafs:
        for dim in range(4):
            graphs = []
            for n, g in sc.graphs:
                new = reshaped(g, leaf, dim) if leaf in g.by_name else g
                if new is None:
                    break
                graphs.append((n, new))
            else:
                if any(new is not old for (_, new), (_, old) in zip(graphs, sc.graphs, strict=True)):
                    yield replace(sc, graphs=tuple(graphs))


def _with_graph(sc: Scenario, gi: int, new: GraphSpec) -> Scenario:
    return replace(sc, graphs=sc.graphs[:gi] + ((sc.graphs[gi][0], new),) + sc.graphs[gi + 1 :])


def bypass_everywhere(sc: Scenario, victims: Sequence[str]) -> Scenario | None:
    """``bypass`` the same ops (by name) in every graph that has them: graphs of one model
    shrink together, so the relations between them (same topology or not) survive."""
    graphs = []
    for name, g in sc.graphs:
        mine = [v for v in victims if v in g.by_name]
        new = bypass(g, mine) if mine else g
        if new is None:
            return None
        graphs.append((name, new))
    return replace(sc, graphs=tuple(graphs))


def _op_names(sc: Scenario) -> list[str]:
    """Op names of all graphs, in creation order of the first graph that has each."""
    return list(dict.fromkeys(t.name for _, g in sc.graphs for t in g.tensors if not t.is_leaf))


def _workload_candidates(w: Workload) -> Iterator[Workload]:
    for i in range(len(w.events) - 1, 0, -1):
        yield replace(w, events=w.events[:i] + w.events[i + 1 :])
    m = w.model
    if m.n_layer > 1:
        for il in range(m.n_layer):
            devs = m.layer_devices[:il] + m.layer_devices[il + 1 :]
            ffn = m.ffn_devices[:il] + m.ffn_devices[il + 1 :] if m.ffn_devices else ()
            yield replace(w, model=replace(m, layer_devices=devs, ffn_devices=ffn))
    for field, small in (("n_expert", 0), ("flash_attn", False), ("ffn_devices", ())):
        if getattr(m, field) != small:
            yield replace(w, model=replace(m, **{field: small}))
    for i, e in enumerate(w.events):
        if isinstance(e, Ubatch) and e.n_tokens > 1:
            t = max(1, e.n_tokens // 2)
            yield replace(w, events=w.events[:i] + (Ubatch(t, min(e.n_outputs, t), max(t, e.n_kv // 2)),) + w.events[i + 1 :])
    if w.n_ubatch > 2:
        n = w.n_ubatch // 2
        events = tuple(Ubatch(min(e.n_tokens, n), min(e.n_outputs, n), e.n_kv) if isinstance(e, Ubatch) else e for e in w.events)
        yield replace(w, n_ubatch=n, events=events)
    # the model's sizes (a shape that no longer divides is refused by the driver and skipped)
    for small in halvings(m, ("n_embd", "n_head", "n_head_kv", "n_ff", "n_vocab", "kv_size")):
        yield replace(w, model=small)
    if m.extra_ops:
        yield replace(w, model=replace(m, extra_ops=m.extra_ops // 2))
    if m.n_expert > 2:
        yield replace(w, model=replace(m, n_expert=max(2, m.n_expert // 2), n_expert_used=min(m.n_expert_used, max(2, m.n_expert // 2))))


def llama_candidates(w: LlamaWorkload) -> Iterator[LlamaWorkload]:
    """Smaller llama workloads, most shrinking first: fewer calls (from the end), fewer parts and
    tokens per batch, one RPC device, fewer layers and sequences. Invalid ones are skipped."""

    def valid(c: LlamaWorkload) -> bool:
        try:
            c.validate()
        except ValueError:
            return False
        return True

    calls = list(w.calls)
    cands: list[LlamaWorkload] = []
    for i in reversed(range(len(calls))):
        cands.append(replace(w, calls=tuple(calls[:i] + calls[i + 1 :])))
    for i, c in enumerate(calls):
        if c.kind != "decode":
            continue
        for j, p in enumerate(c.parts):
            if len(c.parts) > 1:
                cands.append(replace(w, calls=tuple(calls[:i] + [replace(c, parts=c.parts[:j] + c.parts[j + 1 :])] + calls[i + 1 :])))
            if p.n_tokens > 1:
                for n in (1, p.n_tokens // 2, p.n_tokens - 1):
                    q = replace(p, n_tokens=n)
                    cands.append(replace(w, calls=tuple(calls[:i] + [replace(c, parts=c.parts[:j] + (q,) + c.parts[j + 1 :])] + calls[i + 1 :])))
    dv = w.devices
    if dv.n_rpc > 1:
        cands.append(replace(w, devices=replace(dv, n_rpc=1, tensor_split=(), main_gpu=0, overrides=())))
    # the placement: fewer GPU-like devices, no overrides, no memory limit, plain device settings
    for k in reversed(range(len(dv.gpus))):
        gpus = dv.gpus[:k] + dv.gpus[k + 1 :]
        cands.append(replace(w, devices=replace(dv, gpus=gpus, gpu_free=dv.gpu_free[:k] + dv.gpu_free[k + 1 :], tensor_split=(), main_gpu=0, overrides=(),
                                                n_rpc=max(dv.n_rpc, 0 if gpus else 1))))
    if dv.overrides:
        cands.append(replace(w, devices=replace(dv, overrides=())))
    if dv.gpu_free:
        cands.append(replace(w, devices=replace(dv, gpu_free=())))
    if dv.tensor_split:
        cands.append(replace(w, devices=replace(dv, tensor_split=())))
    for k, g in enumerate(dv.gpus):
        plain = BackendSpec("gpu", asynchronous=g.asynchronous, offload_min_batch=g.offload_min_batch, cuda_batch=g.cuda_batch)
        if g != plain:
            cands.append(replace(w, devices=replace(dv, gpus=dv.gpus[:k] + (plain,) + dv.gpus[k + 1 :])))
    if w.model.n_layer > 1:
        cands.append(replace(w, model=replace(w.model, n_layer=1)))
    used = max((max((p.seq for p in c.parts), default=c.seq) for c in calls), default=0)
    if w.ctx.n_seq_max > used + 1:
        cands.append(replace(w, ctx=replace(w.ctx, n_seq_max=used + 1)))
    # the model's and the context's sizes (validate refuses what no longer fits or divides)
    m = w.model
    cands += [replace(w, model=small) for small in halvings(m, ("n_embd", "n_head", "n_head_kv", "n_ff"))]
    if m.has_experts:
        cands += [replace(w, model=small) for small in halvings(m, ("n_expert", "n_expert_used"))]
    cands += [replace(w, ctx=small) for small in halvings(w.ctx, ("n_ctx", "n_batch", "n_ubatch"))]
    yield from (c for c in cands if valid(c))


class _Shrinker:
    """One minimization: which candidates keep ``case``'s signature, and what that cost."""

    def __init__(self, case: Case, replay: Replay, screen: Callable[[Case], list[str] | None] | None, progress: bool) -> None:
        self.case, self.replay, self.screen = case, replay, screen
        self.tries = MinimizationCost()
        original = screen(case) if screen else None
        self.use_screen = screen is not None and original is not None and case.signature in original
        # disable=None: tqdm draws only on a terminal, so CI logs get no bar
        self.bar = tqdm(desc=f"minimize {case.path.name if case.path else case.signature}", unit="try", disable=None if progress else True, leave=False)

    def keeps(self, c: Case) -> bool:
        """Whether ``c`` still shows the signature: the reference's screen first, then a replay."""
        self.tries.candidates += 1
        if self.use_screen:
            try:
                if self.case.signature not in (self.screen(c) or []):  # type: ignore[misc]
                    self.tries.screened += 1
                    return False
            except Exception:  # noqa: BLE001 - a candidate the reference rejects is not kept
                self.tries.screened += 1
                return False
        self.tries.replays += 1
        self.bar.update(1)
        self.bar.set_postfix(steps=c.size()[0], nodes=c.size()[1])
        try:
            return self.case.signature in self.replay(c)
        except Exception:  # noqa: BLE001 - a candidate the engine or reference cannot take is not kept
            return False

    def greedy(self, best: Case, candidates: Callable[[Case], Iterator[Case]]) -> Case:
        """Take the first candidate that keeps the signature, until none does."""
        while (better := next((c for c in candidates(best) if self.keeps(c)), None)) is not None:
            best = better
        return best

    def fixpoint(self, best: Case, candidates: Callable[[Scenario], Iterator[Scenario]] = _structural_candidates) -> Case:
        """``greedy`` over scenario candidates that are smaller (or move devices) and valid."""
        def smaller(b: Case) -> Iterator[Case]:
            assert b.scenario is not None
            for sc in candidates(b.scenario):
                if (replace(b, scenario=sc).size() < b.size() or sc.layout != b.scenario.layout) and _valid(sc):
                    yield replace(b, scenario=sc)
        return self.greedy(best, smaller)

    def ddmin_ops(self, best: Case) -> Case:
        """Bypass windows of ops, halving the window only when no window of a size goes."""
        assert best.scenario is not None
        size = len(_op_names(best.scenario)) // 2
        while size >= 1:
            ops = _op_names(best.scenario)
            start, shrunk = 0, False
            while start + size <= len(ops):
                sc = bypass_everywhere(best.scenario, ops[start : start + size])
                cand = replace(best, scenario=sc) if sc is not None else None
                if cand is not None and _valid(sc) and self.keeps(cand):  # type: ignore[arg-type]
                    best, shrunk = cand, True
                    ops = _op_names(best.scenario)
                else:
                    start += max(1, size // 2)
            if not shrunk:
                size //= 2
        return best


def minimize_case(
    case: Case,
    replay: Replay,
    driver_scenario: Callable[[Workload], Scenario],
    screen: Callable[[Case], list[str] | None] | None = None,
    progress: bool = True,
) -> tuple[Case, MinimizationCost]:
    """The smallest case found that replays to ``case.signature``, and what finding it cost.

    ``screen`` (the reference's prediction of a candidate's signatures) rejects most candidates
    without running the engine; it is used only if it predicts the original case."""
    s = _Shrinker(case, replay, screen, progress)

    def workload_candidates(b: Case) -> Iterator[Case]:
        assert b.workload is not None
        for w in _workload_candidates(b.workload):
            try:
                sc = driver_scenario(w)
            except (ValueError, SpecError, IndexError):
                continue
            if _valid(sc):
                yield replace(b, workload=w, scenario=sc)

    if case.llama is not None:
        best = s.greedy(case, lambda b: (replace(b, llama=lw) for lw in llama_candidates(b.llama)))  # type: ignore[arg-type]
    elif case.workload is not None:
        best = s.greedy(case, workload_candidates)
    else:
        best = s.fixpoint(s.fixpoint(s.ddmin_ops(s.fixpoint(case))), _shape_candidates)
    s.bar.close()
    return best, s.tries


def simplest(cases: Sequence[Case]) -> dict[str, Case]:
    """The smallest case per signature."""
    out: dict[str, Case] = {}
    for c in cases:
        if c.signature not in out or c.size() < out[c.signature].size():
            out[c.signature] = c
    return out
