"""ggml as loaded in a worker process: its bindings checked, its log, abort and realloc callbacks
installed, and the constructors that build a graph spec's tensors through ggml's own API.
Shared by the graph engine's worker (``ggml.graph_worker``) and the llama.cpp worker (``llama.llama_worker``)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..builds.compile import BuildError, ggml_source_location
from ..engine import TargetError, Unsupported
from ..model.graph_spec import TensorSpec
from ..model.layout import BackendSpec
from ..model.shapes import Geometry
from ..model.trace import RELEASE
from ..process.channel import Channel
from .build import build_fake_gpu, build_helpers
from .lib import import_ggml, loaded_library_path
from .program import GraphProgram, native_encoder
from .schedlog import SchedLog

Ptr = Any  # a ctypes pointer to a ggml struct (ggml_tensor, ggml_cgraph...)

TYPE_NAMES = ("f32", "f16", "i32", "i64", "q8_0")
VIEW_OP_NAMES = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})  # ggml_is_view_op
# SCHEDFUZZ_BARE=1 (benchmarks): no GGML_SCHED_DEBUG, so the scheduler runs at its own speed and
# records carry no splits
OBSERVE_SPLITS = os.environ.get("SCHEDFUZZ_BARE") != "1"
# threads of every CPU backend (the scheduler's, those the GPU-like devices compute with, the RPC
# servers'; llama.cpp's too): one count everywhere, so that a kernel splits its work, and rounds,
# the same way on each. One, not more: the graphs are small, and under pytest-xdist an idle
# OpenMP thread spins for its next region on a core another worker needs (2 threads cost the
# RPC servers many times the CPU of 1, for the same examples)
CPU_THREADS = 1
# ggml_backend_sched_realloc_callback (the seeds' ggml): (sched, graph, backend_ids_changed, graph_size_changed, user_data)
REALLOC_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool, ctypes.c_void_p)


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
        ("fuse", ctypes.c_int),
        ("cuda_batch", ctypes.c_int),
    ]

    @staticmethod
    def of(b: BackendSpec) -> FakeGpuConfig:
        return FakeGpuConfig(b.offload_min_batch or 0, b.max_size or 0, b.alignment, b.host_buffer, b.shared_buft, b.graph_optimize,
                             b.asynchronous, b.delay_us, ",".join(b.unsupported).encode(), b.memory or 0, b.corrupt_op.encode(), b.fuse,
                             b.cuda_batch)


def gpu_device() -> str:
    """Whether the GPU-like device can be built for the ggml loaded here: ``available``, or why
    not (a library folder with no ggml source above it has no headers to verify its backend
    interface against: ggml 0.27.0's source is not published)."""
    try:
        ggml_source_location(loaded_library_path("libggml-base"))  # nothing fetched: a built-in's source comes on first use
    except BuildError as e:
        return f"unavailable: {e}"
    return "available"


def load_fake_gpu() -> ctypes.CDLL:
    """``libschedfuzz-fake-gpu.so``, built against the loaded ggml's headers (cached on disk)."""
    try:
        lib = ctypes.CDLL(str(build_fake_gpu(loaded_library_path("libggml-base"))))
    except BuildError as e:
        raise TargetError(f"the GPU-like device cannot be built for this ggml: {e}") from None
    lib.schedfuzz_fake_gpu_config_size.restype = ctypes.c_size_t
    if lib.schedfuzz_fake_gpu_config_size() != ctypes.sizeof(FakeGpuConfig):
        raise TargetError("fake_gpu.c's struct fake_gpu_config and engine.FakeGpuConfig differ")
    lib.schedfuzz_fake_gpu_init.restype = ctypes.c_void_p
    lib.schedfuzz_fake_gpu_init.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(FakeGpuConfig)]
    lib.schedfuzz_fake_gpu_register.restype = ctypes.c_void_p
    lib.schedfuzz_fake_gpu_register.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(FakeGpuConfig)]
    lib.schedfuzz_fake_gpu_set_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.schedfuzz_fake_gpu_take_dep_nodes.restype = ctypes.c_int
    lib.schedfuzz_fake_gpu_take_dep_nodes.argtypes = [ctypes.c_void_p]
    return lib


def load_helpers() -> ctypes.CDLL:
    """``libschedfuzz-worker.so`` (``ggml/observe.c``, ``ggml/graph.c``), built on first use
    (cached on disk); a ``TargetError`` if its ops are not ``GraphProgram.OPS``."""
    try:
        lib = ctypes.CDLL(str(build_helpers()))
    except BuildError as e:
        raise TargetError(f"the graph worker's helpers cannot be built: {e}") from None
    lib.schedfuzz_observe_init.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.schedfuzz_observe_arm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.schedfuzz_observe_disarm.restype = ctypes.c_int
    lib.schedfuzz_log_take.restype = ctypes.c_void_p
    lib.schedfuzz_log_take.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    lib.schedfuzz_names.restype = ctypes.c_size_t
    lib.schedfuzz_names.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p]
    for fn in ("schedfuzz_graph_fn_names", "schedfuzz_graph_op_names"):
        getattr(lib, fn).restype = ctypes.c_char_p
    if lib.schedfuzz_graph_op_names().decode().rstrip(",").split(",") != list(GraphProgram.OPS) or (
            lib.schedfuzz_graph_record_words() != GraphProgram.WORDS):
        raise TargetError("graph.c's ops or record layout and engine.GraphProgram's differ")
    lib.schedfuzz_graph_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.schedfuzz_graph_build.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p,
                                          ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return lib


class GeometryMismatch(TargetError):
    """ggml built a tensor whose layout differs from what ``shapes`` inferred for the spec."""



def check_geometry(name: str, want: Geometry, got: Geometry) -> None:
    """Raise ``GeometryMismatch`` naming every field (type, ne, nb, view source) that differs."""
    diffs = [
        f"{f}: spec {getattr(want, f)!r}, ggml {getattr(got, f)!r}"
        for f in ("type", "ne", "nb", "view_src", "view_offs")
        if getattr(want, f) != getattr(got, f)
    ]
    if diffs:
        raise GeometryMismatch(f"tensor {name!r}: ops.infer and ggml disagree: " + "; ".join(diffs))


def gcov_dump(reset: bool = False) -> None:
    """Write the counts of a coverage build of ggml (``schedfuzz coverage``) now, and with
    ``reset`` start counting afresh (no count is then written twice). ``abort()`` skips the exit
    handlers that would write them, and a crash kills the process with every count it holds: the
    worker writes them after each scenario and from ggml's abort callback, so that a scenario that
    ends in an abort (a finding, an oracle under ``GGML_SCHED_DEBUG_REALLOC``) or a later crash of
    the same worker takes no other scenario's counts with it. A no-op on every other build (no
    ``__gcov_dump`` in the library)."""
    try:
        for lib in _loaded_ggml_base():
            dump = getattr(lib, "__gcov_dump", None)
            if dump is not None:
                dump()
                if reset:
                    getattr(lib, "__gcov_reset")()
    except Exception:
        pass  # the process dies anyway; a figure without these counts is still a figure


def _loaded_ggml_base() -> list[ctypes.CDLL]:
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libggml-base.so" in line}
    return [ctypes.CDLL(path) for path in sorted(paths)]


def coverage_build() -> bool:
    """Whether the loaded ``libggml-base`` counts coverage (``schedfuzz coverage``'s build)."""
    return any(hasattr(lib, "__gcov_dump") for lib in _loaded_ggml_base())


class Ggml:
    """ggml-python as loaded in this process, with the log and abort callbacks installed.

    ``ggml_log_set`` routes all ggml logging to ``observe.c``'s buffer, which ``drain_log`` hands
    to ``log`` (a ``SchedLog``); ``ggml_set_abort_callback`` reports an abort on the channel (with
    the step being run) before ggml calls ``abort()``. The callback objects are kept on ``self``:
    ggml holds only their C pointers.
    """

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.g: ModuleType = import_ggml()
        self.lib = self.g.ggml.lib
        # ggml-python 0.0.45 declares these restypes as int NewTypes: ctypes truncates to 32 bits
        self.lib.ggml_backend_sched_get_tensor_backend.restype = ctypes.c_void_p
        self.lib.ggml_backend_sched_get_backend.restype = ctypes.c_void_p
        self.lib.ggml_backend_sched_get_buffer_type.restype = ctypes.c_void_p
        self.lib.ggml_backend_sched_reserve_size.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        self.lib.ggml_backend_sched_reserve_size.restype = None
        for fn in ("ggml_backend_get_device", "ggml_backend_dev_host_buffer_type", "ggml_backend_get_default_buffer_type"):
            getattr(self.lib, fn).restype = ctypes.c_void_p
            getattr(self.lib, fn).argtypes = [ctypes.c_void_p]
        self.step = -1
        self.log = SchedLog()
        # backends outlive scenarios: an RPC backend keeps its connection, the CPU its threads
        self.backends: dict[tuple[str, str], int] = {}
        # the last scenario's weights and caches (``scenario_run.ScenarioRun._alloc_persistent``), each
        # group kept for a next scenario that asks for exactly it
        self.kept_weights: dict[tuple[Any, ...], Any] = {}
        self.helpers = load_helpers()
        get_backend = ctypes.cast(self.lib.ggml_backend_sched_get_tensor_backend, ctypes.c_void_p).value
        self.helpers.schedfuzz_observe_init(get_backend, self.g.GGML_LOG_LEVEL_ERROR)
        self._log_cb = ctypes.cast(self.helpers.schedfuzz_log, self.g.ggml_log_callback)
        self._init_graph_builder()
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
        # whether ggml logs its re-plans (a build without NDEBUG): set by the worker's start-up probe; a
        # Release build with the callback is observed through it alone (``record.StepRecording``)
        self.logs_reallocs = True
        if self.set_realloc_callback is not None:
            self.set_realloc_callback.argtypes = [ctypes.c_void_p, REALLOC_CALLBACK, ctypes.c_void_p]
            self.set_realloc_callback.restype = None
            self._realloc_cb = REALLOC_CALLBACK(self._on_realloc)

    def _init_graph_builder(self) -> None:
        """Hand ``graph.c`` the loaded library's constructors (by name; NULL where it has none) and
        where ``ggml_tensor`` keeps the fields it reads and writes (ggml-python's layout, which
        ``check_bindings`` checks against the library)."""
        names = self.helpers.schedfuzz_graph_fn_names().decode().rstrip(",").split(",")
        fns = (ctypes.c_void_p * len(names))(*[ctypes.cast(getattr(self.lib, n), ctypes.c_void_p).value if hasattr(self.lib, n) else None for n in names])
        t = self.g.ggml_tensor
        offsets = (ctypes.c_size_t * 6)(t.type.offset, t.ne.offset, t.nb.offset, t.op_params.offset, t.view_src.offset, t.view_offs.offset)
        self.helpers.schedfuzz_graph_init(fns, offsets, len(t().op_params))
        self._graph_fns = fns  # graph.c keeps pointers only

    def _on_realloc(self, sched: int | None, graph: int | None, backend_ids_changed: bool, graph_size_changed: bool, user_data: int | None) -> None:
        try:
            self.said.append((bool(backend_ids_changed), bool(graph_size_changed)))
        except Exception as e:  # an exception must not unwind into C
            self.log.errors.append(f"realloc callback failed: {e!r}")

    def drain_log(self) -> None:
        """Hand what ggml logged since the last call to ``log``."""
        n, lost = ctypes.c_size_t(0), ctypes.c_int(0)
        text = self.helpers.schedfuzz_log_take(ctypes.byref(n), ctypes.byref(lost))
        if lost.value:
            self.log.errors.append("some of ggml's log was lost: the observation helper could not grow its buffer")
        if n.value:
            self.log.feed_fragments(ctypes.string_at(text, n.value).decode(errors="replace"))

    def _on_abort(self, message: bytes | None) -> None:
        try:
            self.chan.send({"abort": {"step": self.step, "message": (message or b"").decode(errors="replace")}})
        except Exception:
            pass  # ggml aborts anyway; the parent then reports a crash
        gcov_dump()

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
            # what tells a re-plan: ggml's debug log (reasons, ggml-alloc's own re-plans), or in a Release build the callback alone
            "realloc_log": "logged" if self.logs_reallocs else RELEASE,
            "gpu_device": self.gpu_device(),
            # the graph programs' encoder: "C", or why programs are encoded in Python (slower, the same)
            "program_encoder": encoder if isinstance(encoder := native_encoder(), str) else "C",
        }

    def gpu_device(self) -> str:
        return gpu_device()

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
        flag, at = self.g.GGML_TENSOR_FLAG_INPUT, self.g.ggml_tensor.flags.offset
        inputs = {t for t in built.leafs if ctypes.c_int.from_address(t + at).value & flag}
        if n_copies <= 1:
            return len(inputs), 0
        read = {src for node, srcs in zip(built.nodes, built.srcs) if self.op_name(self.tensor(node)) not in VIEW_OP_NAMES for src in srcs if src in inputs}
        return len(inputs), len(read)

    def read(self, t: Ptr) -> bytes:
        """A tensor's bytes (``ggml_backend_tensor_get``)."""
        n = self.g.ggml_nbytes(t)
        out = ctypes.create_string_buffer(n)
        self.g.ggml_backend_tensor_get(t, out, 0, n)
        return out.raw

    def name_of(self, t: Ptr) -> str:
        return bytes(t.contents.name).split(b"\0", 1)[0].decode(errors="replace")

    def names_at(self, tensors: Any) -> tuple[str, ...]:
        """The names of the tensors in the ctypes array ``tensors`` of their addresses
        (``ggml_tensor.name``, NUL-ended), read by ``observe.c``'s ``schedfuzz_names`` in one call."""
        if not len(tensors):
            return ()
        field = self.g.ggml_tensor.name
        out = ctypes.create_string_buffer(len(tensors) * field.size)
        n = self.helpers.schedfuzz_names(tensors, len(tensors), field.offset, field.size, out)
        return tuple(out.raw[: n - 1].decode(errors="replace").split("\0"))

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

    def build_graph(self, ctx: int, program: GraphProgram) -> tuple[Ptr, list[int]]:
        """``program`` run in ``ctx`` by ``graph.c``: the cgraph of its roots and every tensor's
        address, in spec order. ggml made a tensor unlike its geometry row: ``GeometryMismatch``."""
        n = program.n
        tensors = (ctypes.c_void_p * n)()
        graph, failed, missing = ctypes.c_void_p(), ctypes.c_int(-1), ctypes.c_int(-1)
        size = n + 1  # ggml_visit_parents asserts n_nodes, n_leafs < size
        addr = GraphProgram.address
        got = self.helpers.schedfuzz_graph_build(ctx, addr(program.records), addr(program.reals), n, program.names, addr(program.words), addr(program.roots),
                                                  len(program.roots), size, tensors, ctypes.byref(graph), ctypes.byref(failed), ctypes.byref(missing))
        if got == GraphProgram.OK:
            return ctypes.cast(graph, ctypes.POINTER(self.g.ggml_cgraph)), list(tensors)
        names = list(program.index)
        if got >= 0:
            p = self.tensor(tensors[got])
            rec = program.records[got * GraphProgram.WORDS + GraphProgram.GEO: (got + 1) * GraphProgram.WORDS]
            want = Geometry(self.type_names.get(rec[0], f"type#{rec[0]}"), tuple(rec[1:5]), tuple(rec[5:9]),
                            names[rec[9]] if rec[9] >= 0 else None, rec[10] if rec[9] >= 0 else 0)
            check_geometry(names[got], want, self.geometry_of(p))
            raise TargetError(f"tensor {names[got]!r}: graph.c and the harness disagree on its geometry")
        if got == GraphProgram.MISSING:
            fn = self.helpers.schedfuzz_graph_fn_names().decode().split(",")[missing.value]
            raise Unsupported(f"tensor {names[failed.value]!r}: this ggml has no {fn}()")
        what = "its graph" if failed.value >= n else f"tensor {names[failed.value]!r}"
        raise TargetError(f"graph.c could not build {what} (error {got})")

    def tensor(self, address: int) -> Ptr:
        """The ``ggml_tensor`` at ``address``, as ggml-python's functions take it."""
        return ctypes.cast(address, ctypes.POINTER(self.g.ggml_tensor))


@dataclass
class Built:
    """A graph spec materialized in a fresh no_alloc context: its tensors' addresses in spec
    order (``index``: by name), the cgraph, and the addresses of its nodes and leafs."""

    ctx: int
    gf: Ptr
    tensors: list[int]
    index: dict[str, int]
    nodes: list[int]
    leafs: list[int]
    # each node's srcs (addresses) as built, read on a scheduler with n_copies > 1 only (``input_leafs``):
    # the scheduler later points some at input copies
    srcs: list[tuple[int, ...]] = field(default_factory=list)
    names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # of the nodes and the leafs
    observed: Any = None  # the nodes, then the leafs, as a C array for ``observe.c``'s snapshot

    def tensor(self, eng: Ggml, name: str) -> Ptr:
        return eng.tensor(self.tensors[self.index[name]])
