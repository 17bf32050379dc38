"""Local ggml RPC servers.

Each server is ``schedfuzz-rpc-server 127.0.0.1:P THREADS``, a program of the engine's
(``ServerProgram``: ``ggml.rpc_program.RpcProgram``, ``ggml/rpc_server.c`` linked against the ggml
under test), in its own session (so its own process group), listening on a free loopback port. A server is ready once it is alive and a listening
socket on its port is its own (``owns_listener``: not a stranger's that took the port);
``ggml_backend_rpc_init`` on a port that is not listening yet fails inside ggml, so we poll
rather than sleep. Servers are stopped on ``close()`` and, as every child, at interpreter exit
and on SIGTERM (``children``).

A server's death is charged to the workload that last sent it work (``assign``: its *client*),
by its exit status (``Popen.returncode``), never by message text (``deaths``). A death no
workload was charged for is never replaced silently: ``ensure`` records it (``lost``), and the
campaign counts and lists it with its last client. After a client aborted, ``quiesce`` waits
until each server has finished with it, so that a crash on what it had queued is its workload's.

Servers are programs of their own, each exec'd, not forked from a fork server as the workers are
(``forkserver``): forked from one process, every server would have the same address layout, and a
buffer handle of one server would then name a buffer of another too (the starter case where ggml
0.15.3 places a view of RPC0's cache in RPC1's split reproduces only with servers of their own).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, Protocol

from .children import KILLED_FROM_OUTSIDE, describe_exit, exiting, kill_group, spawn


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


# what ggml's RPC server prints that is not about a client's command: ``ggml_backend_rpc_start_server``'s
# own lines (printed to a buffered stdout: they reach the log late, with the first "Accepted"), the
# backends' registration, the test hook's counting (``rpc_server.c``), and a client that closed its
# connection (b11739's server says "recv returned 0 (peer closed?)" each time)
_SERVER_OWN = re.compile(r"(Accepted client connection|Client connection closed|schedfuzz-rpc-server: graph compute|"
                         r"ggml_backend_rpc_start_server|Starting RPC server|Devices:|register_backend|register_device|  |"
                         r"recv returned 0 \(peer closed\?\))")
_CLOSED_AFTER = re.compile(r"schedfuzz-rpc-server: closed the connection after command (\d+)$")


class ServerProgram(Protocol):
    """What the servers are, as the engine under test has them built: the program (built on first
    use; ``RpcServerError`` where it cannot be), the environment it needs to load its ggml, the
    threads it computes with, and the RPC commands by number as its ggml declares them (empty
    where its source is not on disk: they are then said by number)."""

    threads: int

    def program(self) -> Path: ...

    def environment(self) -> Mapping[str, str]: ...

    def commands(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class ServerDeath:
    """A server that died: its endpoint, its exit status as the process gave it (``Popen.returncode``:
    ``-signal`` or the status; None: still exiting when it was asked), the workload that last sent
    it work (``RpcServers.assign``) and the end of its output (ggml's abort message, if any)."""

    endpoint: str
    returncode: int | None
    client: str = ""
    log: str = ""

    @property
    def status(self) -> str:
        """``killed by SIGSEGV``, ``exited with status 1``, ``still exiting``."""
        return describe_exit(self.returncode).removeprefix("was ") if self.returncode is not None else "still exiting"

    @property
    def from_outside(self) -> bool:
        """Killed by a signal only something outside sends (``KILLED_FROM_OUTSIDE``: the OOM
        killer, a user): an infrastructure fault, not ggml."""
        return self.returncode is not None and -self.returncode in KILLED_FROM_OUTSIDE

    def brief(self) -> str:
        """``127.0.0.1:P: killed by SIGSEGV`` (``LlamaAbort.servers``)."""
        return f"{self.endpoint}: {self.status}"

    def report(self) -> str:
        """What a trace's message says of it, as it always has: ``RPC server 127.0.0.1:P was
        killed by SIGSEGV``, then its last output."""
        status = describe_exit(self.returncode) if self.returncode is not None else "was still exiting"
        return f"RPC server {self.endpoint} {status}" + (f"; its last output:\n{self.log}" if self.log else "")


@dataclass
class _Server:
    port: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    client: str = ""  # the workload that last sent it work (``assign``)
    charged: bool = False  # its death was reported to a workload (``deaths``)
    mark: int = 0  # the length of its output when ``client`` got it (``refusals`` reads what follows)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


class RpcServers:
    """A pool of local ggml RPC servers, started on demand and reused across scenarios.

    ``ensure(n)`` returns the endpoints of the first ``n`` servers, starting missing ones and
    restarting any that died (on a new port; see ``ensure``); ``assign(n, client)`` says which
    workload now sends them work; ``deaths(n)`` charges that workload with the ones that died;
    ``close()`` stops them all. ``env`` is added to the servers' environment (a test's
    ``SCHEDFUZZ_RPC_CRASH_AT_COMPUTE``, ``rpc_server.c``).
    """

    def __init__(self, server: ServerProgram, start_timeout: float = 30.0, attempts: int = 3,
                 env: Mapping[str, str] | None = None) -> None:
        self.server = server
        self.start_timeout = start_timeout
        self.attempts = attempts
        self.env = dict(env or {})
        self._servers: list[_Server] = []
        self._logdir = Path(tempfile.mkdtemp(prefix="schedfuzz-rpc-"))
        self.lost: list[ServerDeath] = []  # deaths no workload was charged for, found by ``ensure`` (replaced, not silently)

    @property
    def pids(self) -> list[int]:
        return [s.proc.pid for s in self._servers]

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self._servers]

    def ensure(self, n: int) -> list[str]:
        """The endpoints of the first ``n`` servers, started where missing. Only those are
        looked at (a workload without RPC devices touches no server). One that died is replaced:
        at once if its death was charged to a workload (``deaths``); else it is recorded in
        ``lost`` (its status, its last client and its last output: the campaign counts and lists
        them, ``Engines.run_llama``), never charged to the workload that asks now."""
        for i, server in enumerate(self._servers[:n]):
            if server.proc.poll() is None and not exiting(server.proc.pid):
                continue
            death = self._death(server, 10.0)
            self._stop(server)
            self._servers[i] = self._start()
            if not server.charged:
                self.lost.append(death)
        while len(self._servers) < n:
            self._servers.append(self._start())
        return [s.endpoint for s in self._servers[:n]]

    def quiesce(self, n: int, timeout: float = 5.0) -> None:
        """Wait, up to ``timeout`` s, until each of the first ``n`` servers has finished with its
        last client: a new connection of ours is accepted (ggml's RPC server serves one client at
        a time, and says "Accepted client connection"), or it died. After a client aborted, the
        work it had queued is still being computed, and a crash there is that client's
        workload's (``deaths``), not the next one's."""
        deadline = time.monotonic() + timeout
        for server in self._servers[:n]:
            if server.proc.poll() is not None:
                continue
            before = self.log(server.endpoint).count("Accepted client connection")
            try:
                probe = socket.create_connection(("127.0.0.1", server.port), timeout=max(0.01, deadline - time.monotonic()))
            except OSError:
                continue
            with probe:
                while (server.proc.poll() is None and time.monotonic() < deadline
                       and self.log(server.endpoint).count("Accepted client connection") <= before):
                    time.sleep(0.002)

    def assign(self, n: int, client: str) -> None:
        """The first ``n`` servers now work for ``client`` (a workload's name): their deaths, and
        the commands they refuse from now on (``refusals``), are its."""
        for server in self._servers[:n]:
            server.client = client
            server.mark = self._size(server)

    def refusals(self, n: int) -> tuple[str, ...]:
        """What the first ``n`` servers said against their client's commands since ``assign``,
        each "ENDPOINT: LINE": ggml's RPC server logs why it refuses a command
        (``GGML_LOG_ERROR("[%s] ...", __func__)`` in ``rpc_server``'s methods) and then closes the
        connection, which the client reports only as a server that "crashed or returned malformed
        response". Its own lines (a connection accepted or closed, the test hook's) are not refusals."""
        out = []
        for server in self._servers[:n]:
            try:
                server.log.flush()
                with open(self._logdir / f"rpc-{server.port}.log", "rb") as f:
                    f.seek(server.mark)
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            out += [f"{server.endpoint}: {self._named(line.strip())}" for line in text.splitlines() if line.strip() and not _SERVER_OWN.match(line)]
        return tuple(out)

    def _named(self, line: str) -> str:
        """``rpc_server.c``'s "closed the connection after command N" with the command's name
        from this build's ``enum rpc_cmd`` (``ServerProgram.commands``), where its source is on disk."""
        m = _CLOSED_AFTER.match(line)
        if m is None:
            return line
        names = self.server.commands()
        n = int(m.group(1))
        return f"schedfuzz-rpc-server: closed the connection after command {names[n] if n < len(names) else n}"

    def _size(self, server: _Server) -> int:
        try:
            server.log.flush()
            return (self._logdir / f"rpc-{server.port}.log").stat().st_size
        except OSError:
            return 0

    def gone(self, endpoints: Iterable[str]) -> bool:
        """Whether any of ``endpoints`` has no live server now (it died, or was replaced)."""
        live = {s.endpoint for s in self._servers if s.proc.poll() is None and not exiting(s.proc.pid)}
        return any(e not in live for e in endpoints)

    def deaths(self, n: int | None = None, timeout: float = 10.0) -> list[ServerDeath]:
        """The first ``n`` servers (all: None) that have exited, or are exiting now
        (``children.exiting``: waited for, up to ``timeout`` s, for their exit status), charged
        to the workload that asks: each is reported once. A server whose death closed the
        worker's connection is exiting by the time the worker reports it: nothing healthy is
        waited for."""
        gone = [s for s in self._servers[:n] if not s.charged and (s.proc.poll() is not None or exiting(s.proc.pid))]
        deadline = time.monotonic() + timeout
        out = []
        for s in gone:
            out.append(self._death(s, max(0.0, deadline - time.monotonic())))
            s.charged = True
        return out

    def _death(self, server: _Server, timeout: float) -> ServerDeath:
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return ServerDeath(server.endpoint, server.proc.returncode, server.client, self._log_tail(server))

    def restart(self, endpoint: str) -> None:
        """Replace the server at ``endpoint`` (one that does not answer) by a new one; one that
        died is handled as ``ensure`` handles it."""
        for i, server in enumerate(self._servers):
            if server.endpoint == endpoint:
                alive = server.proc.poll() is None and not exiting(server.proc.pid)
                death = None if alive else self._death(server, 10.0)
                self._stop(server)
                self._servers[i] = self._start()
                if death is not None and not server.charged:
                    self.lost.append(death)

    def dead(self, timeout: float = 10.0) -> list[str]:
        """Servers that have exited, or are exiting now, as a trace's message says them
        (``ServerDeath.report``), whether charged already or not; ``deaths`` charges them."""
        gone = [s for s in self._servers if s.proc.poll() is not None or exiting(s.proc.pid)]
        deadline = time.monotonic() + timeout
        return [self._death(s, max(0.0, deadline - time.monotonic())).report() for s in gone]

    def log(self, endpoint: str) -> str:
        """All a server has printed so far."""
        server = next(s for s in self._servers if s.endpoint == endpoint)
        server.log.flush()
        return (self._logdir / f"rpc-{server.port}.log").read_text(errors="replace")

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
            return server.log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    @cached_property
    def program(self) -> Path:
        """The server program for this ggml, built on first use (cached across runs)."""
        return self.server.program()

    def _start(self) -> _Server:
        problems: list[str] = []
        self._logdir.mkdir(exist_ok=True)
        for _ in range(self.attempts):
            port = free_port()
            log = open(self._logdir / f"rpc-{port}.log", "w+b")
            cmd = [str(self.program), f"127.0.0.1:{port}", str(self.server.threads)]
            proc = spawn(cmd, {**self.server.environment(), **self.env}, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
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
        """Poll until the server listens on its port (``owns_listener``); False if it exits or
        times out. Another process listening on the port (one that took it between ``free_port``
        and the server's bind) is not ready: the server fails to bind and exits, and the caller
        tries another port."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                return False
            if owns_listener(server.proc.pid, server.port):
                return True
            time.sleep(0.005)
        return False

    def _stop(self, server: _Server) -> None:
        kill_group(server.proc)
        server.log.close()

    def close(self) -> None:
        """Stop every server (deaths found now are nobody's: the servers are being stopped)."""
        for server in self._servers:
            self._stop(server)
        self._servers.clear()
        shutil.rmtree(self._logdir, ignore_errors=True)

    def __enter__(self) -> RpcServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


TCP_LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN, as /proc/net/tcp writes a socket's state


def owns_listener(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on loopback ``port``: the listening
    sockets on the port in its network namespace (``/proc/PID/net/tcp``: local address, state,
    inode), one of them among its open files (``/proc/PID/fd``, ``socket:[INODE]``). A few
    hundred microseconds (a server has a handful of files); False once it is gone."""
    want = f":{port:04X}"
    try:
        with open(f"/proc/{pid}/net/tcp") as f:
            inodes = {f"socket:[{fields[9]}]" for line in f if len(fields := line.split()) > 9
                      and fields[1].endswith(want) and fields[3] == TCP_LISTEN}
        if not inodes:
            return False
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False
