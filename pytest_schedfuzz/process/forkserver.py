"""A fork server for the engine workers: ``python -m pytest_schedfuzz.process.forkserver FD MODULE [PRELOAD...]``.

A worker dies with every ggml abort and crash, and a known bug can abort every few examples; a
fresh Python process then spends more CPU importing this package, numpy and ggml-python before
its first step than the step itself (a large share of a ci run's CPU time, before this). The fork server, started once per worker module and environment
(``children.spawn``: in its own session, dying with its parent), imports MODULE and the PRELOAD
modules (CFFI, for the llama.cpp worker) once, runs MODULE's ``prefork()`` (which maps its
engine's bindings and libraries), and forks each new worker from itself; it knows no engine: the worker then runs ``MODULE.main()`` as
``python -m MODULE`` would, in a new session, with the stdin, stdout and stderr its parent passed
(``SCM_RIGHTS``). Nothing of ggml is initialized before the fork (no backend, no thread), so each
worker starts from what a fresh process would have, at the server's addresses (not the RPC
servers: ``rpc`` says why). A MODULE's ``prefork()``, where it has one, runs once before any fork:
what every worker would otherwise do first (ggml-python's bindings, the llama.cpp worker's parse
of llama.h).

Protocol on the ``SOCK_SEQPACKET`` socket ``FD``, one message each way per request, fields
separated by NUL:

* startup: ``ready``, once the modules are imported (or the server exits: the parent starts its
  workers as plain processes, whose own startup then tells what is wrong);
* ``spawn`` with three file descriptors (the worker's stdin, stdout, stderr): its pid;
* ``wait PID SECONDS``: its exit status as ``Popen.returncode`` gives it (``-N`` for signal N)
  once it has exited, waiting up to SECONDS; ``running`` if it still runs.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any

from .children import PARENT_ENV, die_with_parent, kill_group, spawn

_FDS = 3


def _become_worker(fds: list[int], module: Any) -> None:
    """In the forked child: MODULE as ``python -m MODULE`` runs it; never returns."""
    os.setsid()  # its own process group, as ``children.spawn`` gives every child: killed as a group
    sys.argv = [sys.argv[0]]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    module.main()
    raise SystemExit(0)


def _wait(pid: int, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not one of ours (any more): gone
            return -signal.SIGKILL
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.002)


def serve(sock: socket.socket, name: str, preload: list[str]) -> None:
    module = importlib.import_module(name)
    for other in preload:
        importlib.import_module(other)
    # what every worker would do first (the engine's bindings and libraries mapped), done once here
    prefork = getattr(module, "prefork", None)
    if prefork is not None:
        try:
            prefork()
        except Exception:  # noqa: BLE001 -- each worker does it again, and its own start says what is wrong
            pass
    os.environ[PARENT_ENV] = str(os.getpid())  # the workers' parent (``die_with_parent``)
    sock.send(b"ready")
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 4096, _FDS)
        if not msg:
            return  # the parent is gone or done
        cmd, *args = msg.decode().split("\0")
        if cmd == "spawn":
            pid = os.fork()
            if pid == 0:
                sock.close()
                _become_worker(fds, module)
            for fd in fds:
                os.close(fd)
            sock.send(str(pid).encode())
        elif cmd == "wait":
            code = _wait(int(args[0]), float(args[1]))
            sock.send(b"running" if code is None else str(code).encode())


class ForkedProc:
    """A worker forked by a ``ForkServer``, with what ``Worker`` and ``children.kill_group`` use
    of a ``subprocess.Popen``: ``pid``, ``stdin``, ``stdout``, ``returncode``, ``poll`` and ``wait``."""

    def __init__(self, server: ForkServer, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.server, self.pid, self.stdin, self.stdout = server, pid, stdin, stdout
        self.returncode: int | None = None
        try:  # the pid stays ours until the server reaps it, which it does only when asked (``wait``)
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None

    def poll(self) -> int | None:
        # the pidfd says whether it exited without a round trip to the server (asked before each
        # run); the server, which reaps it, is asked for its status once it has, or is gone
        # (its children die with it, a moment later)
        if self.returncode is None and (self._pidfd is None or not self.server.alive() or select.select([self._pidfd], [], [], 0)[0]):
            self._ended(self.server.wait(self.pid, 0.0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._ended(self.server.wait(self.pid, 1e9 if timeout is None else timeout))
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        return self.returncode

    def _ended(self, code: int | None) -> None:
        self.returncode = code
        if code is not None and self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class ForkServer:
    """One fork server process, the parent's side; ``None`` from ``start`` where it could not
    import its modules. ``live``: the children it forked that nobody has seen exit yet."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc, self.sock = proc, sock
        self.live: set[int] = set()
        self.retired = False

    @staticmethod
    def start(module: str, preload: Sequence[str], env: dict[str, str], timeout: float) -> ForkServer | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with tempfile.TemporaryFile() as log:
            proc = spawn([sys.executable, "-m", __name__, str(theirs.fileno()), module, *preload], env, pass_fds=(theirs.fileno(),),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        theirs.close()
        ours.settimeout(timeout)
        try:
            ready = ours.recv(16) == b"ready"
        except OSError:
            ready = False
        if not ready:
            ours.close()
            kill_group(proc)
            return None
        ours.settimeout(None)
        return ForkServer(proc, ours)

    def spawn(self, stderr: IO[bytes]) -> ForkedProc | None:
        """A new worker writing its stderr to ``stderr``, its stdin and stdout pipes to us;
        None if the server is gone."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            socket.send_fds(self.sock, [b"spawn"], [stdin_r, stdout_w, stderr.fileno()])
            pid = int(self.sock.recv(32))
        except (OSError, ValueError):
            os.close(stdin_w)
            os.close(stdout_r)
            return None
        finally:  # the worker's ends: it has its own copies
            os.close(stdin_r)
            os.close(stdout_w)
        self.live.add(pid)
        return ForkedProc(self, pid, open(stdin_w, "wb"), open(stdout_r, "rb"))

    def wait(self, pid: int, seconds: float) -> int | None:
        """``pid``'s exit status, waiting up to ``seconds``; None while it runs. A server that
        is gone took its children with it (``PR_SET_PDEATHSIG``): SIGKILL, from outside."""
        try:
            self.sock.send(f"wait\0{pid}\0{seconds}".encode())
            reply = self.sock.recv(32)
        except OSError:
            reply = b""
        if reply == b"running":
            return None
        self.live.discard(pid)
        if self.retired and not self.live:
            self.close()
        return int(reply) if reply else -signal.SIGKILL

    def retire(self) -> None:
        """Fork no more; exit once every child has been seen to exit (they die with the server)."""
        self.retired = True
        if not self.live:
            self.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self.sock.close()
        kill_group(self.proc)


class Forker:
    """Workers of ``module``, forked by a fork server for their environment, started on first
    use, again when it has died (it takes its children with it), and anew when the environment
    changes (the old one retires: its children live on); None from ``spawn`` where the server
    cannot start (the caller then starts a process of its own, whose own startup says what is wrong)."""

    def __init__(self, module: str, preload: Sequence[str], timeout: float) -> None:
        self.module, self.preload, self.timeout = module, tuple(preload), timeout
        self.server: ForkServer | None = None
        self.env: dict[str, str] | None = None
        self.retired: list[ForkServer] = []
        self.failed = False

    def spawn(self, env: dict[str, str], stderr: IO[bytes]) -> ForkedProc | None:
        if env != self.env:
            if self.server is not None:
                self.server.retire()
                self.retired = [s for s in (*self.retired, self.server) if s.alive()]
            self.server, self.env, self.failed = None, env, False
        for _ in range(2):
            if self.failed:
                return None
            if self.server is None or not self.server.alive():
                self._stop()
                self.server = ForkServer.start(self.module, self.preload, env, self.timeout)
                self.failed = self.server is None
                if self.server is None:
                    return None
            proc = self.server.spawn(stderr)
            if proc is not None:
                return proc
            self._stop()  # it died since it was last asked
        return None

    def _stop(self) -> None:
        if self.server is not None:
            self.server.close()
        self.server = None

    def close(self) -> None:
        self._stop()
        for server in self.retired:
            server.close()
        self.retired = []
        self.env = None


def main() -> None:
    die_with_parent()
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2], sys.argv[3:])


if __name__ == "__main__":
    main()
