"""Loading ggml-python, optionally against shared libraries from another directory.

ggml-python (0.0.45) has no setting for where its shared libraries live: ``ggml/ggml.py``'s
``load_shared_library`` always opens ``<package dir>/lib/libggml.so`` (after preloading
``libggml-base.so``, ``libggml-cpu.so``, ``libggml-rpc.so``... from the same ``lib`` folder).
To run against a ggml built elsewhere (``SCHEDFUZZ_GGML_LIB=DIR``), we therefore import the
package from an *overlay*: a folder ``ggml/`` whose Python files link to the installed ones and
whose ``lib`` links to ``DIR``. The bindings stay those of the installed ggml-python, so the
other build must keep the same C API and struct layouts.

Only the child processes (the worker and the RPC servers) import ggml; the parent never does.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from ..builds.compile import BuildError

# LibError, base_library and BUILT_IN (the newest first: the default engine): also what the plugin
# and the CLI import from here
from ..builds.installed import LibError, ggml_python_dir, has_ggml, installed_folder
from ..builds.names import SEED_GGML
from ..builds.seed import build_llama_seed
from ..files import cache_dir
from ..model.versions import BINDING_OWN, BUILT_IN
from ..process.children import PARENT_ENV

LIB_ENV = "SCHEDFUZZ_GGML_LIB"


def child_env(lib_dir: str | None, **extra: str) -> dict[str, str]:
    """The environment of a ggml child process: no gdb backtrace on abort, the library folder."""
    env = dict(os.environ)
    env.pop(LIB_ENV, None)
    env.update({"GGML_NO_BACKTRACE": "1", PARENT_ENV: str(os.getpid()), **extra})
    # the project root, so that ``python -m pytest_schedfuzz.engine...`` resolves
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    if lib_dir:
        env[LIB_ENV] = lib_dir
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        # children start often (a worker after each abort, a spare with each worker, the RPC
        # servers): without bytecode each compiles ggml-python's 16k-line bindings and this
        # package again at each start; theirs goes to our cache, not the sources'
        env.setdefault("PYTHONPYCACHEPREFIX", str(cache_dir() / "pycache"))
    return env


DEFAULT_LIB = BUILT_IN[0]
# ggml 0.25.3 with the seeds' patch set (builds.seed.build_llama_seed: the libraries of llama.cpp-0.3.36-seed),
# compiled on first use, so not one of BUILT_IN (which the CLI and tests walk through)
SEED_LIB = SEED_GGML
# where a build keeps its shared libraries, below the folder a user names
_LIB_SUBDIRS = ("", "bin", "lib", "src", "ggml/src", "build/bin", "build/lib", "build/src", "build/ggml/src")


def resolve_lib(value: str | None) -> str | None:
    """The library folder for ``--schedfuzz-lib``: ``ggml-0.25.3`` (the default: the libraries
    llama-cpp-python 0.3.36 built), ``ggml-0.15.3`` (ggml-python's own: ``None``, the bindings'
    default), ``ggml-0.25.3-seed`` (0.25.3 with the seeds' realloc callback: built from
    llama-cpp-python's source on first use, minutes, then cached), or a folder holding
    ``libggml-base.so`` — directly or in ``bin``, ``lib`` or ``build/bin`` below it, as ggml and
    llama.cpp checkouts keep them. ``LibError`` otherwise.
    """
    value = value or DEFAULT_LIB
    if value == BINDING_OWN:
        return None
    if value == SEED_LIB:
        try:
            return str(build_llama_seed())
        except BuildError as e:
            raise LibError(f"--schedfuzz-lib {SEED_LIB}: building llama.cpp 0.3.36 with the seeds' patches failed: {e}") from None
    if value in BUILT_IN:
        return str(installed_folder(value))
    base = Path(value).expanduser()
    if not base.is_dir():
        raise LibError(f"--schedfuzz-lib {value}: not a folder, nor one of {', '.join((*BUILT_IN, SEED_LIB))}")
    for sub in _LIB_SUBDIRS:
        if has_ggml(base / sub):
            return str((base / sub).resolve())
    raise LibError(
        f"--schedfuzz-lib {value}: no libggml-base.so there, nor in {', '.join(s for s in _LIB_SUBDIRS if s)} below it "
        "(build ggml with -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON -DCMAKE_BUILD_TYPE=Debug)"
    )


def library_folder(value: str | None) -> Path:
    """The folder holding the libraries of ``--schedfuzz-lib value``, ggml-python's own included."""
    return Path(resolve_lib(value) or ggml_python_dir() / "lib")


def _soname_file(lib: Path) -> Path:
    """The file the dynamic linker loads for ``lib``'s soname. Wheels store ``libX.so``,
    ``libX.so.0`` and ``libX.so.0.25.3`` as three copies, and loading two of them gives two ggml
    instances in one process (two loggers, two abort callbacks, two backend registries):
    everything must load ``libX.so.0``, the name libllama and libggml record as needed."""
    versioned = sorted(lib.parent.glob(lib.name + ".*"), key=lambda p: len(p.name))
    return (versioned[0] if versioned else lib).resolve()


def lib_overlay(lib_dir: Path) -> Path:
    """A folder of links to ``lib_dir``'s shared libraries in which every name of a library
    (``libX.so``, ``libX.so.N``...) leads to the one file of its soname. Shared by concurrent
    processes (the folder name is derived from ``lib_dir``)."""
    if not (lib_dir / "libggml.so").exists() and not any(lib_dir.glob("libggml.so.*")):
        raise FileNotFoundError(f"{LIB_ENV}={lib_dir}: no libggml.so there")
    key = hashlib.sha1(f"libs-v2\0{lib_dir}".encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / f"schedfuzz-libs-{key}"
    if root.exists():
        return root
    staging = Path(tempfile.mkdtemp(prefix="schedfuzz-libs-"))
    for lib in sorted(lib_dir.glob("lib*.so*")):
        stem = lib.name.split(".so", 1)[0] + ".so"
        (staging / lib.name).symlink_to(_soname_file(lib_dir / stem) if (lib_dir / stem).exists() else lib.resolve())
    try:
        staging.rename(root)
    except OSError:  # another process won the race: use its folder
        shutil.rmtree(staging, ignore_errors=True)
    return root


def _overlay(lib_dir: Path) -> Path:
    """A folder holding a ``ggml`` package that loads its libraries from ``lib_dir`` (through
    ``lib_overlay``, so that they are the very files libllama loads).

    The folder name is derived from both paths, so concurrent processes share one overlay.
    """
    libs = lib_overlay(lib_dir)
    pkg = ggml_python_dir()
    key = hashlib.sha1(f"v2\0{pkg}\0{lib_dir}".encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / f"schedfuzz-ggml-overlay-{key}"
    if (root / "ggml" / "lib").exists():
        return root
    staging = Path(tempfile.mkdtemp(prefix="schedfuzz-ggml-overlay-"))
    (staging / "ggml").mkdir()
    for entry in pkg.iterdir():
        if entry.name not in ("lib", "__pycache__"):
            (staging / "ggml" / entry.name).symlink_to(entry)
    (staging / "ggml" / "lib").symlink_to(libs, target_is_directory=True)
    try:
        staging.rename(root)
    except OSError:  # another process won the race: use its overlay
        shutil.rmtree(staging, ignore_errors=True)
    return root


def import_ggml() -> ModuleType:
    """Import ggml-python, loading its shared libraries from ``$SCHEDFUZZ_GGML_LIB`` when set."""
    lib_dir = os.environ.get(LIB_ENV)
    if lib_dir:
        sys.path.insert(0, str(_overlay(Path(lib_dir).resolve())))
    import ggml

    return ggml


def loaded_library_path(stem: str = "libggml-base") -> str:
    """The file a shared library was actually mapped from (``/proc/self/maps``)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and Path(fields[5]).name.startswith(stem + "."):
            return os.path.realpath(fields[5])
    raise RuntimeError(f"{stem} is not mapped into this process")
