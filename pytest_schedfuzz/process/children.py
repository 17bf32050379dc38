"""Child processes: each started in a session of its own (so killed as a process group), none
left alive after us (``close()``, interpreter exit, SIGTERM; and they die with their parent,
``die_with_parent``)."""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Protocol

# how a child killed from outside ends: an infrastructure fault, not ggml
PARENT_ENV = "SCHEDFUZZ_PARENT_PID"  # a child's parent, which it dies with (``die_with_parent``)
KILLED_FROM_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


class Proc(Protocol):
    """What ``kill_group`` uses of a child: a ``subprocess.Popen``, or a ``forkserver.ForkedProc``."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


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


def kill_group(proc: Proc, grace: float = 2.0) -> None:
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


# include/linux/sched.h: do_exit() sets it (exit_signals) before it closes the process's files
PF_EXITING = 0x4


def _stat_fields(path: str) -> list[str] | None:
    """The fields after ``(comm)`` of a ``/proc`` stat file (state, ppid, pgrp, session, tty_nr,
    tpgid, flags...; comm may hold spaces and parentheses), or None once it is gone. Read with
    os.open, not Path.read_text: it is read for every RPC server after every scenario."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            stat = os.read(fd, 4096).decode(errors="replace")
        finally:
            os.close(fd)
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def exiting(pid: int) -> bool:
    """Whether the process has begun to exit: ``PF_EXITING`` in ``/proc/PID/stat``, or a zombie, or
    gone. The kernel sets the flag before it closes the process's sockets, so a peer that saw a
    socket of the process close because the process died sees it set, with no wait."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    if fields is None:
        return True
    state, flags = fields[0], fields[6]
    return state in ("Z", "X") or bool(int(flags) & PF_EXITING)


def describe_exit(code: int) -> str:
    """``Popen.returncode`` in words."""
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``).

    The parent passes its pid in ``SCHEDFUZZ_PARENT_PID``; if it is already gone, exit now.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    parent = os.environ.get(PARENT_ENV)
    if parent is not None and os.getppid() != int(parent):
        os._exit(1)
