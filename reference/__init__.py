"""The reference scheduler: an independent model of ggml's ``ggml_backend_sched`` (0.15.3).

``reference.predict.predict(scenario)`` says what the real scheduler must do at every step;
``reference.sched`` holds the passes; ``SchedParams`` holds llama.cpp's ``can_reuse`` rule.
"""

from .params import SchedParams

__all__ = ["SchedParams"]
