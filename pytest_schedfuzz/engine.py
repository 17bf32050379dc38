"""Targets: the engines a scenario runs on. ``ggml.graph_target.GgmlTarget`` runs the real ggml.

A target takes a ``Scenario`` and returns the ``Trace`` of what the engine did. Targets are
named ``module:factory`` (``load_target``), e.g. ``pytest_schedfuzz.ggml.graph_target:GgmlTarget``.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from .model.scenario import Scenario
from .model.trace import Trace


@runtime_checkable
class Target(Protocol):
    def run(self, scenario: Scenario) -> Trace:
        """Run every step of ``scenario``; an engine abort/crash/hang ends the trace early."""
        ...

    def close(self) -> None:
        """Release the engine (child processes, servers)."""
        ...


class Unsupported(Exception):
    """The target cannot run this scenario (e.g. a BLAS backend in a ggml built without it)."""


class TargetError(RuntimeError):
    """The target itself failed: the harness, not the engine under test (e.g. a shape mismatch)."""


def load_target(spec: str) -> Target:
    """Build a target from ``"package.module:factory"``, calling ``factory()`` with no arguments."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"target {spec!r} must be written module:factory")
    factory = getattr(importlib.import_module(module_name), attr)
    target = factory()
    if not isinstance(target, Target):
        raise TypeError(f"{spec} built a {type(target).__name__}, which has no run(scenario)/close()")
    return target


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for one example or one request to a worker (the
    reference's ``predict`` pauses it itself: ``reference/`` imports only the data package). Each
    makes many containers (a llama.cpp trace's captured graphs: thousands of dicts
    and lists) that live until it ends: the collector promoted them and so ran full collections of
    the whole heap (Hypothesis's, the caches'), 29% of the parent's time in a llama.cpp run. Their
    reference counts free them when it ends, so they never reach the collector; a cycle left
    behind is collected afterwards, as before."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def gc_young_threshold(threshold: int = 100_000) -> Iterator[None]:
    """Python's cyclic collector run on the young generation only once ``threshold`` more
    containers live than at its last run (700 by default), for a fuzzing run: an example's
    objects (its drawn graphs, a trace) are alive while Hypothesis draws and records it, and at
    700 each example had them collected, promoted and scanned again by full collections of the
    whole heap (the cached specs with their reference graphs), which made the collector a large share of a
    ci run's CPU. Cycles are still collected, later."""
    before = gc.get_threshold()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
