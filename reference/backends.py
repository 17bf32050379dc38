"""What each backend kind answers to the scheduler's questions.

Mirrors the device interfaces of ggml 0.15.3: ``ggml_backend_cpu_device_supports_op`` /
``_supports_buft`` (``ggml-cpu.cpp``), ``ggml_backend_rpc_device_supports_op`` /
``_supports_buft`` (``ggml-rpc.cpp``: every op, only its own buffer type) and
``ggml_backend_blas_device_supports_op`` (``ggml-blas.cpp``: large contiguous matmuls with
f32 src1, host buffers). No backend here implements ``offload_op``; ``BackendSpec.offload_min_batch``
models one that does, for reference-only layouts.
"""

from __future__ import annotations

from pytest_schedfuzz.scenario import BackendLayout

from .graph import CGraph

BLAS_MIN_BATCH = 32  # ggml-blas.cpp: min_batch in supports_op


class Backends:
    """The scheduler's view of a layout: ``supports_op``, ``supports_buft``, ``offload_op``."""

    def __init__(self, layout: BackendLayout) -> None:
        self.layout = layout
        self.n = layout.n
        self.bufts = [layout.buft(i) for i in range(layout.n)]
        self.kinds = [b.kind for b in layout.backends]

    def supports_op(self, b: int, g: CGraph, t: int) -> bool:
        """``ggml_backend_supports_op(backends[b], t)``."""
        kind = self.kinds[b]
        if kind == "rpc":
            return True
        op = g.op[t]
        if kind == "cpu":
            # every op built here is supported on the CPU (mul_mat's src1 is always f32)
            return True
        # blas: contiguous matmuls with f32 src1 whose ne0, ne1 and ne10 reach min_batch
        if op != "mul_mat":
            return op in ("none", "view", "reshape", "permute", "transpose")
        a, bb = g.srcs[t][0], g.srcs[t][1]
        return (
            g.contiguous[a]
            and g.contiguous[bb]
            and g.type[bb] == "f32"
            and min(g.ne0[t], g.ne1[t], g.ne0[bb]) >= BLAS_MIN_BATCH
        )

    def supports_buft(self, b: int, buft: str) -> bool:
        """``ggml_backend_supports_buft``: RPC only its own; CPU and BLAS host memory."""
        return buft == self.bufts[b] if self.kinds[b] == "rpc" else buft == "CPU"

    def offload_op(self, b: int, g: CGraph, t: int) -> bool:
        """``ggml_backend_offload_op``: false unless the layout models an offloading backend."""
        threshold = self.layout.backends[b].offload_min_batch
        return threshold is not None and g.ne1[t] >= threshold

    def is_host(self, b: int) -> bool:
        return self.layout.is_host(b)
