"""The real llama.cpp under test: tiny GGUF models and LoRA adapters written at test time, the
worker process that runs server-like workloads on a ``llama_context``, the scheduler hook
(``sched_hook.c``) and the seeds' patch set (``patches/``)."""
