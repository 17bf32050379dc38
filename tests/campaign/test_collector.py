"""Python's cyclic collector is paused while an example is judged (``engine.gc_paused``): the
containers an example makes (llama.cpp's captured graphs) die by their reference counts instead
of being promoted and scanned in full collections of the whole heap."""

from __future__ import annotations

import gc

import pytest

from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.campaign.profiles import FuzzConfig
from pytest_schedfuzz.engine import gc_paused
from reference.predict import predict


def test_gc_paused_restores_the_collector_as_it_was() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # an inner pause does not turn it on early
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("an example that fails")
    assert gc.isenabled()


@pytest.mark.engine
def test_every_example_is_judged_with_the_collector_paused_and_it_runs_between_them() -> None:
    fuzzer = Fuzzer(FuzzConfig(database=None, seed=3))
    during: list[bool] = []

    def predicting(scenario):  # type: ignore[no-untyped-def]
        during.append(gc.isenabled())
        return predict(scenario, rules=fuzzer.rules)

    fuzzer.predict = predicting  # type: ignore[method-assign]
    try:
        assert fuzzer.fuzz("matches-reference", examples=5) is None
    finally:
        fuzzer.close()
    assert during and not any(during)
    assert gc.isenabled()
