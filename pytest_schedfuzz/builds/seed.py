"""The third built-in llama.cpp, ``llama.cpp-0.3.36-seed``: the llama.cpp vendored in
llama-cpp-python 0.3.36 with the project's own patch set of the seeds' change
(``patches/llama.cpp-0.3.36-seed/*.patch``: ggml's realloc callback, llama.cpp's ``sched_new``,
realloc counters and ``sched_params::can_reuse``), libllama and all of its ggml
(``ggml-0.25.3-seed`` as a graph engine), configured as llama-cpp-python's install configures it
and built on first use (``build_llama_seed``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from ..files import cache_dir
from .compile import OPTIMIZE, BuildError, Patch, publish_build, replace_texts, run_tool, source_tree
from .names import SEED_GGML, SEED_LLAMA

# the seeds' system (builds.SEED_LLAMA): llama.cpp 0.3.36 with the patch set of patches/<SEED_LLAMA>/,
# and its ggml (builds.SEED_GGML)
SEED_BASE = "llama.cpp-0.3.36"  # the source it patches
PATCHES = Path(__file__).with_name("patches")
# llama-cpp-python's configuration (its CMakeLists.txt and requirements.txt's config settings:
# Debug with OPTIMIZE, shared libraries, RPC, the native CPU backend of ggml's default, RUNPATH
# $ORIGIN), less what it builds beside libllama (common, llava/mtmd); tests, tools, examples,
# server, app off
SEED_CMAKE_FLAGS = (
    f"-DCMAKE_C_FLAGS={OPTIMIZE}", f"-DCMAKE_CXX_FLAGS={OPTIMIZE}",
    "-DBUILD_SHARED_LIBS=ON", "-DGGML_RPC=ON", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_MTMD=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)
# the libraries the seed build must leave (libllama and the ggml it links)
SEED_LIBRARIES = ("libllama", "libggml-base", "libggml-cpu", "libggml", "libggml-rpc")
# top-level folders of the llama.cpp source that no library build reads
# what a seeds build keeps of its work tree beside lib/ (a build that kept less is another build)
SEED_KEPT = ("include", "ggml/include", "ggml/src", "src")
_UNUSED_SOURCE = {"models", "docs", "media", "benches", ".github", ".devops"}


def seed_patch_files() -> tuple[Path, ...]:
    """The seeds' patch set for llama.cpp 0.3.36, in the order it applies (``NNNN-*.patch``)."""
    files = tuple(sorted((PATCHES / SEED_LLAMA).glob("*.patch")))
    if not files:
        raise BuildError(f"no patches in {PATCHES / SEED_LLAMA} (an install without the package's patch files?)")
    return files


def patch_command() -> list[str]:
    """The command that applies one patch file (its path appended) in the current folder, exactly
    (no fuzz): patch(1), or git's own applier where patch is not installed."""
    if shutil.which("patch"):
        return ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "-i"]
    if shutil.which("git"):
        return ["git", "apply", "-p1", "--whitespace=nowarn"]
    raise BuildError("neither patch nor git is installed (one is needed to apply the seeds' patch set: install patch)")


def build_llama_seed(extra: tuple[Patch, ...] = (), build_type: str = "Debug") -> Path:
    """The library folder of ``llama.cpp-0.3.36-seed``: the llama.cpp (and ggml) vendored in
    llama-cpp-python 0.3.36 with ``seed_patch_files()`` applied in order (``patch -p1``, exactly:
    no fuzz), then ``extra`` (planted faults, e.g. a ``can_reuse`` that ignores ``max_nodes``),
    configured as llama-cpp-python's install is (``SEED_CMAKE_FLAGS``) and built for the ``llama``
    target. The folder holds ``libllama.so``, ``libggml-base.so``, ``libggml-cpu.so``,
    ``libggml.so``, ``libggml-rpc.so`` with their sonamed versions (RUNPATH ``$ORIGIN``) and
    ``BUILT``; the patched ggml source (``include/``, ``src/``) stays in ``../ggml`` for the
    GPU-like device (``ggml_source_location``), and llama.cpp's in ``../src`` (``SEED_KEPT``: where
    an abort's check site is read, ``kept_source``). Cached by the patch files' bytes, ``extra``,
    the build type and flags; one process builds it while the others wait. ``BuildError`` with
    the tool's output otherwise."""
    patches = seed_patch_files()
    flags = [f"-DCMAKE_BUILD_TYPE={build_type}", *SEED_CMAKE_FLAGS]
    key = hashlib.sha1(json.dumps([SEED_LLAMA, [[p.name, hashlib.sha1(p.read_bytes()).hexdigest()] for p in patches],
                                   [asdict(p) for p in extra], flags, SEED_KEPT]).encode()).hexdigest()[:16]
    out = cache_dir() / "builds" / f"{SEED_LLAMA}-{key}"

    def make(folder: Path) -> None:
        t0 = time.monotonic()
        applier = patch_command()
        src = source_tree(SEED_BASE)
        work, build, lib = folder / "llama.cpp", folder / "build", folder / "lib"
        shutil.copytree(src, work, symlinks=True,
                        ignore=lambda d, names: [n for n in names if Path(d) == src and n in _UNUSED_SOURCE])
        for p in patches:
            run_tool([*applier, str(p)], cwd=work)
        replace_texts(work, extra)
        run_tool(["cmake", "-S", str(work), "-B", str(build), *flags])
        run_tool(["cmake", "--build", str(build), "--target", "llama", "-j", str(os.cpu_count() or 2)])
        built = [f for f in sorted((build / "bin").glob("lib*.so*")) if f.name.split(".so", 1)[0] in SEED_LIBRARIES]
        missing = [n for n in SEED_LIBRARIES if not any(f.name == n + ".so" for f in built)]
        if missing:
            raise BuildError(f"the build left no {', '.join(n + '.so' for n in missing)} in {build / 'bin'}")
        lib.mkdir()
        for f in built:
            shutil.copy2(f, lib / f.name, follow_symlinks=False)  # libX.so -> libX.so.0 -> libX.so.0.25.3
        ggml_src = work / "ggml" / "src"
        shutil.copytree(work / "ggml" / "include", folder / "ggml" / "include")
        shutil.copytree(ggml_src, folder / "ggml" / "src", ignore=lambda d, names: [
            n for n in names if Path(d) == ggml_src and (ggml_src / n).is_dir() and n not in ("ggml-cpu", "ggml-rpc")])
        shutil.copytree(work / "src", folder / "src")  # llama.cpp's own, patched: an abort's check site is read there
        shutil.copytree(work / "include", folder / "include")  # llama.h, patched: the build's declarations (llama.declarations)
        shutil.rmtree(work)
        shutil.rmtree(build)
        (lib / "BUILT").write_text(json.dumps([SEED_GGML, {
            "llama.cpp": SEED_LLAMA, "source": SEED_BASE, "patches": [p.name for p in patches],
            "extra": [asdict(p) for p in extra], "cmake": flags, "ggml_source": "../ggml",
            "build_seconds": round(time.monotonic() - t0, 1)}], indent=1) + "\n")

    # in place: its libraries print the paths they were compiled in (an assert's file), which
    # ``kept_source`` maps back to the kept sources
    return publish_build(out, make, in_place=True) / "lib"


def kept_source(path: str) -> Path | None:
    """The copy a seeds build kept of source file ``path``, named as its libraries print it (the
    work tree ``<build>/llama.cpp/`` is deleted; its ``ggml/`` and ``src/`` stay beside ``lib/``),
    or None: where an abort's check site is read (``properties.sites``)."""
    m = re.search(rf"^(.*/builds/{re.escape(SEED_LLAMA)}-[0-9a-f]+)/llama\.cpp/((?:ggml/)?src/.+)$", path)
    if m is None:
        return None
    kept = Path(m.group(1)) / m.group(2)
    return kept if kept.is_file() else None
