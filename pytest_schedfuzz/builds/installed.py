"""Where the installed ggml builds keep their libraries: ggml-python's own (ggml 0.15.3) and
llama-cpp-python's (ggml 0.25.3); and a folder's library by its shortest name.

Below both ``lib`` (which resolves any ``--schedfuzz-lib`` value, the seeds' build included,
which it builds) and ``build`` (which builds from these installs' sources): what each needs of the
other's folders is here, so neither imports the other."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..model.versions import built_in


class LibError(ValueError):
    """A ``--schedfuzz-lib`` value that names no usable ggml build; the message says why."""


def has_ggml(folder: Path) -> bool:
    return (folder / "libggml-base.so").exists() or any(folder.glob("libggml-base.so.*"))


def installed_folder(name: str) -> Path:
    """The library folder of the installed built-in ``name`` (``model.versions.BUILT_INS``): the
    ``lib/`` of the Python package that holds it (ggml-python's own ``ggml``, the libraries
    llama-cpp-python built); ``LibError`` where it is not installed."""
    v = built_in(name)
    assert v is not None, name
    distribution = v.source[0]
    spec = importlib.util.find_spec(v.package)
    if spec is None or not spec.submodule_search_locations:
        raise LibError(f"--schedfuzz-lib {name}: {distribution} (whose build holds ggml {v.version}) is not installed; run the README's install command")
    folder = Path(list(spec.submodule_search_locations)[0]) / "lib"
    if not has_ggml(folder):
        raise LibError(f"--schedfuzz-lib {name}: no libggml-base.so in {folder} ({distribution} built without shared ggml libraries?)")
    return folder


def base_library(folder: Path) -> Path:
    """``folder``'s ``libggml-base`` by its shortest name (``libggml-base.so``: what links against it)."""
    return shared_library(folder, "libggml-base")


def shared_library(folder: Path, stem: str) -> Path:
    """``folder``'s library ``stem`` by its shortest name (``libggml.so`` before ``libggml.so.0``)."""
    found = sorted(folder.glob(f"{stem}.so*"), key=lambda p: len(p.name))
    if not found:
        raise LibError(f"{folder}: no {stem}.so there")
    return found[0]


def ggml_python_dir() -> Path:
    spec = importlib.util.find_spec("ggml")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("ggml-python is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])
