"""llama.cpp's graphs as captured inside it, said as a graph scenario (``cases.capture`` makes
them; ``llama-matches-reference`` judges them): plain data, below the properties that read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .scenario import Scenario


@dataclass(frozen=True)
class CapturedStep:
    """What ggml did at one reserve or alloc inside llama.cpp: the backend (index in the layout)
    of each node and leaf of the graph (in ggml's order), its splits and compute buffer sizes."""

    step: int  # in the scenario
    call: int  # the llama.cpp call it happened in (-1: the context's constructor)
    kind: str  # reserve | alloc | split
    node_backends: tuple[int, ...]
    leaf_backends: tuple[int, ...]
    n_splits: int
    buffer_sizes: tuple[int, ...]
    realloc: bool


@dataclass(frozen=True)
class Captured:
    """A workload's captured graphs as one scenario, with what ggml did at each of its steps."""

    scenario: Scenario
    steps: tuple[CapturedStep, ...]
    ops: Mapping[str, int]  # ggml op (GLU and UNARY by their kind) -> nodes with it, over all graphs
    # the step where ggml aborted inside llama.cpp (the scenario's last), the call, ggml's message; None: none did
    abort: tuple[int, int, str] | None = None
