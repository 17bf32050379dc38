"""Scenarios as plain data: a backend layout (``layout``) plus a list of steps over named graph
specs (``graph_spec``), with a versioned JSON form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .graph_spec import GraphSpec
from .layout import BackendLayout
from .shapes import SpecError

FORMAT_VERSION = 1

# eval_callback: ggml_backend_sched_set_eval_callback on the current scheduler, with a callback that
# asks for every MUL_MAT and MUL_MAT_ID result, as llama.cpp's imatrix tool does (EVAL_CALLBACK_OPS)
# reserve_size: ggml_backend_sched_reserve_size, the measurement llama.cpp's memory estimate makes (the
# compute buffer sizes a reservation would need, with no buffer allocated)
STEP_KINDS = ("sched_new", "reserve", "alloc", "compute", "reset", "split", "eval_callback", "reserve_size")
EVAL_CALLBACK_OPS = ("MUL_MAT", "MUL_MAT_ID")
GRAPH_STEP_KINDS = ("reserve", "alloc", "compute", "split", "reserve_size")  # the steps that schedule a graph
# an explicit limit on what a scenario may ask of the engine (case files are checked against it;
# a graph's own limits are ``graph_spec``'s)
MAX_NODES = 2**24  # a sched_new's max_nodes (ggml's hash set grows with it)


@dataclass(frozen=True)
class SchedParams:
    """``llama_context::sched_params``: what a ``ggml_backend_sched_new`` call was given. Whether
    a scheduler built with some params serves others is the reference's rule
    (``reference.params.can_reuse``)."""

    max_nodes: int
    parallel: bool = False
    op_offload: bool = True


@dataclass(frozen=True)
class Step:
    """One call on the scheduler. ``sched_new`` carries the params and the reuse decision."""

    kind: str
    graph: str | None = None
    params: SchedParams | None = None
    reuse: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.graph is not None:
            out["graph"] = self.graph
        if self.params is not None:
            p = self.params
            out["params"] = {"max_nodes": p.max_nodes, "parallel": p.parallel, "op_offload": p.op_offload}
        if self.reuse:
            out["reuse"] = True
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Step:
        p = d.get("params")
        return Step(
            kind=d["kind"],
            graph=d.get("graph"),
            params=SchedParams(int(p["max_nodes"]), bool(p["parallel"]), bool(p["op_offload"])) if p else None,
            reuse=bool(d.get("reuse", False)),
        )

    def describe(self) -> str:
        if self.kind == "sched_new":
            p = self.params
            assert p is not None
            verb = "reuse" if self.reuse else "sched_new"
            return f"{verb}(max_nodes={p.max_nodes}, parallel={p.parallel}, op_offload={p.op_offload})"
        return f"{self.kind}({self.graph})" if self.graph else self.kind


@dataclass(frozen=True)
class Scenario:
    layout: BackendLayout
    graphs: tuple[tuple[str, GraphSpec], ...]
    steps: tuple[Step, ...]

    @cached_property
    def graph_map(self) -> dict[str, GraphSpec]:
        return dict(self.graphs)

    def graph(self, name: str) -> GraphSpec:
        return self.graph_map[name]

    def __repr__(self) -> str:
        kinds = ", ".join(b.kind for b in self.layout.backends)
        graphs = ", ".join(f"{n}: {g!r}" for n, g in self.graphs)
        steps = "; ".join(s.describe() for s in self.steps)
        return f"Scenario([{kinds}], {{{graphs}}}, [{steps}])"

    def validate(self) -> None:
        for name, g in self.graphs:
            try:
                g.validate(self.layout.n)
            except SpecError as e:
                raise SpecError(f"graph {name!r}: {e}") from None
        if self.steps and self.steps[0].kind != "sched_new":
            raise SpecError("the first step must be sched_new")
        for i, s in enumerate(self.steps):
            if s.kind not in STEP_KINDS:
                raise SpecError(f"step {i}: unknown kind {s.kind!r}")
            if s.kind == "sched_new" and s.params is None:
                raise SpecError(f"step {i}: sched_new needs params")
            if s.kind == "sched_new" and s.params is not None and not 1 <= s.params.max_nodes <= MAX_NODES:
                raise SpecError(f"step {i}: max_nodes {s.params.max_nodes} is outside 1 .. {MAX_NODES:,} (2**24)")
            if s.kind in GRAPH_STEP_KINDS and s.graph not in self.graph_map:
                raise SpecError(f"step {i}: unknown graph {s.graph!r}")
            if s.kind == "sched_new" and s.reuse and i == 0:
                raise SpecError("step 0: nothing to reuse")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "layout": self.layout.to_json(),
            "graphs": {name: g.to_json() for name, g in self.graphs},
            "steps": [s.to_json() for s in self.steps],
        }

    def dumps(self) -> str:
        return self._text

    def __getstate__(self) -> dict[str, Any]:
        # pickled for the engine's worker: without its JSON text (tens of kB), which it never reads
        return {k: v for k, v in self.__dict__.items() if k != "_text"}

    @cached_property
    def _text(self) -> str:
        # once per scenario: it is written for the worker, for the run's sample and for the corpus
        return json.dumps(self.to_json(), sort_keys=True)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Scenario:
        version = d.get("version")
        if version != FORMAT_VERSION:
            raise SpecError(f"scenario format version {version!r} is not supported (this schedfuzz reads {FORMAT_VERSION})")
        try:
            sc = Scenario(
                layout=BackendLayout.from_json(d["layout"]),
                graphs=tuple((str(k), GraphSpec.from_json(v)) for k, v in d["graphs"].items()),
                steps=tuple(Step.from_json(s) for s in d["steps"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, SpecError):
                raise
            raise SpecError(f"malformed scenario: {type(e).__name__}: {e}") from None
        sc.validate()
        return sc
