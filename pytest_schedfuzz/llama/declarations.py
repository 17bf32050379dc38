"""A llama.cpp build's own declarations: the C types and functions the llama worker exchanges
with its libllama, read from that build and checked against its library.

Struct layouts change every few weeks on llama.cpp master (``llama_context_params`` gained
``moe_cache_size`` between 0.3.36 and b11739, shifting every field after it), so nothing here is
written by hand for one version. The declarations come from the build, as C text CFFI parses
(``cffi.FFI.cdef``), from the first source in ``SOURCES`` that has them:

* its headers, ``llama.h`` with ggml's beside it: where a llama.cpp checkout keeps them relative
  to ``build/bin``, where llama-cpp-python installs them (``site-packages/include``), or where the
  seeds' build keeps them; the C preprocessor (``gcc -E``) makes them plain declarations;
* the cdef of the binding a prebuilt build ships with (llama-cpp-py-sync's ``_cffi_bindings.py``,
  or the copy ``upstream.py`` puts beside its libraries as ``llama.cdef``).

``parse`` turns the text into a ``cffi.FFI``. The worker then calls the library through ctypes
types made from the parsed declarations (``Bindings``), and ``check_bindings`` compares them with
the library itself before any workload: every function the worker calls is exported, every struct
a function returns by value is as large as the library writes it, and its defaults hold values
its declared types allow. What cannot be established is refused, naming what is missing.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import os
import platform
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine import TargetError
from ..files import cache_dir

# the C library headers llama.h and ggml.h include: empty, since CFFI knows their types (size_t,
# int32_t, bool, FILE as an opaque type)
STD_HEADERS = ("stdint.h", "stddef.h", "stdbool.h", "stdio.h", "stdlib.h", "string.h", "stdarg.h")
# the export macros and attributes, defined away before the preprocessor reads the headers
DEFINES = ("-D__attribute__(x)=", "-DLLAMA_API=", "-DGGML_API=", "-DGGML_BACKEND_API=", "-DDEPRECATED(f,h)=f",
           "-DGGML_DEPRECATED(f,h)=f", "-DGGML_RESTRICT=", "-D__restrict__=", "-D__restrict=")
BINDING_CDEF = ("_cffi_bindings.py", "_LLAMA_H_CDEF")  # llama-cpp-py-sync's binding: its file, the variable holding llama.h
CDEF_FILE = "llama.cdef"  # a cdef beside the libraries (upstream.py writes the binding's there)
RPC_HEADER = "ggml-rpc.h"  # read with llama.h where a build's headers have it (a binding's cdef has it already)


@dataclass(frozen=True)
class Declarations:
    """Where a build's declarations were read (``source``, said in the run's header) and the C
    text CFFI parses."""

    source: str
    cdef: str


def _header_dirs(lib_dir: Path) -> Iterator[tuple[Path, ...]]:
    """Include folders of a build whose libraries are in ``lib_dir`` (or, for a folder of links,
    where its libllama really is), most specific first: the seeds' build (``lib`` beside
    ``include``), a llama.cpp checkout (``build/bin``), llama-cpp-python's
    (``site-packages/llama_cpp/lib``, headers in ``site-packages/include``)."""
    for folder in dict.fromkeys((lib_dir, (lib_dir / "libllama.so").resolve().parent)):  # and where a linked libllama is
        for up in (folder.parent, folder.parent.parent):
            yield up / "include", up / "ggml" / "include"


def from_headers(lib_dir: Path) -> Declarations | None:
    for dirs in _header_dirs(lib_dir):
        if (dirs[0] / "llama.h").is_file():
            return headers(dirs[0] / "llama.h", [d for d in dirs if d.is_dir()])
    return None


def from_binding(lib_dir: Path) -> Declarations | None:
    cdef = lib_dir / CDEF_FILE
    if cdef.is_file():
        return Declarations(str(cdef), cdef.read_text())
    path = lib_dir / BINDING_CDEF[0]
    return Declarations(f"{path} ({BINDING_CDEF[1]})", binding_cdef(path)) if path.is_file() else None


# where a build's declarations may be, in order
SOURCES: tuple[Callable[[Path], Declarations | None], ...] = (from_headers, from_binding)


def find(lib_dir: Path) -> Declarations:
    """The declarations of the build in ``lib_dir``, parsed once here so that a header CFFI cannot
    read is refused before any worker starts."""
    for source in SOURCES:
        found = source(lib_dir)
        if found is not None:
            parse(found)
            return found
    raise TargetError(
        f"llama library folder {lib_dir}: no declarations of this build found: no llama.h in "
        f"{', '.join(str(d[0]) for d in _header_dirs(lib_dir))}, no {CDEF_FILE} or {BINDING_CDEF[0]} beside the libraries. "
        "The harness reads struct layouts from the build itself; keep the checkout's include/ folders beside build/bin"
    )


def headers(llama_h: Path, include: list[Path]) -> Declarations:
    """``llama_h`` and the ggml headers it includes (and ``ggml-rpc.h`` where the build has it),
    preprocessed into declarations CFFI reads:
    the standard headers stubbed, export macros and attributes defined away, ``extern`` dropped,
    and the one constant expression CFFI does not evaluate (``GGML_MAX_OP_PARAMS / sizeof(int32_t)``,
    an array length in ``struct ggml_tensor``) computed."""
    stub = cache_dir() / "std-stub"
    stub.mkdir(parents=True, exist_ok=True)
    for name in STD_HEADERS:
        if not (stub / name).exists():
            (stub / name).write_text("")
    # ggml-rpc.h too, where the build has it (llama.h does not include it): the RPC client's own
    # functions the worker calls (its round trip before a context is freed, ``llama_worker.Llama``)
    rpc = [f"-include{RPC_HEADER}"] if any((d / RPC_HEADER).is_file() for d in include) else []
    cmd = ["gcc", "-E", "-P", "-nostdinc", f"-I{stub}", *[f"-I{d}" for d in include], *DEFINES, *rpc, str(llama_h)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TargetError(f"{llama_h}: the C preprocessor (gcc -E) could not read it: {e}") from None
    if out.returncode:
        raise TargetError(f"{llama_h}: the C preprocessor (gcc -E) refused it:\n{out.stderr[-2000:]}")
    sizes = {"int32_t": 4, "int64_t": 8, "float": 4, "double": 8}
    text = re.sub(r"(\d+)\s*/\s*sizeof\((\w+)\)", lambda m: str(int(m[1]) // sizes[m[2]]), out.stdout)
    return Declarations(str(llama_h), re.sub(r"\bextern\s+", "", text))


def binding_cdef(path: Path) -> str:
    """The llama.h cdef of a llama-cpp-py-sync binding, read from its source (``ast``): importing
    it would load its libllama in this process."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError) as e:
        raise TargetError(f"{path}: cannot read the binding's declarations: {e}") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == BINDING_CDEF[1] for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise TargetError(f"{path}: no {BINDING_CDEF[1]} (the binding's llama.h declarations) in it")


def parse(decl: Declarations) -> Any:
    """A ``cffi.FFI`` holding ``decl``; a ``TargetError`` naming the source where CFFI cannot read
    it. Headers declare a typedef more than once (``override``)."""
    import cffi

    ffi = cffi.FFI()
    try:
        ffi.cdef("typedef struct FILE FILE;\n" + decl.cdef, override=True)
    except (cffi.CDefError, cffi.FFIError, AssertionError) as e:
        raise TargetError(f"declarations of {decl.source}: CFFI cannot read them: {e}") from None
    return ffi


# ---------------------------------------------------------------------------- ctypes from them

_INTEGERS = {(1, True): ctypes.c_int8, (1, False): ctypes.c_uint8, (2, True): ctypes.c_int16, (2, False): ctypes.c_uint16,
             (4, True): ctypes.c_int32, (4, False): ctypes.c_uint32, (8, True): ctypes.c_int64, (8, False): ctypes.c_uint64}
_PRIMITIVES = {"float": ctypes.c_float, "double": ctypes.c_double, "_Bool": ctypes.c_bool, "char": ctypes.c_char}


class DeclaredStruct(ctypes.Structure):
    """A struct made from declarations: setting a field it does not have is an error (a plain
    ctypes Structure takes it as a Python attribute, and the library never sees the value)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self).FIELDS:
            raise AttributeError(f"struct {type(self).__name__} of this build has no field {name!r}")
        super().__setattr__(name, value)


class Bindings:
    """libllama's functions, structs, typedefs and enum constants by name, as ctypes objects made
    from the build's declarations. A pointer is ``c_void_p`` unless it points to a number
    (``POINTER``, to index it: ``batch.token[j]``, the logits) or is a C string; enums are their
    declared size; callbacks are ``CFUNCTYPE``; structs are ``DeclaredStruct`` with CFFI's offsets."""

    def __init__(self, ffi: Any, lib_path: str) -> None:
        self.ffi = ffi
        self.lib_path = lib_path
        self.clib = ffi.dlopen(lib_path)  # CFFI's view: function types and enum values
        self.dll = ctypes.CDLL(lib_path)
        self.types: dict[str, Any] = {}
        self.undeclared: set[str] = set()  # names asked for and not declared: asked again, no parse

    def __getattr__(self, name: str) -> Any:
        import cffi

        if name in self.__dict__.get("undeclared", ()):  # (before __init__ too)
            raise AttributeError(f"{name} is not declared in this build's declarations")
        ffi = self.ffi
        try:
            value = getattr(self.clib, name)
        except AttributeError:
            value = None
        except Exception as e:  # declared, not in the library
            raise AttributeError(f"{name}: {e}") from None
        if isinstance(value, int):
            self.__dict__[name] = value
            return value
        if value is not None:
            ftype = ffi.typeof(value)
            fn = getattr(self.dll, name)
            fn.restype = None if ftype.result.kind == "void" else self.ctype(ftype.result)
            fn.argtypes = [self.ctype(a) for a in ftype.args]
            self.__dict__[name] = fn
            return fn
        for cname in (name, f"struct {name}"):
            try:
                t = ffi.typeof(cname)
            except (cffi.CDefError, cffi.FFIError, KeyError):
                continue
            if t.kind == "struct" and t.fields is None:  # CFFI makes any unknown "struct X" an opaque one
                break
            # kept: CFFI caches the types it parsed, not a name it failed to parse, and a struct
            # without a typedef fails as ``name`` before ``struct name`` (a pycparser run each time)
            found = self.__dict__[name] = self.ctype(t.item if t.kind == "pointer" and t.item.kind == "function" else t)
            return found
        self.undeclared.add(name)
        raise AttributeError(f"{name} is not declared in this build's declarations")

    def has(self, name: str) -> bool:
        try:
            getattr(self, name)
        except AttributeError:
            return False
        return True

    def ctype(self, t: Any) -> Any:
        kind = t.kind
        if kind == "primitive":
            if t.cname in _PRIMITIVES:
                return _PRIMITIVES[t.cname]
            size = self.ffi.sizeof(t)
            signed = int(self.ffi.cast(t, -1)) < 0
            return _INTEGERS[(size, signed)]
        if kind == "enum":
            return _INTEGERS[(self.ffi.sizeof(t), any(v < 0 for v in t.elements))]
        if kind == "pointer":
            item = t.item
            if item.kind == "primitive" and item.cname == "char":
                return ctypes.c_char_p
            if item.kind in ("primitive", "enum"):
                return ctypes.POINTER(self.ctype(item))
            if item.kind == "pointer" and item.item.kind in ("primitive", "enum") and item.item.cname != "char":
                return ctypes.POINTER(ctypes.POINTER(self.ctype(item.item)))
            return ctypes.c_void_p
        if kind == "array":
            return self.ctype(t.item) * t.length
        if kind == "function":
            return ctypes.CFUNCTYPE(None if t.result.kind == "void" else self.ctype(t.result), *[self.ctype(a) for a in t.args])
        if kind in ("struct", "union"):
            return self._struct(t)
        raise TypeError(f"{t.cname}: a {kind} the harness cannot pass to ctypes")

    def _struct(self, t: Any) -> Any:
        if t.cname in self.types:
            return self.types[t.cname]
        if t.fields is None:
            raise TypeError(f"{t.cname} is opaque in this build's declarations")
        base = DeclaredStruct if t.kind == "struct" else ctypes.Union
        name = t.cname.split()[-1]
        fields = [(f or f"_anonymous{i}", self.ctype(ft.type)) for i, (f, ft) in enumerate(t.fields)]
        cls = type(name, (base,), {"_fields_": fields, "FIELDS": frozenset(f for f, _ in fields)})
        for (f, ft), (field, _) in zip(t.fields, fields):
            if getattr(cls, field).offset != ft.offset:
                raise TypeError(f"{t.cname}.{f}: ctypes lays it at {getattr(cls, field).offset}, the declarations at {ft.offset}")
        if ctypes.sizeof(cls) != self.ffi.sizeof(t):
            raise TypeError(f"{t.cname}: ctypes makes it {ctypes.sizeof(cls)} bytes, the declarations {self.ffi.sizeof(t)}")
        self.types[t.cname] = cls
        return cls


# ---------------------------------------------------------------------------- checked against the library

# functions returning a struct by value, called with no arguments, whose size and defaults show the layout
DEFAULTS = ("llama_model_default_params", "llama_context_default_params")
_CANARIES = (0xA5, 0x5A)


def check_bindings(b: Bindings, functions: tuple[str, ...]) -> list[str]:
    """What does not match between the declarations and the library: ``functions`` the worker
    calls that the declarations lack or the library does not export; for each of ``DEFAULTS``,
    a struct size other than the library writes (read on x86-64, where the caller passes the
    struct's memory as a hidden first argument) and defaults its declared types do not allow (a
    bool other than 0 or 1, an enum value the declarations do not name: what a shifted field
    holds). An empty list: they match."""
    wrong = []
    for name in functions:
        try:
            getattr(b, name)
        except (AttributeError, TypeError) as e:
            wrong.append(f"{name}: {e}")
    for name in DEFAULTS:
        if name in wrong:
            continue
        ftype = b.ffi.typeof(getattr(b.clib, name))
        declared = b.ffi.sizeof(ftype.result)
        written = _written_size(b.dll, name, declared)
        if written is not None and written != declared:
            wrong.append(f"{name} writes a {written}-byte {ftype.result.cname}; the declarations make it {declared} bytes")
            continue
        wrong += _implausible(b, name, getattr(b, name)(), ftype.result)
    return wrong


def declares(ffi: Any, struct: str) -> bool:
    """Whether the declarations give ``struct``'s fields (a binding may leave it opaque)."""
    import cffi

    try:
        return ffi.typeof(f"struct {struct}").fields is not None
    except (cffi.CDefError, cffi.FFIError, KeyError):
        return False


def check_struct(ffi: Any, struct: str, offsets: dict[str, int]) -> str:
    """"" where ``struct``, if declared, has each of ``offsets``' fields at that offset (another
    binding's layout of it, such as ggml-python's ``ggml_tensor``); else what differs."""
    if not declares(ffi, struct):
        return ""
    declared = {f: ft.offset for f, ft in ffi.typeof(f"struct {struct}").fields}
    wrong = [f"{f} at {at}, declared at {declared.get(f, 'nowhere')}" for f, at in offsets.items() if declared.get(f) != at]
    return "; ".join(wrong)


def _written_size(dll: ctypes.CDLL, name: str, declared: int) -> int | None:
    """How many bytes the library's ``name()`` writes into the struct it returns (rounded up to 8),
    or None where that cannot be read (not x86-64, or the struct returns in registers)."""
    if platform.machine() not in ("x86_64", "AMD64") or declared <= 16:
        return None
    fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(ctypes.cast(getattr(dll, name), ctypes.c_void_p).value)
    extent = 0
    for canary in _CANARIES:
        buf = (ctypes.c_uint8 * (declared + 256))(*([canary] * (declared + 256)))
        fn(ctypes.addressof(buf))
        extent = max(extent, max((i + 1 for i, x in enumerate(buf) if x != canary), default=0))
    return -(-extent // 8) * 8


def _implausible(b: Bindings, name: str, value: Any, t: Any) -> list[str]:
    out = []
    raw = ctypes.string_at(ctypes.addressof(value), ctypes.sizeof(value))
    for f, ft in t.fields:
        kind = ft.type.kind
        if kind == "primitive" and ft.type.cname == "_Bool" and raw[ft.offset] > 1:
            out.append(f"{name}(): {t.cname}.{f} holds {raw[ft.offset]}, not a bool")
        elif kind == "enum":
            v = int.from_bytes(raw[ft.offset:ft.offset + b.ffi.sizeof(ft.type)], "little", signed=True)
            if v not in ft.type.elements:
                out.append(f"{name}(): {t.cname}.{f} holds {v}, not one of {ft.type.cname}'s values")
    return out


class DeclarationsError(RuntimeError):
    """The declarations do not match the library (``check_bindings``): a usage error, not a finding."""


# how the target hands a worker its build's declarations: where they were read, and a file of their text
SOURCE_ENV, CDEF_ENV = "SCHEDFUZZ_LLAMA_DECLARATIONS", "SCHEDFUZZ_LLAMA_CDEF"


def cdef_file(decl: Declarations) -> Path:
    """``decl``'s text in a cache file named by its digest (the worker reads it)."""
    path = cache_dir() / "declarations" / f"{hashlib.sha1(decl.cdef.encode()).hexdigest()[:16]}.cdef"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(decl.cdef)
        tmp.replace(path)
    return path
