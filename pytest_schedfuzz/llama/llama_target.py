"""``LlamaTarget``: runs server-like workloads on the real llama.cpp, in a worker process, with
its extra devices on local ggml RPC servers.

The libraries are llama-cpp-python's (its Debug build with RPC: libllama and ggml 0.25.3), or a
user's llama.cpp build (``lib_dir``: a checkout's ``build/bin``; env ``SCHEDFUZZ_LLAMA_LIB``).
The RPC servers run the same ggml, so client and server speak the same protocol. The scheduler
is observed through ``sched_hook.c``, compiled once per source version with the system's C
compiler and preloaded into the worker. The parent never loads llama.cpp.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..builds.compile import BuildError
from ..builds.names import BUILT_IN, UPSTREAM, build_name, is_published
from ..builds.seed import build_llama_seed
from ..engine import TargetError, Unsupported
from ..files import cache_dir
from ..ggml.lib import child_env, lib_overlay
from ..ggml.rpc_program import RpcProgram
from ..model.llama_trace import LlamaAbort, LlamaTrace, SchedCall
from ..model.llama_workload import LlamaWorkload
from ..process.crash import build_preload, with_preload
from ..process.rpc import RpcServers
from ..process.worker import Worker, WorkerGone, WorkerTarget, WorkerTimeout
from . import declarations
from .gguf_models import write_lora, write_model
from .graph_records import RecentGraphs
from .published import published_folder
from .upstream import is_prebuilt, prebuilt_lib_dir, upstream_lib_dir

LIB_ENV = "SCHEDFUZZ_LLAMA_LIB"
HOOK_SOURCE = Path(__file__).with_name("sched_hook.c")


def default_lib_dir() -> Path:
    """llama-cpp-python's ``lib`` folder, found without importing it (that would load libllama here)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            "llama-cpp-python is not installed: install it as the README says (built from source, Debug, GGML_RPC=ON), "
            f"or point --schedfuzz-llama-lib / {LIB_ENV} at your llama.cpp build's library folder"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def resolve_lib_dir(lib_dir: str | os.PathLike[str] | None) -> Path:
    """The folder holding libllama.so and its libggml*.so: ``None`` or ``llama.cpp-0.3.36`` for
    llama-cpp-python's, ``llama.cpp-0.3.36-seed`` for the seeds' build (made on first use,
    minutes, then cached), ``llama.cpp-bNNNN`` for a published upstream build (fetched on first
    use, seconds), or a folder; a clear ``TargetError`` otherwise."""
    if lib_dir == UPSTREAM:
        return upstream_lib_dir()
    if is_published(lib_dir):  # any other published build: its wheel fetched on first use
        return prebuilt_lib_dir(published_folder(str(lib_dir)), str(lib_dir))
    if lib_dir == BUILT_IN[1]:
        try:
            return build_llama_seed()
        except BuildError as e:
            raise TargetError(f"llama library {lib_dir}: building llama.cpp 0.3.36 with the seeds' patches failed: {e}") from None
    path = Path(lib_dir).expanduser().resolve() if lib_dir and lib_dir != BUILT_IN[0] else default_lib_dir()
    if path.is_dir() and is_prebuilt(path):  # a wheel's libraries, or built for a newer glibc: loaded from a copy
        return prebuilt_lib_dir(path)
    missing = [n for n in ("libllama.so", "libggml-base.so", "libggml-rpc.so") if not (path / n).exists()]
    if missing:
        raise TargetError(
            f"llama library folder {path}: no {', '.join(missing)} there (a llama.cpp build keeps them in build/bin; "
            "configure it with -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON -DCMAKE_BUILD_TYPE=Debug)"
        )
    return path


class LlamaTarget(WorkerTarget):
    """The real llama.cpp. ``run(workload) -> LlamaTrace``; an abort, crash or hang ends the trace
    at the call that caused it and the next workload gets a fresh worker.

    ``debug_realloc`` sets ``GGML_SCHED_DEBUG_REALLOC``: 1 is ggml's own same-size check, which
    aborts on a same-size reallocation (an independent confirmation of a finding); 2 aborts on
    any reallocation, printing ggml's graph size."""

    module, what = "pytest_schedfuzz.llama.llama_worker", "llama.cpp"
    preload = ("cffi",)  # its fork server imports CFFI once; each worker reads its build's declarations with it

    def __init__(self, lib_dir: str | None = None, call_timeout: float = 60.0, start_timeout: float = 120.0, debug_realloc: int = 0) -> None:
        given = lib_dir if lib_dir is not None else os.environ.get(LIB_ENV) or None
        self.lib_dir = resolve_lib_dir(given)
        self.build = build_name(given, self.lib_dir)  # what a case's known_on names it by
        self.declarations = declarations.find(self.lib_dir)  # the build's own struct layouts, read by each worker
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.debug_realloc = debug_realloc
        self.hook = build_preload(HOOK_SOURCE)
        self.models = cache_dir() / "models"
        self.servers = RpcServers(RpcProgram(str(self.lib_dir)))
        self.has_rpc = (self.lib_dir / "libggml-rpc.so").exists()  # ggml's RPC library: else no RPC devices (``_servers_for``)
        self.recent_graphs = RecentGraphs()  # captured graphs' tensors, made once for the workloads that capture them again
        self.engine: dict[str, str] = {}
        self._used: weakref.WeakKeyDictionary[Worker, set[str]] = weakref.WeakKeyDictionary()  # the servers each worker sent work

    def _start_worker(self) -> Worker:
        worker = super()._start_worker()
        self.engine = {**self.engine, "llama_build": self.build}  # saved with each case: where its bug is known
        return worker

    def _env(self) -> dict[str, str]:
        env = child_env(str(self.lib_dir), GGML_SCHED_DEBUG="1", LLAMA_CPP_LIB_PATH=str(lib_overlay(self.lib_dir)))
        with_preload(env, self.hook)
        env[declarations.SOURCE_ENV], env[declarations.CDEF_ENV] = self.declarations.source, str(declarations.cdef_file(self.declarations))
        env.pop("GGML_SCHED_DEBUG_REALLOC", None)
        if self.debug_realloc:
            env["GGML_SCHED_DEBUG_REALLOC"] = str(int(self.debug_realloc))
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def run(self, workload: LlamaWorkload, logits: bool = False, capture: bool = False, meanwhile: Callable[[], None] | None = None,
            on_graph: Callable[[dict[str, Any]], None] | None = None) -> LlamaTrace:
        """Run ``workload`` on llama.cpp; with ``logits``, each decode's record also carries the
        logits of its first and last output (``CallRecord.logits``); with ``capture``, each reserve
        and alloc the graph llama.cpp handed the scheduler and where ggml put it (``SchedCall.capture``).
        ``meanwhile`` is called once the worker has the workload, while it runs (the caller makes
        it idempotent: a workload may be sent again); ``on_graph`` with each graph captured, the
        first time the workload's calls hand it the scheduler, while the worker goes on."""
        model_path = write_model(workload.model, self.models)
        lora_paths = [str(write_lora(workload.model, a, self.models)) for a in workload.loras]
        n_rpc = workload.devices.n_rpc
        for attempt in range(2):
            endpoints = self._servers_for(n_rpc)
            self.servers.assign(n_rpc, client_name(workload))
            worker = self._live_worker()
            self._used.setdefault(worker, set()).update(endpoints)
            calls: list[dict[str, Any]] = []
            try:
                worker.send({"workload": workload.to_json(), "model_path": str(model_path), "endpoints": endpoints, "lora_paths": lora_paths,
                             "logits": logits, "capture": capture})
                if meanwhile is not None:
                    meanwhile()
                result = self._collect(worker, calls, on_graph)
            except BaseException:
                self._worker = None
                worker.close()
                raise
            if isinstance(result, Unsupported):
                raise result
            if isinstance(result, str):  # an RPC server did not answer: replace it, once
                if attempt:
                    raise TargetError(f"the RPC server at {result} does not answer, even after a restart")
                self.servers.restart(result)
                continue
            break
        # a server's death is this workload's only if it used servers (a CPU-only run never is charged), and only
        # its own: before its contexts were freed the worker made a round trip to each (``synchronize_servers``), so
        # one that crashed on the workload's last graph made ggml abort there; one dead now died of what it sent
        if isinstance(result, LlamaAbort):
            self._worker = None
            worker.close()
            if n_rpc:  # what the aborted client had queued is still computed: a crash there is this workload's
                self.servers.quiesce(n_rpc)
        deaths = self.servers.deaths(n_rpc) if n_rpc else []
        if isinstance(result, LlamaAbort):
            if deaths:  # an RPC server crash shows in the worker as an abort, with the server exiting already
                result = replace(result, message="\n".join([result.message, *(d.report() for d in deaths)]), servers=tuple(d.brief() for d in deaths))
            elif n_rpc:
                result = replace(result, refused=self.servers.refusals(n_rpc))
            if result.kind == "timeout":
                self.servers.close()
            return LlamaTrace.from_messages(calls, result, self.engine, {})
        if deaths:
            self._worker = None  # its models live on a dead server: the next workload gets a fresh worker
            worker.close()
            last = calls[-1]["index"] if calls else -1
            abort = LlamaAbort(last, "crash", "\n".join(d.report() for d in deaths), servers=tuple(d.brief() for d in deaths))
            return LlamaTrace.from_messages(calls, abort, self.engine, {})
        return LlamaTrace.from_messages(calls, None, self.engine, result)

    def _servers_for(self, n: int) -> list[str]:
        """``RpcServers.ensure``, on a worker none of whose servers died since it used them; a
        build without ggml's RPC library cannot have RPC devices (``Unsupported``, as its worker says)."""
        if n and not self.has_rpc:
            raise Unsupported(f"RPC devices: this build has no RPC library (no libggml-rpc.so in {self.lib_dir})")
        if self._worker is not None and self.servers.gone(self._used.get(self._worker, ())):
            # a server it used died idle (nobody charged: ``ensure`` says so when it is asked for next): its
            # models live there, and any workload, a CPU-only one too, would meet the dead server freeing them
            self._worker.close()
            self._worker = None
        return self.servers.ensure(n)

    def _collect(self, worker: Worker, calls: list[dict[str, Any]], on_graph: Callable[[dict[str, Any]], None] | None) -> dict[str, int] | LlamaAbort | str | Unsupported:
        current = -1
        graphs: dict[int, tuple[Any, ...]] = {}  # the graphs the workload captured, by the worker's id
        while True:
            try:
                msg = worker.recv(self.call_timeout)
            except WorkerTimeout:
                return LlamaAbort(current, "timeout", f"call {current} did not finish within {self.call_timeout:g} s")
            except WorkerGone:
                return LlamaAbort(current, "crash", worker.crash_report())
            if "begin" in msg:
                current = int(msg["begin"])
            elif "call" in msg:
                new = _with_graphs(msg["call"].get("sched", ()), graphs, self.recent_graphs)
                calls.append(msg["call"])
                if on_graph is not None:
                    for cap in new:
                        on_graph(cap)
            elif "done" in msg:
                return dict(msg["done"].get("perf", {}))
            elif "abort" in msg:
                a = msg["abort"]
                _with_graphs(a.get("sched", ()), graphs, self.recent_graphs)
                return LlamaAbort(int(a["call"]), "abort", a["message"], tuple(SchedCall.from_json(s) for s in a.get("sched", ())), str(a.get("phase", "")))
            elif "unreachable" in msg:
                return str(msg["unreachable"])
            elif "unsupported" in msg:  # refused before any call: the worker waits for the next workload
                return Unsupported(str(msg["unsupported"]))
            elif "error" in msg:
                raise TargetError(f"the llama.cpp worker failed (harness, not llama.cpp):\n{msg['error']}")
            else:
                raise TargetError(f"unexpected message from the llama.cpp worker: {msg}")


def client_name(w: LlamaWorkload) -> str:
    """A workload as its RPC servers' client (``RpcServers.assign``): a digest of it, and its devices."""
    digest = hashlib.sha1(json.dumps(w.to_json(), sort_keys=True).encode()).hexdigest()[:10]
    return f"llama.cpp workload {digest} ({w.devices.describe()}; {len(w.calls)} calls)"


def _with_graphs(records: Sequence[dict[str, Any]], graphs: dict[int, tuple[Any, ...]], recent: RecentGraphs) -> list[dict[str, Any]]:
    """Each captured graph's nodes and leafs made of the records the worker sent (or, for a graph
    made recently, in this workload or an earlier one, the same objects again: ``recent``). The
    worker sends a graph it captured before in the workload as ``same_graph``: put back the one
    it sent with that ``graph_id`` and its ``key``. Returns the captures of graphs new to the
    workload."""
    new = []
    for s in records:
        cap = s.get("capture")
        if not cap:
            continue
        if "same_graph" in cap:
            cap["nodes"], cap["leafs"], cap["forced"], cap["key"] = graphs[cap.pop("same_graph")]
            continue
        cap["nodes"], cap["leafs"] = recent.get(cap["key"], cap.pop("records"), cap.pop("n_nodes"), cap.pop("buffers"))
        if "graph_id" in cap:
            graphs[cap.pop("graph_id")] = (cap["nodes"], cap["leafs"], cap["forced"], cap["key"])
            new.append(cap)
    return new
