"""The engines' own C, compiled against the ggml under test (``builds.compile`` fetches,
patches and compiles; this module holds what the graph engine and the reproducers build): the
graph worker's helpers, the C encoder, the RPC server and the GPU-like device."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from ..builds.compile import BuildError, compiler, ggml_source_for, run_tool
from ..builds.installed import LibError, base_library, installed_folder, shared_library
from ..files import atomic_write, cache_dir
from ..model.versions import BINDING_OWN
from . import graph_ops

FAKE_GPU_SOURCE = Path(__file__).with_name("fake_gpu.c")
RPC_SERVER_SOURCE = Path(__file__).with_name("rpc_server.c")
# the graph worker's helpers: its log buffer and assignment snapshot, its graph builder
HELPER_SOURCES = (Path(__file__).with_name("observe.c"), Path(__file__).with_name("graph.c"))


def build_helpers() -> Path:
    """``libschedfuzz-worker.so``: the graph worker's helpers (``ggml/observe.c``: its log
    buffer and assignment snapshot; ``ggml/graph.c``: its graph builder, with the ops' C that
    ``graph_ops`` writes from their table). They include no ggml header, so one build serves
    every ggml. Cached by their source."""
    headers = {name: write().encode() for name, write in graph_ops.HEADERS.items()}
    digest = hashlib.sha1(b"".join([*(f.read_bytes() for f in HELPER_SOURCES), *headers.values()])).hexdigest()[:16]
    out = cache_dir() / "worker" / digest / "libschedfuzz-worker.so"
    if out.exists():
        return out
    cc = compiler("the graph worker's helpers")

    def compile_to(tmp: Path) -> None:
        for name, text in headers.items():
            atomic_write(tmp.parent / name, lambda t, text=text: t.write_bytes(text))
        run_tool([cc, "-std=c11", "-D_GNU_SOURCE", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", f"-I{tmp.parent}", "-o", str(tmp),
                  *map(str, HELPER_SOURCES)])

    return atomic_write(out, compile_to, 0o777)


ENCODER_SOURCE = Path(__file__).with_name("encode.c")


def build_encoder() -> Path:
    """``_schedfuzz_encode``: ``program.encode_rows`` in C, a CPython extension built against the
    headers of the Python running this (its sysconfig ``include``). Cached by its source and that
    Python's version; a ``BuildError`` without those headers or a compiler."""
    import sysconfig

    include = sysconfig.get_path("include")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    digest = hashlib.sha1(ENCODER_SOURCE.read_bytes() + sys.version.encode()).hexdigest()[:16]
    out = cache_dir() / "encoder" / digest / f"_schedfuzz_encode{suffix}"
    if out.exists():
        return out
    if not include or not (Path(include) / "Python.h").is_file():
        raise BuildError(f"no Python.h in {include!r} (this Python's development headers) to build the C encoder")
    cc = compiler("the C encoder")

    def compile_to(tmp: Path) -> None:
        # no -Werror: it compiles against the headers of whichever Python runs it
        run_tool([cc, "-std=c11", "-O2", "-fPIC", "-shared", "-Wall", f"-I{include}", "-o", str(tmp), str(ENCODER_SOURCE)])

    return atomic_write(out, compile_to, 0o777)


def build_rpc_server(lib_dir: str | None) -> Path:
    """``schedfuzz-rpc-server`` (``ggml/rpc_server.c``) linked against the ggml of ``lib_dir``
    (``None``: ggml-python's own libraries), with the folder as its ``DT_RPATH`` so that the
    libraries those load come from it too; cached by the source, the folder and the flags."""
    folder = Path(lib_dir).resolve() if lib_dir else installed_folder(BINDING_OWN)
    try:
        libs = [shared_library(folder, "libggml"), shared_library(folder, "libggml-rpc")]
    except LibError as e:
        raise BuildError(f"the RPC server: {e} (ggml must be built with -DGGML_RPC=ON)") from None
    # its test hook (SCHEDFUZZ_RPC_CRASH_AT_COMPUTE) interposes ggml's compute functions: exported (-rdynamic)
    flags = ["-std=c11", "-D_GNU_SOURCE", "-DSCHEDFUZZ_TEST_HOOKS", "-O2", "-Wall", "-Werror", "-rdynamic"]
    digest = hashlib.sha1(RPC_SERVER_SOURCE.read_bytes() + str(folder).encode() + " ".join(flags).encode()).hexdigest()[:16]
    out = cache_dir() / "rpc_server" / digest / "schedfuzz-rpc-server"
    if out.exists():
        return out
    cc = compiler("the RPC server")

    def compile_to(tmp: Path) -> None:
        run_tool([cc, *flags, "-o", str(tmp), str(RPC_SERVER_SOURCE), "-L", str(folder), *(f"-l:{lib.name}" for lib in libs), "-ldl",
                  f"-Wl,-rpath,{folder}", "-Wl,--disable-new-dtags"])

    return atomic_write(out, compile_to, 0o777)


def build_fake_gpu(lib_file: str) -> Path:
    """``libschedfuzz-fake-gpu.so`` (``ggml/fake_gpu.c``) compiled against the headers of the
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
    cc = compiler("the GPU-like device")
    flags = ["-DSCHEDFUZZ_OPTIMIZE_PARAMS"] if "ggml_backend_graph_optimize_params" in impl else []
    linked = base_library(lib_dir).name

    def compile_to(tmp: Path) -> None:
        run_tool([cc, "-std=c11", "-D_GNU_SOURCE", "-O2", "-fPIC", "-shared", *flags, "-I", str(src / "include"), "-I", str(src / "src"),
              "-o", str(tmp), str(FAKE_GPU_SOURCE), "-L", str(lib_dir), f"-l:{linked}", f"-Wl,-rpath,{lib_dir}", "-lpthread"])

    return atomic_write(out, compile_to, 0o777)
