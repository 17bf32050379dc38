"""The built-in llama.cpp builds by the name ``--schedfuzz-llama-lib`` takes, each with what it is
(the help texts are made from this table; the first is the default), and the name of the seeds'
ggml for ``--schedfuzz-lib``. Names only, importing nothing: how each is found or built is
``target.resolve_lib_dir``'s (``seed.build_llama_seed``, ``upstream.upstream_lib_dir``)."""

from __future__ import annotations

SEED_LLAMA = "llama.cpp-0.3.36-seed"  # llama.cpp 0.3.36 with the patch set of patches/<SEED_LLAMA>/
SEED_GGML = "ggml-0.25.3-seed"  # its ggml
UPSTREAM = "llama.cpp-b11739"  # upstream b11739 as published: a Release build with ggml's realloc callback

ABOUT = {
    "llama.cpp-0.3.36": "llama-cpp-python's",
    SEED_LLAMA: "the seeds' system, built on first use",
    UPSTREAM: "upstream, Release, prebuilt",
}
BUILT_IN = tuple(ABOUT)
