"""The process that runs scenarios on the real ggml: ``python -m pytest_schedfuzz.ggml.worker``.

Protocol: JSON lines. The worker reads requests on stdin and writes replies on the file
descriptor that was its stdout; its fd 1 is then pointed at stderr, so whatever ggml or Python
print cannot corrupt the protocol.

* startup: ``{"hello": {engine info}}``, or ``{"fatal": message}`` and exit;
* request ``{"scenario": <Scenario JSON>, "endpoints": ["127.0.0.1:P", ...]}``, answered with one
  ``{"record": <StepRecord>}`` per step and then ``{"done": true}``; or ``{"unsupported": reason}``;
  or ``{"unreachable": endpoint}`` when an RPC server does not answer (the parent restarts it
  and sends the scenario again); or ``{"error": {"step": i, "message": traceback}}`` when the
  harness failed (not ggml);
* when ggml aborts (``GGML_ABORT``/``GGML_ASSERT``): ``{"abort": {"step": i, "message": text}}``
  is written from ggml's abort callback, and the process dies right after.

What is observed, and how:

* backends of nodes and leafs: ``ggml_backend_sched_get_tensor_backend``, called from the log
  callback when ``ggml_backend_sched_print_assignments`` starts (``GGML_SCHED_DEBUG=2``): that
  is inside ``ggml_backend_sched_split_graph``, once every node has its backend, and before
  ``ggml_backend_sched_reserve`` resets the scheduler (which empties its hash table);
* splits: the ``## SPLIT`` headers of the same printout (``schedlog.SchedLog``);
* reallocations: ggml's debug log (Debug builds only; checked by a probe at startup).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from types import ModuleType
from typing import Any

from ..engine import TargetError, Unsupported
from ..model.scenario import BackendLayout, BackendSpec, GraphBuilder, GraphSpec, Scenario, SchedParams, Step, TensorSpec
from ..model.shapes import Geometry
from ..model.trace import ReallocEvent, SizeCounts, Split, StepRecord
from . import values
from .build import BuildError, build_fake_gpu, ggml_source_location
from .lib import die_with_parent, import_ggml, loaded_library_path
from .schedlog import SchedLog

Ptr = Any  # a ctypes pointer to a ggml struct (ggml_tensor, ggml_cgraph...)

TYPE_NAMES = ("f32", "f16", "i32", "i64", "q8_0")
VIEW_OP_NAMES = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})  # ggml_is_view_op
# SCHEDFUZZ_BARE=1 (benchmarks): no GGML_SCHED_DEBUG, so the scheduler runs at its own speed and
# records carry no splits
OBSERVE_SPLITS = os.environ.get("SCHEDFUZZ_BARE") != "1"
# threads of every CPU backend (the scheduler's and those the GPU-like devices compute with): one
# count everywhere, so that a kernel splits its work, and rounds, the same way on each
CPU_THREADS = 2
# ggml_backend_sched_realloc_callback (the seeds' ggml): (sched, graph, backend_ids_changed, graph_size_changed, user_data)
REALLOC_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool, ctypes.c_void_p)

def no_realloc_fix(lib: str) -> str:
    """What to do when the startup probe saw no reallocation (a build with ``NDEBUG``), for the
    library that was loaded: the built-in ones are rebuilt with pip, a user's with cmake."""
    head = (f"ggml logged no graph reallocation for a graph that must reallocate: its debug logging is compiled out "
            f"(NDEBUG) in {lib}. ")
    if "/site-packages/ggml/" in lib:
        return head + ("Rebuild ggml-python as a Debug build: pip install --force-reinstall --no-cache-dir --no-binary ggml-python "
                       "ggml-python==0.0.45 --config-settings=cmake.build-type=Debug --config-settings=cmake.define.GGML_RPC=ON "
                       "(--no-cache-dir: pip's wheel cache ignores build settings)")
    if "/site-packages/llama_cpp/" in lib:
        return head + ("Rebuild llama-cpp-python as a Debug build: pip install --force-reinstall --no-cache-dir --no-binary "
                       "llama-cpp-python llama-cpp-python==0.3.36 --config-settings=cmake.build-type=Debug "
                       "--config-settings=cmake.define.GGML_RPC=ON --config-settings=cmake.define.LLAVA_BUILD=OFF")
    return head + "Configure your build with -DCMAKE_BUILD_TYPE=Debug -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON and build it again"


class FakeGpuConfig(ctypes.Structure):
    """``struct fake_gpu_config`` of ``fake_gpu.c`` (its size is checked against the library's)."""

    _fields_ = [
        ("offload_min_batch", ctypes.c_int64),
        ("max_size", ctypes.c_size_t),
        ("alignment", ctypes.c_size_t),
        ("host_buffer", ctypes.c_int),
        ("shared_buft", ctypes.c_int),
        ("graph_optimize", ctypes.c_int),
        ("asynchronous", ctypes.c_int),
        ("delay_us", ctypes.c_int),
        ("unsupported", ctypes.c_char * 512),
        ("memory", ctypes.c_size_t),
        ("corrupt_op", ctypes.c_char * 32),
    ]

    @staticmethod
    def of(b: BackendSpec) -> FakeGpuConfig:
        return FakeGpuConfig(b.offload_min_batch or 0, b.max_size or 0, b.alignment, b.host_buffer, b.shared_buft, b.graph_optimize,
                             b.asynchronous, b.delay_us, ",".join(b.unsupported).encode(), b.memory or 0, b.corrupt_op.encode())


def load_fake_gpu() -> ctypes.CDLL:
    """``libschedfuzz-fake-gpu.so``, built against the loaded ggml's headers (cached on disk)."""
    try:
        lib = ctypes.CDLL(str(build_fake_gpu(loaded_library_path("libggml-base"))))
    except BuildError as e:
        raise TargetError(f"the GPU-like device cannot be built for this ggml: {e}") from None
    lib.schedfuzz_fake_gpu_config_size.restype = ctypes.c_size_t
    if lib.schedfuzz_fake_gpu_config_size() != ctypes.sizeof(FakeGpuConfig):
        raise TargetError("fake_gpu.c's struct fake_gpu_config and worker.FakeGpuConfig differ")
    lib.schedfuzz_fake_gpu_init.restype = ctypes.c_void_p
    lib.schedfuzz_fake_gpu_init.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(FakeGpuConfig)]
    lib.schedfuzz_fake_gpu_register.restype = ctypes.c_void_p
    lib.schedfuzz_fake_gpu_register.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(FakeGpuConfig)]
    lib.schedfuzz_fake_gpu_set_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


class GeometryMismatch(TargetError):
    """ggml built a tensor whose layout differs from what ``shapes`` inferred for the spec."""


def tcp_reachable(endpoint: str, timeout: float = 5.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout):
            return True
    except OSError:
        return False


class RpcUnreachable(Exception):
    """No RPC server answers at this endpoint (``ggml_backend_rpc_get_device_memory`` gives 0)."""


def check_geometry(name: str, want: Geometry, got: Geometry) -> None:
    """Raise ``GeometryMismatch`` naming every field (type, ne, nb, view source) that differs."""
    diffs = [
        f"{f}: spec {getattr(want, f)!r}, ggml {getattr(got, f)!r}"
        for f in ("type", "ne", "nb", "view_src", "view_offs")
        if getattr(want, f) != getattr(got, f)
    ]
    if diffs:
        raise GeometryMismatch(f"tensor {name!r}: shapes.infer and ggml disagree: " + "; ".join(diffs))


class Channel:
    """The protocol's output: JSON lines on a file descriptor of its own."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]


class Ggml:
    """ggml-python as loaded in this process, with the log and abort callbacks installed.

    ``ggml_log_set`` routes all ggml logging to ``log`` (a ``SchedLog``); ``ggml_set_abort_callback``
    reports an abort on the channel (with the step being run) before ggml calls ``abort()``.
    The callback objects are kept on ``self``: ggml holds only their C pointers.
    """

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.g: ModuleType = import_ggml()
        self.lib = self.g.ggml.lib
        # ggml-python 0.0.45 declares these restypes as int NewTypes: ctypes truncates to 32 bits
        self.lib.ggml_backend_sched_get_tensor_backend.restype = ctypes.c_void_p
        for fn in ("ggml_backend_get_device", "ggml_backend_dev_host_buffer_type", "ggml_backend_get_default_buffer_type"):
            getattr(self.lib, fn).restype = ctypes.c_void_p
            getattr(self.lib, fn).argtypes = [ctypes.c_void_p]
        self.step = -1
        self.log = SchedLog()
        # backends outlive scenarios: an RPC backend keeps its connection, the CPU its threads
        self.backends: dict[tuple[str, str], int] = {}
        self._log_cb = self.g.ggml_log_callback(self._on_log)
        self.g.ggml_log_set(self._log_cb, None)
        self._abort_cb = self.g.ggml_abort_callback_t(self._on_abort)
        self.g.ggml_set_abort_callback(self._abort_cb)
        self.types = {name: getattr(self.g, f"GGML_TYPE_{name.upper()}") for name in TYPE_NAMES}
        self.type_names = {v: k for k, v in self.types.items()}
        self.ggml_version = self.version()
        self.bindings = ""  # check_bindings()
        self._fake_gpu: ctypes.CDLL | None = None
        # the seeds' ggml (and ggml master) tell each re-reservation's decision through a callback:
        # where it exists, every realloc of the scheduler is read from it (``said``, per step)
        self.set_realloc_callback = getattr(self.lib, "ggml_backend_sched_set_realloc_callback", None)
        self.said: list[tuple[bool, bool]] = []  # (backend_ids_changed, graph_size_changed), in order
        if self.set_realloc_callback is not None:
            self.set_realloc_callback.argtypes = [ctypes.c_void_p, REALLOC_CALLBACK, ctypes.c_void_p]
            self.set_realloc_callback.restype = None
            self._realloc_cb = REALLOC_CALLBACK(self._on_realloc)

    def _on_realloc(self, sched: int | None, graph: int | None, backend_ids_changed: bool, graph_size_changed: bool, user_data: int | None) -> None:
        try:
            self.said.append((bool(backend_ids_changed), bool(graph_size_changed)))
        except Exception as e:  # an exception must not unwind into C
            self.log.errors.append(f"realloc callback failed: {e!r}")

    def _on_log(self, level: int, text: bytes | None, user_data: int | None) -> None:
        try:
            line = (text or b"").decode(errors="replace")
            if level == self.g.GGML_LOG_LEVEL_ERROR:
                # ggml's errors also go to stderr: a crash's report then carries them
                os.write(2, line.encode())
            self.log.feed(line)
        except Exception as e:  # an exception must not unwind into C
            self.log.errors.append(f"log callback failed: {e!r}")

    def _on_abort(self, message: bytes | None) -> None:
        try:
            self.chan.send({"abort": {"step": self.step, "message": (message or b"").decode(errors="replace")}})
        except Exception:
            pass  # ggml aborts anyway; the parent then reports a crash

    def check_bindings(self) -> str:
        """Check ggml-python's bindings against the loaded library where a mismatch matters:
        the layouts of ``ggml_tensor`` and ``ggml_object`` (``ggml_tensor_overhead``), which the
        harness reads through ctypes; a ``TargetError`` if they differ. Op numbers may differ
        (ggml inserts new ops in the enum): the harness names ops through the library's
        ``ggml_op_name``, so that only goes into the description returned."""
        g = self.g
        want = ctypes.sizeof(g.ggml_tensor) + ctypes.sizeof(g.ggml_object)
        if g.ggml_tensor_overhead() != want:
            raise TargetError(
                f"ggml-python {g.__version__}'s struct ggml_tensor does not match the loaded library "
                f"{loaded_library_path('libggml-base')} (ggml {self.ggml_version}): ggml_tensor_overhead() is "
                f"{g.ggml_tensor_overhead()} bytes, the bindings expect {want}; this ggml cannot be tested through these bindings"
            )
        # names by value (GGML_OP_POOL_MAX and others of enum ggml_op_pool share the values)
        by_value: dict[int, set[str]] = {}
        for n, v in vars(g).items():
            if n.startswith("GGML_OP_") and isinstance(v, int) and n != "GGML_OP_COUNT":
                by_value.setdefault(v, set()).add(n[len("GGML_OP_"):])
        for v in range(g.GGML_OP_COUNT):
            name = g.ggml_op_name(v).decode()
            if name not in by_value.get(v, ()):
                return (f"op numbers agree up to {v} of {g.GGML_OP_COUNT} (there the library has {name}, the bindings "
                        f"{'/'.join(sorted(by_value.get(v, ())))}; harmless: the harness names ops through the library)")
        return f"all {g.GGML_OP_COUNT} op numbers agree"

    def info(self) -> dict[str, str]:
        """Engine description for ``Trace.engine``."""
        return {
            "name": "ggml",
            "lib": loaded_library_path("libggml-base"),
            "ggml_version": self.ggml_version,
            "ggml_python": self.g.__version__,
            "bindings": self.bindings,
            # the seeds' ggml tells each realloc decision through a callback; older ones only log them
            "realloc_callback": "observed" if self.set_realloc_callback is not None else "absent (decisions derived from the graph-size formula)",
            "gpu_device": self.gpu_device(),
        }

    def gpu_device(self) -> str:
        """Whether the GPU-like device can be built for this ggml: ``available``, or why not
        (a library folder with no ggml source above it has no headers to build it against)."""
        try:
            ggml_source_location(loaded_library_path("libggml-base"))  # nothing fetched: a built-in's source comes on first use
        except BuildError as e:
            return f"unavailable: {e}"
        return "available"

    def fake_gpu(self) -> ctypes.CDLL:
        """``libschedfuzz-fake-gpu.so``, built against this ggml's headers on first use (cached)."""
        if self._fake_gpu is None:
            self._fake_gpu = load_fake_gpu()
        return self._fake_gpu

    def new_fake_gpu(self, name: str, b: BackendSpec) -> int:
        """A GPU-like backend named ``name``, computing through a CPU backend of its own."""
        cpu = self.g.ggml_backend_cpu_init()
        self.g.ggml_backend_cpu_set_n_threads(cpu, CPU_THREADS)
        backend = self.fake_gpu().schedfuzz_fake_gpu_init(name.encode(), cpu, ctypes.byref(FakeGpuConfig.of(b)))
        if not backend:
            raise TargetError(f"schedfuzz_fake_gpu_init refused {b.to_json()}")
        return int(backend)

    def version(self) -> str:
        """``ggml_version()``, which ggml-python 0.0.45 does not bind (its vendored ggml is 0.15.3)."""
        if not hasattr(self.lib, "ggml_version"):
            return "unknown (the library has no ggml_version())"
        fn = self.lib.ggml_version
        fn.restype = ctypes.c_char_p
        return str(fn().decode())

    def op_name(self, t: Ptr) -> str:
        """The op of ``t`` as the loaded library names it (``ggml_op_name``), so that no enum
        value of the bindings is trusted."""
        return str(self.g.ggml_op_name(t.contents.op).decode())

    def input_leafs(self, built: Built, n_copies: int) -> tuple[int, int]:
        """The graph's input leafs, and how many of them a non-view node reads (the graph inputs
        0.15.3's pass 5 collects with ``n_copies > 1``; 0.25.3's pass 6 takes every input leaf).
        ggml collects graph inputs only with ``n_copies > 1``: the nodes are not walked otherwise."""
        flag = self.g.GGML_TENSOR_FLAG_INPUT
        inputs = {ctypes.addressof(t.contents) for t in built.leafs if t.contents.flags & flag}
        if n_copies <= 1:
            return len(inputs), 0
        read = {src for node, srcs in zip(built.nodes, built.srcs) if self.op_name(node) not in VIEW_OP_NAMES for src in srcs if src in inputs}
        return len(inputs), len(read)

    def name_of(self, t: Ptr) -> str:
        return bytes(t.contents.name).split(b"\0", 1)[0].decode(errors="replace")

    def geometry_of(self, t: Ptr) -> Geometry:
        c = t.contents
        view_src = self.name_of(c.view_src) if c.view_src else None
        return Geometry(
            self.type_names.get(c.type, f"type#{c.type}"),
            (c.ne[0], c.ne[1], c.ne[2], c.ne[3]),
            (c.nb[0], c.nb[1], c.nb[2], c.nb[3]),
            view_src,
            c.view_offs if view_src is not None else 0,
        )

    def new_context(self, n_tensors: int, extra: int = 0) -> int:
        """``ggml_init`` of a no_alloc context for ``n_tensors`` tensor headers and ``extra`` bytes."""
        g = self.g
        mem = (n_tensors + 1) * g.ggml_tensor_overhead() + extra
        ctx = g.ggml_init(g.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
        if not ctx:
            raise TargetError("ggml_init failed")
        return int(ctx)

    def new_leaf(self, ctx: int, t: TensorSpec) -> Ptr:
        """``ggml_new_tensor`` with the spec's type and shape, named."""
        ne = list(t.ne) + [1] * (4 - len(t.ne))
        p = self.g.ggml_new_tensor(ctx, self.types[t.type], max(len(t.ne), 1), (ctypes.c_int64 * 4)(*ne))
        self.g.ggml_set_name(p, t.name.encode())
        return p

    def new_op(self, ctx: int, t: TensorSpec, a: list[Ptr | None]) -> Ptr:
        """The ggml call that builds op ``t.op`` over ``a`` (the spec's ``args``, in call order)."""
        g, op, P = self.g, t.op, t.param
        if op in ("get_rows", "mul_mat", "add", "mul", "cpy"):
            return getattr(g, f"ggml_{op}")(ctx, a[0], a[1])
        if op in ("silu", "cont", "transpose", "view_tensor"):
            return getattr(g, f"ggml_{op}")(ctx, a[0])
        if op == "mul_mat_id":
            return g.ggml_mul_mat_id(ctx, a[0], a[1], a[2])
        if op == "set_rows":
            return g.ggml_set_rows(ctx, a[0], a[1], a[2])
        if op == "scale":
            return g.ggml_scale(ctx, a[0], float(P("scale", 1.0)))
        if op == "rms_norm":
            return g.ggml_rms_norm(ctx, a[0], float(P("eps", 1e-6)))
        if op == "rope":
            # ggml_rope_ext(a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
            #               ext_factor, attn_factor, beta_fast, beta_slow)
            return g.ggml_rope_ext(ctx, a[0], a[1], a[2], int(P("n_dims")), int(P("mode", 0)), 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        if op == "soft_max_ext":
            return g.ggml_soft_max_ext(ctx, a[0], a[1], float(P("scale", 1.0)), float(P("max_bias", 0.0)))
        if op == "flash_attn_ext":
            return g.ggml_flash_attn_ext(
                ctx, a[0], a[1], a[2], a[3], float(P("scale", 1.0)), float(P("max_bias", 0.0)), float(P("logit_softcap", 0.0))
            )
        if op == "concat":
            return g.ggml_concat(ctx, a[0], a[1], int(P("dim", 0)))
        if op == "permute":
            return g.ggml_permute(ctx, a[0], *[int(x) for x in P("axes")])
        if op == "reshape":
            ne = [int(x) for x in P("ne")]
            return getattr(g, f"ggml_reshape_{len(ne)}d")(ctx, a[0], *ne)
        if op == "view":
            ne, nb = [int(x) for x in P("ne")], [int(x) for x in P("nb", ())]
            return getattr(g, f"ggml_view_{len(ne)}d")(ctx, a[0], *ne, *nb, int(P("offset", 0)))
        raise TargetError(f"tensor {t.name!r}: op {op!r} has no ggml builder here")


@dataclass
class Built:
    """A graph spec materialized in a fresh no_alloc context: tensors by name, and the cgraph."""

    ctx: int
    gf: Ptr
    tensors: dict[str, Ptr]
    nodes: list[Ptr]
    leafs: list[Ptr]
    inputs: list[Ptr]
    # each node's srcs (addresses) as built: the scheduler later points some at input copies
    srcs: list[tuple[int, ...]] = field(default_factory=list)

    def node_names(self, eng: Ggml) -> tuple[str, ...]:
        return tuple(eng.name_of(t) for t in self.nodes)

    def leaf_names(self, eng: Ggml) -> tuple[str, ...]:
        return tuple(eng.name_of(t) for t in self.leafs)


@dataclass
class Snapshot:
    """Backend index (-1: none) of every node and leaf, read while the hash table is live."""

    nodes: tuple[int, ...] = ()
    leafs: tuple[int, ...] = ()
    taken: bool = False


@dataclass
class _Persistent:
    """Weights and caches: one context and one backend buffer per (device, role)."""

    tensors: dict[tuple[Any, ...], Ptr] = field(default_factory=dict)
    ctxs: list[int] = field(default_factory=list)
    buffers: list[int] = field(default_factory=list)


class ScenarioRun:
    """The backends, scheduler, weights and graphs of one scenario, run step by step.

    Backends: ``ggml_backend_rpc_init`` (one per "rpc" entry, in layout order, each on its own
    server), ``ggml_backend_blas_init``, ``ggml_backend_cpu_init``. Steps, on ``ggml_backend_sched_*``:
    ``sched_new`` -> ``_new`` (or keep the scheduler: reuse); ``reserve`` -> ``_set_tensor_backend``
    for forced tensors, ``_reserve``; ``alloc`` -> ``_reset``, forced, ``_alloc_graph``; ``compute``
    -> as alloc, inputs zeroed (``ggml_backend_tensor_set``), ``_graph_compute``; ``reset`` -> ``_reset``.
    Each record reads ``_get_n_splits``, ``_get_n_copies`` and ``_get_buffer_size`` per backend.
    """

    def __init__(self, eng: Ggml, scenario: Scenario, endpoints: Sequence[str]) -> None:
        self.eng = eng
        self.g = eng.g
        self.scenario = scenario
        self.backends: list[int] = []
        self.rpc_endpoints: list[str] = []
        self.sched: int | None = None
        self.counts: SizeCounts | None = None  # of the last ggml_backend_sched_split_graph on this scheduler
        self.built: list[Built] = []
        self.persistent = _Persistent()
        # the values oracle: the seed of every leaf's contents, and what each weight and cache
        # holds in the CPU-only computation (``_solo``)
        self.seed = values.scenario_seed(scenario)
        self.shadow: dict[tuple[Any, ...], bytes] = {}
        self.values_off: str | None = None  # why values are no longer compared (``values.undetermined``)
        try:
            self._init_backends(scenario.layout, endpoints)
            self.names = [self.g.ggml_backend_name(b).decode() for b in self.backends]
            if len(set(self.names)) != len(self.names):
                raise TargetError(f"backend names are not unique: {self.names}")
            self.index_of = {b: i for i, b in enumerate(self.backends)}
            self._alloc_persistent()
        except BaseException:
            self.close()
            raise

    # one constructor per device kind (``model.scenario.BACKEND_KINDS``): name, spec, RPC endpoint
    def _new_rpc(self, name: str, b: BackendSpec, endpoint: str) -> int:
        # ggml_backend_rpc_init does not check the server (it crashes on a dead one), and
        # 0.25.3 aborts in any RPC call that cannot connect: try a TCP connection first
        if not tcp_reachable(endpoint):
            raise RpcUnreachable(endpoint)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        self.g.ggml_backend_rpc_get_device_memory(endpoint.encode(), 0, ctypes.byref(free), ctypes.byref(total))
        if total.value == 0:
            raise RpcUnreachable(endpoint)
        return self.g.ggml_backend_rpc_init(endpoint.encode(), 0)

    def _new_gpu(self, name: str, b: BackendSpec, endpoint: str) -> int:
        return self.eng.new_fake_gpu(name, b)

    def _new_blas(self, name: str, b: BackendSpec, endpoint: str) -> int:
        if not self.g.GGML_USE_BLAS:
            raise Unsupported("this ggml was built without the BLAS backend (GGML_BLAS=OFF)")
        return self.g.ggml_backend_blas_init()

    def _new_cpu(self, name: str, b: BackendSpec, endpoint: str) -> int:
        backend = self.g.ggml_backend_cpu_init()
        self.g.ggml_backend_cpu_set_n_threads(backend, CPU_THREADS)
        return backend

    def _init_backends(self, layout: BackendLayout, endpoints: Sequence[str]) -> None:
        if layout.n_rpc > len(endpoints):
            raise TargetError(f"the layout has {layout.n_rpc} RPC backends but {len(endpoints)} endpoints were given")
        if layout.n_rpc and not self.g.GGML_USE_RPC:
            raise Unsupported("this ggml was built without the RPC backend (GGML_RPC=OFF)")
        rpc = iter(endpoints)
        pool = self.eng.backends
        for i, b in enumerate(layout.backends):
            key = (b.kind, next(rpc) if b.kind == "rpc" else json.dumps([layout.name(i), b.to_json()]) if b.kind == "gpu" else "")
            if b.kind == "rpc":
                self.rpc_endpoints.append(key[1])
            if key in pool:
                self.backends.append(pool[key])
                continue
            backend = getattr(self, f"_new_{b.kind}")(layout.name(i), b, key[1])
            if not backend:
                raise TargetError(f"could not initialize the {b.kind} backend")
            pool[key] = backend
            self.backends.append(backend)

    @staticmethod
    def _key(t: TensorSpec) -> tuple[Any, ...]:
        return (t.name, t.type, t.ne, t.role, t.device)

    def _alloc_persistent(self) -> None:
        """Weights (buffer usage WEIGHTS) and caches (usage ANY) of all graphs: per device and
        role, one context allocated with ``ggml_backend_alloc_ctx_tensors`` and zeroed."""
        g = self.g
        unique: dict[tuple[Any, ...], TensorSpec] = {}
        for _, spec in self.scenario.graphs:
            for t in spec.tensors:
                if t.role in ("weight", "cache"):
                    unique.setdefault(self._key(t), t)
        groups: dict[tuple[int, str], list[TensorSpec]] = {}
        for t in unique.values():
            assert t.device is not None  # Scenario.validate
            groups.setdefault((t.device, t.role), []).append(t)
        for (device, role), specs in sorted(groups.items()):
            ctx = self.eng.new_context(len(specs))
            self.persistent.ctxs.append(ctx)
            for t in specs:
                self.persistent.tensors[self._key(t)] = self.eng.new_leaf(ctx, t)
            buf = g.ggml_backend_alloc_ctx_tensors(ctx, self.backends[device])
            if not buf:
                raise TargetError(f"could not allocate the {role} buffer of backend {device}")
            self.persistent.buffers.append(buf)
            usage = g.GGML_BACKEND_BUFFER_USAGE_WEIGHTS if role == "weight" else g.GGML_BACKEND_BUFFER_USAGE_ANY
            g.ggml_backend_buffer_set_usage(buf, usage)
        # rope frequency factors are ones (random ones could be 0: theta / 0 = inf, then NaN)
        freq_factors = {(s.args[2]) for _, spec in self.scenario.graphs for s in spec.tensors if s.op == "rope" and s.args[2]}
        for _, spec in self.scenario.graphs:
            for t in spec.tensors:
                key = self._key(t)
                if key in self.persistent.tensors and key not in self.shadow:
                    data = values.leaf_bytes(self.seed, spec, t, 0, {}, ones=t.name in freq_factors)
                    self.shadow[key] = data
                    g.ggml_backend_tensor_set(self.persistent.tensors[key], data, 0, len(data))

    # -- graphs --------------------------------------------------------------------------

    def materialize(self, spec: GraphSpec) -> Built:
        """A fresh context and cgraph for ``spec``: inputs (``ggml_set_input``) and ops are new,
        weights and caches are the scenario's; every tensor is named and checked against
        ``spec.geometry``; the roots go to ``ggml_build_forward_expand`` in order."""
        g, eng = self.g, self.eng
        size = len(spec.tensors) + 1  # ggml_visit_parents asserts n_nodes, n_leafs < size
        ctx = eng.new_context(len(spec.tensors), g.ggml_graph_overhead_custom(size, False))
        built = Built(ctx, None, {}, [], [], [])
        self.built.append(built)
        geo = spec.geometry
        for t in spec.tensors:
            if t.role in ("weight", "cache"):
                p = self.persistent.tensors[self._key(t)]
            elif t.is_leaf:
                p = eng.new_leaf(ctx, t)
                g.ggml_set_input(p)
                built.inputs.append(p)
            else:
                p = eng.new_op(ctx, t, [built.tensors[a] if a is not None else None for a in t.args])
                g.ggml_set_name(p, t.name.encode())
            if t.output:
                g.ggml_set_output(p)
            check_geometry(t.name, geo[t.name], eng.geometry_of(p))
            built.tensors[t.name] = p
        built.gf = g.ggml_new_graph_custom(ctx, size, False)
        for root in spec.roots:
            g.ggml_build_forward_expand(built.gf, built.tensors[root])
        built.nodes = [g.ggml_graph_node(built.gf, i) for i in range(g.ggml_graph_n_nodes(built.gf))]
        cg = built.gf.contents
        if cg.n_nodes != len(built.nodes):
            raise TargetError("ggml_cgraph's layout in ggml-python does not match the loaded ggml")
        built.leafs = [cg.leafs[i] for i in range(cg.n_leafs)]
        built.srcs = [tuple(ctypes.addressof(s.contents) for s in n.contents.src if s) for n in built.nodes]
        # the previous graph stays alive: while its tensors exist, no new tensor can take the
        # address of one the scheduler's hash table may still hold (a reserve does not reset first)
        while len(self.built) > 2:
            g.ggml_free(self.built.pop(0).ctx)
        return built

    def _backend_index(self, t: Ptr) -> int:
        b = self.eng.lib.ggml_backend_sched_get_tensor_backend(self.sched, t)
        return -1 if b is None else self.index_of[b]

    def _snapshot(self, built: Built) -> Snapshot:
        return Snapshot(
            tuple(self._backend_index(t) for t in built.nodes),
            tuple(self._backend_index(t) for t in built.leafs),
            True,
        )

    # -- steps ---------------------------------------------------------------------------

    def _sizes(self) -> tuple[int, ...]:
        return tuple(self.g.ggml_backend_sched_get_buffer_size(self.sched, b) for b in self.backends)

    def step(self, index: int, st: Step) -> StepRecord:
        g = self.g
        if st.kind == "sched_new":
            assert st.params is not None
            if st.reuse:
                if self.sched is None:
                    raise TargetError(f"step {index}: nothing to reuse")
            else:
                self._new_sched(st.params)
            n_copies = g.ggml_backend_sched_get_n_copies(self.sched)
            return StepRecord(index, st.kind, n_copies=n_copies, buffer_sizes=self._sizes(), reused=st.reuse)
        if self.sched is None:
            raise TargetError(f"step {index}: {st.kind} before any sched_new")
        if st.kind == "reset":
            g.ggml_backend_sched_reset(self.sched)
            return StepRecord(index, st.kind, n_copies=g.ggml_backend_sched_get_n_copies(self.sched), buffer_sizes=self._sizes())
        assert st.graph is not None
        spec = self.scenario.graph(st.graph)
        built = self.materialize(spec)
        snap = Snapshot()

        def on_split_print() -> None:
            nonlocal snap
            snap = self._snapshot(built)

        self.eng.log.begin(on_split_print)
        self.eng.said = []
        # like llama_context::graph_reserve and ::decode: reset (forget the previous graph's
        # assignments and copies), apply the graph's own assignments, then reserve or alloc
        t0 = time.perf_counter()
        g.ggml_backend_sched_reset(self.sched)
        self._force(spec, built)
        if st.kind == "reserve":
            ok = bool(g.ggml_backend_sched_reserve(self.sched, built.gf))
        else:
            ok = bool(g.ggml_backend_sched_alloc_graph(self.sched, built.gf))
        seconds = time.perf_counter() - t0
        if st.kind != "reserve":
            if not snap.taken:  # a graph without nodes prints no split: read the live hash table
                snap = self._snapshot(built)
            if ok and st.kind == "compute":
                inputs = self._inputs(index, spec)
                self._set_inputs(inputs, built)
                ok = g.ggml_backend_sched_graph_compute(self.sched, built.gf) == g.GGML_STATUS_SUCCESS
                self._round_trip()
        self.eng.log.on_split_print = None
        record = replace(self._record(index, st.kind, built, snap, ok), seconds=seconds)
        if ok and st.kind == "compute":
            # once a step's values are undetermined, so are the caches every later step reads
            self.values_off = self.values_off or values.undetermined(spec)
            if self.values_off is None:
                record = replace(record, values=self._compare_values(index, spec, built, inputs), values_checked=len(values.compared(spec)))
        return record

    def _round_trip(self) -> None:
        """One request with a reply to every RPC server, after a compute: from 0.25.3 on the RPC
        client sends ``GRAPH_COMPUTE`` without waiting for the server, so a server that crashes
        computing would otherwise show up in a later step or scenario. Each server answers only
        once it has computed; a dead one makes ggml abort here, in the step that crashed it."""
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        for endpoint in self.rpc_endpoints:
            self.g.ggml_backend_rpc_get_device_memory(endpoint.encode(), 0, ctypes.byref(free), ctypes.byref(total))

    def _new_sched(self, params: SchedParams) -> None:
        """``ggml_backend_sched_new(backends, NULL, n, max_nodes, parallel, op_offload)``; the
        debug level comes from ``GGML_SCHED_DEBUG`` (set to 2 when this module starts)."""
        g = self.g
        if self.sched is not None:
            g.ggml_backend_sched_free(self.sched)
            self.sched = None
        arr = (g.ggml_backend_t_ctypes * len(self.backends))(*self.backends)
        self.sched = g.ggml_backend_sched_new(arr, self._bufts(), len(self.backends), params.max_nodes, params.parallel, params.op_offload)
        if not self.sched:
            raise TargetError("ggml_backend_sched_new returned NULL")
        if self.eng.set_realloc_callback is not None:
            self.eng.set_realloc_callback(self.sched, self.eng._realloc_cb, None)
        self.counts = None

    def _bufts(self) -> Any:
        """``NULL`` (every backend's default buffer type), or, when a gpu has a host buffer type,
        the defaults with that host type for the CPU backend, as llama.cpp passes them."""
        g, lib = self.g, self.eng.lib
        host = self.scenario.layout.host_buffer_of
        if host is None:
            return None
        bufts = [lib.ggml_backend_get_default_buffer_type(b) for b in self.backends]
        bufts[-1] = lib.ggml_backend_dev_host_buffer_type(lib.ggml_backend_get_device(self.backends[host]))
        return (g.ggml_backend_buffer_type_t_ctypes * len(bufts))(*bufts)

    def _force(self, spec: GraphSpec, built: Built) -> None:
        for name, backend in spec.forced:
            self.g.ggml_backend_sched_set_tensor_backend(self.sched, built.tensors[name], self.backends[backend])

    def _inputs(self, index: int, spec: GraphSpec) -> dict[str, bytes]:
        """What every input holds at compute step ``index`` (``values.leaf_bytes``)."""
        ranges = values.index_ranges(spec)
        return {t.name: values.leaf_bytes(self.seed, spec, t, index, ranges) for t in spec.tensors if t.role == "input"}

    def _set_inputs(self, inputs: dict[str, bytes], built: Built) -> None:
        """Write ``inputs`` into those the graph uses."""
        in_graph = {ctypes.addressof(t.contents) for t in built.leafs}
        for name, data in inputs.items():
            p = built.tensors[name]
            if ctypes.addressof(p.contents) in in_graph:
                self.g.ggml_backend_tensor_set(p, data, 0, len(data))

    def _read(self, t: Ptr) -> bytes:
        n = self.g.ggml_nbytes(t)
        out = ctypes.create_string_buffer(n)
        self.g.ggml_backend_tensor_get(t, out, 0, n)
        return out.raw

    def _compare_values(self, index: int, spec: GraphSpec, built: Built, inputs: dict[str, bytes]) -> str:
        """The first of the step's roots, outputs and caches whose bytes differ from the same
        graph computed on the CPU backend alone (``_solo``); "" if none."""
        want = self._solo(index, spec, inputs)
        geo = spec.geometry
        tolerant = any(b.kind == "blas" for b in self.scenario.layout.backends)
        for name in values.compared(spec):
            diff = values.difference(name, geo[name], self._read(built.tensors[name]), want[name], tolerant)
            if diff:
                return diff
        return ""

    def _solo(self, index: int, spec: GraphSpec, inputs: dict[str, bytes]) -> dict[str, bytes]:
        """``spec`` computed on the CPU backend alone, every tensor in one buffer of its own (no
        scheduler, no allocator reuse), from the same leaf contents; the compared tensors' bytes.
        The weights and caches it leaves are the next compute's."""
        g, eng = self.g, self.eng
        cpu = self.backends[-1]
        size = len(spec.tensors) + 1
        ctx = eng.new_context(len(spec.tensors), g.ggml_graph_overhead_custom(size, False))
        buf = None
        try:
            tensors: dict[str, Ptr] = {}
            for t in spec.tensors:
                tensors[t.name] = eng.new_leaf(ctx, t) if t.is_leaf else eng.new_op(ctx, t, [tensors[a] if a is not None else None for a in t.args])
            gf = g.ggml_new_graph_custom(ctx, size, False)
            for root in spec.roots:
                g.ggml_build_forward_expand(gf, tensors[root])
            buf = g.ggml_backend_alloc_ctx_tensors(ctx, cpu)
            if not buf:
                raise TargetError(f"step {index}: could not allocate the CPU-only graph")
            for t in spec.tensors:
                if t.is_leaf:
                    data = self.shadow[self._key(t)] if t.role in ("weight", "cache") else inputs[t.name]
                    g.ggml_backend_tensor_set(tensors[t.name], data, 0, len(data))
            if g.ggml_backend_graph_compute(cpu, gf) != g.GGML_STATUS_SUCCESS:
                raise TargetError(f"step {index}: the CPU-only computation failed")
            for t in spec.tensors:
                if t.role == "cache":
                    self.shadow[self._key(t)] = self._read(tensors[t.name])
            return {name: self._read(tensors[name]) for name in values.compared(spec)}
        finally:
            if buf:
                g.ggml_backend_buffer_free(buf)
            g.ggml_free(ctx)

    def _with_ggml_decisions(self, index: int, events: tuple[ReallocEvent, ...]) -> tuple[ReallocEvent, ...]:
        """The scheduler's reallocations (``via`` sched: ``alloc_splits`` re-reserving) with ggml's
        own decision from its realloc callback, one call per reallocation it logged."""
        said, out = list(self.eng.said), []
        for e in events:
            if e.via != "sched":
                out.append(e)  # ggml-alloc re-planned by itself: no scheduler decision to report
                continue
            if not said:
                raise TargetError(f"step {index}: ggml logged a reallocation its realloc callback did not report")
            ids_changed, size_changed = said.pop(0)
            if ids_changed != e.backend_ids_changed:
                raise TargetError(f"step {index}: ggml's realloc callback says backend_ids_changed = {int(ids_changed)}, its log {int(e.backend_ids_changed)}")
            out.append(replace(e, ggml_size_changed=size_changed))
        if said:
            raise TargetError(f"step {index}: ggml's realloc callback reported {len(said)} reallocation(s) its log did not show")
        return tuple(out)

    def _record(self, index: int, kind: str, built: Built, snap: Snapshot, ok: bool) -> StepRecord:
        g, log = self.g, self.eng.log
        if log.errors:
            raise TargetError(f"step {index}: cannot read ggml's log: " + "; ".join(log.errors) + self._log_tail())
        n_nodes, n_leafs = len(built.nodes), len(built.leafs)
        n_splits = g.ggml_backend_sched_get_n_splits(self.sched)
        n_copies = g.ggml_backend_sched_get_n_copies(self.sched)
        splits = self._splits(index, n_nodes, n_splits) if OBSERVE_SPLITS else ()
        counts = SizeCounts(n_nodes, n_leafs, n_splits, sum(len(s.inputs) for s in splits), *self.eng.input_leafs(built, n_copies), n_copies)
        prev, self.counts = self.counts, counts
        events = tuple(ReallocEvent(index, r.via, r.backend_ids_changed, n_splits, r.reason) for r in log.reallocs)
        if self.eng.set_realloc_callback is not None:
            events = self._with_ggml_decisions(index, events)
        return StepRecord(
            index,
            kind,
            node_names=built.node_names(self.eng),
            node_backends=snap.nodes,
            leaf_names=built.leaf_names(self.eng),
            leaf_backends=snap.leafs,
            splits=splits,
            n_copies=n_copies,
            counts=counts,
            prev_counts=prev,
            buffer_sizes=self._sizes(),
            events=events,
            ok=ok,
        )

    def _splits(self, index: int, n_nodes: int, n_splits: int) -> tuple[Split, ...]:
        logged = self.eng.log.splits
        if n_nodes == 0:
            return ()
        if len(logged) != n_splits:
            raise TargetError(
                f"step {index}: ggml_backend_sched_get_n_splits says {n_splits} splits, the log shows {len(logged)}"
                " (is GGML_SCHED_DEBUG=2 set before ggml_backend_sched_new?)" + self._log_tail()
            )
        starts = [s.first_node for s in logged]
        if any(s is None for s in starts):
            raise TargetError(f"step {index}: a logged split has no node line" + self._log_tail())
        bounds = [int(s) for s in starts if s is not None] + [n_nodes]
        by_name = {n: i for i, n in enumerate(self.names)}
        return tuple(Split(by_name[s.backend_name], bounds[k], bounds[k + 1], tuple(s.inputs)) for k, s in enumerate(logged))

    def _log_tail(self) -> str:
        return "\nlast lines of ggml's log:\n" + "\n".join(self.eng.log.tail)

    def close(self) -> None:
        """Free the scheduler, graphs and weight buffers, in that order (backends are pooled)."""
        g = self.g
        if self.sched is not None:
            g.ggml_backend_sched_free(self.sched)
            self.sched = None
        for b in self.built:
            g.ggml_free(b.ctx)
        self.built.clear()
        for buf in self.persistent.buffers:
            g.ggml_backend_buffer_free(buf)
        for ctx in self.persistent.ctxs:
            g.ggml_free(ctx)
        self.persistent = _Persistent()
        self.backends.clear()


def probe_scenario() -> Scenario:
    """CPU only: reserve a one-op graph, then alloc a two-op one. The single compute buffer
    must reallocate by itself (``ggml_gallocr_alloc_graph``: "different number of nodes")."""
    small, big = GraphBuilder(), GraphBuilder()
    for b in (small, big):
        b.input("x", (8, 2))
        b.op("scale", "x", name="y", scale=2.0)
    big.op("add", "y", "y", name="z")
    return Scenario(
        BackendLayout.of("cpu"),
        (("small", small.build("y")), ("big", big.build("z"))),
        (Step("sched_new", params=SchedParams(64, False, True)), Step("reserve", "small"), Step("alloc", "big")),
    )


def run_scenario(eng: Ggml, scenario: Scenario, endpoints: Sequence[str], chan: Channel | None) -> list[StepRecord]:
    """Run every step, sending each record on ``chan`` as soon as it exists."""
    records: list[StepRecord] = []
    eng.step = 0  # backends and weights are set up as part of step 0
    run = ScenarioRun(eng, scenario, endpoints)
    try:
        for i, st in enumerate(scenario.steps):
            eng.step = i
            records.append(run.step(i, st))
            if chan is not None:
                chan.send({"record": asdict(records[-1])})
    finally:
        run.close()
    return records


def main() -> None:
    die_with_parent()
    if OBSERVE_SPLITS:
        os.environ["GGML_SCHED_DEBUG"] = "2"  # read by ggml_backend_sched_new
    chan = Channel(os.dup(1))
    os.dup2(2, 1)  # ggml's printf and Python's print now go to stderr
    sys.stdout = sys.stderr
    eng = Ggml(chan)
    try:
        eng.bindings = eng.check_bindings()
    except TargetError as e:
        chan.send({"fatal": str(e)})
        raise SystemExit(2)
    try:
        probe = run_scenario(eng, probe_scenario(), [], None)
    except Exception:
        chan.send({"fatal": "the startup probe failed:\n" + traceback.format_exc()})
        raise SystemExit(2)
    # a benchmark may time a Release build, which cannot show reallocs: only it skips the check
    if OBSERVE_SPLITS and not any(r.events for r in probe):
        chan.send({"fatal": no_realloc_fix(eng.info()["lib"])})
        raise SystemExit(2)
    chan.send({"hello": eng.info()})
    for line in sys.stdin.buffer:
        req = json.loads(line)
        eng.step = -1
        try:
            run_scenario(eng, Scenario.from_json(req["scenario"]), req["endpoints"], chan)
            chan.send({"done": True})
        except Unsupported as e:
            chan.send({"unsupported": str(e)})
        except RpcUnreachable as e:
            chan.send({"unreachable": str(e)})
        except Exception:
            chan.send({"error": {"step": eng.step, "message": traceback.format_exc()}})


if __name__ == "__main__":
    main()
