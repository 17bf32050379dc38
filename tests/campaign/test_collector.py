"""Python's cyclic collector is paused while an example is judged (``engine.gc_paused``), and
collects its young generation rarely while a fuzzing run draws (``engine.gc_young_threshold``):
the containers an example makes (its graphs, llama.cpp's captured graphs) die by their reference
counts instead of being promoted and scanned in full collections of the whole heap."""

from __future__ import annotations

import gc

import pytest

from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.engine import gc_paused
from pytest_schedfuzz.profiles import FuzzConfig
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
    """Judged with the collector paused; drawn (between judgements) with a young generation of
    ``gc_young_threshold``'s size, which the run restores when it ends."""
    fuzzer = Fuzzer(FuzzConfig(database=None, seed=3))
    during: list[bool] = []
    thresholds: list[int] = []

    def predicting(scenario):  # type: ignore[no-untyped-def]
        during.append(gc.isenabled())
        thresholds.append(gc.get_threshold()[0])
        return predict(scenario, rules=fuzzer.rules)

    fuzzer.predict = predicting  # type: ignore[method-assign]
    before = gc.get_threshold()
    try:
        assert fuzzer.fuzz("matches-reference", examples=5) is None
    finally:
        fuzzer.close()
    assert during and not any(during)
    assert gc.isenabled()
    assert set(thresholds) == {100_000} and gc.get_threshold() == before
