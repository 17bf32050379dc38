"""One scenario on the real ggml: its backends, scheduler, weights and graphs, run step by step,
each step's observations read from ggml (``ggml_backend_sched_*``, its log and callbacks)."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..engine import TargetError
from ..model.devices import DEVICE_KINDS
from ..model.graph_spec import GraphSpec, TensorSpec
from ..model.scenario import EVAL_CALLBACK_OPS, Scenario, SchedParams, Step
from ..model.trace import SizeCounts, StepRecord
from . import cpu_values
from .bindings import Built, Ggml, Ptr
from .constructors import init_backends
from .cpu_only import CpuOnly, tensor_key
from .program import GraphProgram, encoded, made_of
from .record import Snapshot, StepRecording


@dataclass
class _Group:
    """The weights or the caches of one device: a context, its tensors, their backend buffer."""

    ctx: int
    tensors: dict[tuple[Any, ...], Ptr]
    buffer: int = 0

    def free(self, g: Any) -> None:
        g.ggml_backend_buffer_free(self.buffer)
        g.ggml_free(self.ctx)


@dataclass
class _Persistent:
    """Weights and caches: a ``_Group`` per (device, role), under its key (``_alloc_persistent``)."""

    tensors: dict[tuple[Any, ...], Ptr] = field(default_factory=dict)
    groups: dict[tuple[Any, ...], _Group] = field(default_factory=dict)


class ScenarioRun(StepRecording):
    """The backends, scheduler, weights and graphs of one scenario, run step by step.

    Backends: ``ggml_backend_rpc_init`` (one per "rpc" entry, in layout order, each on its own
    server), ``ggml_backend_blas_init``, ``ggml_backend_cpu_init``. Steps, on ``ggml_backend_sched_*``:
    ``sched_new`` -> ``_new`` (or keep the scheduler: reuse); ``reserve`` -> ``_set_tensor_backend``
    for forced tensors, ``_reserve``; ``alloc`` -> ``_reset``, forced, ``_alloc_graph``; ``compute``
    -> as alloc, inputs zeroed (``ggml_backend_tensor_set``), ``_graph_compute``; ``split`` -> ``_reset``,
    forced, ``_split_graph`` (llama.cpp's probe of where ops go); ``reset`` -> ``_reset``.
    Each record reads ``_get_n_splits``, ``_get_n_copies`` and ``_get_buffer_size`` per backend.
    """

    def __init__(self, eng: Ggml, scenario: Scenario, endpoints: Sequence[str], compare_values: bool = True) -> None:
        self.eng = eng
        self.g = eng.g
        self.scenario = scenario
        self.backends: list[int] = []
        self.rpc_endpoints: list[str] = []
        self.sched: int | None = None
        self.counts: SizeCounts | None = None  # of the last ggml_backend_sched_split_graph on this scheduler
        self.built: list[Built] = []
        self.programs: dict[int, GraphProgram] = {}  # per spec (``materialize``): its program, bound to this scenario's tensors
        self.persistent = _Persistent()
        self.encoding_seconds = 0.0  # the programs encoded for ``_alloc_persistent``, not yet in a record's build_seconds
        self.cpu_only = CpuOnly(eng, scenario, compare_values)  # the values check of compute steps
        self._eval_cb = self.g.ggml_backend_sched_eval_callback(self._on_eval)  # kept alive while a scheduler may call it
        try:
            self.backends, self.rpc_endpoints = init_backends(eng, scenario.layout, endpoints)
            self.names = [self.g.ggml_backend_name(b).decode() for b in self.backends]
            if len(set(self.names)) != len(self.names):
                raise TargetError(f"backend names are not unique: {self.names}")
            self._backend_array = (ctypes.c_void_p * len(self.backends))(*self.backends)
            self._alloc_persistent()
        except BaseException:
            self.close()
            raise

    def _alloc_persistent(self) -> None:
        """Weights (buffer usage WEIGHTS) and caches (usage ANY) of all graphs: per device and
        role, one context allocated with ``ggml_backend_alloc_ctx_tensors`` (or the last
        scenario's, where it had the same), and filled with the values oracle's contents where a
        step computes (nothing else reads them: an RPC device would take a round trip per tensor)."""
        g, eng = self.g, self.eng
        unique: dict[tuple[Any, ...], TensorSpec] = {}
        t0 = time.perf_counter()
        for _, spec in self.scenario.graphs:
            # the program's weights and caches: the spec's tensors are not made for them (``encode``)
            for _, t in encoded(spec, True, eng.types, eng.ggml_version).persistent:
                unique.setdefault(tensor_key(t), t)
        self.encoding_seconds = time.perf_counter() - t0  # a part of building the graphs: the first one's record says it
        groups: dict[tuple[int, str], list[TensorSpec]] = {}
        for t in unique.values():
            assert t.device is not None  # Scenario.validate
            groups.setdefault((t.device, t.role), []).append(t)
        # a group an earlier scenario had alike (its backend, role and tensors) is taken as it
        # is: the same tensors in a buffer of the same size, as a fresh one would be (what it
        # holds is written below wherever a step computes); the others are freed before anything
        # is allocated, so that a device's free memory is a fresh run's. Those on an RPC server
        # this scenario does not use wait for a scenario that does: that server may be gone
        # (restarted under another endpoint), and freeing there would abort ggml
        wanted = {(self.backends[device], role, tuple(map(tensor_key, specs))): (device, role, specs)
                  for (device, role), specs in sorted(groups.items())}
        kept, mine = self.eng.kept_weights, set(self.backends)
        served = {b for (kind, _), b in self.eng.backends.items() if DEVICE_KINDS[kind].endpoint}
        for key in [k for k in kept if k not in wanted and (k[0] in mine or k[0] not in served)]:
            kept.pop(key).free(g)
        for key, (device, role, specs) in wanted.items():
            group = kept.pop(key, None) or self._new_group(device, role, specs)
            self.persistent.groups[key] = group
            self.persistent.tensors.update(group.tensors)
        if not any(st.kind == "compute" for st in self.scenario.steps):
            return
        if not self.cpu_only.compared:  # zeros (a call per buffer), and the ones rope reads
            for group in self.persistent.groups.values():
                g.ggml_backend_buffer_clear(group.buffer, 0)
        for _, spec in self.scenario.graphs:
            for t in spec.tensors:
                key = tensor_key(t)
                if key in self.persistent.tensors and (self.cpu_only.compared or t.name in self.cpu_only.ones):
                    data = self.cpu_only.persistent_bytes(spec, t)
                    g.ggml_backend_tensor_set(self.persistent.tensors[key], data, 0, len(data))

    def _new_group(self, device: int, role: str, specs: list[TensorSpec]) -> _Group:
        """``role``'s tensors on ``device``: a context, allocated with ``ggml_backend_alloc_ctx_tensors``."""
        g = self.g
        ctx = self.eng.new_context(len(specs))
        group = _Group(ctx, {tensor_key(t): self.eng.new_leaf(ctx, t) for t in specs})
        group.buffer = g.ggml_backend_alloc_ctx_tensors(ctx, self.backends[device])
        if not group.buffer:
            g.ggml_free(ctx)
            raise TargetError(f"could not allocate the {role} buffer of backend {device}")
        usage = g.GGML_BACKEND_BUFFER_USAGE_WEIGHTS if role == "weight" else g.GGML_BACKEND_BUFFER_USAGE_ANY
        g.ggml_backend_buffer_set_usage(group.buffer, usage)
        return group

    # -- graphs --------------------------------------------------------------------------

    def materialize(self, spec: GraphSpec) -> Built:
        """A fresh context and cgraph for ``spec``, built by ``graph.c`` from the spec's program
        (encoded once per scenario): inputs (``ggml_set_input``) and ops are new, weights and
        caches are the scenario's; every tensor is named and checked against the spec's geometry
        (as the parent inferred it: it comes with the pickled spec); the roots go to
        ``ggml_build_forward_expand`` in order. The node and leaf names are read from ggml the
        first time (ggml builds a program alike each time)."""
        g, eng = self.g, self.eng
        program = self.programs.get(id(spec))  # the scenario holds its specs: ids are stable
        if program is None:
            # encoded once per spec and worker (a kept spec serves many scenarios: ``kept``), bound
            # to this scenario's weights and caches once per scenario
            program = self.programs[id(spec)] = encoded(spec, True, eng.types, eng.ggml_version).bound(
                lambda t: ctypes.addressof(self.persistent.tensors[tensor_key(t)].contents))
        ctx = eng.new_context(program.n, g.ggml_graph_overhead_custom(program.n + 1, False))
        built = Built(ctx, None, [], program.index, [], [])
        self.built.append(built)
        built.gf, built.tensors = eng.build_graph(ctx, program)
        cg = built.gf.contents
        if cg.n_nodes != g.ggml_graph_n_nodes(built.gf):
            raise TargetError("ggml_cgraph's layout in ggml-python does not match the loaded ggml")
        built.nodes = ctypes.cast(cg.nodes, ctypes.POINTER(ctypes.c_void_p))[: cg.n_nodes]
        built.leafs = ctypes.cast(cg.leafs, ctypes.POINTER(ctypes.c_void_p))[: cg.n_leafs]
        built.observed = (ctypes.c_void_p * (len(built.nodes) + len(built.leafs)))(*built.nodes, *built.leafs)
        made = made_of(spec, eng.ggml_version)
        if "names" not in made:
            names = eng.names_at(built.observed)
            made["names"] = (names[: len(built.nodes)], names[len(built.nodes):])
        built.names = made["names"]
        # the previous graph stays alive: while its tensors exist, no new tensor can take the
        # address of one the scheduler's hash table may still hold (a reserve does not reset first)
        while len(self.built) > 2:
            g.ggml_free(self.built.pop(0).ctx)
        return built

    # -- steps ---------------------------------------------------------------------------

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
            return StepRecord(index, st.kind, n_copies=n_copies, buffer_sizes=self._sizes(), reused=st.reuse, buffer_types=self._buffer_types())
        if self.sched is None:
            raise TargetError(f"step {index}: {st.kind} before any sched_new")
        if st.kind == "reset":
            g.ggml_backend_sched_reset(self.sched)
            return StepRecord(index, st.kind, n_copies=g.ggml_backend_sched_get_n_copies(self.sched), buffer_sizes=self._sizes())
        if st.kind == "eval_callback":
            g.ggml_backend_sched_set_eval_callback(self.sched, self._eval_cb, None)
            return StepRecord(index, st.kind, n_copies=g.ggml_backend_sched_get_n_copies(self.sched), buffer_sizes=self._sizes())
        assert st.graph is not None
        spec = self.scenario.graph(st.graph)
        t_build = time.perf_counter()
        built = self.materialize(spec)
        build_seconds = time.perf_counter() - t_build + self.encoding_seconds
        self.encoding_seconds = 0.0
        snap = Snapshot()
        self.eng.drain_log()  # what earlier calls logged: no part of this step
        self.eng.log.begin()
        out = self._arm_snapshot(built)
        self.eng.said = []
        if g.ggml_backend_sched_get_n_copies(self.sched) > 1:  # as built: split_graph points some srcs at input copies
            built.srcs = [tuple(ctypes.addressof(s.contents) for s in self.eng.tensor(n).contents.src if s) for n in built.nodes]
        # like llama_context::graph_reserve and ::decode: reset (forget the previous graph's
        # assignments and copies), apply the graph's own assignments, then reserve or alloc
        t0 = time.perf_counter()
        g.ggml_backend_sched_reset(self.sched)
        self._force(spec, built)
        self._dep_nodes()  # forget what an earlier split_graph made
        if st.kind == "reserve":
            ok = bool(g.ggml_backend_sched_reserve(self.sched, built.gf))
        elif st.kind == "split":  # llama.cpp's probe of where ops go (its flash-attention check)
            g.ggml_backend_sched_split_graph(self.sched, built.gf)
            ok = True
        elif st.kind == "reserve_size":  # llama.cpp's memory estimate: no buffer allocated
            measured = (ctypes.c_size_t * len(self.backends))()
            self.eng.lib.ggml_backend_sched_reserve_size(self.sched, built.gf, measured)
            ok = True
        else:
            ok = bool(g.ggml_backend_sched_alloc_graph(self.sched, built.gf))
        n_dep_nodes = self._dep_nodes()  # of this step's one split_graph
        seconds = time.perf_counter() - t0
        if self.eng.helpers.schedfuzz_observe_disarm():
            snap = self._snapshot(built, out)
        if st.kind not in ("reserve", "reserve_size"):  # both reset the scheduler: no hash table to read after
            if not snap.taken:  # a graph without nodes prints no split: read the live hash table
                self.eng.helpers.schedfuzz_observe_snapshot()
                snap = self._snapshot(built, out)
            if ok and st.kind == "compute":
                inputs = self.cpu_only.inputs(index, spec)
                self._set_inputs(inputs, built)
                ok = g.ggml_backend_sched_graph_compute(self.sched, built.gf) == g.GGML_STATUS_SUCCESS
                self._round_trip()
        self.eng.drain_log()
        record = replace(self._record(index, st.kind, built, snap, ok, n_dep_nodes), seconds=seconds, build_seconds=build_seconds)
        if st.kind == "reserve_size":
            record = replace(record, buffer_sizes=tuple(measured))
        if ok and st.kind == "compute":
            # once a step's values are undetermined, so are the caches every later step reads
            self.cpu_only.off = self.cpu_only.off or cpu_values.undetermined(spec)
            if self.cpu_only.off is None:
                diff = self.cpu_only.compare(index, spec, built, inputs, self.backends[-1])
                record = replace(record, values=diff, values_checked=len(cpu_values.compared(spec)))
        return record

    def _on_eval(self, t: Ptr, ask: bool, user_data: int | None) -> bool:
        """The eval callback (``eval_callback`` steps): asked, it wants the results of the ops of
        ``EVAL_CALLBACK_OPS``, so that ``compute_splits`` computes each split up to each of them and
        waits; given one, it lets the computation go on."""
        return self.eng.op_name(t) in EVAL_CALLBACK_OPS if ask else True

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

    def _buffer_types(self) -> tuple[str, ...]:
        """The buffer type the scheduler allocates each of its backends' compute buffers in
        (``ggml_backend_sched_get_n_backends``, ``_get_backend``, ``_get_buffer_type``), named as
        ``BackendLayout.buft`` names them: a backend's default buffer type by that backend's own
        buffers, a gpu's host buffer type ``<gpu>_Host``; anything else, or a backend at another
        position than given, by what ggml says."""
        lib, layout = self.eng.lib, self.scenario.layout
        known = {lib.ggml_backend_get_default_buffer_type(b): layout.buffer_buft(i) for i, b in enumerate(self.backends)}
        for i, (b, spec) in enumerate(zip(self.backends, layout.backends)):
            if spec.host_buffer:
                known[lib.ggml_backend_dev_host_buffer_type(lib.ggml_backend_get_device(b))] = f"{layout.name(i)}_Host"
        out = []
        for i in range(lib.ggml_backend_sched_get_n_backends(self.sched)):
            b = lib.ggml_backend_sched_get_backend(self.sched, i)
            if i >= len(self.backends) or b != self.backends[i]:
                out.append(f"backend #{i} is not the one given")
                continue
            buft = lib.ggml_backend_sched_get_buffer_type(self.sched, ctypes.c_void_p(b))
            out.append(known.get(buft) or f"{self.g.ggml_backend_buft_name(buft).decode()} (unknown)")
        return tuple(out)

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
            self.g.ggml_backend_sched_set_tensor_backend(self.sched, built.tensor(self.eng, name), self.backends[backend])

    def _set_inputs(self, inputs: dict[str, bytes], built: Built) -> None:
        """Write ``inputs`` into those the graph uses."""
        in_graph = set(built.leafs)
        for name, data in inputs.items():
            if built.tensors[built.index[name]] in in_graph:
                self.g.ggml_backend_tensor_set(built.tensor(self.eng, name), data, 0, len(data))

    def close(self) -> None:
        """Free the scheduler and the graphs, in that order; backends and the weights and
        caches are kept (``Ggml.backends``, ``Ggml.kept_weights``)."""
        g = self.g
        if self.sched is not None:
            g.ggml_backend_sched_free(self.sched)
            self.sched = None
        for b in self.built:
            g.ggml_free(b.ctx)
        self.built.clear()
        # the weights and caches are kept for the next scenario, which frees what it does not take
        self.eng.kept_weights.update(self.persistent.groups)
        self.persistent = _Persistent()
        self.backends.clear()
        self.programs.clear()
        self.__dict__.pop("_eval_cb", None)


