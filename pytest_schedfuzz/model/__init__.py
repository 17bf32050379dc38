"""Plain data, imported by everyone and importing nothing of the project's: scenarios (graphs,
backend layouts, steps), shapes, what a scheduler did (``trace``), llama.cpp workloads, models and
what llama.cpp did (``llama_trace``)."""
