"""The built-in llama.cpp builds by the name ``--schedfuzz-llama-lib`` takes, each with what it is
(the help texts are made from this table; the first is the default), and the name of the seeds'
ggml for ``--schedfuzz-lib``. Names only, importing nothing: how each is found or built is
``target.resolve_lib_dir``'s (``seed.build_llama_seed``, ``upstream.upstream_lib_dir``)."""

from __future__ import annotations

import re

SEED_LLAMA = "llama.cpp-0.3.36-seed"  # llama.cpp 0.3.36 with the patch set of patches/<SEED_LLAMA>/
SEED_GGML = "ggml-0.25.3-seed"  # its ggml
UPSTREAM = "llama.cpp-b11739"  # upstream b11739 as published: a Release build with ggml's realloc callback

ABOUT = {
    "llama.cpp-0.3.36": "llama-cpp-python's",
    SEED_LLAMA: "the seeds' system, built on first use",
    UPSTREAM: "upstream, Release, prebuilt",
}
BUILT_IN = tuple(ABOUT)
# any published upstream build by its build number (published.py fetches it): llama.cpp-b11548
PUBLISHED = re.compile(r"llama\.cpp-b(?P<number>\d+)")


def is_published(name: object) -> bool:
    """Whether ``name`` names a published upstream build (``llama.cpp-b11548``, the built-in
    ``llama.cpp-b11739`` too)."""
    return isinstance(name, str) and PUBLISHED.fullmatch(name) is not None


def build_name(given: str | None, lib_dir: object) -> str:
    """The name a run's llama.cpp goes by in expectations (a case's ``known_on``): the built-in's
    or the published build's name (the default's where none is given), else "build at DIR" for a
    user's folder."""
    if given is None or given in ABOUT or is_published(given):
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
    if f"/{SEED_LLAMA}-" in lib:
        return SEED_LLAMA
    if found := re.search(r"/(llama\.cpp-b\d+)-[0-9a-f]+/", lib):
        return found[1]
    return BUILT_IN[0] if "/llama_cpp/lib/" in lib else None
