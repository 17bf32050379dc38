"""Building a built-in ggml again from its vendored source, with patches: a scheduler with a
planted bug (the gate's own test, mutation testing) that loads like any user's build.

Only ``libggml-base`` (which holds ``ggml-backend.cpp`` and ``ggml-alloc.c``: the scheduler and
the allocator) is rebuilt; the folder made for ``--schedfuzz-lib`` links the built-in ggml's
other libraries (CPU, RPC, the registry) beside it, which load the new base by its soname.
Sources are the source distributions the install built from, fetched once with
``pip download`` and cached (``$SCHEDFUZZ_CACHE``); builds are cached by their patches.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .files import atomic_write, cache_dir
from .targets.ggml_lib import base_library, library_folder

# built-in ggml -> (distribution, version, the ggml folder inside its source distribution)
SOURCES = {
    "ggml-0.25.3": ("llama-cpp-python", "0.3.36", "vendor/llama.cpp/ggml"),
    "ggml-0.15.3": ("ggml-python", "0.0.45", "vendor/ggml"),
}


class BuildError(RuntimeError):
    """Fetching, patching or compiling failed; the message holds the tool's own output."""


@dataclass(frozen=True)
class Patch:
    """Replace the one occurrence of ``old`` by ``new`` in ``file`` (relative to the ggml folder,
    e.g. ``src/ggml-backend.cpp``)."""

    file: str
    old: str
    new: str


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")


def source_tree(name: str) -> Path:
    """The ggml folder of built-in ``name``'s source distribution (downloaded once)."""
    if name not in SOURCES:
        raise BuildError(f"no source for {name!r}: choose one of {', '.join(SOURCES)}")
    dist, version, inner = SOURCES[name]
    root = cache_dir() / "src" / f"{dist}-{version}"
    if not (root / inner).is_dir():
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp, f"{dist}=={version}"])
            archive = next(Path(tmp).glob("*.tar.gz"), None)
            if archive is None:
                raise BuildError(f"pip download {dist}=={version} gave no source archive")
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            extracted = next(p for p in Path(tmp).iterdir() if p.is_dir())
            root.parent.mkdir(parents=True, exist_ok=True)
            try:
                extracted.rename(root)
            except OSError:  # another process extracted it first
                pass
    return root / inner


def build_ggml_base(name: str, patches: tuple[Patch, ...] = (), build_type: str = "Debug") -> Path:
    """A library folder for ``--schedfuzz-lib``: built-in ``name`` with ``libggml-base`` rebuilt
    from its source with ``patches`` applied (Debug, as the install builds it; ``Release``
    compiles out the scheduler's debug logging). Cached."""
    key = hashlib.sha1(json.dumps([name, [asdict(p) for p in patches], build_type]).encode()).hexdigest()[:16]
    out = cache_dir() / "builds" / f"{name}-{key}"
    if (out / "lib" / "BUILT").exists():
        return out / "lib"
    installed = library_folder(name)
    src = source_tree(name)
    shutil.rmtree(out, ignore_errors=True)
    work = out / "ggml"
    shutil.copytree(src, work, symlinks=True)
    if not (work / "ggml.pc.in").exists():  # left out of llama-cpp-python's sdist; only installs use it
        (work / "ggml.pc.in").write_text("Name: ggml\nDescription: ggml\nVersion: @GGML_VERSION@\n")
    for p in patches:
        path = work / p.file
        text = path.read_text()
        if text.count(p.old) != 1:
            raise BuildError(f"{p.file}: the text to replace occurs {text.count(p.old)} times, not once: {p.old!r}")
        path.write_text(text.replace(p.old, p.new))
    build = out / "build"
    _run(["cmake", "-S", str(work), "-B", str(build), f"-DCMAKE_BUILD_TYPE={build_type}", "-DBUILD_SHARED_LIBS=ON", "-DGGML_RPC=ON",
          "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF"])
    _run(["cmake", "--build", str(build), "--target", "ggml-base", "-j", str(os.cpu_count() or 2)])
    built = sorted(build.rglob("libggml-base.so*"))
    if not built:
        raise BuildError(f"the build left no libggml-base.so under {build}")
    lib = out / "lib"
    lib.mkdir()
    for f in installed.iterdir():
        if f.name.startswith("lib") and ".so" in f.name and not f.name.startswith("libggml-base."):
            (lib / f.name).symlink_to(f.resolve())
    for f in built:
        shutil.copy2(f, lib / f.name, follow_symlinks=True)
    shutil.rmtree(work)
    shutil.rmtree(build)
    (lib / "BUILT").write_text(json.dumps([name, [asdict(p) for p in patches]], indent=1) + "\n")
    return lib


FAKE_GPU_SOURCE = Path(__file__).with_name("targets") / "fake_gpu.c"


def ggml_source_for(lib_file: str) -> Path:
    """The ggml source folder (``include/``, ``src/``) that the library file ``lib_file`` was
    built from: a built-in's source distribution, the source a ``build_ggml_base`` folder names,
    or the checkout above a user's build folder. ``BuildError`` naming ``lib_file`` otherwise."""
    where = ggml_source_location(lib_file)
    return source_tree(where) if isinstance(where, str) else where


def ggml_source_location(lib_file: str) -> str | Path:
    """Where ``ggml_source_for`` finds the source, without fetching anything: a built-in's name
    (its source distribution, fetched on first use) or a folder; ``BuildError`` if nowhere."""
    path = Path(lib_file).resolve()
    built = path.parent / "BUILT"
    if built.exists():
        return str(json.loads(built.read_text())[0])
    if "/site-packages/llama_cpp/" in str(path):
        return "ggml-0.25.3"
    if "/site-packages/ggml/" in str(path):
        return "ggml-0.15.3"
    for folder in path.parents:
        for root in (folder, folder / "ggml"):
            if (root / "src" / "ggml-backend-impl.h").exists() and (root / "include" / "ggml.h").exists():
                return root
    raise BuildError(f"{lib_file}: no ggml source (include/ggml.h and src/ggml-backend-impl.h) in a folder above it, "
                     "to build the GPU-like device against; build ggml inside its checkout")


def build_fake_gpu(lib_file: str) -> Path:
    """``libschedfuzz-fake-gpu.so`` (``targets/fake_gpu.c``) compiled against the headers of the
    ggml that ``lib_file`` (a ``libggml-base``) was built from; cached by the source and headers.
    It links that ``libggml-base`` (by soname where it has one, which a process that has loaded
    it then shares; by this folder, the rpath, otherwise), so it is built per library folder."""
    src = ggml_source_for(lib_file)
    impl = (src / "src" / "ggml-backend-impl.h").read_text()
    headers = [src / "src" / "ggml-backend-impl.h", src / "src" / "ggml-impl.h", src / "include" / "ggml.h", src / "include" / "ggml-backend.h"]
    lib_dir = Path(lib_file).resolve().parent
    digest = hashlib.sha1(FAKE_GPU_SOURCE.read_bytes() + b"".join(h.read_bytes() for h in headers) + str(lib_dir).encode()).hexdigest()[:16]
    out = cache_dir() / "fake_gpu" / digest / "libschedfuzz-fake-gpu.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise BuildError("no C compiler (cc/gcc) to build the GPU-like device: install gcc")
    flags = ["-DSCHEDFUZZ_OPTIMIZE_PARAMS"] if "ggml_backend_graph_optimize_params" in impl else []
    linked = base_library(lib_dir).name

    def compile_to(tmp: Path) -> None:
        _run([cc, "-std=c11", "-D_GNU_SOURCE", "-O2", "-fPIC", "-shared", *flags, "-I", str(src / "include"), "-I", str(src / "src"),
              "-o", str(tmp), str(FAKE_GPU_SOURCE), "-L", str(lib_dir), f"-l:{linked}", f"-Wl,-rpath,{lib_dir}", "-lpthread"])

    return atomic_write(out, compile_to, 0o777)
