"""Backend layouts as plain data: the ordered backends given to ``ggml_backend_sched_new``,
with the settings of schedfuzz's GPU-like device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .devices import BACKEND_KINDS, DEVICE_KINDS, DeviceKind
from .shapes import SpecError


@dataclass(frozen=True)
class BackendSpec:
    """One backend given to ``ggml_backend_sched_new``.

    ``rpc`` devices each have their own buffer type; ``blas`` and ``cpu`` share the host buffer
    type. ``gpu`` is schedfuzz's GPU-like device (``ggml/fake_gpu.c``), with the fields below:

    * ``offload_min_batch``: its ``offload_op`` accepts ops whose batch (``ne[1]``) is at least this;
    * ``cuda_batch``: that batch is measured as ggml-cuda and ggml-vulkan measure it
      (``get_op_batch_size``: ``ne[2]`` for ``MUL_MAT_ID`` and ``ROPE``, never for ``GET_ROWS``,
      the rows for the rest), so that a routed-expert matmul is offloaded by its tokens;
    * ``max_size``: the maximum size of a buffer of its buffer type (ggml-alloc splits larger
      compute buffers into chunks; the device refuses a larger allocation);
    * ``alignment`` of its buffers; ``unsupported``: ops (as ``ggml_op_name`` names them) its
      ``supports_op`` refuses;
    * ``host_buffer``: it has a host (pinned) buffer type, which the scheduler then uses for the
      CPU backend, as llama.cpp does;
    * ``shared_buft``: it uses the CPU's buffer type instead of one of its own (an accelerator,
      like BLAS);
    * ``graph_optimize``: it reorders the nodes of each split (a stable sort by dependency depth);
    * ``fuse``: its ``graph_optimize`` fuses a node with the next node where that reads it, and
      asks the scheduler to keep the pair's inputs alive until the second (``add_alloc_dep``,
      ggml 0.25.3: dependency nodes in the graph copy, counted in its graph size);
    * ``asynchronous``: it computes and copies on a thread of its own, after ``delay_us``;
    * ``memory``: its memory (None: 16 GiB); it refuses to allocate beyond it;
    * ``corrupt_op``: a planted fault, for tests of the values properties only: the first element
      of each result of this op (``ggml_op_name``) comes back off by one; ``"OP=nan"`` and
      ``"OP=inf"`` make it a NaN or +Inf (a device that loses precision or overflows).
    """

    kind: str
    offload_min_batch: int | None = None
    max_size: int | None = None
    alignment: int = 128
    unsupported: tuple[str, ...] = ()
    host_buffer: bool = False
    shared_buft: bool = False
    graph_optimize: bool = False
    asynchronous: bool = False
    delay_us: int = 0
    memory: int | None = None
    corrupt_op: str = ""
    fuse: bool = False
    cuda_batch: bool = False

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_KINDS:
            raise SpecError(f"unknown backend kind {self.kind!r} (one of {', '.join(BACKEND_KINDS)})")
        if not self.device.fake_gpu and any(getattr(self, f.name) != f.default for f in fields(self)[1:]):
            raise SpecError(f"backend {self.kind!r}: only a gpu backend takes device settings ({self.to_json()})")
        if self.offload_min_batch is not None and self.offload_min_batch < 1:
            raise SpecError(f"offload_min_batch {self.offload_min_batch}: must be at least 1")
        if self.cuda_batch and self.offload_min_batch is None:
            raise SpecError("cuda_batch: measures offload_op's batch, so it needs an offload_min_batch")
        if self.max_size is not None and self.max_size < 1024:
            raise SpecError(f"max_size {self.max_size}: must be at least 1024 bytes")
        if self.alignment < 1 or self.alignment & (self.alignment - 1) or self.alignment > 4096:
            raise SpecError(f"alignment {self.alignment}: must be a power of two up to 4096")
        if self.host_buffer and self.shared_buft:
            raise SpecError("a gpu backend with shared_buft uses host memory already: no host_buffer")
        if not 0 <= self.delay_us <= 100_000 or (self.delay_us and not self.asynchronous):
            raise SpecError(f"delay_us {self.delay_us}: 0..100000, and only for an asynchronous gpu")
        if len(",".join(self.unsupported)) >= 500:
            raise SpecError("unsupported: too many op names")
        if self.memory is not None and self.memory < 1 << 20:
            raise SpecError(f"memory {self.memory}: at least 1 MiB")
        if len(self.corrupt_op) >= 32 or self.corrupt_op.partition("=")[1:] not in (("", ""), ("=", "nan"), ("=", "inf")):
            raise SpecError(f"corrupt_op {self.corrupt_op!r}: not an op name, or OP=nan, OP=inf")

    @property
    def device(self) -> DeviceKind:
        """The entry of its kind (``model.devices``)."""
        return DEVICE_KINDS[self.kind]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> BackendSpec:
        known = {f.name for f in fields(BackendSpec)}
        unknown = set(d) - known
        if unknown:
            raise SpecError(f"backend: unknown field(s) {', '.join(sorted(unknown))}")
        kw = dict(d)
        if "unsupported" in kw:
            kw["unsupported"] = tuple(kw["unsupported"])
        return BackendSpec(**kw)


@dataclass(frozen=True)
class BackendLayout:
    """The ordered backends (highest priority first, CPU last)."""

    backends: tuple[BackendSpec, ...]

    def __post_init__(self) -> None:
        if not self.backends or not self.backends[-1].device.host:
            raise SpecError("a layout must end with the CPU backend")
        if sum(b.device.host for b in self.backends) != 1:
            raise SpecError("a layout has exactly one CPU backend")

    @staticmethod
    def of(*kinds: str) -> BackendLayout:
        return BackendLayout(tuple(BackendSpec(k) for k in kinds))

    @property
    def n(self) -> int:
        return len(self.backends)

    @property
    def n_rpc(self) -> int:
        return sum(b.device.endpoint for b in self.backends)

    @property
    def host_buffer_of(self) -> int | None:
        """The gpu whose host buffer type the CPU backend uses (the first that has one)."""
        return next((i for i, b in enumerate(self.backends) if b.host_buffer), None)

    def buffer_buft(self, i: int) -> str:
        """The buffer type of backend ``i``'s own buffers (its weights): each RPC device and each
        gpu its own, host memory (``CPU``) for BLAS, the CPU and a gpu with ``shared_buft``."""
        b = self.backends[i]
        if b.device.own_buft and not b.shared_buft:
            return self.name(i)
        return "CPU"

    def buft(self, i: int) -> str:
        """The buffer type the scheduler allocates backend ``i``'s compute buffer in (the
        ``bufts`` given to ``ggml_backend_sched_new``): the CPU's is a gpu's host buffer type
        when one has it, every other backend's its own."""
        host = self.host_buffer_of
        if self.backends[i].device.host and host is not None:
            return f"{self.name(host)}_Host"
        return self.buffer_buft(i)

    @staticmethod
    def is_host_buft(buft: str) -> bool:
        """``ggml_backend_buft_is_host``: the CPU buffer type and every host buffer type."""
        return buft == "CPU" or buft.endswith("_Host")

    def name(self, i: int) -> str:
        kind = self.backends[i].kind
        label = DEVICE_KINDS[kind].label
        return f"{label}{sum(b.kind == kind for b in self.backends[:i])}" if DEVICE_KINDS[kind].numbered else label

    def is_host(self, i: int) -> bool:
        """Whether backend ``i``'s own buffers are host memory."""
        return self.is_host_buft(self.buffer_buft(i))

    def to_json(self) -> list[dict[str, Any]]:
        return [b.to_json() for b in self.backends]

    @staticmethod
    def from_json(d: Sequence[Mapping[str, Any]]) -> BackendLayout:
        return BackendLayout(tuple(BackendSpec.from_json(b) for b in d))

