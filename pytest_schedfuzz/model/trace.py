"""What a scheduler did, step by step: the common currency of the engines and the reference.

A target (the real ggml engine) produces a ``Trace``; the reference produces a ``Prediction``
of the same shape; properties compare them. Everything is plain data with a JSON form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Split:
    """A run of nodes on one backend; ``inputs`` are the names of tensors copied in."""

    backend: int
    i_start: int
    i_end: int
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class SizeCounts:
    """What one ``ggml_backend_sched_split_graph`` was given and made, as the engine observed it:
    the graph's nodes and leafs, the splits and their inputs, its input leafs (and, with
    ``n_copies > 1``, where ggml collects graph inputs, how many of them a non-view node reads),
    and ``n_copies``. The figures ggml keeps but does not tell (its
    ``debug_graph_size``, the graph copy's counts) are derived from these on the judging side
    (``properties.derived``)."""

    n_nodes: int = 0
    n_leafs: int = 0
    n_splits: int = 0
    split_inputs: int = 0
    input_leafs: int = 0
    input_leafs_read: int = 0
    n_copies: int = 1
    n_dep_nodes: int = 0  # what the backends' graph_optimize asked to keep alive makes (GPU-like devices report it)


# ggml-alloc's reason for a re-plan where a Release build (NDEBUG) does not log it: the scheduler's
# decision is then told by ggml's realloc callback alone, and ggml-alloc's own re-plans not at all
UNOBSERVABLE = "unobservable in a Release build"
# ``Trace.engine["realloc_log"]`` of such a build (``ggml.bindings.Ggml.info``): judges compare only what it tells
RELEASE = "unlogged: a Release build; the scheduler's re-plans from ggml's realloc callback, ggml-alloc's reasons and own re-plans unobservable"


@dataclass(frozen=True)
class ReallocEvent:
    """An alloc that found its plan invalid and re-reserved.

    ``via`` is ``"sched"`` when ``ggml_backend_sched_alloc_splits`` re-reserved (several
    buffers), ``"gallocr"`` when ``ggml_gallocr_alloc_graph`` re-reserved by itself (a single
    buffer: the CPU-only layout). ``reason`` is ggml's: ``backend ids changed``, ``different
    number of nodes``, ``different number of leafs``, ``node NAME is not valid`` or
    ``src J (NAME) of node NAME is not valid``.
    """

    step: int
    via: str
    backend_ids_changed: bool
    n_splits: int
    reason: str = ""
    # derived (``properties.derived``) from the step's ``SizeCounts`` and the previous split_graph's;
    # None until derived
    graph_size: int | None = None
    prev_graph_size: int | None = None
    n_nodes: int = 0
    # ggml's own decision, from its realloc callback (None: a ggml without it, or ggml-alloc re-planning by itself)
    ggml_size_changed: bool | None = None

    @property
    def observed(self) -> bool:
        return self.ggml_size_changed is not None

    @property
    def same_size(self) -> bool:
        """As ggml says it where it can (its realloc callback), else derived (``properties.derived``):
        ggml's graph-size formula on the graph, as its ``GGML_SCHED_DEBUG_REALLOC`` check."""
        if self.ggml_size_changed is not None:
            return not self.backend_ids_changed and not self.ggml_size_changed
        if self.graph_size is None:
            raise ValueError(f"step {self.step}: the reallocation's graph sizes were never derived (properties.derived.graph_trace)")
        return not self.backend_ids_changed and self.graph_size == self.prev_graph_size

    def describe(self) -> str:
        size = "same size" if self.same_size else "changed size"
        return (
            f"graph reallocation at step {self.step} ({size}, via {self.via}): nodes = {self.n_nodes}, "
            f"splits = {self.n_splits}, backend_ids_changed = {int(self.backend_ids_changed)}, "
            f"graph_size = {self.graph_size} (prev {self.prev_graph_size}); reason: {self.reason or '?'}"
        )


@dataclass(frozen=True)
class StepRecord:
    """The observable result of one step. Assignment fields are empty for steps without a graph.

    ``node_backends``/``leaf_backends`` are backend indices per node/leaf of the graph in
    ggml's order (``-1``: unassigned); ``counts`` what the step's split_graph was given and made,
    ``prev_counts`` the previous split_graph's on the same scheduler (``None``: none since
    ``ggml_backend_sched_new``). ``graph_size`` and ``n_nodes``/``n_leafs`` (the scheduled graph
    copy's, as in ggml's own realloc message) are derived from them (``properties.derived``).
    ``buffer_sizes`` is ``ggml_backend_sched_get_buffer_size`` of each backend after the step (of
    a ``reserve_size`` step: the sizes ``ggml_backend_sched_reserve_size`` measured), and ``ok``
    whether the step's reserve or alloc succeeded.
    """

    index: int
    kind: str
    node_names: tuple[str, ...] = ()
    node_backends: tuple[int, ...] = ()
    leaf_names: tuple[str, ...] = ()
    leaf_backends: tuple[int, ...] = ()
    splits: tuple[Split, ...] = ()
    n_copies: int = 1
    counts: SizeCounts | None = None
    prev_counts: SizeCounts | None = None
    graph_size: int = 0
    n_nodes: int = 0
    n_leafs: int = 0
    buffer_sizes: tuple[int, ...] = ()
    # sched_new steps: the buffer type of each backend's compute buffer (``BackendLayout.buft``'s names)
    buffer_types: tuple[str, ...] = ()
    events: tuple[ReallocEvent, ...] = ()
    reused: bool = False
    ok: bool = True
    seconds: float = 0.0  # wall time of the bare ggml calls of the step (reset, reserve/alloc)
    build_seconds: float = 0.0  # wall time of building the step's graph (``materialize``: graph.c; the first one's: every program encoded)
    # compute steps: the first root, output or cache whose values differ from the same graph
    # computed on the CPU alone ("": none), and how many tensors were compared
    values: str = ""
    values_checked: int = 0

    @property
    def n_splits(self) -> int:
        return len(self.splits)


@dataclass(frozen=True)
class Abort:
    """ggml aborted (``GGML_ABORT``/``GGML_ASSERT``), crashed, or a step hung."""

    step: int
    kind: str  # "abort" | "crash" | "timeout"
    message: str
    # the scenario's RPC servers that died, each "127.0.0.1:PORT: killed by SIGSEGV" (``process.rpc.ServerDeath.brief``)
    servers: tuple[str, ...] = ()
    # what its RPC servers logged against its commands (``process.rpc.RpcServers.refusals``)
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trace:
    records: tuple[StepRecord, ...]
    abort: Abort | None = None
    engine: Mapping[str, str] = field(default_factory=dict)  # name, lib path, ggml version

    @property
    def events(self) -> list[ReallocEvent]:
        return [e for r in self.records for e in r.events]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

