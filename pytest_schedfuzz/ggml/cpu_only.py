"""The values check of compute steps: the same graph computed by ggml's CPU backend alone.

What the scheduler computed is compared, byte for byte (``cpu_values.difference``), with what ggml's
CPU backend computes for the same graph from the same leaf contents, every tensor in one buffer of
its own: no scheduler, no allocator reuse, no copies. Both are the real ggml; this run only
removes the scheduler from the computation.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from ..engine import TargetError
from ..model.graph_spec import GraphSpec, TensorSpec
from ..model.scenario import Scenario
from . import cpu_values
from .bindings import Built, Ggml
from .program import encoded


def tensor_key(t: TensorSpec) -> tuple[Any, ...]:
    """A weight's or cache's identity across the graphs of a scenario."""
    return (t.name, t.type, t.ne, t.role, t.device)


class CpuOnly:
    """The leaf contents of one scenario (from its seed) and what every weight and cache holds
    in the CPU-only computation, carried from compute step to compute step."""

    def __init__(self, eng: Ggml, scenario: Scenario, compared: bool = True) -> None:
        self.eng = eng
        self.scenario = scenario
        self.compared = compared  # False: nobody compares this run's values (``cpu_values.fill``'s zeros)
        self.shadow: dict[tuple[Any, ...], bytes] = {}
        # why values are no longer compared (``cpu_values.undetermined``)
        self.off: str | None = None if compared else "not compared in this run"

    @cached_property
    def seed(self) -> int | None:
        return cpu_values.scenario_seed(self.scenario) if self.compared else None

    @cached_property
    def ones(self) -> frozenset[str]:
        return cpu_values.ones_leafs(self.scenario)

    def persistent_bytes(self, spec: GraphSpec, t: TensorSpec) -> bytes:
        """What weight or cache ``t`` holds before the first step (kept for the CPU-only run)."""
        key = tensor_key(t)
        if key not in self.shadow:
            self.shadow[key] = cpu_values.leaf_bytes(self.seed, spec, t, 0, {}, ones=t.name in self.ones)
        return self.shadow[key]

    def inputs(self, index: int, spec: GraphSpec) -> dict[str, bytes]:
        """What every input holds at compute step ``index`` (``cpu_values.leaf_bytes``)."""
        return cpu_values.step_inputs(self.seed, index, spec)

    def compare(self, index: int, spec: GraphSpec, built: Built, inputs: dict[str, bytes], cpu: int) -> str:
        """The first of the step's roots, outputs and caches whose bytes differ from the same
        graph computed on the CPU backend ``cpu`` alone (``solo``); "" if none."""
        want = self.solo(index, spec, inputs, cpu)
        geo = spec.geometry
        tolerant = any(b.device.inexact for b in self.scenario.layout.backends)
        for name in cpu_values.compared(spec):
            diff = cpu_values.difference(name, geo[name], self.eng.read(built.tensor(self.eng, name)), want[name], tolerant)
            if diff:
                return diff
        return ""

    def solo(self, index: int, spec: GraphSpec, inputs: dict[str, bytes], cpu: int) -> dict[str, bytes]:
        """``spec`` computed on ``cpu`` alone, every tensor in one buffer of its own, from the same
        leaf contents; the compared tensors' bytes. The caches it leaves are the next compute's."""
        g, eng = self.eng.g, self.eng
        program = encoded(spec, False, eng.types, eng.ggml_version)
        ctx = eng.new_context(program.n, g.ggml_graph_overhead_custom(program.n + 1, False))
        buf = None
        try:
            gf, addresses = eng.build_graph(ctx, program)
            tensors = {t.name: eng.tensor(a) for t, a in zip(spec.tensors, addresses)}
            buf = g.ggml_backend_alloc_ctx_tensors(ctx, cpu)
            if not buf:
                raise TargetError(f"step {index}: could not allocate the CPU-only graph")
            for t in spec.tensors:
                if t.is_leaf:
                    data = self.shadow[tensor_key(t)] if t.role in ("weight", "cache") else inputs[t.name]
                    g.ggml_backend_tensor_set(tensors[t.name], data, 0, len(data))
            if g.ggml_backend_graph_compute(cpu, gf) != g.GGML_STATUS_SUCCESS:
                raise TargetError(f"step {index}: the CPU-only computation failed")
            for t in spec.tensors:
                if t.role == "cache":
                    self.shadow[tensor_key(t)] = eng.read(tensors[t.name])
            return {name: eng.read(tensors[name]) for name in cpu_values.compared(spec)}
        finally:
            if buf:
                g.ggml_backend_buffer_free(buf)
            g.ggml_free(ctx)
