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


def build_name(given: str | None, lib_dir: object) -> str:
    """The name a run's llama.cpp goes by in expectations (a case's ``known_on``): the built-in's
    name (the default's where none is given), else "build at DIR" for a user's folder."""
    if given is None or given in ABOUT:
        return given or BUILT_IN[0]
    return f"build at {lib_dir}"


def recorded_build(engine: dict[str, str] | object) -> str | None:
    """The llama.cpp build a case's engine record names: its ``llama_build``, or, for a case saved
    before the build was recorded, the built-in its library path is the folder of (the seeds' and
    upstream's are cache folders named after them; llama-cpp-python's is its package's ``lib``);
    None for any other build.

    >>> recorded_build({"lib": "/c/schedfuzz/builds/llama.cpp-b11739-66a72b2e95a9aca1/libllama.so"})
    'llama.cpp-b11739'
    """
    get = getattr(engine, "get", None)
    if get is None:
        return None
    if get("llama_build"):
        return str(get("llama_build"))
    lib = str(get("lib", ""))
    for name in (SEED_LLAMA, UPSTREAM):
        if f"/{name}-" in lib:
            return name
    return BUILT_IN[0] if "/llama_cpp/lib/" in lib else None
