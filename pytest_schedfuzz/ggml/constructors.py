"""The graph engine's backends: one constructor per device kind (``model.devices.DEVICE_KINDS``,
whose entry says all else the harness knows of the kind; ``tests/test_layout.py`` checks that
each has its constructor here).
"""

from __future__ import annotations

import ctypes
import json
import socket
from collections.abc import Callable, Sequence

from ..engine import TargetError, Unsupported
from ..model.layout import BackendLayout, BackendSpec
from .bindings import CPU_THREADS, Ggml


def tcp_reachable(endpoint: str, timeout: float = 5.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = endpoint.rpartition(":")
    try:
        # bytes: a str host makes getaddrinfo import the idna codec, in every new worker
        with socket.create_connection((host.encode(), int(port)), timeout):
            return True
    except OSError:
        return False


class RpcUnreachable(Exception):
    """No RPC server answers at this endpoint (``ggml_backend_rpc_get_device_memory`` gives 0)."""


def new_rpc(eng: Ggml, name: str, b: BackendSpec, endpoint: str) -> int:
    """``ggml_backend_rpc_init`` on its own server."""
    # ggml_backend_rpc_init does not check the server (it crashes on a dead one), and
    # 0.25.3 aborts in any RPC call that cannot connect: try a TCP connection first
    if not tcp_reachable(endpoint):
        raise RpcUnreachable(endpoint)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    eng.g.ggml_backend_rpc_get_device_memory(endpoint.encode(), 0, ctypes.byref(free), ctypes.byref(total))
    if total.value == 0:
        raise RpcUnreachable(endpoint)
    return int(eng.g.ggml_backend_rpc_init(endpoint.encode(), 0))


def new_gpu(eng: Ggml, name: str, b: BackendSpec, endpoint: str) -> int:
    """Our GPU-like device (``fake_gpu.c``) with the spec's settings."""
    return eng.new_fake_gpu(name, b)


def new_blas(eng: Ggml, name: str, b: BackendSpec, endpoint: str) -> int:
    """``ggml_backend_blas_init``, where ggml was built with it."""
    if not eng.g.GGML_USE_BLAS:
        raise Unsupported("this ggml was built without the BLAS backend (GGML_BLAS=OFF)")
    return int(eng.g.ggml_backend_blas_init())


def new_cpu(eng: Ggml, name: str, b: BackendSpec, endpoint: str) -> int:
    """``ggml_backend_cpu_init`` with the harness's one thread count."""
    backend = eng.g.ggml_backend_cpu_init()
    eng.g.ggml_backend_cpu_set_n_threads(backend, CPU_THREADS)
    return int(backend)


# the engine's half of each entry of model.devices.DEVICE_KINDS (which cannot import the engine)
CONSTRUCTORS: dict[str, Callable[[Ggml, str, BackendSpec, str], int]] = {"rpc": new_rpc, "gpu": new_gpu, "blas": new_blas, "cpu": new_cpu}


def init_backends(eng: Ggml, layout: BackendLayout, endpoints: Sequence[str]) -> tuple[list[int], list[str]]:
    """The layout's backends, in order, and the RPC endpoints they use. Backends outlive
    scenarios (``Ggml.backends``): an RPC backend keeps its connection, the CPU its threads."""
    if layout.n_rpc > len(endpoints):
        raise TargetError(f"the layout has {layout.n_rpc} RPC backends but {len(endpoints)} endpoints were given")
    if layout.n_rpc and not eng.g.GGML_USE_RPC:
        raise Unsupported("this ggml was built without the RPC backend (GGML_RPC=OFF)")
    rpc = iter(endpoints)
    backends: list[int] = []
    rpc_endpoints: list[str] = []
    for i, b in enumerate(layout.backends):
        # one backend per endpoint, per gpu's name and settings, per other kind
        key = (b.kind, next(rpc) if b.device.endpoint else json.dumps([layout.name(i), b.to_json()]) if b.device.fake_gpu else "")
        if b.device.endpoint:
            rpc_endpoints.append(key[1])
        if key not in eng.backends:
            backend = CONSTRUCTORS[b.kind](eng, layout.name(i), b, key[1])
            if not backend:
                raise TargetError(f"could not initialize the {b.kind} backend")
            eng.backends[key] = backend
        backends.append(eng.backends[key])
    return backends, rpc_endpoints
