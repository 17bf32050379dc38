"""Local ggml RPC servers, and the bookkeeping that keeps no child process alive after us.

Each server is ``python -m pytest_schedfuzz.ggml.rpc_server --port P`` in its own session
(so its own process group), listening on a free loopback port. A server is ready once its port
accepts a TCP connection; ``ggml_backend_rpc_init`` on a port that is not listening yet fails
inside ggml, so we poll rather than sleep. Every child started through ``spawn`` is stopped on
``close()``, at interpreter exit (``atexit``) and on SIGTERM; a KeyboardInterrupt unwinds
through ``close()``/atexit, and the children also die with their parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from .lib import child_env

_children: dict[int, subprocess.Popen[bytes]] = {}
_cleanup_installed = False


def _kill_all() -> None:
    for proc in list(_children.values()):
        kill_group(proc)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _kill_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_cleanup() -> None:
    global _cleanup_installed
    if _cleanup_installed:
        return
    _cleanup_installed = True
    atexit.register(_kill_all)
    # only the main thread may set handlers; never displace a handler somebody else installed
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def spawn(args: Sequence[str], env: dict[str, str], **kwargs: object) -> subprocess.Popen[bytes]:
    """Start a child in its own session (process group), to be killed with the others at exit."""
    _install_cleanup()
    proc: subprocess.Popen[bytes] = subprocess.Popen(list(args), env=env, start_new_session=True, **kwargs)  # type: ignore[call-overload]
    _children[proc.pid] = proc
    return proc


def kill_group(proc: subprocess.Popen[bytes], grace: float = 2.0) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds, and reap it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
    _children.pop(proc.pid, None)


def describe_exit(code: int) -> str:
    """``Popen.returncode`` in words."""
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"


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


# signals that end a process from outside (the OOM killer, a user, CI's timeout), not a crash
KILLED_FROM_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


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

    def __init__(self, lib_dir: str | None = None, threads: int = 2, start_timeout: float = 30.0, attempts: int = 3) -> None:
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

    def dead(self, grace: float = 0.2) -> list[str]:
        """Servers that have exited (waiting up to ``grace`` s for one that is exiting now)."""
        deadline = time.monotonic() + grace
        while self._servers and all(s.proc.poll() is None for s in self._servers) and time.monotonic() < deadline:
            time.sleep(0.02)
        return [f"RPC server {s.endpoint} {describe_exit(s.proc.returncode)}{self._log_tail(s)}" for s in self._servers if s.proc.poll() is not None]

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

    def _start(self) -> _Server:
        problems: list[str] = []
        self._logdir.mkdir(exist_ok=True)
        for _ in range(self.attempts):
            port = free_port()
            log = open(self._logdir / f"rpc-{port}.log", "w+b")
            cmd = [sys.executable, "-m", "pytest_schedfuzz.ggml.rpc_server", "--port", str(port), "--threads", str(self.threads)]
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
