"""A model of ``llama_context``'s use of the scheduler: workloads become scenario steps.

``Driver.scenario(workload)`` plays a workload (reconfigurations and ubatches) the way
``llama_context`` does after commit 3e86ce2 (``../shared/seeds/004_*``):

- ``sched_new(params)`` reuses the current scheduler when the *policy* says so (default:
  ``reference.params.can_reuse``), then ``sched_reserve`` reserves the worst-case graphs: the
  prompt-processing graph, the token-generation graph, then the prompt graph again; when the
  workload declares the reservation out of memory with pipeline parallelism, the driver
  retries with ``parallel = false`` (a second ``sched_new``) as ``sched_reserve`` does;
- every ubatch resets the scheduler and allocates a freshly built graph;
- with ``rereserve`` (llama.cpp PR 18547), a ubatch whose graph topology differs from the
  previous one first re-reserves the worst case of its own topology.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from reference.params import can_reuse

from ..model.graph_spec import GraphSpec
from ..model.layout import BackendLayout
from ..model.scenario import Scenario, SchedParams, Step
from .models import ModelShape, llama_graph

Policy = Callable[[SchedParams, SchedParams], bool]


def load_policy(spec: str) -> Policy:
    """``MODULE:CALLABLE`` -> the callable, with a clear error naming what is wrong."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--schedfuzz-policy {spec!r}: expected MODULE:CALLABLE")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--schedfuzz-policy {spec!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"--schedfuzz-policy {spec!r}: {attr} is not callable")
    return fn


@dataclass(frozen=True)
class Ubatch:
    """One ``llama_decode`` ubatch: tokens, rows of logits wanted, KV cells attended."""

    n_tokens: int
    n_outputs: int
    n_kv: int


@dataclass(frozen=True)
class Reconfigure:
    """A change of the scheduler parameters (``sched_need_reserve``), e.g. a new max_nodes.

    ``out_of_memory`` declares that the compute buffers for these params do not fit, so that
    the driver takes ``sched_reserve``'s fallback. No device here can run out, so the failure
    is declared by the workload, not observed: what it exercises is the sequence of scheduler
    parameters (and reuse decisions) that the fallback produces.
    """

    params: SchedParams
    out_of_memory: bool = False


@dataclass(frozen=True)
class Workload:
    layout: BackendLayout
    model: ModelShape
    n_ubatch: int  # the largest ubatch: the worst case the driver reserves for
    events: tuple[Ubatch | Reconfigure, ...]

    def to_json(self) -> dict[str, Any]:
        events: list[dict[str, Any]] = []
        for e in self.events:
            if isinstance(e, Ubatch):
                events.append({"ubatch": [e.n_tokens, e.n_outputs, e.n_kv]})
            else:
                p = e.params
                r: dict[str, Any] = {"max_nodes": p.max_nodes, "parallel": p.parallel, "op_offload": p.op_offload}
                if e.out_of_memory:
                    r["out_of_memory"] = True
                events.append({"reconfigure": r})
        return {"layout": self.layout.to_json(), "model": asdict(self.model), "n_ubatch": self.n_ubatch, "events": events}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Workload:
        model = {k: tuple(v) if isinstance(v, list) else v for k, v in d["model"].items()}
        events: list[Ubatch | Reconfigure] = []
        for e in d["events"]:
            if "ubatch" in e:
                events.append(Ubatch(*(int(x) for x in e["ubatch"])))
            else:
                p = e["reconfigure"]
                params = SchedParams(int(p["max_nodes"]), bool(p["parallel"]), bool(p["op_offload"]))
                events.append(Reconfigure(params, bool(p.get("out_of_memory", False))))
        w = Workload(BackendLayout.from_json(d["layout"]), ModelShape(**model), int(d["n_ubatch"]), tuple(events))
        w.validate()
        return w

    def validate(self) -> None:
        """A ``ValueError`` naming the first field out of range."""
        self.model.validate(self.layout.n)
        if not 1 <= self.n_ubatch <= 1 << 16:
            raise ValueError(f"n_ubatch {self.n_ubatch}: must be in 1 .. 65536")
        if not self.events or not isinstance(self.events[0], Reconfigure):
            raise ValueError("events[0] must be a reconfigure (the context's first sched_new)")
        for i, e in enumerate(self.events):
            if isinstance(e, Ubatch):
                if not (1 <= e.n_tokens <= self.n_ubatch and 0 <= e.n_outputs <= e.n_tokens and 1 <= e.n_kv <= self.model.kv_size):
                    raise ValueError(f"events[{i}]: ubatch {e.n_tokens, e.n_outputs, e.n_kv} needs 1 <= tokens <= n_ubatch, 0 <= outputs <= tokens, 1 <= n_kv <= kv_size")
            elif not 1 <= e.params.max_nodes <= 1 << 24:
                raise ValueError(f"events[{i}]: max_nodes {e.params.max_nodes} is outside 1 .. 2**24")


def topology(spec: GraphSpec) -> tuple:
    """What fixes the allocation plan's positions: the op program without shapes."""
    return tuple((t.op, t.args, t.role, t.device) for t in spec.tensors) + (spec.roots,)


@dataclass(frozen=True)
class Driver:
    policy: Policy = can_reuse
    rereserve: bool = True

    def _sched_new(self, steps: list[Step], params: SchedParams, cur: SchedParams | None) -> SchedParams:
        """``llama_context::sched_new``: reuse when the policy says so; the params the current
        scheduler was built with afterwards."""
        reuse = cur is not None and bool(self.policy(params, cur))
        steps.append(Step("sched_new", params=params, reuse=reuse))
        return cur if reuse and cur is not None else params

    def scenario(self, w: Workload) -> Scenario:
        graphs: dict[str, GraphSpec] = {}
        steps: list[Step] = []
        kv = w.model.kv_size

        def graph(n_tokens: int, n_outputs: int, n_kv: int) -> str:
            name = f"T{n_tokens}-out{n_outputs}-kv{n_kv}"
            if name not in graphs:
                graphs[name] = llama_graph(w.model, n_tokens, n_kv, n_outputs, label=name)
            return name

        def worst_case(u: Ubatch) -> str:
            # the largest graph of the same topology: all outputs, or all but one
            n_out = w.n_ubatch if u.n_outputs == u.n_tokens else w.n_ubatch - 1
            return graph(w.n_ubatch, n_out, kv)

        cur: SchedParams | None = None
        last_topology: tuple | None = None
        for ev in w.events:
            if isinstance(ev, Reconfigure):
                pp = graph(w.n_ubatch, w.n_ubatch, kv)
                params = ev.params
                cur = self._sched_new(steps, params, cur)
                if ev.out_of_memory and params.parallel:
                    # "compute buffer allocation failed, retrying without pipeline parallelism"
                    steps.append(Step("reserve", pp))
                    params = SchedParams(params.max_nodes, False, params.op_offload)
                    cur = self._sched_new(steps, params, cur)
                # sched_reserve: pp, then tg, then pp again so the pp assignment is the last
                steps += [Step("reserve", pp), Step("reserve", graph(1, 1, kv)), Step("reserve", pp)]
                last_topology = topology(graphs[pp])
                continue
            name = graph(ev.n_tokens, ev.n_outputs, ev.n_kv)
            topo = topology(graphs[name])
            if self.rereserve and topo != last_topology:
                steps.append(Step("reserve", worst_case(ev)))
            last_topology = topo
            steps.append(Step("compute", name))  # llama_decode: alloc the ubatch's graph, then compute it
        return Scenario(w.layout, tuple(graphs.items()), tuple(steps))
