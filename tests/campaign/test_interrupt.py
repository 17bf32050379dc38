"""Ctrl-C while fuzzing is never lost (the CLI's and the plugin's end-to-end tests are in
tests/cases/test_corpus.py and tests/test_plugin.py)."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from pytest_schedfuzz.campaign.fuzz import Fuzzer


def test_a_first_ctrl_c_is_noted_for_the_next_example_and_a_second_raises_at_once():
    """Where the signal lands (a finalizer, Hypothesis's gc callback mid-shrink) a raised
    KeyboardInterrupt would be printed and lost: the first press is noted, and the fuzz loop's
    next example raises it (``Fuzzer._fuzz_run``'s ``one``); a second press raises where it lands."""
    fuzzer = SimpleNamespace(interrupted=False)
    before = signal.getsignal(signal.SIGINT)
    with Fuzzer.ctrl_c_noted(fuzzer):  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the handler runs at the next bytecode boundary: noted, not raised
        assert fuzzer.interrupted
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))
    assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_while_the_engines_close_is_noted_and_leaves_nothing_running() -> None:
    """A Ctrl-C that lands while the engines close (a run that has just saved its finding) does
    not cut the closing short: it is noted (the CLI then exits 130), and no worker, fork server
    or RPC server is left running."""
    from pytest_schedfuzz.model.layout import BackendLayout
    from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
    from pytest_schedfuzz.profiles import FuzzConfig
    from pytest_schedfuzz.sim.models import ModelShape, llama_graph

    graph = llama_graph(ModelShape(layer_devices=(0, 1), output_device=1, cpu_device=1), 4, 16)
    scenario = Scenario(BackendLayout.of("rpc", "cpu"), (("g", graph),), (Step("sched_new", params=SchedParams(1024, False, True)), Step("alloc", "g")))
    fuzzer = Fuzzer(FuzzConfig(database=None))
    assert fuzzer.engines.run(scenario).abort is None
    target = fuzzer.engines.target
    assert target._forker is not None and target._forker.server is not None  # type: ignore[attr-defined]
    pids = [*target.servers.pids, target.worker_pid, target._forker.server.proc.pid]  # type: ignore[attr-defined]
    close = target.close

    def pressed_first() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        close()

    target.close = pressed_first  # type: ignore[method-assign]
    before = signal.getsignal(signal.SIGINT)
    fuzzer.close()
    assert fuzzer.interrupted and signal.getsignal(signal.SIGINT) is before
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
