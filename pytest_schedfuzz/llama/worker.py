"""The process that runs server-like workloads on the real llama.cpp:
``python -m pytest_schedfuzz.llama.worker`` (started by ``llama_target.LlamaTarget``).

Protocol: requests are JSON lines; replies are pickled messages, as ``ggml.worker``'s, on the file
descriptor that was stdout, and fd 1 is pointed at stderr so that llama.cpp's and ggml's prints
cannot corrupt them.

* startup: ``{"hello": {engine info}}`` or ``{"fatal": message}``;
* request ``{"workload": <LlamaWorkload JSON>, "model_path": P, "endpoints": [...], "lora_paths": [...]}``
  (with ``"capture": true``, every reserve and alloc record carries the graph whole, as
  ``sched_hook.c`` writes it (``"records"``, ``"n_nodes"``, ``"buffers"``: ``graph_records``), the
  first time in the workload with a ``"graph_id"`` and a ``"key"``, a digest of it that is the same
  for the same graph in any workload, and again only as ``"same_graph": id``: half the graphs of
  a workload are one it captured before, each ubatch of the same size), answered with
  ``{"begin": i}`` before call ``i`` (``-1``: creating the context, whose constructor reserves),
  ``{"call": <record>}`` after it, then ``{"done": {...}}``; ``{"unreachable": endpoint}`` when an
  RPC server does not answer; ``{"error": message}`` when the harness failed; ``{"unsupported":
  message}``, before any call, when the workload sets a context parameter this build lacks;
* on a ggml abort: ``{"abort": {"call": i, "message": text}}`` from ggml's abort callback, then
  the process dies; in a captured run, ``"sched"`` adds the call's scheduler calls up to the one that
  aborted, which is last, ``"aborted": true``, with its graph.

What is observed, and how: the scheduler calls libllama makes (``ggml_backend_sched_new``,
``_reserve``, ``_alloc_graph``, ``_free``) through ``sched_hook.c``, preloaded into this process;
the graph handed to each (node and leaf counts, the input leafs and their shapes) through ggml's
own structs (ggml-python's ``ggml_tensor``); splits and the reallocation decision with its reason
from ggml's debug log (``GGML_SCHED_DEBUG=1`` prints the split headers; a Debug build logs
``ggml_gallocr_needs_realloc`` and ``failed to allocate graph, reserving``), which
``llama_log_set`` routes to us together with llama.cpp's own lines.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import pickle
import re
import struct
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from ..engine import gc_paused
from ..ggml.engine import CPU_THREADS, VIEW_OP_NAMES, FakeGpuConfig, Ggml, gpu_device, load_fake_gpu
from ..ggml.lib import import_ggml, loaded_library_path
from ..ggml.schedlog import SchedLog
from ..ggml.worker import no_realloc_fix, probe_scenario, run_scenario
from ..model.llama import CPU_DEVICE, OPTIONAL_PARAMS, SAMPLER_CHAINS, Call, ContextParams, Devices, LlamaWorkload, Part
from ..model.llama_calls import CALLS
from ..model.llama_model import RECURRENT_KINDS
from ..model.scenario import BackendSpec
from ..process.channel import Channel
from ..process.children import die_with_parent
from . import declarations, graph_records
from .speculative import BATCH_EXT, CONTEXT_TYPE_MTP, MtpDraft, nextn_functions

(HOOK_SCHED_NEW, HOOK_RESERVE_BEGIN, HOOK_RESERVE_END, HOOK_ALLOC_BEGIN, HOOK_ALLOC_END, HOOK_SCHED_FREE, HOOK_SPLIT_BEGIN, HOOK_SPLIT_END,
 HOOK_RESERVE_SIZE_BEGIN, HOOK_RESERVE_SIZE_END, HOOK_REALLOC, HOOK_REALLOC_OWNER, HOOK_SET_TENSOR_BACKEND, HOOK_RESET,
 HOOK_COMPUTE_BEGIN, HOOK_COMPUTE_END) = range(16)  # sched_hook.c
# ggml-alloc's reason for a re-plan where a Release build (NDEBUG) does not log it
UNOBSERVABLE = "unobservable in a Release build"
# ggml-alloc's reason naming a node llama.cpp left unnamed (ggml_build_forward_expand names it node_N)
UNNAMED_NODE = re.compile(r"node (node_\d+) is not valid")
OUTER = {HOOK_RESERVE_BEGIN: "reserve", HOOK_ALLOC_BEGIN: "alloc", HOOK_RESERVE_SIZE_BEGIN: "reserve_size"}
OUTER_END = {HOOK_RESERVE_END: "reserve", HOOK_ALLOC_END: "alloc", HOOK_RESERVE_SIZE_END: "reserve_size"}
# the seeds' llama.cpp (llama_context::sched_graph_realloc, sched_new)
LLAMA_REALLOC = re.compile(r"^sched_graph_realloc: graph reallocation: nodes = (?P<nodes>\d+)(?: \(changed = (?P<changed>\d+)\))?, splits = (?P<splits>\d+), "
                           r"n_same = (?P<n_same>\d+), n_diff = (?P<n_diff>\d+)$")
LLAMA_SCHED_PARAMS = re.compile(r"^sched_new: max_nodes = (?P<max_nodes>\d+), parallel = (?P<parallel>[01]), op_offload = (?P<op_offload>[01])$")
LLAMA_SCHED_REUSE = re.compile(r"^sched_new: reusing scheduler: max_nodes = (?P<max_nodes>\d+) \(current max_nodes = (?P<current>\d+)\)$")
# the libllama functions the worker needs whatever the calls (each call kind's own: ``CALLS[k].functions``)
CORE = ("llama_backend_init", "llama_batch_free", "llama_batch_init", "llama_context_default_params", "llama_decode", "llama_free",
        "llama_get_logits_ith", "llama_get_memory", "llama_init_from_model", "llama_log_set", "llama_max_devices", "llama_memory_seq_pos_max",
        "llama_memory_seq_rm", "llama_model_default_params", "llama_model_free", "llama_model_get_vocab", "llama_model_load_from_file",
        "llama_perf_context", "llama_print_system_info", "llama_sampler_chain_add", "llama_sampler_chain_default_params",
        "llama_sampler_chain_init", "llama_sampler_free", "llama_sampler_init_dist", "llama_sampler_init_greedy", "llama_sampler_init_min_p",
        "llama_sampler_init_temp", "llama_sampler_init_top_k", "llama_sampler_init_top_p", "llama_synchronize", "llama_vocab_n_tokens")
PERF_FIELDS = ("n_eval", "n_p_eval", "n_reused", "n_reallocs_same", "n_reallocs_diff")  # llama_perf_context_data
HOOK_T = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long)
TENSOR_FLAG_INPUT = 1
KV_TYPE = {"f16": 1, "f32": 0, "q8_0": 8}  # enum ggml_type
FLASH = {"off": 0, "on": 1, "auto": -1}
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3}
SPLIT_MODE = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # enum llama_split_mode
BUFFER_USAGE_WEIGHTS = 1  # enum ggml_backend_buffer_usage
ALL_MEMORY = ctypes.c_size_t(-1).value  # schedfuzz_fake_gpu_set_free: all of the device's memory
STATE_PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid model's recurrent part only, as llama-server checkpoints
MAX_BUFFERS = 256  # distinct buffers of one captured graph (sched_hook.c's graph_records)
# llama.cpp's lines on where the model and the context went (llama_model_load, llama_context), how
# the context resolved flash attention "auto" (llama_context::resolve_fused_ops), and what its MoE
# cache made of its budget (llama_moe_cache, b11739: made, or why not)
PLACEMENT = re.compile(r"using device \S+ \(|offloaded \d+/\d+ layers to GPU|buffer type overridden to|pipeline parallelism enabled|"
                       r"retrying without pipeline parallelism|Flash Attention (?:enabled|not supported)|"
                       r"MoE cache size = |MoE cache is disabled|MoE cache budget is too small")


class HarnessError(RuntimeError):
    """The harness failed inside a callback (or could not read ggml's log): the call cannot be judged."""


class TensorBuftOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (llama.h), which llama-cpp-python does not bind."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class CGraphHead(ctypes.Structure):
    """The leading fields of ``struct ggml_cgraph`` (ggml-impl.h; unchanged from 0.15.3 to 0.26.0).
    The struct is private to ggml and no header a build ships declares it: ``Llama.check_graph_head``
    checks it against the loaded library before any workload."""

    _fields_ = [
        ("size", ctypes.c_int),
        ("n_nodes", ctypes.c_int),
        ("n_leafs", ctypes.c_int),
        ("nodes", ctypes.c_void_p),
        ("grads", ctypes.c_void_p),
        ("grad_accs", ctypes.c_void_p),
        ("leafs", ctypes.c_void_p),
    ]


def graph_head_wrong(g: ModuleType, head_type: type[ctypes.Structure]) -> str:
    """What is wrong with ``head_type`` (``CGraphHead``) on the ggml ggml-python ``g`` loaded, or
    "": a graph of one ADD of two leafs, made with ggml's own calls, read through it and through
    ggml's accessors (``ggml_graph_size``, ``ggml_graph_nodes``, ``ggml_graph_n_nodes``); the
    leafs, which no accessor gives, must be the two operands."""
    glib = g.ggml.lib
    for name, res in (("ggml_graph_size", ctypes.c_int), ("ggml_graph_n_nodes", ctypes.c_int), ("ggml_graph_nodes", ctypes.c_void_p)):
        getattr(glib, name).argtypes, getattr(glib, name).restype = [ctypes.c_void_p], res
    ctx = g.ggml_init(g.ggml_init_params(mem_size=16 * 1024 * 1024, mem_buffer=None, no_alloc=True))
    try:
        a, b = (g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 4) for _ in range(2))
        c = g.ggml_add(ctx, a, b)
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, c)
        graph = ctypes.cast(gf, ctypes.c_void_p).value
        head: Any = head_type.from_address(graph)
        addr = [ctypes.cast(t, ctypes.c_void_p).value for t in (a, b, c)]
        told = (int(glib.ggml_graph_size(graph)), int(glib.ggml_graph_n_nodes(graph)), glib.ggml_graph_nodes(graph))
        if (head.size, head.n_nodes, head.nodes) != told:
            return f"size, n_nodes, nodes read {head.size}, {head.n_nodes}, {head.nodes or 0:#x}; ggml says {told[0]}, {told[1]}, {told[2] or 0:#x}"
        leafs = ctypes.cast(head.leafs, ctypes.POINTER(ctypes.c_void_p))[:2] if head.leafs and head.n_leafs == 2 else []
        if sorted(leafs) != sorted(addr[:2]) or ctypes.cast(head.nodes, ctypes.POINTER(ctypes.c_void_p))[0] != addr[2]:
            return f"n_leafs {head.n_leafs} and leafs {head.leafs or 0:#x} read are not the ADD's two operands"
        return ""
    finally:
        g.ggml_free(ctx)


class TensorLayout(ctypes.Structure):
    """``struct schedfuzz_tensor_layout`` of ``sched_hook.c``: where the fields its graph records
    copy lie in a ``ggml_tensor`` (offsets), and how many sources, op params and name bytes."""

    OFFSETS = ("type", "buffer", "ne", "nb", "op", "op_params", "flags", "src", "view_src", "view_offs", "name")
    _fields_ = [(name, ctypes.c_int32) for name in (*OFFSETS, "n_src", "n_op_params", "name_size")]

    @classmethod
    def of(cls, tensor: type[ctypes.Structure]) -> TensorLayout:
        """The layout of ggml-python's ``ggml_tensor`` (checked against the library by the
        worker's startup probe), refused where a record could not hold it."""
        f = {name: getattr(tensor, name) for name in cls.OFFSETS}
        counts = f["src"].size // 8, f["op_params"].size // 4, f["name"].size
        if counts[0] > graph_records.N_SRC or counts[1] > graph_records.N_PARAMS or counts[2] > graph_records.NAME_SIZE:
            raise RuntimeError(f"ggml_tensor has {counts} sources, op params and name bytes: more than sched_hook.c's records hold")
        return cls(*(x.offset for x in f.values()), *counts)


class RawTensor(NamedTuple):
    """The fields of a ``ggml_tensor`` the worker reads, from one copy of its bytes (a ctypes
    read per field cost a captured graph about 30% of a workload's time in the worker)."""

    type: int
    buffer: int
    ne: tuple[int, ...]
    nb: tuple[int, ...]
    op: int
    op_params: tuple[int, ...]
    flags: int
    src: tuple[int, ...]
    view_src: int
    view_offs: int
    name: str

    @staticmethod
    def reader(layout: type[ctypes.Structure]) -> Callable[[int], RawTensor]:
        """A reader of tensors laid out as ``layout`` (ggml-python's ``ggml_tensor``, checked
        against the library by the worker's startup probe): ``struct`` formats at its offsets."""
        codes = {"type": "i", "buffer": "Q", "ne": "q", "nb": "Q", "op": "i", "op_params": "i", "flags": "i", "src": "Q", "view_src": "Q",
                 "view_offs": "Q", "name": "s"}
        fmt, at, spans, k = "<", 0, {}, 0
        for name, code in codes.items():
            f = getattr(layout, name)
            n = f.size if code == "s" else f.size // struct.calcsize("<" + code)
            fmt += "x" * (f.offset - at) + f"{n}{code}"
            at = f.offset + f.size
            width = 1 if code == "s" else n
            spans[name] = slice(k, k + width)
            k += width
        unpack, size = struct.Struct(fmt).unpack_from, ctypes.sizeof(layout)
        ne, nb, params, src = spans["ne"], spans["nb"], spans["op_params"], spans["src"]
        i = {name: spans[name].start for name in ("type", "buffer", "op", "flags", "view_src", "view_offs", "name")}

        def read(ptr: int) -> RawTensor:
            v = unpack(ctypes.string_at(ptr, size))
            return RawTensor(v[i["type"]], v[i["buffer"]], v[ne], v[nb], v[i["op"]], v[params], v[i["flags"]], v[src], v[i["view_src"]],
                             v[i["view_offs"]], v[i["name"]].split(b"\0", 1)[0].decode(errors="replace"))

        return read


class Llama:
    """libllama (llama-cpp-python's bindings) and ggml (ggml-python's, on the same libraries)."""

    def __init__(self, chan: Channel, logs_reallocs: bool = True) -> None:
        # libllama through the build's own declarations (declarations.py), checked against it
        decl = declarations.Declarations(os.environ[declarations.SOURCE_ENV], Path(os.environ[declarations.CDEF_ENV]).read_text())
        L = declarations.Bindings(declarations.parse(decl), os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libllama.so"))
        wrong = declarations.check_bindings(L, CORE)
        if wrong:
            raise declarations.DeclarationsError(f"the declarations of {decl.source} do not match {os.path.realpath(L.lib_path)}:\n  " + "\n  ".join(wrong))
        self.L = L
        self.declarations = decl.source
        self.absent_calls = tuple(kind for kind, k in CALLS.items() if not all(L.has(f) for f in k.functions))
        # draft-mtp: llama.h's extended batch and llama-ext.h's NextN functions (speculative.py)
        self.nextn = nextn_functions(L.lib_path) if all(L.has(f) for f in BATCH_EXT) else None
        if self.nextn is None:
            self.absent_calls += ("draft mtp",)
        self.context = 0  # whose scheduler calls come now: 0 the target context, 1 the draft context
        self.sched_context: dict[int, int] = {}  # scheduler id -> the context that made it
        self.mtp: MtpDraft | None = None
        # context parameters this build's llama_context_params lacks (b11739's moe_cache_size on 0.3.36)
        self.absent_params = tuple(p for p in OPTIONAL_PARAMS if p not in L.llama_context_params.FIELDS)
        # a Debug build logs each reallocation with ggml-alloc's reason; a Release one is observed through the callback alone
        self.logs_reallocs = logs_reallocs
        self.chan = chan
        self.g: ModuleType = import_ggml()
        glib = self.g.ggml.lib
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
        self.glib = glib
        self.rpc = ctypes.CDLL(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libggml-rpc.so"))
        self.rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
        self.rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
        glib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
        glib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        glib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
        glib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
        fn = glib.ggml_version
        fn.restype = ctypes.c_char_p
        self.version = fn().decode()
        try:
            hook_lib = ctypes.CDLL(None)
            set_hook = hook_lib.schedfuzz_set_hook
            self.tensor_backends = hook_lib.schedfuzz_tensor_backends
            self.graph_records = hook_lib.schedfuzz_graph_records
            record_size = hook_lib.schedfuzz_tensor_record_size()
        except AttributeError:
            raise RuntimeError("sched_hook.so is not preloaded (LD_PRELOAD): the scheduler cannot be observed") from None
        self.tensor_backends.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.tensor_backends.restype = None
        if record_size != graph_records.RECORD.size:
            raise RuntimeError(f"sched_hook.c writes {record_size}-byte graph records, graph_records.RECORD reads {graph_records.RECORD.size}")
        self.graph_records.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        self.graph_records.restype = ctypes.c_int
        self.layout = TensorLayout.of(self.g.ggml_tensor)
        wrong = declarations.check_struct(L.ffi, "ggml_tensor", {f: getattr(self.g.ggml_tensor, f).offset for f in TensorLayout.OFFSETS})
        if wrong:  # where the build declares ggml_tensor (its ggml.h): ggml-python's layout, with which graphs are read, must be it
            raise declarations.DeclarationsError(f"ggml-python's struct ggml_tensor does not match {decl.source}: {wrong}")
        wrong = graph_head_wrong(self.g, CGraphHead)
        if wrong:
            raise declarations.DeclarationsError(f"struct ggml_cgraph of {loaded_library_path('libggml-base')} does not begin as "
                                                 f"the worker reads it (CGraphHead, ggml-impl.h 0.15.3-0.26.0): {wrong}")
        # which layouts the build's own declarations confirmed (a binding's cdef may leave ggml's structs opaque)
        self.layouts = ("llama.h structs and ggml_tensor" if declarations.declares(L.ffi, "ggml_tensor") else "llama.h structs (ggml_tensor: ggml-python's)") \
            + "; ggml_cgraph's head by ggml's own graph calls"
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
        self.placement: list[str] = []  # PLACEMENT lines since the model was loaded
        self.n_model_lines = 0  # ... of which the model's loading wrote
        self.want_logits = False  # record each decode's logits (llama-same-logits)
        self.logits: list[list[float]] = []  # of the call being made
        self.last_counts: dict[int, dict[str, int]] = {}  # sched id -> SizeCounts of its last split_graph
        self.last_backends: dict[tuple[int, str], list[int]] = {}  # (sched id, node|leaf) -> each one's backend at its last split_graph
        self.backends: dict[int, list[tuple[str, int]]] = {}  # sched id -> its backends' names and buffer types
        self.outer: str | None = None  # the scheduler call a split_graph happens in
        self.computing = False  # inside ggml_backend_sched_graph_compute_async (an abort's phase)
        self.split: dict[str, Any] | None = None  # what the last split_graph did
        self.said: dict[str, bool] | None = None  # ggml's realloc callback in this scheduler call (where ggml has it)
        self.observing: set[int] = set()  # sched ids whose realloc decisions ggml reports (its callback)
        self.llama_said: dict[str, int] | None = None  # llama.cpp's trace of that reallocation (the seeds' build)
        self.errors: list[str] = []  # the harness's own failures inside callbacks: the call is not judged
        self.capturing = False  # read every graph handed to reserve/alloc whole (cases.capture)
        self.captured: dict[str, Any] | None = None  # ... the one being split
        self.graph_ids: dict[bytes, int] = {}  # the graphs this workload captured (their digest) -> their id
        self.forced: dict[int, dict[int, int]] = {}  # sched -> tensor -> backend llama.cpp set since the last reset
        self._hook = HOOK_T(self._on_sched)
        set_hook(self._hook)
        self._log_cb = L.ggml_log_callback(self._on_log)
        L.llama_log_set(self._log_cb, None)
        self._abort_cb = self.g.ggml_abort_callback_t(self._on_abort)
        self.g.ggml_set_abort_callback(self._abort_cb)
        L.llama_backend_init()
        self.devices: dict[str, int] = {}  # endpoint -> ggml_backend_dev_t
        self.gpus: dict[str, int] = {}  # GPU-like device (index, settings) -> ggml_backend_dev_t
        self.fake: ctypes.CDLL | None = None
        # libggml (the registry: ggml_backend_register, ggml_backend_dev_by_type)
        self.ggml = ctypes.CDLL(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libggml.so"))
        self.ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        self.ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        self.ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
        self.ggml.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
        self.ggml.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
        self.cpu_dev = self.ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU: tensor overrides to the CPU, the GPU-like devices' kernels
        self.model: Any = None
        self.model_key: tuple[Any, ...] | None = None
        self.draft_model: Any = None  # a draft model of its own (``DraftModel``), kept as the target's
        self.draft_model_key: tuple[Any, ...] | None = None
        self._kept: dict[str, list[Any]] = {}  # per model slot: the arrays its load parameters point to

    # ------------------------------------------------------------------ callbacks from C

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
                self.placement.append(line.strip())
            self.log.feed(line)
        except Exception:  # an exception must not unwind into C
            self.errors.append(f"the log callback failed in call {self.call}: " + traceback.format_exc())

    def _on_abort(self, message: bytes | None) -> None:
        try:
            # the phase: inside which scheduler call ggml aborted, else "llama.cpp" (its own code between them:
            # building a graph, setting its inputs, reading outputs)
            phase = self.outer or ("compute" if self.computing else "llama.cpp")
            msg: dict[str, Any] = {"call": self.call, "message": (message or b"").decode(errors="replace"), "phase": phase}
            if self.captured is not None:
                # the scheduler call that aborts, with the graph llama.cpp handed it, after this call's earlier ones
                cap = {k: v for k, v in self.captured.items() if k not in ("order", "sched")}
                cap["key"] = _digest(cap).hex()
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
            self.log.begin()
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

    def _backends(self, sched: int) -> list[tuple[str, int]]:
        """The scheduler's backends in priority order: (name, buffer type)."""
        glib, s = self.glib, ctypes.c_void_p(sched)
        out = []
        for i in range(int(glib.ggml_backend_sched_get_n_backends(s))):
            backend = glib.ggml_backend_sched_get_backend(s, i)
            out.append((glib.ggml_backend_name(ctypes.c_void_p(backend)).decode(), int(glib.ggml_backend_sched_get_buffer_type(s, ctypes.c_void_p(backend)) or 0)))
        return out

    def _read_split(self, sched: int, graph: int) -> dict[str, Any]:
        """What one ``ggml_backend_sched_split_graph`` did: the graph's counts and input shapes,
        the splits ggml printed, and the graph size; ``moved``: the first node (then leaf) whose
        backend (buffer type) differs from the previous split_graph's at its position, as ggml
        compares them in ``alloc_splits`` (it compares its graph copy; this names a tensor of the
        graph, or says that none at a common position moved)."""
        sid = self.scheds.get(sched, -1)
        s = ctypes.c_void_p(sched)
        n_splits = int(self.glib.ggml_backend_sched_get_n_splits(s))
        n_copies = int(self.glib.ggml_backend_sched_get_n_copies(s))
        g = self._read_graph(graph)
        names = self.backends.get(sid, [])
        head = CGraphHead.from_address(graph)
        n_prev = len(self.last_backends.get((sid, "node"), []))
        moved, by_offload = "", False
        for what, array, n in (("node", head.nodes, head.n_nodes), ("leaf", head.leafs, head.n_leafs)):
            tensors = ctypes.cast(array, ctypes.POINTER(ctypes.c_void_p))
            ids = self._backend_ids(sched, array, n)
            key = (sid, what)
            prev, self.last_backends[key] = self.last_backends.get(key, []), ids
            if not moved:
                for i, (was, now) in enumerate(zip(prev, ids)):
                    if was != now and min(was, now) >= 0 and names[was][1] != names[now][1]:
                        moved = f"{what} {self._name(tensors[i])}: #{was} {names[was][0]} -> #{now} {names[now][0]}"
                        by_offload = what == "node" and self._reads_host_weight(tensors[i], g["host_weights"])
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
        key = _digest(cap)
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

    # ------------------------------------------------------------------ running a workload

    def info(self) -> dict[str, str]:
        return {
            "name": "llama.cpp",
            "lib": loaded_library_path("libllama"),
            "ggml_lib": loaded_library_path("libggml-base"),
            "ggml_version": self.version,
            "declarations": self.declarations,
            "layouts_checked": self.layouts,
            "absent_calls": ",".join(self.absent_calls),  # call kinds this build lacks a function of: absent from its workloads
            "absent_params": ",".join(self.absent_params),  # context parameters its llama_context_params lacks: ditto
            "system_info": self.L.llama_print_system_info().decode(errors="replace").strip(),
            # the seeds' ggml tells each realloc decision through a callback (the hook wraps it)
            "realloc_callback": "observed" if hasattr(self.glib, "ggml_backend_sched_set_realloc_callback")
            else "absent (decisions derived from the graph-size formula)",
            # a Release build tells its decisions through the callback alone, without ggml-alloc's reasons
            "build": "Debug (ggml-alloc logs its reasons)" if self.logs_reallocs else "Release (NDEBUG: decisions from the callback, reasons unobservable)",
            "gpu_device": gpu_device(),
        }

    def rpc_device(self, endpoint: str) -> int:
        if endpoint not in self.devices:
            reg = self.rpc.ggml_backend_rpc_add_server(endpoint.encode())
            if not reg or not self.glib.ggml_backend_reg_dev_count(reg):
                raise ConnectionError(endpoint)
            self.devices[endpoint] = self.glib.ggml_backend_reg_dev_get(reg, 0)
        return self.devices[endpoint]

    def gpu_device(self, index: int, spec: BackendSpec) -> int:
        """GPU-like device ``GPU<index>`` with ``spec``'s settings (``ggml/fake_gpu.c``), registered
        with ggml's backend registry on first use (``ggml_backend_register``) and kept: ggml's
        registry cannot drop a device, so one per distinct setting lives as long as the worker, and
        the model is given its devices explicitly (``llama_model_params.devices``)."""
        key = json.dumps([index, spec.to_json()], sort_keys=True)
        if key not in self.gpus:
            if self.fake is None:
                self.fake = load_fake_gpu()
            reg = self.fake.schedfuzz_fake_gpu_register(f"GPU{index}".encode(), self.cpu_dev, ctypes.byref(FakeGpuConfig.of(spec)))
            if not reg:
                raise RuntimeError(f"schedfuzz_fake_gpu_register refused {spec.to_json()}")
            self.ggml.ggml_backend_register(ctypes.c_void_p(reg))
            self.gpus[key] = self.glib.ggml_backend_reg_dev_get(reg, 0)
        return self.gpus[key]

    def load_model(self, path: str, dv: Devices, endpoints: Sequence[str], mtp: bool = False) -> Any:
        """The model on ``dv``'s devices (kept while the next workload's placement is the same),
        each GPU-like device then left with ``dv.gpu_free`` bytes free for the contexts; with its
        MTP layers (``load_mtp``) where a draft context will run them, as llama-server loads it."""
        key = (path, tuple(endpoints[: dv.n_rpc]), replace(dv, gpu_free=()), mtp)
        if key != self.model_key:
            self.free_model()
            self.placement = []
            self.model = self._loaded("target", path, dv, dv, tuple(range(dv.n_devices)), endpoints, mtp)
            self.model_key, self.n_model_lines = key, len(self.placement)
        self._left_free(dv)
        return self.model

    def load_draft_model(self, path: str, w: LlamaWorkload, endpoints: Sequence[str]) -> Any:
        """The draft's model of its own (``DraftModel``: the target's file again, on its devices,
        with its MTP layers), kept like the target's while its placement is the same."""
        assert w.draft_model is not None
        dv, chosen = w.draft_model.placement(w.devices)
        key = (path, tuple(endpoints[: dv.n_rpc]), replace(dv, gpu_free=()), chosen)
        if key != self.draft_model_key:
            self.free_draft_model()
            self.draft_model = self._loaded("draft", path, w.devices, dv, chosen, endpoints, True)
            self.draft_model_key = key
        self._left_free(w.devices)
        return self.draft_model

    def _loaded(self, slot: str, path: str, devices: Devices, dv: Devices, chosen: Sequence[int], endpoints: Sequence[str], mtp: bool) -> Any:
        """A model loaded with ``dv``'s placement on the ``chosen`` of ``devices``' devices (every
        GPU-like device with all its memory free for the weights)."""
        gpus = [self.gpu_device(k, g) for k, g in enumerate(devices.gpus)]
        for dev in gpus:
            self.fake.schedfuzz_fake_gpu_set_free(dev, ALL_MEMORY)  # for the weights
        devs = [self.rpc_device(e) for e in endpoints[: devices.n_rpc]] + gpus
        return self._load(slot, path, dv, [devs[i] for i in chosen], mtp)

    def _left_free(self, dv: Devices) -> None:
        """Each GPU-like device left with ``dv.gpu_free`` bytes free for the contexts."""
        for dev, free in zip([self.gpu_device(k, g) for k, g in enumerate(dv.gpus)], dv.gpu_free or [0] * len(dv.gpus)):
            self.fake.schedfuzz_fake_gpu_set_free(dev, free or ALL_MEMORY)

    def _load(self, slot: str, path: str, dv: Devices, devs: list[int], mtp: bool) -> Any:
        """``llama_model_load_from_file``; the arrays its parameters point to are kept per
        ``slot`` (the target's model, the draft's) while that model lives."""
        L = self.L
        keep: list[Any] = [(ctypes.c_void_p * (len(devs) + 1))(*devs, None)]
        mp = L.llama_model_default_params()
        if mtp:
            mp.load_mtp = True
        mp.devices = ctypes.cast(keep[0], ctypes.c_void_p)
        mp.n_gpu_layers = dv.n_gpu_layers
        mp.split_mode = SPLIT_MODE[dv.split_mode]
        mp.main_gpu = dv.main_gpu
        if dv.tensor_split:
            keep.append((ctypes.c_float * L.llama_max_devices())(*dv.tensor_split))
            mp.tensor_split = keep[-1]
        if dv.overrides:
            bufts = [self.ggml.ggml_backend_dev_buffer_type(ctypes.c_void_p(self.cpu_dev if d == CPU_DEVICE else devs[d])) for _, d in dv.overrides]
            patterns = [p.encode() for p, _ in dv.overrides]
            keep += [patterns, (TensorBuftOverride * (len(bufts) + 1))(*[TensorBuftOverride(p, b) for p, b in zip(patterns, bufts)])]
            mp.tensor_buft_overrides = ctypes.cast(keep[-1], ctypes.c_void_p)
        self._kept[slot] = keep
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise RuntimeError(f"llama_model_load_from_file({path}) failed: {self.log.tail and list(self.log.tail)[-3:]}")
        return model

    def free_model(self) -> None:
        if self.model:
            self.L.llama_model_free(self.model)
        self.model, self.model_key = None, None

    def free_draft_model(self) -> None:
        if self.draft_model:
            self.L.llama_model_free(self.draft_model)
        self.draft_model, self.draft_model_key = None, None

    def context_params(self, c: ContextParams) -> Any:
        L = self.L
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = c.n_ctx, c.n_batch, c.n_ubatch, c.n_seq_max
        p.n_threads = p.n_threads_batch = CPU_THREADS
        p.flash_attn_type = FLASH[c.flash_attn]
        p.op_offload, p.offload_kqv, p.kv_unified = c.op_offload, c.offload_kqv, c.kv_unified
        p.type_k, p.type_v = KV_TYPE[c.type_k], KV_TYPE[c.type_v]
        p.embeddings = c.embeddings
        p.pooling_type = POOLING[c.pooling] if c.embeddings else L.LLAMA_POOLING_TYPE_UNSPECIFIED
        p.n_outputs_max, p.n_outputs_max_per_seq = c.n_outputs_max, c.n_outputs_max_per_seq
        p.no_perf = False
        for name in OPTIONAL_PARAMS:  # where the build has it (``unsupported`` refused a workload setting one it lacks)
            if name not in self.absent_params:
                setattr(p, name, getattr(c, name))
        if c.backend_samplers:
            # as llama-server makes them: one sampler chain per sequence (the context keeps no reference alive)
            chains = [self.chain(c.sampler_chain) for _ in range(c.n_seq_max)]
            self._seq_cfg = (L.llama_sampler_seq_config * c.n_seq_max)(*[L.llama_sampler_seq_config(s, ctypes.cast(ch, ctypes.c_void_p)) for s, ch in enumerate(chains)])
            p.samplers = ctypes.cast(self._seq_cfg, ctypes.c_void_p)
            p.n_samplers = c.n_seq_max
        return p

    def chain(self, kind: str) -> Any:
        """A backend sampler chain (``SAMPLER_CHAINS``), kept alive until the context is freed."""
        L = self.L
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        for name in SAMPLER_CHAINS[kind]:
            L.llama_sampler_chain_add(chain, {
                "greedy": lambda: L.llama_sampler_init_greedy(),
                "top_k": lambda: L.llama_sampler_init_top_k(8),
                "top_p": lambda: L.llama_sampler_init_top_p(0.9, 1),
                "min_p": lambda: L.llama_sampler_init_min_p(0.05, 1),
                "temp": lambda: L.llama_sampler_init_temp(0.8),
                "dist": lambda: L.llama_sampler_init_dist(1234),
            }[name]())
        self._samplers.append(chain)
        return chain

    def run(self, w: LlamaWorkload, model_path: str, endpoints: Sequence[str], lora_paths: Sequence[str] = ()) -> dict[str, Any]:
        L = self.L
        model = self.load_model(model_path, w.devices, endpoints, mtp=w.draft == "mtp")
        if w.draft_model is None:
            self.free_draft_model()  # a later workload's contexts never share a device with a draft model it did not load
        draft_model = self.load_draft_model(model_path, w, endpoints) if w.draft_model is not None else model
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        self._samplers = []
        self.model_for_loras, self.lora_paths = model, list(lora_paths)
        self.adapters: dict[int, Any] = {}  # workload adapter index -> llama_adapter_lora loaded on the model
        self.graph_ids = {}  # a workload's captured graphs are numbered from 0
        # logits are compared only where the context computes them: not while it outputs embeddings, nor
        # with backend samplers (the graph samples; the logits it keeps are the samplers')
        self.embeddings, self.backend_samplers, self.logits = w.ctx.embeddings, w.ctx.backend_samplers, []
        self.checkpoints: dict[int, tuple[Any, int]] = {}  # seq -> its saved state and last position
        self.recurrent = w.model.kind in RECURRENT_KINDS
        ctx = None
        try:
            self.begin(-1)
            ctx = L.llama_init_from_model(model, self.context_params(w.ctx))
            if ctx and w.draft == "mtp":
                self.mtp = self._mtp_context(draft_model, ctx, w.ctx)
            if not ctx or (self.mtp is not None and not self.mtp.ctx):
                # not a pass: what llama.cpp said is the finding's message
                said = [x for x in self.log.tail if re.search(r"error|failed|out of memory", x, re.I)] or list(self.log.tail)
                self.end(-1, "init", -1, error=said[-12:])
                return {"perf": {}}
            self.end(-1, "init", 0)
            mem = L.llama_get_memory(ctx)
            for i, call in enumerate(w.calls):
                self.begin(i)
                rc = self.do(ctx, mem, call)
                self.end(i, call.kind, rc)
            # llama.cpp's own counters, where its perf data has them (upstream since seed 000's merge); the draft context's apart
            perf = self._perf(ctx)
            return {"perf": perf | ({f"draft.{k}": v for k, v in self._perf(self.mtp.ctx).items()} if self.mtp is not None else {})}
        finally:
            self.begin(len(w.calls))
            if self.mtp is not None:
                with self.in_context(1):
                    self.mtp.free()
                self.mtp = None
            if ctx:
                L.llama_free(ctx)
            for chain in self._samplers:
                L.llama_sampler_free(chain)
            self._samplers = []
            # the model is kept for the next workload: its adapters go (they count in its contexts' max_nodes)
            for adapter in self.adapters.values():
                L.llama_adapter_lora_free(adapter)
            self.adapters = {}
            self.errors, self.log.errors = [], []

    def _perf(self, ctx: Any) -> dict[str, int]:
        perf = self.L.llama_perf_context(ctx)
        return {f: getattr(perf, f) for f in PERF_FIELDS if f in type(perf).FIELDS}

    def _mtp_context(self, model: Any, target: Any, c: ContextParams) -> MtpDraft:
        """The draft context of draft-mtp, as llama-server makes it (common/speculative.cpp): the
        target's parameters, of type MTP, ``ctx_other`` the target."""
        assert self.nextn is not None, "draft mtp on a build without it (the workload should have been refused)"

        def make(other: Any) -> Any:
            p = self.context_params(replace(c, backend_samplers=False, embeddings=False))  # a draft samples tokens, it pools nothing
            p.ctx_type, p.ctx_other = CONTEXT_TYPE_MTP, ctypes.cast(other, ctypes.c_void_p)
            with self.in_context(1):
                return self.L.llama_init_from_model(model, p)

        return MtpDraft(self.L, self.nextn, model, target, make)

    @contextlib.contextmanager
    def in_context(self, context: int) -> Iterator[None]:
        """Scheduler calls in the block are the ``context``'s (0 the target's, 1 the draft's)."""
        before, self.context = self.context, context
        try:
            yield
        finally:
            self.context = before

    def unsupported(self, w: LlamaWorkload) -> str:
        """Why this build cannot run ``w`` ("" where it can): a context parameter its
        ``llama_context_params`` lacks, set to other than its default; a draft context it has no
        functions for; GPU-like devices where the device cannot be built against its ggml."""
        wrong = [f"ctx.{p} {getattr(w.ctx, p)}" for p in self.absent_params if getattr(w.ctx, p) != getattr(ContextParams(), p)]
        if w.draft == "mtp" and "draft mtp" in self.absent_calls:
            return f"draft mtp: {loaded_library_path('libllama')} lacks llama_batch_ext or the NextN functions (speculative.py)"
        if w.devices.gpus and self.fake is None and (why := gpu_device()) != "available":
            return f"GPU-like devices: {why}"
        return (f"{', '.join(wrong)}: this build's llama_context_params has no such field ({self.declarations}, "
                f"{loaded_library_path('libllama')}): the workload needs a build that has it") if wrong else ""

    def begin(self, i: int) -> None:
        self.call = i
        self.sched_events = []
        self.chan.send({"begin": i})

    def end(self, i: int, kind: str, rc: int | str, error: list[str] | None = None) -> None:
        errors = self.errors + self.log.errors
        if errors:  # run()'s finally forgets them for the next workload
            raise HarnessError("\n".join(errors))
        for e in self.sched_events:  # the draft context's schedulers' calls say so (a log line's, when it came)
            if "context" not in e and self.sched_context.get(e["sched"], 0):
                e["context"] = self.sched_context[e["sched"]]
        rec: dict[str, Any] = {"index": i, "kind": kind, "rc": rc, "sched": self.sched_events}
        if error:
            rec["error"] = error
        if kind == "init":
            rec["log"], self.placement = self.placement, self.placement[: self.n_model_lines]
        if self.logits:
            rec["logits"], self.logits = self.logits, []
        self.chan.send({"call": rec})

    def do(self, ctx: Any, mem: Any, call: Call) -> int | str:
        """One call (``CALLS[kind].make``); its return code (``llama_decode``'s, or 0/1 for the bool memory calls)."""
        kind = CALLS[call.kind]
        if call.kind in self.absent_calls:  # a corpus case's call this build cannot make (drawn workloads have none)
            return f"this build lacks {', '.join(f for f in kind.functions if not self.L.has(f))}"
        rc = getattr(self, kind.make)(ctx, mem, call)
        if self.mtp is not None and rc == 0 and kind.draft:
            getattr(self, f"_draft_{kind.draft}")(mem, call)  # llama-server's common_memory: on the draft context too
        return rc

    def token(self, seq: int, pos: int) -> int:
        """The token at ``pos`` of ``seq``: every run of a workload decodes the same ones."""
        return 3 + (seq * 31 + pos * 7) % max(1, self.n_vocab - 3)

    def _make_decode(self, ctx: Any, mem: Any, call: Call) -> int:
        return self._decode(ctx, mem, call.parts)

    def _decode(self, ctx: Any, mem: Any, parts: Sequence[Part]) -> int:
        """``llama_decode`` of ``parts`` (each sequence's next tokens); with a draft context, its
        catch-up on them (``MtpDraft.catch_up``)."""
        L = self.L
        n = sum(p.n_tokens for p in parts)
        batch = L.llama_batch_init(n, 0, 1)
        decoded: list[tuple[int, int, int]] = []  # token, position, sequence
        try:
            j = 0
            for part in parts:
                pos0 = L.llama_memory_seq_pos_max(mem, part.seq) + 1
                for t in range(part.n_tokens):
                    batch.token[j] = self.token(part.seq, pos0 + t)
                    decoded.append((batch.token[j], pos0 + t, part.seq))
                    batch.pos[j] = pos0 + t
                    batch.n_seq_id[j] = 1
                    batch.seq_id[j][0] = part.seq
                    batch.logits[j] = part.outputs == "all" or (part.outputs == "last" and t == part.n_tokens - 1)
                    j += 1
            batch.n_tokens = n
            rc = int(L.llama_decode(ctx, batch))
            L.llama_synchronize(ctx)  # RPC computes asynchronously: a crash must surface in this call
            outputs = [i for i in range(n) if batch.logits[i]]
            if rc == 0 and self.want_logits and outputs and not self.embeddings and not self.backend_samplers:
                for i in dict.fromkeys((outputs[0], outputs[-1])):
                    row = L.llama_get_logits_ith(ctx, i)
                    self.logits.append([round(float(row[v]), 5) for v in range(self.n_vocab)])
        finally:
            L.llama_batch_free(batch)
        if rc == 0 and self.mtp is not None:
            with self.in_context(1):
                rc = self.mtp.catch_up(decoded)
        return rc

    def _make_spec(self, ctx: Any, mem: Any, call: Call) -> int | str:
        """One speculative step of ``call.seq`` (``speculative.py``): draft, verify, accept, roll back."""
        L, seq = self.L, call.seq
        pos0 = int(L.llama_memory_seq_pos_max(mem, seq)) + 1
        if self.mtp is not None:
            with self.in_context(1):
                rc = self.mtp.draft(seq, [(self.token(seq, pos0 + i), pos0 + i) for i in range(call.n)])
            if rc:
                return rc
        # a memory that cannot drop its last positions is rolled back from a checkpoint (llama-server's FULL)
        saved = self._checkpoint(ctx, mem, seq) if self.recurrent and call.accept < call.n else None
        rc = self._decode(ctx, mem, (Part(seq, 1 + call.n, "all"),))
        if rc or call.accept == call.n:
            return rc
        keep = pos0 + call.accept + 1
        if self.mtp is not None:
            self.mtp.accept(seq, call.accept)
            L.llama_memory_seq_rm(self.mtp.mem, seq, keep, -1)
        if L.llama_memory_seq_rm(mem, seq, keep, -1):
            return 0
        if saved is None or not self._restore(ctx, mem, seq, *saved):
            return f"the rollback of the rejected drafts failed (llama_memory_seq_rm{', then the checkpoint' if saved else ''})"
        return self._decode(ctx, mem, (Part(seq, call.accept + 1, "none"),))  # the accepted tokens again

    def _checkpoint(self, ctx: Any, mem: Any, seq: int) -> tuple[Any, int]:
        """``seq``'s state as llama-server checkpoints it (``PARTIAL_ONLY``), and its last position."""
        L = self.L
        size = L.llama_state_seq_get_size_ext(ctx, seq, STATE_PARTIAL_ONLY)
        buf = (ctypes.c_uint8 * size)()
        got = L.llama_state_seq_get_data_ext(ctx, buf, size, seq, STATE_PARTIAL_ONLY)
        return (buf if got == size else None), int(L.llama_memory_seq_pos_max(mem, seq))

    def _restore(self, ctx: Any, mem: Any, seq: int, buf: Any, pos: int) -> bool:
        """A checkpoint set back, and what the attention cache holds after it dropped."""
        L = self.L
        return buf is not None and bool(L.llama_state_seq_set_data_ext(ctx, buf, len(buf), seq, STATE_PARTIAL_ONLY)) \
            and bool(L.llama_memory_seq_rm(mem, seq, pos + 1, -1))

    # the draft context's side of a memory call the target made (``DRAFT_ACTIONS``, llama-server's common_memory)

    def _draft_drop_after(self, mem: Any, call: Call) -> None:
        """The target's positions after the call decide what the draft context drops."""
        assert self.mtp is not None
        self.L.llama_memory_seq_rm(self.mtp.mem, call.seq, int(self.L.llama_memory_seq_pos_max(mem, call.seq)) + 1, -1)

    def _draft_shift(self, mem: Any, call: Call) -> None:
        assert self.mtp is not None
        self.L.llama_memory_seq_rm(self.mtp.mem, call.seq, call.n_keep, call.n_keep + call.n)
        self.L.llama_memory_seq_add(self.mtp.mem, call.seq, call.n_keep + call.n, -1, -call.n)

    def _draft_copy(self, mem: Any, call: Call) -> None:
        assert self.mtp is not None
        self.L.llama_memory_seq_cp(self.mtp.mem, call.seq, call.dst, -1, -1)
        self.mtp.copy(call.seq, call.dst)

    def _draft_keep(self, mem: Any, call: Call) -> None:
        assert self.mtp is not None
        self.L.llama_memory_seq_keep(self.mtp.mem, call.seq)

    def _draft_clear(self, mem: Any, call: Call) -> None:
        assert self.mtp is not None
        self.L.llama_memory_clear(self.mtp.mem, True)
        self.mtp.pending.clear()

    # every call but a decode and a speculative step, on the target (``CALLS[kind].make``)

    def _make_checkpoint(self, ctx: Any, mem: Any, call: Call) -> int:
        self.checkpoints[call.seq] = self._checkpoint(ctx, mem, call.seq)
        return int(self.checkpoints[call.seq][0] is None)

    def _make_restore(self, ctx: Any, mem: Any, call: Call) -> int:
        return int(not self._restore(ctx, mem, call.seq, *self.checkpoints[call.seq]))

    def _make_seq_rm(self, ctx: Any, mem: Any, call: Call) -> int:
        end = self.L.llama_memory_seq_pos_max(mem, call.seq) + 1
        p0 = 0 if call.n < 0 else max(0, end - call.n)
        return int(not self.L.llama_memory_seq_rm(mem, call.seq, p0, -1))

    def _make_seq_cp(self, ctx: Any, mem: Any, call: Call) -> int:
        self.L.llama_memory_seq_cp(mem, call.seq, call.dst, -1, -1)
        return 0

    def _make_seq_keep(self, ctx: Any, mem: Any, call: Call) -> int:
        self.L.llama_memory_seq_keep(mem, call.seq)
        return 0

    def _make_shift(self, ctx: Any, mem: Any, call: Call) -> int | str:
        L = self.L
        if not L.llama_memory_can_shift(mem):
            return "cannot shift"
        a, b = call.n_keep, call.n_keep + call.n
        if not L.llama_memory_seq_rm(mem, call.seq, a, b):
            return 1
        L.llama_memory_seq_add(mem, call.seq, b, -1, -call.n)
        return 0

    def _make_clear(self, ctx: Any, mem: Any, call: Call) -> int:
        self.L.llama_memory_clear(mem, True)
        return 0

    def _make_set_sampler(self, ctx: Any, mem: Any, call: Call) -> int:
        # llama-server attaches a new chain per request (or none); the old one stays alive until llama_free
        smpl = self.chain(call.chain or "greedy") if call.flag else None
        return int(not self.L.llama_set_sampler(ctx, call.seq, smpl))

    def _make_lora_load(self, ctx: Any, mem: Any, call: Call) -> int | str:
        adapter = self.L.llama_adapter_lora_init(self.model_for_loras, self.lora_paths[call.n].encode())
        if not adapter:
            return "llama_adapter_lora_init failed: " + " / ".join(list(self.log.tail)[-2:])
        self.adapters[call.n] = adapter
        return 0

    def _make_lora_free(self, ctx: Any, mem: Any, call: Call) -> int | str:
        adapter = self.adapters.pop(call.n, None)
        if adapter is None:  # its lora_load failed, and that call says why
            return f"adapter {call.n} is not loaded: its lora_load failed"
        self.L.llama_adapter_lora_free(adapter)
        return 0

    def _make_lora_set(self, ctx: Any, mem: Any, call: Call) -> int:
        chosen = [self.adapters[i] for i in sorted(self.adapters) if call.n >> i & 1]
        arr = (ctypes.c_void_p * max(1, len(chosen)))(*chosen)
        scales = (ctypes.c_float * max(1, len(chosen)))(*([1.0] * len(chosen)))
        return int(self.L.llama_set_adapters_lora(ctx, arr if chosen else None, len(chosen), scales if chosen else None))

    def _make_flag(self, ctx: Any, mem: Any, call: Call) -> int:
        """set_embeddings, set_causal_attn, set_warmup."""
        if call.kind == "set_embeddings":
            self.embeddings = call.flag
        getattr(self.L, f"llama_{call.kind}")(ctx, call.flag)
        return 0


def _digest(cap: dict[str, Any]) -> bytes:
    """A captured graph's digest: equal for equal graphs, in any workload (its ``key``)."""
    h = hashlib.sha1(cap["records"])
    h.update(pickle.dumps((cap["n_nodes"], cap["buffers"], cap["forced"]), protocol=pickle.HIGHEST_PROTOCOL))
    return h.digest()


def main() -> None:
    chan = Channel(os.dup(1))
    os.dup2(2, 1)
    die_with_parent()
    try:
        # a Release build (NDEBUG) logs no reallocation: its decisions are observed only where ggml tells
        # them through its realloc callback; without it every verdict would be a false pass
        probe = Ggml(chan)
        logs_reallocs = any(r.events for r in run_scenario(probe, probe_scenario(), [], None))
        base = loaded_library_path("libggml-base")
        if not logs_reallocs and not hasattr(ctypes.CDLL(base), "ggml_backend_sched_set_realloc_callback"):
            chan.send({"fatal": no_realloc_fix(base) + " (or use a build whose ggml has ggml_backend_sched_set_realloc_callback)"})
            return
        eng = Llama(chan, logs_reallocs)  # its log and abort callbacks replace the probe's
    except declarations.DeclarationsError as e:
        chan.send({"fatal": str(e)})
        return
    except Exception:
        chan.send({"fatal": traceback.format_exc()})
        return
    chan.send({"hello": eng.info()})
    for line in sys.stdin:
        req = json.loads(line)
        try:
            w = LlamaWorkload.from_json(req["workload"])
            refused = eng.unsupported(w)
            if refused:
                chan.send({"unsupported": refused})
                continue
            eng.want_logits = bool(req.get("logits"))
            eng.capturing = bool(req.get("capture"))
            with gc_paused():
                done = eng.run(w, req["model_path"], req["endpoints"], req.get("lora_paths", ()))
            chan.send({"done": done})
        except ConnectionError as e:
            chan.send({"unreachable": str(e)})
        except Exception:
            chan.send({"error": traceback.format_exc()})


if __name__ == "__main__":
    main()
