"""The real ggml under test (the graph engine): the worker process that drives ggml's scheduler
through ggml-python, library loading, RPC servers on loopback, the GPU-like device (``fake_gpu.c``),
crash stacks and the builds of patched ggml and of the seeds' llama.cpp. It reports raw
observations and never imports the reference."""
