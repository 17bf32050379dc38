"""The ggml versions the harness has a built-in of: one entry each, with what the harness needs to
know of it. A new version is one entry here (and, for the reference, its ``Rules`` in
``reference/versions.py``, keyed by the same version: its scheduler's semantics, which the
reference reads and the harness never does).

* ``built_in``: its name for ``--schedfuzz-lib`` (``ggml-<version>``); the first is the default;
* ``source``: where the built-in's source comes from (``builds.compile.source_tree``): the distribution
  whose sdist vendors it, its version, and the ggml folder inside the sdist;
* ``package``: the Python package whose install holds the built-in's libraries (in its ``lib/``):
  ggml-python's ``ggml`` (the binding's own: what it loads without a folder) or ``llama_cpp``;
* ``has_top_k``, ``ssm_scan_takes_k``, ``clamp_out_of_place``: the API the ops' builds
  (``ops.OPS``: ``graph.c``, ``program.encode``, the exporter's ``cases.export``) are written for.

A library's version (``ggml_version()``) is looked up by its series (``0.15.`` of ``0.15.3``):
one the harness has no entry for is taken as the newest (``version_of``).

>>> version_of("0.15.3").built_in, version_of("0.26.0").built_in, version_of("unknown").ssm_scan_takes_k
('ggml-0.15.3', 'ggml-0.25.3', True)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgmlVersion:
    """One ggml version the harness has a built-in of (see the module's docstring)."""

    version: str
    source: tuple[str, str, str]  # (distribution, its version, the ggml folder in its source distribution)
    package: str  # the Python package whose install's lib/ holds its libraries
    has_top_k: bool  # GGML_OP_TOP_K and ggml_top_k
    ssm_scan_takes_k: bool  # ggml_ssm_scan's K argument
    clamp_out_of_place: bool  # ggml_clamp makes a new tensor (0.15.3's works in place: a view of its source)

    @property
    def built_in(self) -> str:
        return f"ggml-{self.version}"

    @property
    def series(self) -> str:
        """The prefix every release of this version's series has: ``0.15.`` of ``0.15.3``."""
        return self.version.rsplit(".", 1)[0] + "."


# the newest first: the default engine
VERSIONS = (
    GgmlVersion("0.25.3", ("llama-cpp-python", "0.3.36", "vendor/llama.cpp/ggml"), "llama_cpp", has_top_k=True, ssm_scan_takes_k=True, clamp_out_of_place=True),
    GgmlVersion("0.15.3", ("ggml-python", "0.0.45", "vendor/ggml"), "ggml", has_top_k=False, ssm_scan_takes_k=False, clamp_out_of_place=False),
)
BUILT_IN = tuple(v.built_in for v in VERSIONS)
BINDING_OWN = next(v.built_in for v in VERSIONS if v.package == "ggml")  # ggml-python's own libraries
LLAMA_CPP_PYTHON = next(v.built_in for v in VERSIONS if v.package == "llama_cpp")  # llama-cpp-python's build: libllama beside its ggml


def built_in(name: str) -> GgmlVersion | None:
    """The entry of the built-in called ``name`` (``ggml-0.25.3``), or None."""
    return next((v for v in VERSIONS if v.built_in == name), None)


def version_of(version: str) -> GgmlVersion:
    """The entry of ``version`` (as ``ggml_version()`` or a case gives it) by its series; the
    newest for a version of no series the harness has (a newer ggml, an unknown one)."""
    return next((v for v in VERSIONS if version.startswith(v.series)), VERSIONS[0])
