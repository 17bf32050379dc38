"""The reuse rule of llama.cpp's ``llama_context``: ``sched_params::can_reuse``."""

from __future__ import annotations

from pytest_schedfuzz.model.scenario import SchedParams


def can_reuse(new: SchedParams, cur: SchedParams) -> bool:
    """``sched_params::can_reuse``: a scheduler built with ``cur`` serves ``new`` (same
    ``parallel``, same ``op_offload``, no more nodes).

    >>> can_reuse(SchedParams(2048, False, True), SchedParams(4096, False, True))
    True
    >>> can_reuse(SchedParams(8192, False, True), SchedParams(4096, False, True))
    False
    """
    return new.parallel == cur.parallel and new.op_offload == cur.op_offload and new.max_nodes <= cur.max_nodes
