"""Every RPC server death charged to its cause (docs/design.md §14): the workload that last sent
the server work, by the process's exit status, never a CPU-only run, never replaced silently.

A server dies on a chosen graph through ``rpc_server.c``'s test hook
(``SCHEDFUZZ_RPC_CRASH_AT_COMPUTE=N``: SIGSEGV on its N-th graph compute), given only to the
servers these tests start. Set ``SCHEDFUZZ_LLAMA_LIB=llama.cpp-b11739`` to run them on b11739."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, Part
from pytest_schedfuzz.process.children import exiting
from pytest_schedfuzz.process.rpc import owns_listener
from pytest_schedfuzz.properties.sites import RPC_FAILED

CRASH = "SCHEDFUZZ_RPC_CRASH_AT_COMPUTE"
# the last decode outputs nothing, so nothing is read back from the server after its graph (a
# crash there escapes the decode), and the last call computes nothing: the crash is the decode's
W = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=1), ContextParams(),
                  (Call("decode", (Part(0, 4, "last"),)), Call("decode", (Part(0, 2, "none"),)), Call("set_warmup", on=False)))
CPU = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=0, n_gpu_layers=0), ContextParams(), (Call("decode", (Part(0, 4, "last"),)),))

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def target() -> Iterator[object]:
    from pytest_schedfuzz.llama.llama_target import LlamaTarget

    t = LlamaTarget()
    yield t
    t.close()


def _endpoint(target) -> str:  # type: ignore[no-untyped-def]
    return f"127.0.0.1:{target.servers.ports[0]}"


def _fresh(target, crash_at: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """A fresh worker and servers, which crash at their ``crash_at``-th graph (0: count only)."""
    target.fresh()
    target.servers.env.pop(CRASH, None)
    if crash_at is not None:
        target.servers.env[CRASH] = str(crash_at)


def _kill(target, sig: int) -> None:  # type: ignore[no-untyped-def]
    pid = target.servers.pids[0]
    os.kill(pid, sig)
    while not exiting(pid):
        time.sleep(0.001)


def test_a_crash_on_a_workloads_last_graph_is_its_last_decodes_and_nobody_elses(target) -> None:  # type: ignore[no-untyped-def]
    """The server crashes on the workload's last graph, which the RPC client only queued: the
    round trip before the context is freed makes it the abort of the last call that computed
    (the last decode, not the call after it), in phase ``synchronize``, with the server's exit
    status as a field. The CPU-only run after it and an RPC workload on a new server pass."""
    _fresh(target, 0)
    lost = list(target.servers.lost)
    assert target.run(W).abort is None
    n = target.servers.log(_endpoint(target)).count("schedfuzz-rpc-server: graph compute")
    assert n >= 2
    _fresh(target, n)
    trace = target.run(W)
    endpoint = _endpoint(target)
    a = trace.abort
    assert a is not None and (a.call, a.kind, a.phase) == (1, "abort", "synchronize"), a
    assert a.servers == (f"{endpoint}: killed by SIGSEGV",)
    assert RPC_FAILED in a.message and f"RPC server {endpoint} was killed by SIGSEGV" in a.message
    target.servers.env.pop(CRASH)
    assert target.run(CPU).abort is None
    trace = target.run(W)
    assert trace.abort is None and _endpoint(target) != endpoint
    assert target.servers.lost == lost  # charged, so replaced without a word


def test_a_cpu_only_run_is_never_charged_for_a_server(target) -> None:  # type: ignore[no-untyped-def]
    """A server that died after its workload passed is not the CPU-only run's: that run passes
    on a fresh worker (the old one's model lives on the dead server and would be freed there),
    and the death is told when a workload next asks for the server."""
    _fresh(target)
    assert target.run(W).abort is None
    _kill(target, signal.SIGSEGV)
    trace = target.run(CPU)
    assert trace.abort is None and all(c.rc == 0 for c in trace.calls)
    lost = len(target.servers.lost)
    assert target.run(W).abort is None  # on a new server; the dead one is recorded, not charged to this run
    assert len(target.servers.lost) == lost + 1


def test_a_server_found_dead_that_nobody_was_charged_for_is_not_replaced_silently(target) -> None:  # type: ignore[no-untyped-def]
    """A crash no workload was charged for is recorded with the server, its exit status and its
    last client (the campaign counts and lists it: ``Engines.run_llama``), never charged to the
    workload that asks for the server next; a kill from outside (SIGKILL) is recorded too, as
    such."""
    from pytest_schedfuzz.llama.llama_target import client_name

    _fresh(target)
    assert target.run(W).abort is None
    endpoint, lost = _endpoint(target), len(target.servers.lost)
    _kill(target, signal.SIGSEGV)
    assert target.run(W).abort is None
    (death,) = target.servers.lost[lost:]
    assert (death.endpoint, death.returncode, death.client) == (endpoint, -signal.SIGSEGV, client_name(W)) and not death.from_outside
    assert _endpoint(target) != endpoint
    _kill(target, signal.SIGKILL)
    assert target.run(W).abort is None
    assert len(target.servers.lost) == lost + 2 and target.servers.lost[-1].from_outside


def test_a_server_is_ready_only_on_a_listening_socket_of_its_own() -> None:
    """``owns_listener``: a process's own listening socket on the port, not another's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not owns_listener(os.getpid(), port)  # bound, not listening
        s.listen()
        assert owns_listener(os.getpid(), port)
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not owns_listener(other.pid, port)
        finally:
            other.kill()
            other.wait()
        assert not owns_listener(other.pid, port)
