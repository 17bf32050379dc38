"""No verdict without evidence: values that are not numbers, versions that cannot be read, known
bugs that must not hide another root cause. Pure checks; the engine-backed ones sit beside the
engine they need (``tests/llama``, ``tests/campaign``)."""

from __future__ import annotations

import math

import numpy as np

from pytest_schedfuzz.campaign.known import KnownBugs
from pytest_schedfuzz.campaign.stats import Stats
from pytest_schedfuzz.cases.corpus import STARTER_CORPUS, Case
from pytest_schedfuzz.ggml.values import difference
from pytest_schedfuzz.model.shapes import Geometry
from pytest_schedfuzz.properties.llama import logits_difference

NAN, INF = math.nan, math.inf


def test_logits_that_are_not_numbers_differ_where_the_cpu_has_numbers() -> None:
    cpu = [0.5, -1.0, 2.0]
    assert logits_difference(cpu, cpu) is None
    assert logits_difference([NAN, -1.0, 2.0], cpu) == (0, "nan")
    assert logits_difference([0.5, -1.0, NAN], cpu) == (2, "nan")
    assert logits_difference([NAN, NAN, NAN], cpu) == (0, "nan")
    assert logits_difference([0.5, INF, 2.0], cpu) == (1, "inf")
    assert logits_difference([0.5, -1.0, -INF], [0.5, -1.0, INF]) == (2, "inf")
    # the same NaN pattern on both sides agrees; another pattern does not
    assert logits_difference([NAN, 1.0], [NAN, 1.0]) is None
    assert logits_difference([NAN, 1.0], [1.0, NAN]) == (0, "nan")
    # a finite difference within the tolerance agrees, beyond it does not
    assert logits_difference([0.5005, -1.0, 2.0], cpu) is None
    assert logits_difference([0.5, -1.0, 2.1], cpu) == (2, "finite")
    assert logits_difference([0.5], cpu) == (0, "count")


def _bytes(values: list[float]) -> bytes:
    return np.asarray(values, np.float32).tobytes()


def test_same_values_catches_nan_and_inf_and_agrees_on_the_cpus_own_nan() -> None:
    geo = Geometry("f32", (3, 1, 1, 1), (4, 12, 12, 12))
    want = _bytes([1.0, NAN, 3.0])
    for tolerant in (False, True):
        assert "flat index 0" in difference("t", geo, _bytes([NAN, NAN, 3.0]), want, tolerant)
        assert "flat index 2" in difference("t", geo, _bytes([1.0, NAN, INF]), want, tolerant)
        assert "flat index 1" in difference("t", geo, _bytes([1.0, 2.0, 3.0]), want, tolerant)
        # another NaN payload where the CPU alone has NaN: the same result
        other_nan = np.frombuffer(want, np.uint32).copy()
        other_nan[1] = 0x7FC00001
        assert difference("t", geo, other_nan.tobytes(), want, tolerant) == ""


def test_a_version_that_cannot_be_read_expects_no_bounded_known_bug() -> None:
    """ggml 0.15.3's bounded bugs (fixed in 0.25.3) are expected there and not on 0.25.3; on a build
    whose version cannot be read, none of them is assumed; the header says how many."""
    def known_on(version: str | None) -> tuple[KnownBugs, set[str]]:
        known = KnownBugs(Stats(), lambda llama: version)
        known.learn(STARTER_CORPUS)
        return known, known.expected(False)

    bounded = {c.signature for c in _starter_cases() if c.llama is None and {"since", "fixed_in"} & set(c.expect or {})}
    unbounded = {c.signature for c in _starter_cases() if c.llama is None and c.expected_failure is not None} - bounded
    assert bounded and unbounded
    _, old = known_on("0.15.3")
    assert bounded <= old
    for version in ("unknown (the library has no ggml_version())", None, "master"):
        known, expected = known_on(version)
        assert not (bounded & expected) and unbounded <= expected, version
        note = known.unknown_version_note(False)
        assert note is not None and "cannot be read" in note and "recorded for some ggml versions only are not expected" in note
    assert known_on("0.25.3")[0].unknown_version_note(False) is None


def _starter_cases() -> list[Case]:
    known = KnownBugs(Stats(), lambda llama: "0.25.3")
    known.learn(STARTER_CORPUS)
    return known.cases
