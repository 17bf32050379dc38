"""Engine workers: a process that loads an engine (ggml, llama.cpp) and answers requests on
its stdin with pickled messages on its stdout (``Worker``), and what both real targets share
around it (``WorkerTarget``): a worker started on demand with a spare beside it, forked by a
fork server (``forkserver``), its RPC servers (``rpc.RpcServers``), the crash hook preloaded
(``crash``), and their shutdown. The parent never loads an engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import re
import selectors
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import IO, Any

from ..engine import TargetError
from .children import describe_exit, kill_group, spawn
from .crash import CRASH_HOOK, build_preload, stack_line, with_preload
from .forkserver import ForkedProc, Forker
from .rpc import RpcServers

PIPE_SIZE = 1 << 20  # a worker's reply pipe: /proc/sys/fs/pipe-max-size's default



# pytest's name of the test phase running, set in os.environ at each: a worker's environment
# that carried it changed with every test item, and its fork server (``Forker``, one per
# environment) was started again for each
VOLATILE = ("PYTEST_CURRENT_TEST",)


def worker_env(env: dict[str, str]) -> dict[str, str]:
    """A worker's environment: ``env`` with the crash hook preloaded (``crash_hook.c``), without
    what changes from one test to the next (``VOLATILE``)."""
    kept = {k: v for k, v in env.items() if k not in VOLATILE}
    return with_preload(kept, build_preload(CRASH_HOOK))


class WorkerGone(Exception):
    """The worker closed its protocol channel (it exited or died)."""


class WorkerTimeout(Exception):
    """No message from the worker within the allowed time."""


class Worker:
    """One worker process: requests on its stdin (JSON lines, or pickles: ``send_pickled``),
    pickled messages from its stdout (``channel.Channel``), stderr to a file."""

    def __init__(self, env: dict[str, str], module: str, fork: Callable[[IO[bytes]], ForkedProc | None] | None = None) -> None:
        """A new worker with ``env`` (``worker_env``): forked by ``fork`` where it gives one (a
        fork server's ``spawn``), else a process of its own."""
        self.stderr: IO[bytes] = tempfile.TemporaryFile()
        proc = fork(self.stderr) if fork is not None else None
        self.proc: subprocess.Popen[bytes] | ForkedProc = proc or spawn(
            [sys.executable, "-m", module], env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._out = self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        with contextlib.suppress(OSError):  # a pipe as large as Linux allows: a worker whose messages
            # (llama.cpp's captured graphs) outgrow the default 64 KiB would wait for us to read
            fcntl.fcntl(self._out, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._out, selectors.EVENT_READ)
        self._buf = b""

    def hello(self, timeout: float, what: str) -> dict[str, str]:
        """The worker's ``hello`` (engine info); a ``TargetError`` with the worker's own words if
        it dies, refuses (``fatal``) or is silent for ``timeout`` s."""
        try:
            msg = self.recv(timeout)
        except (WorkerGone, WorkerTimeout) as e:
            how = "did not start in time" if isinstance(e, WorkerTimeout) else self.death()
            tail = self.stderr_tail()
            self.close()
            raise TargetError(f"the {what} worker {how}:\n{tail}") from None
        if "hello" not in msg:
            self.close()
            raise TargetError(f"the {what} worker refused to run: {msg.get('fatal', msg)}")
        return dict(msg["hello"])

    def send(self, msg: dict[str, Any]) -> None:
        self.send_text(json.dumps(msg))

    def send_text(self, line: str) -> None:
        """One message already written as JSON."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def send_pickled(self, msg: dict[str, Any]) -> None:
        """One message as a pickle, after its length (8 bytes, little-endian): the graph worker's
        requests, whose scenarios a JSON round trip cost several ms each way (``ggml.graph_worker.read_request``)."""
        assert self.proc.stdin is not None
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(len(data).to_bytes(8, "little") + data)
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> dict[str, Any]:
        """The next message (``channel.Channel``); ``WorkerGone`` when the worker is gone,
        ``WorkerTimeout`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while len(self._buf) < 8 or len(self._buf) < 8 + int.from_bytes(self._buf[:8], "little"):
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                raise WorkerTimeout()
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                raise WorkerGone()
            self._buf += chunk
        end = 8 + int.from_bytes(self._buf[:8], "little")
        msg: dict[str, Any] = pickle.loads(self._buf[8:end])
        self._buf = self._buf[end:]
        return msg

    def stderr_tail(self, n: int = 3000) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - n))
        return self.stderr.read().decode(errors="replace")

    def crash_report(self) -> str:
        """How the worker died, the top of its C stack where it died of a signal
        (``crash_hook.c``), and the last of its stderr."""
        death = self.death()
        tail = self.stderr_tail(20000)
        stack = stack_line(tail)
        shown = re.sub(r"schedfuzz-frame .*\n|schedfuzz-crash.*\n", "", tail)[-3000:]
        return "\n".join(x for x in (death, stack, shown) if x)

    def death(self) -> str:
        """Reap the process and say how it ended."""
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            code = self.proc.wait()
        return f"the worker {describe_exit(code)}"

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:  # at the end of its input a worker exits by itself, running its exit handlers (a coverage build's counts)
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            pass
        kill_group(self.proc)
        self._sel.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


class WorkerTarget(ABC):
    """What both real targets share: a worker process started on demand, with a spare started
    beside it, RPC servers, and their shutdown."""

    engine: dict[str, str]
    servers: RpcServers
    start_timeout: float
    _worker: Worker | None = None
    _spare: Worker | None = None
    _forker: Forker | None = None  # ``forkserver``: workers forked from one that has imported everything
    module: str  # the worker's module
    preload: tuple[str, ...] = ()  # modules its fork server imports besides (``forkserver``)
    what: str  # the worker's name in errors

    @abstractmethod
    def _env(self) -> dict[str, str]:
        """The worker's environment."""

    def _start_worker(self) -> Worker:
        """The spare worker started with the last one (else a new one), its hello read; and a new
        spare, which starts while this one works: a run after an abort or a crash (a finding, a
        known bug, its confirmation on a fresh worker) then waits for no worker to start (a
        llama.cpp worker takes about half a second)."""
        env = worker_env(self._env())
        spare, self._spare = self._spare, None
        if spare is not None and spare.proc.poll() is not None:
            spare.close()
            spare = None
        if spare is not None:
            try:
                self.engine = spare.hello(self.start_timeout, self.what)
            except TargetError:  # it died idle since its poll (its fork server killed): a new one says why, if it fails too
                spare = None
        worker = spare or self._new_worker(env)
        if spare is None:
            self.engine = worker.hello(self.start_timeout, self.what)
        self._spare = self._new_worker(env)
        return worker

    def _new_worker(self, env: dict[str, str]) -> Worker:
        """A worker forked by this target's fork server for ``env`` (``forkserver``), else a
        process of its own."""
        if self._forker is None:
            self._forker = Forker(self.module, self.preload, self.start_timeout)
        forker = self._forker
        return Worker(env, self.module, lambda stderr: forker.spawn(env, stderr))

    def start(self) -> dict[str, str]:
        """Start the worker now (it otherwise starts with the first run); the engine's description."""
        if self._worker is None:
            self._worker = self._start_worker()
        return self.engine

    def _live_worker(self) -> Worker:
        """The worker, a new one if there is none or it died while idle (killed from outside)."""
        if self._worker is not None and self._worker.proc.poll() is not None:
            self._worker.close()
            self._worker = None
        if self._worker is None:
            self._worker = self._start_worker()
        return self._worker

    def fresh(self) -> None:
        """The next run starts on a fresh worker and fresh RPC servers: what the confirmation of a
        crash needs (``Engines.confirmed``). The spare has run nothing but the startup probe, and
        the fork server never initializes ggml, so both are kept: a confirmation waits for no
        Python process to start (``close`` would restart the fork server too)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        self.servers.close()

    def close(self) -> None:
        for worker in (self._spare, self._worker):
            if worker is not None:
                worker.close()
        self._worker = self._spare = None
        if self._forker is not None:
            self._forker.close()
        self.servers.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
