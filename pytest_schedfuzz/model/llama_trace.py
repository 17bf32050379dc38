"""What llama.cpp's scheduler did during a workload, call by call: the llama target's output.

Every ``llama_decode`` (and the context's constructor, call ``-1``, and any call after which
llama.cpp reserved again) shows up as the scheduler calls libllama made: ``new`` (a scheduler
built, with its ``max_nodes``/``parallel``/``op_offload``), ``reserve`` and ``alloc`` (one per
ubatch whose graph was not reused), ``reserve_size`` (a plan made for its sizes only) and
``split`` (``ggml_backend_sched_split_graph`` called by llama.cpp itself: its fused-op probes),
each with the graph's size as ggml computes it and, when the scheduler re-planned, the
reallocation and ggml's reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .trace import SizeCounts


@dataclass(frozen=True)
class SchedCall:
    """One scheduler call made by libllama. ``realloc_reason`` is set when ``alloc`` re-planned:
    ``backend ids changed``, ``different number of nodes|leafs``, ``node NAME is not valid``..."""

    # sched_reserve (llama.cpp reserves the worst case again) | new | reserve | reserve_size | split | alloc | free;
    # on the seeds' llama.cpp also sched_params (what its sched_new asks for) and reuse (it kept the scheduler)
    kind: str
    sched: int
    ok: bool = True
    n_nodes: int = 0
    n_leafs: int = 0
    n_splits: int = 0
    n_copies: int = 1
    counts: SizeCounts | None = None  # what this split_graph was given and made (split and alloc calls)
    prev_counts: SizeCounts | None = None  # the previous split_graph's on this scheduler (None: none since it was built)
    graph_size: int | None = None  # derived from counts (properties.derived), as prev_graph_size from prev_counts
    prev_graph_size: int | None = None
    inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    realloc: bool = False
    backend_ids_changed: bool = False
    realloc_reason: str = ""
    invalid_node: str = ""  # the reason names an unnamed node (node_N): its op and sources, OP(src, ...)
    moved: str = ""  # backend ids changed: the first node whose backend did, "name: A -> B"
    moved_by_offload: bool = False  # that node reads a weight in host memory: op offload places it (llama.llama_worker)
    offloaded: tuple[str, ...] = ()  # "weight@device": weights in host memory copied to a device's split (ggml's op offload)
    splits: tuple[tuple[str, int], ...] = ()  # split_graph: each split's backend (as ggml names it) and its number of inputs
    # ggml's own realloc decision, from its realloc callback (None: this ggml has none)
    ggml_ids_changed: bool | None = None
    ggml_size_changed: bool | None = None
    allocator: bool = False  # the re-plan was told by ggml-alloc's interposed calls alone (a Release build without the callback)
    allocator_agreed: bool = False  # ... or told by ggml's callback or log, and its interposed calls told the same
    max_nodes: int = 0
    parallel: bool = False
    op_offload: bool = False
    observes_realloc: bool = False  # new: ggml reports this scheduler's realloc decisions
    owner_counts: bool = False  # new: llama.cpp registered its own realloc callback (it counts same/changed)
    current_max_nodes: int = 0  # reuse: the kept scheduler's max_nodes, as llama.cpp logs it
    # alloc that re-planned, on the seeds' llama.cpp: its counters after this reallocation (None: it traced none)
    llama_n_same: int | None = None
    llama_n_diff: int | None = None
    # reserve/alloc of a captured run (LlamaTarget.run(capture=True)): the graph as ggml held it, the
    # backend split_graph gave each node and leaf, and each backend's compute buffer size (cases.capture)
    capture: Mapping[str, Any] | None = None
    aborted: bool = False  # ggml aborted inside this call (the last of LlamaAbort.sched)
    context: int = 0  # whose scheduler: 0 the target context's, 1 the draft (MTP) context's (llama.speculative)

    @property
    def observed(self) -> bool:
        """Whether ggml itself said whether this realloc was same-size (its callback)."""
        return self.ggml_size_changed is not None

    @property
    def derived_same_size(self) -> bool:
        """The harness's derivation (``properties.derived``): ggml's graph-size formula applied to
        the graph the hook read, as ggml's ``GGML_SCHED_DEBUG_REALLOC`` check compares it."""
        if self.realloc and self.graph_size is None:
            raise ValueError(f"a {self.kind} of scheduler {self.sched}: its graph sizes were never derived (properties.derived.llama_trace)")
        return self.realloc and not self.backend_ids_changed and self.graph_size == self.prev_graph_size

    @property
    def same_size(self) -> bool:
        """A re-reservation for a graph of the size scheduled before, its backends unchanged:
        as ggml says it where it can (the realloc callback), else as derived."""
        if self.observed:
            return self.realloc and not self.ggml_ids_changed and not self.ggml_size_changed
        return self.derived_same_size

    def shape(self) -> str:
        """The batch the graph was built for, read from its input leafs."""
        def dims(ne: tuple[int, ...]) -> str:
            kept = list(ne)
            while len(kept) > 1 and kept[-1] == 1:  # trailing 1s, as ggml prints shapes
                kept.pop()
            return "x".join(map(str, kept))

        return ", ".join(f"{name}[{dims(ne)}]" for name, ne in sorted(self.inputs.items()))

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SchedCall:
        r = d.get("realloc") or {}
        said = r.get("ggml") or {}
        counted = r.get("llama") or {}
        return SchedCall(
            kind=d["kind"], sched=int(d["sched"]), ok=bool(d.get("ok", True)),
            n_nodes=int(d.get("n_nodes", 0)), n_leafs=int(d.get("n_leafs", 0)), n_splits=int(d.get("n_splits", 0)),
            n_copies=int(d.get("n_copies", 1)),
            counts=SizeCounts(**d["counts"]) if d.get("counts") else None, prev_counts=SizeCounts(**d["prev_counts"]) if d.get("prev_counts") else None,
            inputs={k: tuple(v) for k, v in d.get("inputs", {}).items()}, offloaded=tuple(d.get("offloaded", ())),
            splits=tuple((str(b), int(n)) for b, n in d.get("splits", ())),
            realloc=bool(r), backend_ids_changed=bool(r.get("backend_ids_changed", False)), realloc_reason=str(r.get("reason", "")), moved=str(r.get("moved", "")),
            invalid_node=str(r.get("invalid_node", "")),
            moved_by_offload=bool(r.get("moved_by_offload", False)), allocator=bool(r.get("allocator", False)),
            allocator_agreed=bool(r.get("allocator_agreed", False)),
            ggml_ids_changed=bool(said["backend_ids_changed"]) if said else None, ggml_size_changed=bool(said["graph_size_changed"]) if said else None,
            max_nodes=int(d.get("max_nodes", 0)), parallel=bool(d.get("parallel", False)), op_offload=bool(d.get("op_offload", False)),
            observes_realloc=bool(d.get("observes_realloc", False)), owner_counts=bool(d.get("owner_counts", False)),
            current_max_nodes=int(d.get("current_max_nodes", 0)),
            llama_n_same=int(counted["n_same"]) if counted else None, llama_n_diff=int(counted["n_diff"]) if counted else None,
            capture=d.get("capture"), aborted=bool(d.get("aborted", False)), context=int(d.get("context", 0)),
        )


@dataclass(frozen=True)
class CallRecord:
    index: int  # -1: llama_init_from_model
    kind: str
    rc: int | str
    sched: tuple[SchedCall, ...] = ()
    error: tuple[str, ...] = ()  # what llama.cpp logged when the call failed (a context that did not initialize)
    # init: llama.cpp's lines on where the model went (its devices, layers offloaded, tensor
    # overrides: from loading it) and the context (pipeline parallelism, and its fallback; how
    # it resolved flash attention "auto")
    log: tuple[str, ...] = ()
    # decode, when asked for (llama-same-logits): the logits of its first and last output
    logits: tuple[tuple[float, ...], ...] = ()
    # how llama.cpp let the call roll a sequence back: "snapshot" (a recurrent state's last positions
    # dropped by llama_memory_seq_rm, n_rs_seq), "checkpoint" (restored), "positions" (an attention cache's)
    rollback: str = ""
    draft_rollback: str = ""  # the same, of the draft context (a draft model's own memory, or an MTP context's positions)


@dataclass(frozen=True)
class LlamaAbort:
    call: int
    kind: str  # abort | crash | timeout
    message: str
    # a captured run's abort: the aborting call's scheduler calls, the last the one ggml aborted in
    sched: tuple[SchedCall, ...] = ()
    # where in the call ggml aborted: inside reserve, alloc, reserve_size or compute, or in llama.cpp's
    # own code between them ("llama.cpp": building a graph, setting inputs), or in the round trip to the RPC servers before
    # the context is freed ("synchronize"); "" where the worker could not say (a crash, a timeout)
    phase: str = ""
    # the RPC servers of the workload that died, each "127.0.0.1:PORT: killed by SIGSEGV" (or "exited with status N"), from
    # their exit status (``process.rpc.ServerDeath.brief``): what ``message``'s "RPC server ... was killed by" lines say
    servers: tuple[str, ...] = ()
    # what the workload's RPC servers logged against its commands, each "127.0.0.1:PORT: LINE" (``RpcServers.refusals``):
    # a server that refused a command says why there, and its client only that it "crashed or returned malformed response"
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class LlamaTrace:
    calls: tuple[CallRecord, ...]
    abort: LlamaAbort | None = None
    engine: Mapping[str, str] = field(default_factory=dict)
    perf: Mapping[str, int] = field(default_factory=dict)  # llama_perf_context: n_eval, n_p_eval, n_reused

    def flash_attn(self) -> str | None:
        """How the context resolved flash attention "auto", as llama.cpp logged it
        (``llama_context::resolve_fused_ops``): "on", "off" (a device the layers are on refused
        ``FLASH_ATTN_EXT``), or None where it resolved nothing (not "auto", or no context)."""
        said = [line for c in self.calls if c.kind == "init" for line in c.log if "Flash Attention " in line]
        return None if not said else "off" if "not supported" in said[-1] else "on"

    def sched_calls(self) -> list[tuple[int, SchedCall]]:
        """Every scheduler call with the index of the llama call it happened in, in order."""
        return [(c.index, s) for c in self.calls for s in c.sched]

    @staticmethod
    def from_messages(calls: list[Mapping[str, Any]], abort: LlamaAbort | None, engine: Mapping[str, str], perf: Mapping[str, int]) -> LlamaTrace:
        records = tuple(CallRecord(int(c["index"]), c["kind"], c["rc"], tuple(SchedCall.from_json(s) for s in c["sched"]), tuple(c.get("error", ())),
                                   tuple(c.get("log", ())), tuple(tuple(r) for r in c.get("logits", ())), str(c.get("rollback", "")),
                                   str(c.get("draft_rollback", "")))
                        for c in calls)
        return LlamaTrace(records, abort, dict(engine), dict(perf))
