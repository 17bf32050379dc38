"""Building a built-in ggml again from its vendored source, with patches: a scheduler with a
planted bug (the gate's own test, mutation testing) that loads like any user's build.

Only ``libggml-base`` (which holds ``ggml-backend.cpp`` and ``ggml-alloc.c``: the scheduler and
the allocator) is rebuilt; the folder made for ``--schedfuzz-lib`` links the built-in ggml's
other libraries (CPU, RPC, the registry) beside it, which load the new base by its soname.
Sources are the source distributions the install built from, fetched once with
``pip download`` and cached (``$SCHEDFUZZ_CACHE``); builds are cached by their patches.

The seeds' llama.cpp (``seed``) is built from the same sources with ``run_tool``,
``source_tree`` and ``replace_texts``; the engines' own C (``ggml.build``: the graph worker's
helpers, the GPU-like device, the RPC server) is compiled with ``compiler`` and ``run_tool``, and
``ggml_source_for`` finds the ggml source a library was built from.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import cache_dir
from ..model.versions import BUILT_INS
from .installed import installed_folder

# built-in -> (distribution, version, the folder inside its source distribution): each ggml's
# (model.versions), and the llama.cpp the seeds' build patches (seed)
SOURCES = {**{v.built_in: v.source for v in BUILT_INS}, "llama.cpp-0.3.36": ("llama-cpp-python", "0.3.36", "vendor/llama.cpp")}

# requirements.txt's compiler flags for llama-cpp-python: optimized, but without NDEBUG (a Debug
# build: asserts and ggml's debug log kept) and without inlining or sibling calls, so that a
# crash's C stack names the functions an -O0 build's does (the known crashes are signed by them)
OPTIMIZE = "-O1 -fno-inline -fno-optimize-sibling-calls"


class BuildError(RuntimeError):
    """Fetching, patching or compiling failed; the message holds the tool's own output."""


@dataclass(frozen=True)
class Patch:
    """Replace the one occurrence of ``old`` by ``new`` in ``file``: relative to the ggml folder
    for ``build_ggml_base`` (``src/ggml-backend.cpp``), to the llama.cpp folder for
    ``build_llama_seed`` (``src/llama-context.h``, ``ggml/src/ggml-backend.cpp``)."""

    file: str
    old: str
    new: str


def run_tool(cmd: list[str], cwd: Path | None = None, stdin: str | None = None) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"{cmd[0]}: no such program (needed to build: install it)") from None
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")


def pip_download(spec: str, into: Path, source: bool) -> Path:
    """The one file pip downloads for ``spec`` into ``into``: its source distribution
    (``source``), else its wheel for this machine; a ``BuildError`` with pip's own words (its
    warnings left out) where there is none."""
    kind = ("--no-binary", ":all:") if source else ("--only-binary", ":all:")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", *kind, "-d", str(into), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    got = next((p for p in into.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz")), None)
    if proc.returncode != 0 or got is None:
        said = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("WARNING"))[-1500:]
        raise BuildError(f"pip could not download {spec} ({'its source' if source else 'a wheel'}):\n{said}")
    return got


def source_tree(name: str) -> Path:
    """The ggml folder of built-in ``name``'s source distribution (downloaded once)."""
    if name not in SOURCES:
        raise BuildError(f"no source for {name!r}: choose one of {', '.join(SOURCES)}")
    dist, version, inner = SOURCES[name]
    root = cache_dir() / "src" / f"{dist}-{version}"
    if not (root / inner).is_dir():
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            archive = pip_download(f"{dist}=={version}", Path(tmp), source=True)
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            extracted = next(p for p in Path(tmp).iterdir() if p.is_dir())
            root.parent.mkdir(parents=True, exist_ok=True)
            try:
                extracted.rename(root)
            except OSError:  # another process extracted it first
                pass
    return root / inner


def publish_build(out: Path, make: Callable[[Path], None], in_place: bool = False) -> Path:
    """The cached build folder ``out``, made once by ``make(folder)`` (which writes ``BUILT`` last).
    One process builds while the others wait on a lock beside it; the build is made in a
    temporary sibling and renamed into place, so no reader sees half a build and no second
    builder deletes the folder the first one is building in. ``in_place``: build in ``out``
    itself, under the same lock (a ``--coverage`` build: its objects write their counts to the
    absolute paths they were compiled in, so the folder cannot move after it is built)."""
    if (out / "lib" / "BUILT").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent caller waits here for the same build
        if (out / "lib" / "BUILT").exists():
            return out
        work = out if in_place else out.with_name(f".{out.name}.building")
        shutil.rmtree(out, ignore_errors=True)  # a build that stopped half-way (no BUILT)
        shutil.rmtree(work, ignore_errors=True)
        try:
            make(work)
            if work != out:
                os.rename(work, out)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return out


def build_ggml_base(name: str, patches: tuple[Patch, ...] = (), build_type: str = "Debug", coverage: bool = False) -> Path:
    """A library folder for ``--schedfuzz-lib``: built-in ``name`` with ``libggml-base`` rebuilt
    from its source with ``patches`` applied (Debug, as the install builds it; ``Release``
    compiles out the scheduler's debug logging). With ``coverage``, instrumented by gcc's
    ``--coverage``: its source and build folder (``.gcno``, and the ``.gcda`` counts every process
    that loads it writes when it exits) stay beside ``lib`` (``coverage_build``). Cached, and
    built by one process at a time (``publish_build``)."""
    key = hashlib.sha1(json.dumps([name, [asdict(p) for p in patches], build_type] + ([True] if coverage else [])).encode()).hexdigest()[:16]
    out = cache_dir() / "builds" / f"{name}-{'coverage-' if coverage else ''}{key}"

    def make(folder: Path) -> None:
        installed = installed_folder(name)
        work = folder / "ggml"
        shutil.copytree(source_tree(name), work, symlinks=True)
        if not (work / "ggml.pc.in").exists():  # left out of llama-cpp-python's sdist; only installs use it
            (work / "ggml.pc.in").write_text("Name: ggml\nDescription: ggml\nVersion: @GGML_VERSION@\n")
        replace_texts(work, patches)
        build = folder / "build"
        flags = ["-DCMAKE_C_FLAGS=--coverage", "-DCMAKE_CXX_FLAGS=--coverage", "-DCMAKE_SHARED_LINKER_FLAGS=--coverage"] if coverage else []
        run_tool(["cmake", "-S", str(work), "-B", str(build), f"-DCMAKE_BUILD_TYPE={build_type}", "-DBUILD_SHARED_LIBS=ON", "-DGGML_RPC=ON",
                  "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF", *flags])
        run_tool(["cmake", "--build", str(build), "--target", "ggml-base", "-j", str(os.cpu_count() or 2)])
        built = sorted(build.rglob("libggml-base.so*"))
        if not built:
            raise BuildError(f"the build left no libggml-base.so under {build}")
        lib = folder / "lib"
        lib.mkdir()
        for f in installed.iterdir():
            if f.name.startswith("lib") and ".so" in f.name and not f.name.startswith("libggml-base."):
                (lib / f.name).symlink_to(f.resolve())
        for f in built:
            shutil.copy2(f, lib / f.name, follow_symlinks=True)
        if not coverage:
            shutil.rmtree(work)
            shutil.rmtree(build)
        (lib / "BUILT").write_text(json.dumps([name, [asdict(p) for p in patches]], indent=1) + "\n")

    return publish_build(out, make, in_place=coverage) / "lib"


def coverage_build(lib: Path) -> Path:
    """The build folder of a ``build_ggml_base(..., coverage=True)`` library folder ``lib``."""
    build = lib.parent / "build"
    if not any(build.rglob("ggml-backend.cpp.gcno")):
        raise BuildError(f"{lib}: not a coverage build (no ggml-backend.cpp.gcno under {build})")
    return build


def replace_texts(root: Path, patches: tuple[Patch, ...]) -> None:
    """Apply ``patches`` in order to the tree at ``root``; ``BuildError`` when a text is not there once."""
    for p in patches:
        path = root / p.file
        text = path.read_text()
        if text.count(p.old) != 1:
            raise BuildError(f"{p.file}: the text to replace occurs {text.count(p.old)} times, not once: {p.old!r}")
        path.write_text(text.replace(p.old, p.new))


def compiler(what: str) -> str:
    """The system's C compiler (``$CC``, else cc or gcc); a ``BuildError`` naming ``what`` needed it."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise BuildError(f"no C compiler (cc/gcc) to build {what}: install gcc")
    return cc


def ggml_source_for(lib_file: str) -> Path:
    """The ggml source folder (``include/``, ``src/``) that the library file ``lib_file`` was
    built from: a built-in's source distribution, the source a ``build_ggml_base`` folder names,
    the patched source a ``build_llama_seed`` folder keeps, or the checkout above a user's build
    folder. ``BuildError`` naming ``lib_file`` otherwise."""
    where = ggml_source_location(lib_file)
    return source_tree(where) if isinstance(where, str) else where


def ggml_source_location(lib_file: str) -> str | Path:
    """Where ``ggml_source_for`` finds the source, without fetching anything: a built-in's name
    (its source distribution, fetched on first use) or a folder; ``BuildError`` if nowhere."""
    path = Path(lib_file).resolve()
    built = path.parent / "BUILT"
    if built.exists():
        kept = path.parent.parent / "ggml"  # build_llama_seed keeps its patched ggml source there
        if _is_ggml_source(kept):
            return kept
        name = str(json.loads(built.read_text())[0])
        if name not in SOURCES:
            raise BuildError(f"{lib_file}: its build ({name}) kept no ggml source in {kept}; build it again")
        return name
    for v in BUILT_INS:  # an installed built-in: its package's lib/
        if f"/site-packages/{v.package}/" in str(path):
            return v.built_in
    for folder in path.parents:
        for root in (folder, folder / "ggml"):
            if _is_ggml_source(root):
                return root
    raise BuildError(f"{lib_file}: no ggml source (include/ggml.h and src/ggml-backend-impl.h) in a folder above it, "
                     "to build the GPU-like device against; build ggml inside its checkout")


def _is_ggml_source(root: Path) -> bool:
    return (root / "src" / "ggml-backend-impl.h").exists() and (root / "include" / "ggml.h").exists()
