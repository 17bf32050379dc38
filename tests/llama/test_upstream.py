"""The fourth built-in llama.cpp, ``llama.cpp-b11739``: the libraries of the wheel
``llama-cpp-py-sync==0.11739``, in a cache folder named as llama.cpp's build names them and, on
this machine's glibc (older than the wheel's 2.38), patched to load there.

Nothing here loads a library into the test process (it would shadow llama-cpp-python's ggml in
later tests): loading is tried in child processes, through ctypes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_schedfuzz.engine import TargetError
from pytest_schedfuzz.llama import upstream
from pytest_schedfuzz.llama.declarations import CDEF_FILE
from pytest_schedfuzz.llama.upstream import (
    C23_SYMBOLS,
    LIBRARIES,
    NEEDED_GLIBC,
    OPTIONAL_LIBRARIES,
    SHIM,
    UPSTREAM,
    upstream_cdef,
    upstream_lib_dir,
)

pytestmark = pytest.mark.engine

OLD_GLIBC = upstream._glibc_version() < NEEDED_GLIBC
needs_old_glibc = pytest.mark.skipif(not OLD_GLIBC, reason="glibc >= 2.38: the libraries load as installed, with no shim")


def _child(code: str, *args: str) -> str:
    """Run ``code`` in a fresh Python with ``args`` as ``sys.argv[1:]``; its stdout."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _installed_files() -> dict[str, str]:
    """The installed package's files (its bytecode cache aside) by name, with their digests."""
    package = upstream._package_dir()
    return {str(p.relative_to(package)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(package.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def lib_dir() -> Path:
    return upstream_lib_dir()


def test_the_folder_names_each_library_as_a_llama_cpp_build_does(lib_dir: Path) -> None:
    assert lib_dir.name.startswith(f"{UPSTREAM}-")
    for stem in LIBRARIES:
        link, target = lib_dir / f"{stem}.so", lib_dir / f"{stem}.so.0"
        assert link.is_symlink() and os.readlink(link) == target.name, stem
        assert target.is_file() and not target.is_symlink(), stem
    assert (lib_dir / SHIM).is_file() == OLD_GLIBC


def test_the_libraries_load_here_and_are_upstream_b11739(lib_dir: Path) -> None:
    """libllama and libggml-base load on this machine, report ggml 0.27.0, export the realloc
    callback the seed PR merged, and llama.cpp runs; nothing comes from the installed package."""
    out = _child(
        "import ctypes, json, sys\n"
        "folder = sys.argv[1]\n"
        "llama = ctypes.CDLL(folder + '/libllama.so')\n"
        "base = ctypes.CDLL(folder + '/libggml-base.so')\n"
        "base.ggml_version.restype = llama.llama_print_system_info.restype = ctypes.c_char_p\n"
        "maps = [line.split()[-1] for line in open('/proc/self/maps') if 'lib' in line and '.so' in line]\n"
        "print(json.dumps({'version': base.ggml_version().decode(),\n"
        "                  'callback': hasattr(base, 'ggml_backend_sched_set_realloc_callback'),\n"
        "                  'system': llama.llama_print_system_info().decode(),\n"
        "                  'installed': [m for m in maps if 'llama_cpp_py_sync' in m]}))\n",
        str(lib_dir))
    seen = json.loads(out)
    assert seen["version"] == "0.27.0"
    assert seen["callback"]
    assert seen["system"].startswith("CPU :")
    assert seen["installed"] == []


# run in a child with the shim's path: each strto* call as [value, characters read]
SHIM_PROBE = """
import ctypes, json, sys
shim = ctypes.CDLL(sys.argv[1])
end = ctypes.c_void_p()

def parse(name, restype, text, base):
    f = getattr(shim, name)
    f.restype, f.argtypes = restype, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    buf = ctypes.create_string_buffer(text)
    value = f(buf, ctypes.byref(end), base)
    return [value, end.value - ctypes.addressof(buf)]

ones = b"0b" + b"1" * 64
strtol = [(b"0b101", 0), (b"0b101", 2), (b"  -0B11z", 0), (b"0b101", 10), (b"0b2", 0), (b"42", 10), (b"0x1f", 0),
          (b"017", 0), (b"-7", 0), (ones, 0)]
number, word = ctypes.c_int(), ctypes.create_string_buffer(8)
shim.__isoc23_sscanf.restype = ctypes.c_int
read = shim.__isoc23_sscanf(b" 12 ab", b"%d %7s", ctypes.byref(number), word)
print(json.dumps({
    "strtol": [parse("__isoc23_strtol", ctypes.c_long, text, base) for text, base in strtol],
    "strtoul": [parse("__isoc23_strtoul", ctypes.c_ulong, text, 0) for text in (b"0b1111", b"-0b1", b"123")],
    "strtoull": [parse("__isoc23_strtoull", ctypes.c_ulonglong, text, base) for text, base in ((ones, 2), (b"99", 0))],
    "sscanf": [read, number.value, word.value.decode()],
}))
"""


@needs_old_glibc
def test_the_shim_reads_c23_numbers_and_leaves_the_others_to_glibc(lib_dir: Path) -> None:
    """C23 reads 0b101 as 5 where C99 reads 0; everything else is glibc's C99 function."""
    seen = json.loads(_child(SHIM_PROBE, str(lib_dir / SHIM)))
    assert seen["strtol"] == [[5, 5], [5, 5], [-3, 7], [0, 1], [0, 1], [42, 2], [31, 4], [15, 3], [-7, 2], [2**63 - 1, 66]]
    assert seen["strtoul"] == [[15, 6], [2**64 - 1, 4], [123, 3]]
    assert seen["strtoull"] == [[2**64 - 1, 66], [99, 2]]
    assert seen["sscanf"] == [2, 12, "ab"]


@needs_old_glibc
def test_the_patched_copies_need_no_glibc_newer_than_this_one(lib_dir: Path) -> None:
    glibc = upstream._glibc_version()
    for stem in LIBRARIES:
        data = (lib_dir / f"{stem}.so.0").read_bytes()
        assert not [n.version for n in upstream._version_needs(data) if upstream._too_new(n.version, glibc)], stem
        # and the shim's functions are looked up unversioned
        index_of = {name: index for index, names in upstream._symbols_by_version(data).items() for name in names}
        assert all(index_of[s] == 1 for s in C23_SYMBOLS if s in index_of), stem


def test_a_version_need_still_in_use_is_not_unlinked() -> None:
    """On the installed (unpatched) libllama, whose __isoc23_* are still bound to GLIBC_2.38."""
    data = bytearray((upstream._package_dir() / "libllama.so.0").read_bytes())
    need = next(n for n in upstream._version_needs(data) if n.version == "GLIBC_2.38")
    with pytest.raises(TargetError, match=r"still needs GLIBC_2\.38 after patching, for __isoc23_sscanf, __isoc23_strtol"):
        upstream._unlink_version_need(data, need, "libllama.so.0")


def test_a_second_call_reuses_the_folder(lib_dir: Path) -> None:
    before = {p.name: p.lstat().st_ino for p in lib_dir.iterdir()}
    assert upstream_lib_dir() == lib_dir
    assert {p.name: p.lstat().st_ino for p in lib_dir.iterdir()} == before


def test_making_the_folder_leaves_the_installed_package_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made afresh by two processes at once (as pytest-xdist workers would), in an empty cache:
    both get the same complete folder, and no installed file changed."""
    installed = _installed_files()
    monkeypatch.setenv("SCHEDFUZZ_CACHE", str(tmp_path))
    code = "from pytest_schedfuzz.llama.upstream import upstream_lib_dir; print(upstream_lib_dir())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    folders = {Path(out.strip()) for out, _ in results}
    assert len(folders) == 1
    (folder,) = folders
    assert sorted(p.name for p in (tmp_path / "builds").iterdir()) == [folder.name]  # no staging folder left
    names = [f"{stem}.so{suffix}" for stem in (*LIBRARIES, *OPTIONAL_LIBRARIES) for suffix in ("", ".0")] + [SHIM] * OLD_GLIBC + [CDEF_FILE]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    assert _installed_files() == installed


def test_the_cdef_is_the_bindings_without_importing_them() -> None:
    cdef = upstream_cdef()
    assert "struct llama_context_params" in cdef and "moe_cache_size" in cdef
    assert "void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir," in cdef
    assert "llama_cpp_py_sync" not in sys.modules


def test_a_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream, "PACKAGE", "schedfuzz_no_such_package")
    for made in (upstream_lib_dir, upstream_cdef):
        with pytest.raises(TargetError, match=r"==0\.11739, which is not installed: the README's install command"):
            made()


@needs_old_glibc
def test_missing_tools_and_unknown_glibc_symbols_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDFUZZ_CACHE", str(tmp_path))
    gcc = shutil.which("gcc")
    with monkeypatch.context() as m:  # neither on PATH nor beside this Python
        m.setenv("PATH", str(tmp_path))
        m.setattr(sys, "executable", str(tmp_path / "python"))
        m.delenv("CC", raising=False)
        with pytest.raises(TargetError, match="needs a C compiler"):
            upstream_lib_dir()
        if gcc:
            m.setenv("CC", gcc)
            with pytest.raises(TargetError, match="needs patchelf, which is not installed: the README's install command"):
                upstream_lib_dir()
    monkeypatch.setattr(upstream, "C23_SYMBOLS", C23_SYMBOLS[1:])
    with pytest.raises(TargetError, match=r"libllama.so.0 needs __isoc23_strtol of GLIBC_2\.38, newer than this machine's glibc"):
        upstream_lib_dir()
    assert list((tmp_path / "builds").iterdir()) == []  # nothing half-made left behind


def test_replaying_a_gpu_like_case_on_a_headerless_build_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """b11739 ships no ggml headers, so the GPU-like device cannot be built against it: replaying a
    case with one says so (the case is not replayed: exit 3, no verdict), not with a traceback."""
    from pytest_schedfuzz.cases.corpus import Case, save_case
    from pytest_schedfuzz.cli import main
    from pytest_schedfuzz.model.layout import BackendSpec
    from pytest_schedfuzz.model.llama_model import ModelSpec
    from pytest_schedfuzz.model.llama_workload import Devices, LlamaWorkload

    w = LlamaWorkload(ModelSpec(), Devices(n_rpc=0, gpus=(BackendSpec("gpu"),)))
    path = save_case(tmp_path, Case("llama-no-abort", "llama-no-abort[x]", None, "x", 0, engine={"name": "llama.cpp"}, llama=w))
    assert main(["replay", "--llama-lib", "llama.cpp-b11739", str(path)]) == 3
    out = capsys.readouterr()
    assert "  cannot replay it on this build: GPU-like devices: unavailable: " in out.out
    assert "Traceback" not in out.out + out.err


@pytest.mark.engine
def test_a_crash_of_the_cpu_only_run_replays_with_that_run() -> None:
    """A llama-no-abort case found in llama-same-logits' CPU-only run (``run=cpu-only``) is
    replayed with that run, though llama-no-abort alone does not need it: without it the replay
    would call the bug fixed (XPASS)."""
    from pytest_schedfuzz.campaign.fuzz import Fuzzer
    from pytest_schedfuzz.cases.corpus import STARTER_CORPUS, load_case
    from pytest_schedfuzz.profiles import FuzzConfig

    case = load_case(STARTER_CORPUS / "llama-no-abort-call-decode-kind-crash-message-the-worker-was-bac6cc7e4e.json")
    assert "run=cpu-only" in case.signature
    f = Fuzzer(FuzzConfig(database=None, llama_lib=UPSTREAM))
    try:
        assert case.signature in {v.signature() for v in f.replay(case)}
    finally:
        f.close()
