"""Scheduler parameters and the reuse rule of llama.cpp's ``llama_context``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedParams:
    """``llama_context::sched_params``: what a ``ggml_backend_sched_new`` call was given.

    >>> SchedParams(2048, False, True).can_reuse(SchedParams(4096, False, True))
    True
    >>> SchedParams(8192, False, True).can_reuse(SchedParams(4096, False, True))
    False
    """

    max_nodes: int
    parallel: bool = False
    op_offload: bool = True

    def can_reuse(self, other: SchedParams) -> bool:
        """``sched_params::can_reuse``: a scheduler built with ``other`` serves these params."""
        return (
            self.parallel == other.parallel
            and self.op_offload == other.op_offload
            and self.max_nodes <= other.max_nodes
        )
