"""The process that runs server-like workloads on the real llama.cpp:
``python -m pytest_schedfuzz.llama.llama_worker`` (started by ``llama.llama_target.LlamaTarget``).

Protocol: requests are JSON lines; replies are pickled messages, as ``ggml.graph_worker``'s, on the file
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
import json
import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from ..engine import gc_paused
from ..ggml.bindings import CPU_THREADS, Ggml, gpu_device
from ..ggml.graph_worker import no_realloc_fix, probe_scenario, replan_probe, run_scenario
from ..ggml.lib import import_ggml, loaded_library_path
from ..model.llama_calls import CALLS
from ..model.llama_model import RECURRENT_KINDS
from ..model.llama_workload import OPTIONAL_PARAMS, SAMPLER_CHAINS, ContextParams, LlamaWorkload
from ..process.channel import Channel
from ..process.children import die_with_parent
from . import declarations, graph_records
from .calls import Calls
from .observe import HOOK_T, Observation, declare_sched_functions
from .placement import Placement
from .speculative import BATCH_EXT, CONTEXT_TYPE_MTP, DraftContext, ModelDraft, MtpDraft, nextn_functions
from .structs import CGraphHead, TensorLayout, graph_head_wrong

# the libllama functions the worker needs whatever the calls (each call kind's own: ``CALLS[k].functions``)
CORE = ("llama_backend_init", "llama_batch_free", "llama_batch_init", "llama_context_default_params", "llama_decode", "llama_free",
        "llama_get_logits_ith", "llama_get_memory", "llama_init_from_model", "llama_log_set", "llama_max_devices", "llama_memory_seq_pos_max",
        "llama_memory_seq_rm", "llama_model_default_params", "llama_model_free", "llama_model_get_vocab", "llama_model_load_from_file",
        "llama_perf_context", "llama_print_system_info", "llama_sampler_chain_add", "llama_sampler_chain_default_params",
        "llama_sampler_chain_init", "llama_sampler_free", "llama_sampler_init_dist", "llama_sampler_init_greedy", "llama_sampler_init_min_p",
        "llama_sampler_init_temp", "llama_sampler_init_top_k", "llama_sampler_init_top_p", "llama_synchronize", "llama_vocab_n_tokens")
PERF_FIELDS = ("n_eval", "n_p_eval", "n_reused", "n_reallocs_same", "n_reallocs_diff")  # llama_perf_context_data
KV_TYPE = {"f16": 1, "f32": 0, "q8_0": 8}  # enum ggml_type
FLASH = {"off": 0, "on": 1, "auto": -1}
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3}


class Llama(Observation, Calls):
    """libllama (llama-cpp-python's bindings) and ggml (ggml-python's, on the same libraries)."""

    def __init__(self, chan: Channel, logs_reallocs: bool = True) -> None:
        # libllama through the build's own declarations (declarations.py), checked against it
        decl, L = bindings()
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
        self.draft_context: DraftContext | None = None
        # context parameters this build's llama_context_params lacks (b11739's moe_cache_size on 0.3.36)
        self.absent_params = tuple(p for p in OPTIONAL_PARAMS if p not in L.llama_context_params.FIELDS)
        # a Debug build logs each reallocation with ggml-alloc's reason; a Release one is observed through the callback alone
        self.logs_reallocs = logs_reallocs
        self.chan = chan
        self.g: ModuleType = import_ggml()
        glib = self.g.ggml.lib
        declare_sched_functions(glib)
        self.glib = glib
        # the RPC client's round trip before a context is freed (``synchronize_servers``), as the build declares it (ggml-rpc.h)
        # (a build without ggml's RPC library, such as the wheels before b11327, runs the workloads without RPC devices)
        rpc = os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libggml-rpc.so")
        self.rpc_library = os.path.isfile(rpc)
        self.rpc_memory = L.ggml_backend_rpc_get_device_memory if L.has("ggml_backend_rpc_get_device_memory") and self.rpc_library else None
        self.rpc: ctypes.CDLL | None = None
        if self.rpc_library:
            self.rpc = ctypes.CDLL(rpc)
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
        self._start_observing()
        self._hook = HOOK_T(self._on_sched)
        set_hook(self._hook)
        self._log_cb = L.ggml_log_callback(self._on_log)
        L.llama_log_set(self._log_cb, None)
        self._abort_cb = self.g.ggml_abort_callback_t(self._on_abort)
        self.g.ggml_set_abort_callback(self._abort_cb)
        L.llama_backend_init()
        self.placement = Placement(L, glib, self.rpc, self.log, self.placement_lines)

    # ------------------------------------------------------------------ running a workload

    def info(self) -> dict[str, str]:
        callback = hasattr(self.glib, "ggml_backend_sched_set_realloc_callback")
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
            "realloc_callback": "observed" if callback else "absent (graph sizes derived from the graph-size formula)",
            # a Release build tells its decisions through the callback or the allocator calls, without ggml-alloc's reasons
            "build": "Debug (ggml-alloc logs its reasons)" if self.logs_reallocs else "Release (NDEBUG: decisions from the "
            f"{'callback' if callback else 'interposed allocator calls'}, reasons unobservable)",
            # the scheduler's calls of ggml-alloc, interposed: the re-plans of any build, held against the callback or the log
            "allocator_calls": "observed" if self.allocator_observed else "not seen (the scheduler binds ggml-alloc directly)",
            "gpu_device": gpu_device(),
            # before a context is freed, one round trip per RPC server (synchronize_servers)
            "rpc_round_trip": "ggml_backend_rpc_get_device_memory" if self.rpc_memory is not None else
            "absent (RPC workloads refused): " + ("the build declares no ggml_backend_rpc_get_device_memory" if self.rpc_library
                                                  else "the build has no RPC library (libggml-rpc.so)"),
        }

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
        self.begin(-1)  # what fails while the models load (an earlier model freed on a server) is the context's
        model = self.placement.load_model(model_path, w.devices, endpoints, mtp=w.draft == "mtp")
        if w.draft_model is None:
            self.placement.free_draft_model()  # a later workload's contexts never share a device with a draft model it did not load
        draft_model = self.placement.load_draft_model(model_path, w, endpoints) if w.draft_model is not None else model
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
        self.rolled_back = ""  # how llama.cpp let the call being made roll a sequence back (``Calls.end``)
        ctx = None
        self.computed_in = -1  # the last call in which a scheduler computed (its crash is charged there: ``synchronize_servers``)
        try:
            ctx = L.llama_init_from_model(model, self.context_params(w.ctx))
            if ctx and w.draft == "mtp":
                self.draft_context = self._mtp_context(draft_model, ctx, w.ctx)
            elif ctx and w.draft == "model":
                assert w.draft_model is not None
                self.draft_context = self._model_context(draft_model, w.ctx, w.draft_model.n_rs_seq)
            if not ctx or (self.draft_context is not None and not self.draft_context.ctx):
                # not a pass: what llama.cpp said is the finding's message
                said = [x for x in self.log.tail if re.search(r"error|failed|out of memory", x, re.I)] or list(self.log.tail)
                self.end(-1, "init", -1, error=said[-12:])
                return {"perf": {}}
            self.end(-1, "init", 0)
            mem = L.llama_get_memory(ctx)
            for i, call in enumerate(w.calls):
                self.begin(i)
                rc = self.make_call(ctx, mem, call)
                self.end(i, call.kind, rc)
            # llama.cpp's own counters, where its perf data has them (upstream since seed 000's merge); the draft context's apart
            perf = self._perf(ctx)
            dft = self.draft_context
            return {"perf": perf | ({f"draft.{k}": v for k, v in self._perf(dft.ctx).items()} if dft is not None else {})}
        finally:
            self.synchronize_servers(endpoints[: w.devices.n_rpc])
            self.begin(len(w.calls))
            if self.draft_context is not None:
                with self.in_context(1):
                    self.draft_context.free()
                self.draft_context = None
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

    def synchronize_servers(self, endpoints: Sequence[str]) -> None:
        """One round trip per RPC server the workload used, before its contexts are freed, on the
        connection they used (ggml-rpc keeps one per endpoint, and a server answers a connection's
        commands in order). From ggml 0.25.3 on the client queues ``GRAPH_COMPUTE`` without waiting
        (``llama_synchronize`` waits until it is sent), so the reply comes once the server has
        computed all the workload sent it; a server that died makes ggml abort here, in phase
        ``synchronize``, charged to the last call in which a scheduler computed (else the last
        call made), not to the next workload, which would meet it at its first connection."""
        if not endpoints:
            return
        assert self.rpc_memory is not None, "RPC devices without the round trip (unsupported should have refused the workload)"
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        device = (0,) if len(self.rpc_memory.argtypes) == 4 else ()  # (endpoint, device, free, total); older ggml: no device
        made, self.synchronizing = self.call, True
        self.call = self.computed_in if self.computed_in >= 0 else made
        try:
            for endpoint in endpoints:
                self.rpc_memory(endpoint.encode(), *device, ctypes.byref(free), ctypes.byref(total))
        finally:
            self.call, self.synchronizing = made, False

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

    def _model_context(self, model: Any, c: ContextParams, n_rs_seq: int) -> ModelDraft:
        """The draft context of draft-simple, as llama-server makes it (``common_speculative_init_result``):
        the target's parameters on the draft model, with ``n_rs_seq`` of its own (llama-server's: 0)."""

        def make() -> Any:
            with self.in_context(1):
                return self.L.llama_init_from_model(model, self.context_params(replace(c, backend_samplers=False, embeddings=False, n_rs_seq=n_rs_seq)))

        return ModelDraft(self.L, make, self.recurrent, self.token)

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
        if w.devices.gpus and self.placement.fake is None and (why := gpu_device()) != "available":
            return f"GPU-like devices: {why}"
        if w.devices.n_rpc and not self.rpc_library:
            return f"RPC devices: this build has no RPC library (no libggml-rpc.so beside {loaded_library_path('libllama')})"
        if w.devices.n_rpc and self.rpc_memory is None:
            return (f"RPC devices: {self.declarations} declares no ggml_backend_rpc_get_device_memory, the round trip that charges a "
                    "server's crash on a workload's last graph to that workload")
        return (f"{', '.join(wrong)}: this build's llama_context_params has no such field ({self.declarations}, "
                f"{loaded_library_path('libllama')}): the workload needs a build that has it") if wrong else ""


_BOUND: tuple[declarations.Declarations, declarations.Bindings] | None = None


def bindings() -> tuple[declarations.Declarations, declarations.Bindings]:
    """The build's declarations (the target names them in the environment), parsed by CFFI, and
    libllama bound through them: made once per fork server (``prefork``), inherited by each worker."""
    global _BOUND
    if _BOUND is None:
        decl = declarations.Declarations(os.environ[declarations.SOURCE_ENV], Path(os.environ[declarations.CDEF_ENV]).read_text())
        _BOUND = decl, declarations.Bindings(declarations.parse(decl), os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libllama.so"))
    return _BOUND


def prefork() -> None:
    """What the fork server does once for all the workers it forks (``forkserver.serve``): CFFI's
    parse of llama.h, and of each type a worker names, cost every worker noticeable CPU at its
    start, and a known abort restarts it every few workloads. Every declared function and the
    structs they pass are bound here, by name too (``Bindings.__getattr__``); nothing of ggml or
    llama.cpp is initialized (ggml-python's bindings and libraries are mapped, as the graph
    engine's fork server maps them). A failure is left for the worker's own start to report."""
    import_ggml()
    _, L = bindings()
    for name in dir(L.clib):
        L.has(name)
    for cname in list(L.types):
        L.has(cname.split()[-1])


def allocator_probe(probe: Ggml) -> tuple[bool, list[tuple[bool, bool]]]:
    """Whether this process sees ggml-alloc's calls from the scheduler (``sched_hook.c`` interposes
    them): ``replan_probe``'s re-plan must show as a reservation's ``reserve_n``, then an
    ``alloc_graph`` that fails, a ``reserve_n`` and one that succeeds. With what ggml's realloc
    callback said of that re-plan (empty where the build has none)."""
    counts = ctypes.CDLL(None).schedfuzz_galloc_counts
    before, after = (ctypes.c_long * 3)(), (ctypes.c_long * 3)()
    counts(before)
    said = replan_probe(probe)
    counts(after)
    return [a - b for a, b in zip(after, before)] == [2, 1, 2], said


def main() -> None:
    chan = Channel(os.dup(1))
    os.dup2(2, 1)
    die_with_parent()
    try:
        # a Release build (NDEBUG) logs no reallocation: its decisions are observed where ggml tells them through
        # its realloc callback, or where its scheduler calls ggml-alloc through the hook; without either every
        # verdict would be a false pass
        probe = Ggml(chan)
        logs_reallocs = any(r.events for r in run_scenario(probe, probe_scenario(), [], None))
        base = loaded_library_path("libggml-base")
        # ggml's own figures' worker (GGML_SCHED_DEBUG_REALLOC=2) aborts at any re-plan, the probe's too: its decisions are the log's
        allocator, said = allocator_probe(probe) if os.environ.get("GGML_SCHED_DEBUG_REALLOC") != "2" else (False, [])
        if said and allocator and said[0][0]:
            chan.send({"fatal": f"the start-up re-plan of {base}: its realloc callback said backend_ids_changed = 1, its "
                                "allocator calls a failed alloc_graph and a reserve_n (backend ids unchanged)"})
            return
        if not logs_reallocs and not said and not allocator:
            chan.send({"fatal": no_realloc_fix(base) + " (or use a build whose ggml has ggml_backend_sched_set_realloc_callback, "
                                "or whose scheduler calls ggml_gallocr_alloc_graph and ggml_gallocr_reserve_n through its PLT)"})
            return
        eng = Llama(chan, logs_reallocs)  # its log and abort callbacks replace the probe's
        eng.allocator_observed = allocator
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
