"""Local ggml RPC servers.

Each server is ``schedfuzz-rpc-server 127.0.0.1:P THREADS`` (``ggml/rpc_server.c``, linked
against the ggml under test: ``build.build_rpc_server``) in its own session (so its own process
group), listening on a free loopback port. A server is ready once its port accepts a TCP
connection; ``ggml_backend_rpc_init`` on a port that is not listening yet fails inside ggml, so
we poll rather than sleep. Servers are stopped on ``close()`` and, as every child, at
interpreter exit and on SIGTERM (``children``).

Servers are programs of their own, each exec'd, not forked from a fork server as the workers are
(``forkserver``): forked from one process, every server would have the same address layout, and a
buffer handle of one server would then name a buffer of another too (the starter case where ggml
0.15.3 places a view of RPC0's cache in RPC1's split reproduces only with servers of their own).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO

from ..ggml.build import BuildError, build_rpc_server
from ..ggml.engine import CPU_THREADS
from ..ggml.lib import child_env
from .children import KILLED_FROM_OUTSIDE, describe_exit, exiting, kill_group, running, spawn


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel's pick for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_accepts(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


class RpcServerError(RuntimeError):
    """An RPC server did not come up."""


@dataclass
class _Server:
    port: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


class RpcServers:
    """A pool of local ggml RPC servers, started on demand and reused across scenarios.

    ``ensure(n)`` returns the endpoints of the first ``n`` servers, starting missing ones and
    restarting any that died (on a new port); ``close()`` stops them all.
    """

    def __init__(self, lib_dir: str | None = None, threads: int = CPU_THREADS, start_timeout: float = 30.0, attempts: int = 3) -> None:
        self.lib_dir = lib_dir
        self.threads = threads
        self.start_timeout = start_timeout
        self.attempts = attempts
        self._servers: list[_Server] = []
        self._logdir = Path(tempfile.mkdtemp(prefix="schedfuzz-rpc-"))

    @property
    def pids(self) -> list[int]:
        return [s.proc.pid for s in self._servers]

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self._servers]

    def ensure(self, n: int) -> list[str]:
        for i, server in enumerate(self._servers):
            if server.proc.poll() is not None:
                self._stop(server)
                self._servers[i] = self._start()
        while len(self._servers) < n:
            self._servers.append(self._start())
        return [s.endpoint for s in self._servers[:n]]

    def restart(self, endpoint: str) -> None:
        """Replace the server at ``endpoint`` (one that does not answer) by a new one."""
        for i, server in enumerate(self._servers):
            if server.endpoint == endpoint:
                self._stop(server)
                self._servers[i] = self._start()

    def settle(self, timeout: float = 10.0) -> None:
        """Wait, up to ``timeout`` s, until no server is still computing (``children.running``):
        from ggml 0.25.3 on, the RPC client sends ``GRAPH_COMPUTE`` without waiting for the server
        (``llama_synchronize`` waits only for the command to be sent), so a server can crash on a
        workload's last graph after the workload has ended. Waited for, that crash is the
        workload's (``dead``); not waited for, it was the next workload's, whose first connection
        the dying server refused ("Failed to connect"), a finding of the wrong workload."""
        deadline = time.monotonic() + timeout
        while any(s.proc.poll() is None and running(s.proc.pid) for s in self._servers) and time.monotonic() < deadline:
            time.sleep(0.001)

    def dead(self, timeout: float = 10.0) -> list[str]:
        """Servers that have exited, or are exiting now (``children.exiting``: waited for, up to
        ``timeout`` s, for their exit status). A server whose death closed the worker's connection
        is exiting by the time the worker reports it: nothing healthy is waited for."""
        gone = [s for s in self._servers if s.proc.poll() is not None or exiting(s.proc.pid)]
        deadline = time.monotonic() + timeout
        while any(s.proc.poll() is None for s in gone) and time.monotonic() < deadline:
            time.sleep(0.002)
        return [f"RPC server {s.endpoint} "
                f"{describe_exit(s.proc.returncode) if s.proc.returncode is not None else f'was still exiting after {timeout:g} s'}"
                f"{self._log_tail(s)}" for s in gone]

    def killed(self) -> list[str]:
        """Servers that were killed from outside (``KILLED_FROM_OUTSIDE``), not crashed."""
        return [f"RPC server {s.endpoint} {describe_exit(s.proc.returncode)}" for s in self._servers
                if s.proc.poll() is not None and -s.proc.returncode in KILLED_FROM_OUTSIDE]

    @staticmethod
    def _log_tail(server: _Server, n: int = 1500) -> str:
        """The end of a server's output (ggml's abort message, when it aborted)."""
        try:
            server.log.flush()
            server.log.seek(0, 2)
            size = server.log.tell()
            server.log.seek(max(0, size - n))
            tail = server.log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return f"; its last output:\n{tail}" if tail else ""

    @cached_property
    def program(self) -> Path:
        """The server program for this ggml, built on first use (cached across runs)."""
        try:
            return build_rpc_server(self.lib_dir)
        except BuildError as e:
            raise RpcServerError(f"could not build the ggml RPC server: {e}") from None

    def _start(self) -> _Server:
        problems: list[str] = []
        self._logdir.mkdir(exist_ok=True)
        for _ in range(self.attempts):
            port = free_port()
            log = open(self._logdir / f"rpc-{port}.log", "w+b")
            cmd = [str(self.program), f"127.0.0.1:{port}", str(self.threads)]
            proc = spawn(cmd, child_env(self.lib_dir), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            server = _Server(port, proc, log)
            try:
                if self._wait_ready(server):
                    return server
            except BaseException:
                self._stop(server)
                raise
            log.seek(0)
            status = "did not listen in time" if proc.poll() is None else describe_exit(proc.returncode)
            problems.append(f"port {port}: {status}: {log.read().decode(errors='replace')[-2000:]}")
            self._stop(server)
        raise RpcServerError("could not start a ggml RPC server:\n" + "\n".join(problems))

    def _wait_ready(self, server: _Server) -> bool:
        """Poll the port until it accepts a connection; False if the server exits or times out."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                return False
            if port_accepts(server.port):
                return True
            time.sleep(0.02)
        return False

    def _stop(self, server: _Server) -> None:
        kill_group(server.proc)
        server.log.close()

    def close(self) -> None:
        for server in self._servers:
            self._stop(server)
        self._servers.clear()
        shutil.rmtree(self._logdir, ignore_errors=True)

    def __enter__(self) -> RpcServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
