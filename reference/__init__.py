"""The reference scheduler: an independent model of ggml's ``ggml_backend_sched`` (0.15.3).

``reference.predict.predict(scenario)`` says what the real scheduler must do at every step;
``reference.sched`` holds the passes; ``can_reuse`` is llama.cpp's rule for reusing a scheduler.
"""

from .params import can_reuse

__all__ = ["can_reuse"]
