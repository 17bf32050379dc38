"""The reference scheduler: an independent model of ggml's ``ggml_backend_sched`` and
``ggml-alloc``, for the ggml versions of the project's table (``pytest_schedfuzz.model.versions``:
0.15.3, 0.23.0, 0.24.0, 0.25.3 and 0.26.0, whose rules are 0.25.3's).

``reference.predict.predict(scenario, rules)`` says what the real scheduler must do at every step;
``reference.sched`` holds the passes, ``reference.alloc`` ggml-alloc, ``reference.backends`` what
each device kind answers, ``reference.rules`` every difference between the versions (``Rules``,
each field read by the passes or by ``pytest_schedfuzz.properties.derived``), and ``can_reuse``
is llama.cpp's rule for reusing a scheduler.
"""

from pytest_schedfuzz.compiled import compiled_path

# the modules mypyc compiled from these sources, when they are built (``pytest_schedfuzz.compiled``)
__path__[:0] = compiled_path()

from .params import can_reuse  # noqa: E402

__all__ = ["can_reuse"]
