"""ggml as loaded in a worker process: its bindings checked, its log, abort and realloc callbacks
installed, and the constructors that build a graph spec's tensors through ggml's own API.
Shared by the graph engine's worker (``ggml.worker``) and the llama.cpp worker (``llama.worker``)."""

from __future__ import annotations

import ctypes
import os
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

from ..engine import TargetError, Unsupported
from ..model.scenario import BackendSpec, GraphSpec, TensorSpec
from ..model.shapes import Geometry
from ..process.channel import Channel
from .build import BuildError, build_fake_gpu, build_helpers, ggml_source_location
from .lib import import_ggml, loaded_library_path
from .schedlog import SchedLog
from .versions import version_of

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
# RPC servers 20x the CPU of 1, for the same examples)
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
        raise GeometryMismatch(f"tensor {name!r}: shapes.infer and ggml disagree: " + "; ".join(diffs))


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
            "gpu_device": self.gpu_device(),
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

    def names_at(self, addresses: Sequence[int]) -> tuple[str, ...]:
        """The names of the tensors at ``addresses`` (``ggml_tensor.name``, NUL-ended)."""
        at = self.g.ggml_tensor.name.offset
        return tuple(ctypes.string_at(a + at).decode(errors="replace") for a in addresses)

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

    def program(self, spec: GraphSpec, persistent: Callable[[TensorSpec], int] | None) -> GraphProgram:
        """``spec`` encoded for ``graph.c``, each tensor to be checked against ``spec.geometry``
        (the parent's inference: it comes with the pickled spec). ``persistent`` gives the
        scenario's tensor of a weight or a cache; without it (the values check's CPU-only graph)
        every leaf is a new tensor, neither named an input nor flagged."""
        GP = GraphProgram
        index = {t.name: i for i, t in enumerate(spec.tensors)}
        types, codes, geometry = self.types, GP.CODES, spec.geometry
        new_k = version_of(self.ggml_version).ssm_scan_takes_k  # with it, top_k and clamp as 0.25.3 has them
        program: list[int] = []
        reals: list[float] = []
        words: list[int] = []
        names = bytearray()
        no_ints, no_reals, no_args, ones = [0] * 8, [0.0] * 4, [-1] * 8, (1, 1, 1, 1)
        leaf_flags = GP.NAME | (GP.INPUT if persistent is not None else 0)
        for t in spec.tensors:
            ne, ints, real, args, w = t.ne, no_ints, no_reals, no_args, None
            flags = GP.OUTPUT if t.output and persistent is not None else 0
            ptr = len(names)
            if t.op == "none":
                if persistent is not None and t.role in ("weight", "cache"):
                    op, ptr = codes["persistent"], persistent(t)
                else:
                    op = codes["leaf"]
                    flags |= leaf_flags
            else:
                op = codes.get(t.op, -1)
                flags |= GP.NAME | (GP.NEW_K if new_k and t.op == "ssm_scan" else 0)
                if t.params:
                    flags |= GP.INPLACE if t.param("inplace") else 0
                    w = t.param("op_params")
                ne = ()
                if t.op in OP_RECORDS:
                    ne, ints, real = self._op_record(t, new_k)
                args = [index[a] if a is not None else -1 for a in t.args] + no_args[len(t.args):]
            if flags & GP.NAME:
                names += t.name.encode() + b"\0"
            geo = geometry[t.name]
            program += [op, types[t.type], max(len(ne), 1), *ne, *ones[len(ne):], *args, flags, *ints, ptr,
                        len(words) if w is not None else -1, len(w) if w is not None else 0,
                        types[geo.type], *geo.ne, *geo.nb, index[geo.view_src] if geo.view_src is not None else -1, geo.view_offs]
            if w is not None:
                words += [int(x) for x in w]
            reals += real
        n = len(spec.tensors)
        return GraphProgram(array("q", program), array("d", reals), bytes(names), array("i", words or [0]),
                            array("i", [index[r] for r in spec.roots]), n, index)

    def _op_record(self, t: TensorSpec, new_k: bool) -> tuple[tuple[int, ...], list[int], list[float]]:
        """An op's record fields: the shape its constructor takes (views and reshapes), its eight
        integer and four real parameters, as ``graph.c``'s ``construct`` reads them."""
        op, P = t.op, t.param
        ne: tuple[int, ...] = ()
        ints, real = [0] * 8, [0.0] * 4
        if op == "fill":
            real[0] = float(P("value", 0.0))
        elif op == "cast":
            ints[0] = self.types[str(P("type"))]
        elif op == "scale":
            real[0] = float(P("scale", 1.0))
        elif op == "pad":
            ints[:8] = [int(x) for x in P("pad")]
        elif op == "top_k":
            if not new_k:  # there ggml_top_k is an argsort and a view: not this op
                raise Unsupported(f"tensor {t.name!r}: GGML_OP_TOP_K is ggml 0.25.3's")
            ints[0] = int(P("k"))
        elif op == "ssm_scan":
            ints[0] = int(P("k", 1))  # 0.25.3 added K, the states kept
        elif op == "cont" and P("ne") is not None:
            cne = [int(x) for x in P("ne")]
            ints[:5] = [*cne, *[1] * (4 - len(cne)), 1]
        elif op == "argsort":
            ints[0] = int(P("order", 0))
        elif op == "clamp":
            if not new_k:  # there ggml_clamp returns a view of its source: not the op the spec describes
                raise Unsupported(f"tensor {t.name!r}: ggml 0.15.3's ggml_clamp works in place")
            real[:2] = [float(P("min", 0.0)), float(P("max", 1.0))]
        elif op == "glu":
            ints[:2] = [int(P("glu", 2)), int(bool(P("swapped", False)))]
        elif op == "rms_norm":
            real[0] = float(P("eps", 1e-6))
        elif op == "rope":
            ints[:2] = [int(P("n_dims")), int(P("mode", 0))]
        elif op == "soft_max_ext":
            real[:2] = [float(P("scale", 1.0)), float(P("max_bias", 0.0))]
        elif op == "flash_attn_ext":
            real[:3] = [float(P("scale", 1.0)), float(P("max_bias", 0.0)), float(P("logit_softcap", 0.0))]
        elif op == "concat":
            ints[0] = int(P("dim", 0))
        elif op == "permute":
            ints[:4] = [int(x) for x in P("axes")]
        elif op == "reshape":
            ne = tuple(int(x) for x in P("ne"))
        elif op == "view":
            ne = tuple(int(x) for x in P("ne"))
            nb = [int(x) for x in P("nb", ())]
            ints[:4] = [*nb, *[0] * (3 - len(nb)), int(P("offset", 0))]
        return ne, ints, real

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


# the ops whose record fields ``Ggml._op_record`` fills (a shape, integer or real parameters);
# every other op's are zeros
OP_RECORDS = frozenset({"fill", "cast", "scale", "pad", "top_k", "ssm_scan", "cont", "argsort", "clamp", "glu", "rms_norm", "rope",
                        "soft_max_ext", "flash_attn_ext", "concat", "permute", "reshape", "view"})


@dataclass(frozen=True)
class GraphProgram:
    """A graph spec encoded for ``graph.c``: per tensor, in spec order, a record of ``WORDS``
    int64 words (op, type, shape, arguments as record indices, flags, integer parameters, the
    persistent tensor or the name's offset, op_params words, then the geometry ggml must give
    it) and four doubles; the names, NUL-ended; the op_params words; the roots as indices."""

    OPS: ClassVar[tuple[str, ...]] = (
        "leaf", "persistent", "fill", "cast", "pad", "argmax", "ssm_conv", "sub", "sum", "log", "exp", "sigmoid", "step", "cumsum", "top_k",
        "ssm_scan", "get_rows", "mul_mat", "add", "mul", "div", "cpy", "silu", "transpose", "view_tensor", "sum_rows", "dup",
        "cont", "argsort", "clamp", "glu", "mul_mat_id", "set_rows", "scale", "rms_norm", "rope", "soft_max_ext", "flash_attn_ext",
        "concat", "permute", "reshape", "view")
    CODES: ClassVar[dict[str, int]] = {name: i for i, name in enumerate(OPS)}
    WORDS: ClassVar[int] = 38
    GEO: ClassVar[int] = 27  # where the geometry starts in a record
    INPUT, OUTPUT, INPLACE, NEW_K, NAME = 1, 2, 4, 8, 16  # flags
    OK, NULL, MISSING, BAD_OP = -1, -2, -3, -4  # graph.c's results besides a record index

    records: array[int]
    reals: array[float]
    names: bytes
    words: array[int]
    roots: array[int]
    n: int
    index: dict[str, int]

    @staticmethod
    def address(a: array[Any]) -> int:
        return a.buffer_info()[0]


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
