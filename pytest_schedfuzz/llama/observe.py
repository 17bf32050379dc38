"""What the llama.cpp worker (``llama_worker.Llama``) observes of the scheduler: the calls libllama
makes (``ggml_backend_sched_new``, ``_reserve``, ``_alloc_graph``, ``_free``) through
``sched_hook.c``, preloaded into the worker; the graph handed to each, read through ggml's own
structs; splits and the reallocation decision with its reason from ggml's debug log, which
``llama_log_set`` routes here together with llama.cpp's own lines (``Observation``, a part of
``Llama``); and the structs those are read with.
"""

from __future__ import annotations

import ctypes
import hashlib
import pickle
import re
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..ggml.bindings import VIEW_OP_NAMES
from ..ggml.schedlog import SchedLog
from ..model.trace import UNOBSERVABLE
from ..process.channel import Channel
from . import graph_records
from .allocator import allocator_decision
from .leaf_order import reordered
from .structs import CGraphHead, RawTensor

(HOOK_SCHED_NEW, HOOK_RESERVE_BEGIN, HOOK_RESERVE_END, HOOK_ALLOC_BEGIN, HOOK_ALLOC_END, HOOK_SCHED_FREE, HOOK_SPLIT_BEGIN, HOOK_SPLIT_END,
 HOOK_RESERVE_SIZE_BEGIN, HOOK_RESERVE_SIZE_END, HOOK_REALLOC, HOOK_REALLOC_OWNER, HOOK_SET_TENSOR_BACKEND, HOOK_RESET,
 HOOK_COMPUTE_BEGIN, HOOK_COMPUTE_END, HOOK_GALLOC_ALLOC, HOOK_GALLOC_RESERVE, HOOK_GALLOC_OWN) = range(19)  # sched_hook.c
# ggml-alloc's reason naming a node llama.cpp left unnamed (ggml_build_forward_expand names it node_N)
UNNAMED_NODE = re.compile(r"node (node_\d+) is not valid")
OUTER = {HOOK_RESERVE_BEGIN: "reserve", HOOK_ALLOC_BEGIN: "alloc", HOOK_RESERVE_SIZE_BEGIN: "reserve_size"}
OUTER_END = {HOOK_RESERVE_END: "reserve", HOOK_ALLOC_END: "alloc", HOOK_RESERVE_SIZE_END: "reserve_size"}
# the seeds' llama.cpp (llama_context::sched_graph_realloc, sched_new)
LLAMA_REALLOC = re.compile(r"^sched_graph_realloc: graph reallocation: nodes = (?P<nodes>\d+)(?: \(changed = (?P<changed>\d+)\))?, splits = (?P<splits>\d+), "
                           r"n_same = (?P<n_same>\d+), n_diff = (?P<n_diff>\d+)$")
LLAMA_SCHED_PARAMS = re.compile(r"^sched_new: max_nodes = (?P<max_nodes>\d+), parallel = (?P<parallel>[01]), op_offload = (?P<op_offload>[01])$")
LLAMA_SCHED_REUSE = re.compile(r"^sched_new: reusing scheduler: max_nodes = (?P<max_nodes>\d+) \(current max_nodes = (?P<current>\d+)\)$")
HOOK_T = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long)
TENSOR_FLAG_INPUT = 1
BUFFER_USAGE_WEIGHTS = 1  # enum ggml_backend_buffer_usage
MAX_BUFFERS = 256  # distinct buffers of one captured graph (sched_hook.c's graph_records)
# llama.cpp's lines on where the model and the context went (llama_model_load, llama_context), how
# the context resolved flash attention "auto" (llama_context::resolve_fused_ops), and what its MoE
# cache made of its budget (llama_moe_cache, b11739: made, or why not)
PLACEMENT = re.compile(r"using device \S+ \(|offloaded \d+/\d+ layers to GPU|buffer type overridden to|pipeline parallelism enabled|"
                       r"retrying without pipeline parallelism|Flash Attention (?:enabled|not supported)|"
                       r"MoE cache size = |MoE cache is disabled|MoE cache budget is too small")


class HarnessError(RuntimeError):
    """The harness failed inside a callback (or could not read ggml's log): the call cannot be judged."""


def declare_sched_functions(glib: Any) -> None:
    """The result and argument types of the ggml functions the observation calls, on ggml-python's
    library object ``glib``."""
    glib.ggml_backend_sched_get_n_splits.restype = ctypes.c_int
    glib.ggml_backend_sched_get_n_copies.restype = ctypes.c_int
    glib.ggml_backend_sched_get_n_backends.restype = ctypes.c_int
    # pointers: ggml-python 0.0.45 declares some of these int, which cuts them to 32 bits
    for name in ("ggml_backend_sched_get_backend", "ggml_backend_sched_get_tensor_backend", "ggml_backend_sched_get_buffer_type"):
        getattr(glib, name).restype = ctypes.c_void_p
    glib.ggml_backend_sched_get_backend.argtypes = [ctypes.c_void_p, ctypes.c_int]
    glib.ggml_backend_sched_get_tensor_backend.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    glib.ggml_backend_sched_get_buffer_type.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    glib.ggml_backend_name.restype = ctypes.c_char_p
    glib.ggml_backend_name.argtypes = [ctypes.c_void_p]
    glib.ggml_op_name.argtypes, glib.ggml_op_name.restype = [ctypes.c_int], ctypes.c_char_p
    glib.ggml_op_desc.argtypes, glib.ggml_op_desc.restype = [ctypes.c_void_p], ctypes.c_char_p
    glib.ggml_graph_get_tensor.argtypes, glib.ggml_graph_get_tensor.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
    glib.ggml_backend_buffer_get_usage.argtypes, glib.ggml_backend_buffer_get_usage.restype = [ctypes.c_void_p], ctypes.c_int
    glib.ggml_backend_buffer_is_host.argtypes, glib.ggml_backend_buffer_is_host.restype = [ctypes.c_void_p], ctypes.c_bool
    glib.ggml_backend_buffer_get_type.argtypes, glib.ggml_backend_buffer_get_type.restype = [ctypes.c_void_p], ctypes.c_void_p
    glib.ggml_backend_buft_name.argtypes, glib.ggml_backend_buft_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    glib.ggml_backend_sched_get_buffer_size.argtypes, glib.ggml_backend_sched_get_buffer_size.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_size_t


def graph_digest(cap: dict[str, Any]) -> bytes:
    """A captured graph's digest: equal for equal graphs, in any workload (its ``key``)."""
    h = hashlib.sha1(cap["records"])
    h.update(pickle.dumps((cap["n_nodes"], cap["buffers"], cap["forced"]), protocol=pickle.HIGHEST_PROTOCOL))
    return h.digest()


class GraphReading:
    """What the scheduler and a graph hold, read through ggml's calls and structs and
    ``sched_hook.c``'s records: splits, each node's backend, buffers, a graph whole. A part of
    ``Observation``, whose callbacks read them."""

    glib: Any
    layout: Any  # TensorLayout of the loaded ggml-python
    tensor_backends: Any
    graph_records: Any
    tensor: Callable[[int], RawTensor]
    records: Any
    buffers: Any
    op_names: dict[int, str]
    backends: dict[int, list[tuple[str, int]]]
    graph_ids: dict[bytes, int]
    forced: dict[int, dict[int, int]]
    inputs_read: int
    capturing: bool
    scheds: dict[int, int]
    log: SchedLog
    last_counts: dict[int, dict[str, int]]
    last_backends: dict[tuple[int, str], list[Any]]

    def _backends(self, sched: int) -> list[tuple[str, int]]:
        """The scheduler's backends in priority order: (name, buffer type)."""
        glib, s = self.glib, ctypes.c_void_p(sched)
        out = []
        for i in range(int(glib.ggml_backend_sched_get_n_backends(s))):
            backend = glib.ggml_backend_sched_get_backend(s, i)
            out.append((glib.ggml_backend_name(ctypes.c_void_p(backend)).decode(), int(glib.ggml_backend_sched_get_buffer_type(s, ctypes.c_void_p(backend)) or 0)))
        return out

    def _read_split(self, sched: int, graph: int) -> dict[str, Any]:
        """What one ``ggml_backend_sched_split_graph`` did: counts, input shapes, splits printed, graph size;
        ``moved``: the first node (then leaf) whose backend (buffer type) differs at its position from the last
        split_graph's, as ``alloc_splits`` compares them (or none; ``reordered``: moved by the leafs' order)."""
        sid = self.scheds.get(sched, -1)
        s = ctypes.c_void_p(sched)
        n_splits = int(self.glib.ggml_backend_sched_get_n_splits(s))
        n_copies = int(self.glib.ggml_backend_sched_get_n_copies(s))
        g = self._read_graph(graph)
        names = self.backends.get(sid, [])
        head = CGraphHead.from_address(graph)
        n_prev = len(self.last_backends.get((sid, "node"), []))
        moved, by_offload = "", False
        leaf_names = [self._name(t) for t in ctypes.cast(head.leafs, ctypes.POINTER(ctypes.c_void_p))[:head.n_leafs]]
        prev_leafs, self.last_backends[(sid, "leaf name")] = self.last_backends.get((sid, "leaf name"), []), leaf_names
        for what, array, n in (("node", head.nodes, head.n_nodes), ("leaf", head.leafs, head.n_leafs)):
            tensors = ctypes.cast(array, ctypes.POINTER(ctypes.c_void_p))
            ids = self._backend_ids(sched, array, n)
            prev, self.last_backends[(sid, what)] = self.last_backends.get((sid, what), []), ids
            if not moved:
                for i, (was, now) in enumerate(zip(prev, ids)):
                    if was != now and min(was, now) >= 0 and names[was][1] != names[now][1]:
                        kind = "reordered" if what == "leaf" and reordered(prev_leafs, prev, leaf_names, ids, i) else self._kind(what, tensors[i])
                        moved, by_offload = f"{what} {self._name(tensors[i])} ({kind}): #{was} {names[was][0]} -> #{now} {names[now][0]}", \
                            what == "node" and self._reads_host_weight(tensors[i], g["host_weights"])
                        break
        if not moved:
            moved = f"no node or leaf at a common position (a graph of {head.n_nodes} nodes after one of {n_prev})"
        counts = {"n_nodes": g["n_nodes"], "n_leafs": g["n_leafs"], "n_splits": n_splits, "split_inputs": sum(len(x.inputs) for x in self.log.splits),
                  "input_leafs": g["n_inputs"], "input_leafs_read": self.inputs_read, "n_copies": n_copies}
        prev, self.last_counts[sid] = self.last_counts.get(sid), counts  # none since ggml_backend_sched_new: its debug_graph_size is 0
        return {
            "sched": sid, "n_nodes": g["n_nodes"], "n_leafs": g["n_leafs"], "n_splits": n_splits, "n_copies": n_copies,
            "counts": counts, "prev_counts": prev, "inputs": g["inputs"],
            # ggml's op offload copies a weight in host memory to the device that runs the op: an input of a device's split
            "offloaded": sorted({f"{x}@{split.backend_name}" for split in self.log.splits if split.backend_name != names[-1][0]
                                 for x in split.inputs if x in g["host_weights"]}),
            "splits": [[x.backend_name, len(x.inputs)] for x in self.log.splits], "moved": moved, "moved_by_offload": by_offload,
        }

    def _reads_host_weight(self, tensor: int, host_weights: set[str]) -> bool:
        """Whether node ``tensor`` reads a weight in host memory, directly or through the copy
        split_graph's pass 5 made of it (``BACKEND#NAME#COPY``): only op offload (pass 1's
        ``ggml_backend_sched_backend_id_from_cur``) puts such a node on another backend than the CPU,
        so its move between two splits is op offload's, whatever else the graphs differ in."""
        for x in self.tensor(tensor).src:
            if x:
                name = self._name(x)
                if name in host_weights or (name.count("#") >= 2 and name.split("#", 1)[1].rsplit("#", 1)[0] in host_weights):
                    return True
        return False

    def _captured_into(self, rec: dict[str, Any], sched: int) -> None:
        cap = rec["capture"] = self.captured
        self.captured = None
        del cap["sched"]
        cap["buffer_sizes"] = self._buffer_sizes(sched)
        key = graph_digest(cap)
        if key in self.graph_ids:
            del cap["records"], cap["n_nodes"], cap["buffers"], cap["forced"]
            cap["same_graph"] = self.graph_ids[key]
        else:
            cap["graph_id"] = self.graph_ids[key] = len(self.graph_ids)
            cap["key"] = key.hex()

    def _capture_graph(self, sched: int, graph: int) -> dict[str, Any]:
        """The graph handed to the scheduler, whole, as ``sched_hook.c`` writes it: a record per
        node and leaf (``graph_records.tensors`` reads them: op, type, shape, strides, sources,
        view source, flags, name, op params, buffer), and each distinct buffer's type name and
        usage (weights, compute, any); ``forced``: the tensors llama.cpp assigned a backend
        (``ggml_backend_sched_set_tensor_backend``) since the scheduler's last reset, with the
        backend's index; ``order``: the nodes and leafs as they are now (``_assigned``)."""
        head = CGraphHead.from_address(graph)
        size = (head.n_nodes + head.n_leafs) * graph_records.RECORD.size
        if len(self.records) < size:
            self.records = ctypes.create_string_buffer(2 * size)
        n_buffers = self.graph_records(graph, ctypes.byref(self.layout), self.records, self.buffers, MAX_BUFFERS)
        if n_buffers < 0:
            raise RuntimeError(f"a graph in more than {MAX_BUFFERS} buffers: sched_hook.c's records cannot name them")
        order = {"nodes": (ctypes.c_void_p * head.n_nodes)(), "leafs": (ctypes.c_void_p * head.n_leafs)()}
        ctypes.memmove(order["nodes"], head.nodes, ctypes.sizeof(order["nodes"]))
        ctypes.memmove(order["leafs"], head.leafs, ctypes.sizeof(order["leafs"]))
        forced = []
        if self.forced.get(sched):
            ref = {p: f"n{i}" for i, p in enumerate(order["nodes"])} | {p: f"l{i}" for i, p in enumerate(order["leafs"])}
            s = ctypes.c_void_p(sched)
            index = {self.glib.ggml_backend_sched_get_backend(s, i): i for i in range(int(self.glib.ggml_backend_sched_get_n_backends(s)))}
            forced = [[ref[t], index.get(b, -1)] for t, b in self.forced[sched].items() if t in ref]
        return {"records": ctypes.string_at(self.records, size), "n_nodes": head.n_nodes, "buffers": [self._buffer_type(b) for b in self.buffers[:n_buffers]],
                "forced": forced, "order": order}

    def _buffer_type(self, buffer: int) -> tuple[str, int]:
        """A buffer's type's name and its usage."""
        buf = ctypes.c_void_p(buffer)
        return self.glib.ggml_backend_buft_name(ctypes.c_void_p(self.glib.ggml_backend_buffer_get_type(buf))).decode(), int(self.glib.ggml_backend_buffer_get_usage(buf))

    def _assigned(self, sched: int, order: dict[str, list[int]]) -> dict[str, list[int]]:
        """The backend (its index among the scheduler's) ggml's split_graph gave each node and leaf,
        in the order they had when captured: a device's ``graph_optimize`` reorders the nodes of its
        split in the graph itself (a split's graph is a view of it)."""
        return {what: self._backend_ids(sched, (ctypes.c_void_p * len(tensors))(*tensors), len(tensors)) for what, tensors in order.items()}

    def _backend_ids(self, sched: int, tensors: Any, n: int) -> list[int]:
        """``ggml_backend_sched_get_tensor_backend`` of each of the ``n`` tensors of the array
        ``tensors`` (an address or a ctypes array), as the backend's index among the scheduler's
        (-1: none); one call into ``sched_hook.c`` for them all."""
        out = (ctypes.c_int * n)()
        if n:
            self.tensor_backends(sched, tensors, n, out)
        return list(out)

    def _buffer_sizes(self, sched: int) -> list[int]:
        """``ggml_backend_sched_get_buffer_size`` of each of the scheduler's backends."""
        s = ctypes.c_void_p(sched)
        return [int(self.glib.ggml_backend_sched_get_buffer_size(s, ctypes.c_void_p(self.glib.ggml_backend_sched_get_backend(s, i))))
                for i in range(int(self.glib.ggml_backend_sched_get_n_backends(s)))]

    def _name(self, tensor: int) -> str:
        return self.tensor(tensor).name

    def _kind(self, what: str, tensor: int) -> str:
        """What kind of tensor moved, in words that no model's names are in: a node's op
        (``ggml_op_desc``), a leaf's role (an input llama.cpp sets per batch, or a weight)."""
        if what == "node":
            return self.glib.ggml_op_desc(ctypes.c_void_p(tensor)).decode()
        return "input" if self.tensor(tensor).flags & TENSOR_FLAG_INPUT else "weight"

    def _read_graph(self, graph: int) -> dict[str, Any]:
        """Node and leaf counts of the graph handed to the scheduler, its input leafs' shapes (they
        say which batch the graph is for: ``inp_tokens`` n_tokens, ``kq_mask`` n_kv, ...), and the
        weights in host memory."""
        head = CGraphHead.from_address(graph)
        leafs = ctypes.cast(head.leafs, ctypes.POINTER(ctypes.c_void_p))
        inputs: dict[str, list[int]] = {}
        n_inputs = 0  # not len(inputs): input leafs can share a name (ggml counts each one)
        host_weights = set()
        for i in range(head.n_leafs):
            t = self.tensor(leafs[i])
            if t.flags & TENSOR_FLAG_INPUT:
                inputs[t.name] = list(t.ne)
                n_inputs += 1
            elif t.buffer and self.glib.ggml_backend_buffer_get_usage(t.buffer) == BUFFER_USAGE_WEIGHTS and self.glib.ggml_backend_buffer_is_host(t.buffer):
                host_weights.add(t.name)
        return {"n_nodes": head.n_nodes, "n_leafs": head.n_leafs, "inputs": inputs, "n_inputs": n_inputs, "host_weights": host_weights}

    def _inputs_read(self, graph: int) -> int:
        """How many input leafs a non-view node of ``graph`` reads, before ggml's split_graph
        replaces the sources it copies in (its pass 5 rewrites ``src``)."""
        head = CGraphHead.from_address(graph)
        leafs = ctypes.cast(head.leafs, ctypes.POINTER(ctypes.c_void_p))
        inputs = {leafs[i] for i in range(head.n_leafs) if self.tensor(leafs[i]).flags & TENSOR_FLAG_INPUT}
        nodes = ctypes.cast(head.nodes, ctypes.POINTER(ctypes.c_void_p))
        read = set()
        for i in range(head.n_nodes if inputs else 0):
            t = self.tensor(nodes[i])
            if self._op_name(t.op) not in VIEW_OP_NAMES:
                read.update(a for a in t.src if a in inputs)
        return len(read)

    def _op_name(self, op: int) -> str:
        if op not in self.op_names:
            self.op_names[op] = self.glib.ggml_op_name(op).decode()
        return self.op_names[op]


class Observation(GraphReading):
    """The scheduler's calls, ggml's log and the graphs, as ``Llama`` sees them: the callbacks
    from C and what they read. A part of ``llama_worker.Llama``, which sets up the libraries first."""

    chan: Channel
    g: ModuleType
    glib: Any
    layout: Any  # TensorLayout of the loaded ggml-python
    logs_reallocs: bool
    context: int  # whose scheduler calls come now: 0 the target context, 1 the draft context
    sched_context: dict[int, int]
    tensor_backends: Any
    graph_records: Any

    def _start_observing(self) -> None:
        """The state the callbacks keep, empty."""
        self.records = ctypes.create_string_buffer(0)  # grown to the largest graph captured
        self.buffers = (ctypes.c_void_p * MAX_BUFFERS)()
        self.call = -1
        self.log = SchedLog()
        self.sched_events: list[dict[str, Any]] = []
        self.scheds: dict[int, int] = {}  # sched pointer -> id, in order of creation
        self.n_scheds = 0
        self.op_names: dict[int, str] = {}  # ggml_op_name, as the loaded library names its ops
        self.tensor = RawTensor.reader(self.g.ggml_tensor)
        self.inputs_read = 0  # of the graph being split (HOOK_SPLIT_BEGIN)
        self.placement_lines: list[str] = []  # PLACEMENT lines since the model was loaded (``Placement.n_model_lines`` its loading's)
        self.want_logits = False  # record each decode's logits (llama-same-logits)
        self.logits: list[list[float]] = []  # of the call being made
        self.last_counts: dict[int, dict[str, int]] = {}  # sched id -> SizeCounts of its last split_graph
        self.last_backends: dict[tuple[int, str], list[Any]] = {}  # (sched id, node|leaf) -> each one's backend at its last split_graph; (sched id, "leaf name") -> the leafs' names
        self.backends: dict[int, list[tuple[str, int]]] = {}  # sched id -> its backends' names and buffer types
        self.outer: str | None = None  # the scheduler call a split_graph happens in
        self.computing = False  # inside ggml_backend_sched_graph_compute_async (an abort's phase)
        self.computed_in = -1  # the last call in which a scheduler computed (``llama_worker.Llama.synchronize_servers``)
        self.synchronizing = False  # in the round trip to the RPC servers before a context is freed (an abort's phase)
        self.split: dict[str, Any] | None = None  # what the last split_graph did
        self.said: dict[str, bool] | None = None  # ggml's realloc callback in this scheduler call (where ggml has it)
        self.observing: set[int] = set()  # sched ids whose realloc decisions ggml reports (its callback)
        self.galloc: list[str] = []  # ggml-alloc's calls in this scheduler alloc: "alloc", "failed", "reserve" (interposed)
        self.allocator_observed = False  # the start-up probe saw alloc_splits call ggml-alloc through the hook (llama_worker.Llama)
        self.llama_said: dict[str, int] | None = None  # llama.cpp's trace of that reallocation (the seeds' build)
        self.errors: list[str] = []  # the harness's own failures inside callbacks: the call is not judged
        self.capturing = False  # read every graph handed to reserve/alloc whole (cases.capture)
        self.captured: dict[str, Any] | None = None  # ... the one being split
        self.graph_ids: dict[bytes, int] = {}  # the graphs this workload captured (their digest) -> their id
        self.forced: dict[int, dict[int, int]] = {}  # sched -> tensor -> backend llama.cpp set since the last reset

    def _on_log(self, level: int, text: bytes | None, user_data: Any) -> None:
        try:
            line = (text or b"").decode(errors="replace")
            if line.startswith("sched_reserve: max_nodes = "):
                # llama_context::sched_reserve: the worst case is reserved again (on a new or a kept scheduler)
                self.sched_events.append({"kind": "sched_reserve", "sched": -1, "context": self.context, "max_nodes": int(line.split("=")[1])})
            elif m := LLAMA_REALLOC.match(line):
                # the seeds' llama.cpp: its own count of the reallocations it did not expect, after this one
                self.llama_said = {k: int(v) for k, v in m.groupdict().items() if v is not None}
            elif m := LLAMA_SCHED_PARAMS.match(line):
                # the seeds' sched_new: the parameters llama.cpp asks a scheduler for
                self.sched_events.append({"kind": "sched_params", "sched": -1, "context": self.context, "max_nodes": int(m["max_nodes"]),
                                          "parallel": m["parallel"] == "1", "op_offload": m["op_offload"] == "1"})
            elif m := LLAMA_SCHED_REUSE.match(line):
                # the seeds' sched_new kept the scheduler it had (sched_params::can_reuse)
                self.sched_events.append({"kind": "reuse", "sched": self.n_scheds - 1, "context": self.context, "max_nodes": int(m["max_nodes"]),
                                          "current_max_nodes": int(m["current"])})
            if PLACEMENT.search(line):
                self.placement_lines.append(line.strip())
            self.log.feed(line)
        except Exception:  # an exception must not unwind into C
            self.errors.append(f"the log callback failed in call {self.call}: " + traceback.format_exc())

    def _on_abort(self, message: bytes | None) -> None:
        try:
            # the phase: in the round trip to the RPC servers before a context is freed ("synchronize"), inside which
            # scheduler call ggml aborted, else "llama.cpp" (its own code between them: building a graph, setting inputs...)
            phase = "synchronize" if self.synchronizing else self.outer or ("compute" if self.computing else "llama.cpp")
            msg: dict[str, Any] = {"call": self.call, "message": (message or b"").decode(errors="replace"), "phase": phase}
            if self.captured is not None:
                # the scheduler call that aborts, with the graph llama.cpp handed it, after this call's earlier ones
                cap = {k: v for k, v in self.captured.items() if k not in ("order", "sched")}
                cap["key"] = graph_digest(cap).hex()
                msg["sched"] = [*self.sched_events, {"kind": self.outer or "split", "sched": self.captured["sched"], "ok": False, "aborted": True,
                                                     "capture": cap}]
            self.chan.send({"abort": msg})
        except Exception:
            pass

    def _on_sched(self, phase: int, sched: int | None, graph: int | None, a: int, b: int, c: int) -> None:
        try:
            self._sched_event(phase, sched or 0, graph or 0, a, b, c)
        except Exception:
            self.errors.append(f"the scheduler hook failed in call {self.call}: " + traceback.format_exc())

    def _unnamed_node(self, graph: int, name: str) -> str:
        """What an unnamed node (``node_N``) is: its op as ggml describes it (``ggml_op_desc``:
        the unary op for GGML_OP_UNARY) and its role, the names of its sources (a source unnamed
        too by its op): ``GET_ROWS(result_norm, out_ids)``; "" where the graph has no such tensor."""
        t = self.glib.ggml_graph_get_tensor(ctypes.c_void_p(graph), name.encode())
        if not t:
            return ""
        srcs = [x for x in self.tensor(t).src if x]
        return f"{self._desc(t)}({', '.join(self._name(x) or self._desc(x) for x in srcs)})"

    def _desc(self, tensor: int) -> str:
        return self.glib.ggml_op_desc(ctypes.c_void_p(tensor)).decode()

    def _sched_event(self, phase: int, sched: int, graph: int, a: int, b: int, c: int) -> None:
        if phase == HOOK_SET_TENSOR_BACKEND:
            self.forced.setdefault(sched, {})[graph] = a
            return
        if phase == HOOK_RESET:
            self.forced.pop(sched, None)
            return
        if phase in (HOOK_COMPUTE_BEGIN, HOOK_COMPUTE_END):
            self.computing = phase == HOOK_COMPUTE_BEGIN
            self.computed_in = self.call
            return
        if phase == HOOK_SCHED_NEW:
            # ids by creation: a new scheduler may get a freed one's address
            sid = self.scheds[sched] = self.n_scheds
            self.n_scheds += 1
            self.sched_context[sid] = self.context
            self.backends[sid] = self._backends(sched)
            self.sched_events.append({"kind": "new", "sched": sid, "max_nodes": a, "parallel": bool(b & 1), "op_offload": bool(c),
                                      "observes_realloc": bool(b & 2)})
            if b & 2:
                self.observing.add(sid)
        elif phase == HOOK_SCHED_FREE:
            self.sched_events.append({"kind": "free", "sched": self.scheds.get(sched, -1)})
        elif phase in OUTER:
            self.outer, self.split, self.said, self.llama_said = OUTER[phase], None, None, None
            self.galloc = []
            self.log.begin()
        elif phase in (HOOK_GALLOC_ALLOC, HOOK_GALLOC_RESERVE, HOOK_GALLOC_OWN):
            if self.outer == "alloc":  # sched_reserve's reserve_n is a reservation, not a re-plan
                self.galloc.append({HOOK_GALLOC_RESERVE: "reserve", HOOK_GALLOC_OWN: "own"}.get(phase) or ("alloc" if a else "failed"))
        elif phase == HOOK_REALLOC_OWNER:
            # llama.cpp registered a realloc callback of its own (the seeds' sched_new): it counts
            sid = self.scheds[sched]
            next(e for e in reversed(self.sched_events) if e["kind"] == "new" and e["sched"] == sid)["owner_counts"] = True
        elif phase == HOOK_REALLOC:
            # ggml_backend_sched_alloc_splits re-reserves: ggml's own view of why
            self.said = {"backend_ids_changed": bool(a), "graph_size_changed": bool(b)}
        elif phase == HOOK_SPLIT_BEGIN:
            if self.outer is None:  # called by llama.cpp itself (the flash-attention probe)
                self.log.begin()
            # ggml collects graph inputs only with n_copies > 1: the nodes are not walked otherwise
            self.inputs_read = self._inputs_read(graph) if self.glib.ggml_backend_sched_get_n_copies(ctypes.c_void_p(sched)) > 1 else 0
            # as llama.cpp built it: split_graph's pass 5 points the nodes' sources at its input copies
            self.captured = self._capture_graph(sched, graph) if self.capturing and self.outer in ("reserve", "alloc", None) else None
            if self.captured is not None:  # its scheduler's backends now: a call that aborts is captured too (_on_abort)
                self.captured["sched"] = self.scheds[sched]
                backends = self.backends[self.scheds[sched]]
                self.captured["backend_names"] = [name for name, _ in backends]
                self.captured["bufts"] = [self.glib.ggml_backend_buft_name(ctypes.c_void_p(b)).decode() for _, b in backends]
        elif phase == HOOK_SPLIT_END:
            self.split = self._read_split(sched, graph)
            if self.captured is not None:
                self.captured["assigned"] = self._assigned(sched, self.captured.pop("order"))
            if self.outer is None:
                self.sched_events.append({"kind": "split", "ok": True, **self.split})
                if self.captured is not None:
                    self._captured_into(self.sched_events[-1], sched)
        else:
            kind, self.outer = OUTER_END[phase], None
            if self.split is None:
                raise RuntimeError(f"ggml_backend_sched_{'alloc_graph' if kind == 'alloc' else kind} returned without calling "
                                   "ggml_backend_sched_split_graph through its PLT: this ggml build binds it directly, and the "
                                   "harness cannot follow its graph sizes (build ggml as a shared library without -fno-semantic-interposition or LTO)")
            rec: dict[str, Any] = {"kind": kind, "ok": bool(a), **self.split}
            if self.log.reallocs:
                r = self.log.reallocs[-1]
                rec["realloc"] = {"via": r.via, "backend_ids_changed": r.backend_ids_changed, "reason": r.reason}
                unnamed = UNNAMED_NODE.search(r.reason)
                if unnamed:  # a node llama.cpp left unnamed (ggml calls it node_N): its op and sources tell it apart
                    rec["realloc"]["invalid_node"] = self._unnamed_node(graph, unnamed.group(1))
            elif self.said is not None and not self.logs_reallocs:
                # a Release build: ggml's realloc callback alone tells the decision; ggml-alloc's reason is compiled out
                rec["realloc"] = {"via": "sched", "backend_ids_changed": self.said["backend_ids_changed"], "reason": UNOBSERVABLE}
            if kind == "alloc" and self.allocator_observed:
                allocator_decision(rec, self.galloc, self.call, told_by=None if self.logs_reallocs else
                                   "callback" if rec["sched"] in self.observing else "")
            if rec.get("realloc", {}).get("backend_ids_changed"):
                rec["realloc"]["moved"] = self.split["moved"]
                rec["realloc"]["moved_by_offload"] = self.split["moved_by_offload"]
            # a scheduler of an earlier call too: its creation is not among this call's events; ggml-alloc
            # re-planning a single buffer by itself (a CPU-only scheduler) is no decision of the scheduler's
            if rec["sched"] in self.observing and rec.get("realloc", {}).get("via") == "sched" and self.said is None:
                raise RuntimeError(f"ggml logged a reallocation in {kind} (call {self.call}) that its realloc callback did not report")
            if self.said is not None:
                if "realloc" not in rec:
                    raise RuntimeError(f"ggml's realloc callback fired in {kind} (call {self.call}) but ggml logged no reallocation")
                rec["realloc"]["ggml"] = self.said
            if self.llama_said is not None:
                rec["realloc"]["llama"] = self.llama_said
            del rec["moved"], rec["moved_by_offload"]
            if self.captured is not None:
                self._captured_into(rec, sched)
            self.sched_events.append(rec)
        if self.log.errors:  # kept before the next scheduler call's log.begin() forgets them
            self.errors += [f"call {self.call}: {e}" for e in self.log.errors]
            self.log.errors = []
