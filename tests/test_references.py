"""Every ``module.Name`` reference in the docstrings, comments and C of the package, the reference
and the tests, and every `module.Name` in ``docs/``, names something that exists: a module of
ours (by any dotted tail of its path: ``rpc.RpcServers``, ``process.rpc.RpcServers``) and what
follows it, or a class or function of ours and its attribute (``Fuzzer.fuzz``; an attribute a
method sets, ``self.x = ...``, counts). A reference whose first word is none of ours (ggml's C,
``llama.cpp``, a file name) is not ours to check."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest_schedfuzz

ROOT = Path(__file__).resolve().parent.parent
FILE_SUFFIXES = {"c", "h", "py", "md", "json", "cpp", "so", "txt", "in", "yml", "yaml", "toml", "patch", "gguf", "cdef", "svg", "png", "dot",
                 "cfg", "ini", "cmake", "log", "lock"}
DOC_REF = re.compile(r"``([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?``")
MD_REF = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")


@cache
def _ours() -> tuple[dict[str, list[ModuleType]], dict[str, list[Any]]]:
    """Our modules by every dotted tail of their names, and our classes and functions by name."""
    modules = {info.name: importlib.import_module(info.name) for info in pkgutil.walk_packages(pytest_schedfuzz.__path__, "pytest_schedfuzz.")}
    modules["pytest_schedfuzz"] = pytest_schedfuzz
    for path in (ROOT / "reference").glob("*.py"):
        name = "reference" if path.stem == "__init__" else f"reference.{path.stem}"
        modules[name] = importlib.import_module(name)
    by_tail: dict[str, list[ModuleType]] = {}
    for full, module in modules.items():
        parts = full.split(".")
        for k in range(len(parts)):
            by_tail.setdefault(".".join(parts[k:]), []).append(module)
    by_name: dict[str, list[Any]] = {}
    for module in modules.values():
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "").startswith(("pytest_schedfuzz", "reference")):
                by_name.setdefault(name, []).append(obj)
    return by_tail, by_name


def _has(obj: Any, attr: str) -> tuple[bool, Any]:
    """Whether ``obj`` has ``attr``, and what it is (None where only its class declares it: an
    annotation, or a method setting ``self.attr``)."""
    if hasattr(obj, attr):
        return True, getattr(obj, attr)
    if inspect.isclass(obj):
        for c in obj.__mro__:
            try:
                source = inspect.getsource(c)
            except (TypeError, OSError):
                source = ""
            if attr in getattr(c, "__annotations__", {}) or re.search(rf"self\.{attr}\b\s*(:[^=]*)?=", source):
                return True, None
    return False, None


def _follows(obj: Any, rest: list[str]) -> bool:
    for attr in rest:
        if obj is None:
            return True
        found, obj = _has(obj, attr)
        if not found:
            return False
    return True


def resolves(ref: str) -> bool | None:
    """True where ``ref`` names something of ours, False where it should and does not, None where
    its first word is none of ours."""
    by_tail, by_name = _ours()
    parts = ref.split(".")
    if parts[-1] in FILE_SUFFIXES or ref == "llama.cpp":
        return None
    ours = False
    for k in range(len(parts), 0, -1):
        for module in by_tail.get(".".join(parts[:k]), []):
            ours = True
            if _follows(module, parts[k:]):
                return True
    if parts[0] in by_name:
        return any(_follows(obj, parts[1:]) for obj in by_name[parts[0]])
    return False if ours else None


def _stale(path: Path) -> list[str]:
    """The references in ``path`` that name nothing: a Python file's docstrings and comments, a C
    file's text, a Markdown page's code spans."""
    text = path.read_text()
    if path.suffix == ".md":
        found = MD_REF.findall(text)
    elif path.suffix == ".py":
        docs = [ast.get_docstring(n, clean=False) or "" for n in ast.walk(ast.parse(text))
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
        found = [ref for chunk in docs + comments for ref in DOC_REF.findall(chunk)]
    else:
        found = DOC_REF.findall(text)
    return [f"{path.relative_to(ROOT)}: {ref}" for ref in found if resolves(ref) is False]


def test_a_stale_reference_is_caught_and_a_live_one_is_not() -> None:
    assert resolves("process.rpc.RpcServers.ensure") and resolves("rpc.ServerProgram") and resolves("Fuzzer.fuzz")
    assert resolves("Checks.stats")  # an attribute its class declares
    assert resolves("properties.base.REGISTRY") is False and resolves("Llama.check_graph_head") is False
    assert resolves("ggml_backend_sched.graph") is None and resolves("llama.cpp") is None and resolves("fake_gpu.c") is None


def test_every_reference_in_the_sources_and_the_docs_names_something() -> None:
    paths = [*(ROOT / "pytest_schedfuzz").rglob("*.py"), *(ROOT / "pytest_schedfuzz").rglob("*.c"), *(ROOT / "pytest_schedfuzz").rglob("*.in"),
             *(ROOT / "reference").glob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    assert [stale for path in sorted(paths) for stale in _stale(path)] == []
