"""One ggml RPC server serving the CPU device: ``python -m pytest_schedfuzz.ggml.rpc_server --port P``.

Calls ``ggml_backend_rpc_start_server(b"127.0.0.1:P", NULL, n_threads, 1, &cpu_device)``,
which blocks forever, serving one client connection at a time. Started by ``rpc.RpcServers``.
"""

from __future__ import annotations

import argparse

from .lib import die_with_parent, import_ggml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    die_with_parent()
    ggml = import_ggml()
    cpu = ggml.ggml_backend_dev_by_type(ggml.GGML_BACKEND_DEVICE_TYPE_CPU)
    if not cpu:
        raise SystemExit("ggml has no CPU device")
    devices = (ggml.ggml_backend_dev_t_ctypes * 1)(cpu)
    endpoint = f"127.0.0.1:{args.port}".encode()
    ggml.ggml_backend_rpc_start_server(endpoint, None, args.threads, 1, devices)
    raise SystemExit(f"ggml_backend_rpc_start_server({endpoint.decode()}) returned: see the messages above")


if __name__ == "__main__":
    main()
