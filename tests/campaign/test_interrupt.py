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
    with Fuzzer._ctrl_c_noted(fuzzer):  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the handler runs at the next bytecode boundary: noted, not raised
        assert fuzzer.interrupted
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))
    assert signal.getsignal(signal.SIGINT) is before
