"""Ctrl-C while fuzzing is never lost (the CLI's and the plugin's end-to-end tests are in
tests/cases/test_corpus.py and tests/test_plugin.py)."""

from __future__ import annotations

import gc
import os
import signal
from types import SimpleNamespace

import pytest

from pytest_schedfuzz.campaign.fuzz import Fuzzer


class _PressesCtrlCWhenCollected:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_swallowed_by_a_finalizer_is_still_noted():
    """Python prints a KeyboardInterrupt raised in a ``__del__`` or a gc callback ("Exception
    ignored in …") and goes on, as CI saw it in Hypothesis's gc callback during a shrink: the
    press must still reach the fuzz loop, which raises it again at the next example."""
    fuzzer = SimpleNamespace(interrupted=False)
    before = signal.getsignal(signal.SIGINT)
    with Fuzzer._ctrl_c_noted(fuzzer):  # type: ignore[arg-type]
        obj = _PressesCtrlCWhenCollected()
        cycle = [obj]
        cycle.append(cycle)  # type: ignore[arg-type]
        del obj, cycle
        gc.collect()  # the KeyboardInterrupt is raised inside the finalizer and ignored there
    assert fuzzer.interrupted
    assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_outside_a_finalizer_still_raises():
    fuzzer = SimpleNamespace(interrupted=False)
    with pytest.raises(KeyboardInterrupt), Fuzzer._ctrl_c_noted(fuzzer):  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode boundary
        sum(range(1000))
    assert fuzzer.interrupted
