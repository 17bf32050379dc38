"""The small C libraries preloaded into the engine workers, and the C stack of a crash.

``build_preload`` compiles one of them (``sched_hook.c``, ``crash_hook.c``) once per source
version into the cache. ``c_stack`` reads what ``crash_hook.c`` printed when the worker died of
a signal and names each frame with ``addr2line`` (the built-in libraries are Debug builds, so
static functions have names too); ``stack_line`` makes the one line a crash is signed by.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..engine import TargetError
from ..files import atomic_write, cache_dir

HERE = Path(__file__).parent
CRASH_HOOK = HERE / "crash_hook.c"
_FRAME = re.compile(r"^schedfuzz-frame (\S+) ([0-9a-f]+)$", re.MULTILINE)
# the objects whose frames say where a crash is: ggml's, llama.cpp's and the GPU-like device's
_OURS = re.compile(r"lib(ggml[\w-]*|llama|schedfuzz-fake-gpu)\.so")


def build_preload(source: Path) -> Path:
    """``source`` compiled to a shared library, once per source version (cached)."""
    text = source.read_bytes()
    out = cache_dir() / f"{source.stem}-{hashlib.sha1(text).hexdigest()[:12]}.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise TargetError(f"no C compiler (cc/gcc) to build {source.name}: install gcc")

    def compile_to(tmp: Path) -> None:
        proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(source), "-ldl"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise TargetError(f"building {source.name} failed:\n{proc.stderr}")

    return atomic_write(out, compile_to, 0o777)


def with_preload(env: dict[str, str], *libs: Path) -> dict[str, str]:
    """``env`` with ``libs`` put first in ``LD_PRELOAD``."""
    env["LD_PRELOAD"] = " ".join(p for p in (*map(str, libs), env.get("LD_PRELOAD", "")) if p)
    return env


def c_stack(stderr: str) -> list[str]:
    """The functions of the last crash's C stack (innermost first), ggml's and llama.cpp's only;
    [] when the worker printed none (an abort, or a build without the hook)."""
    start = stderr.rfind("schedfuzz-crash ")
    if start < 0:
        return []
    frames = [(obj, off) for obj, off in _FRAME.findall(stderr[start:]) if _OURS.search(os.path.basename(obj))]
    names: list[str] = []
    by_obj: dict[str, list[str]] = {}
    for obj, off in frames:
        by_obj.setdefault(obj, []).append(off)
    resolved: dict[tuple[str, str], str] = {}
    tool = shutil.which("addr2line")
    for obj, offs in by_obj.items():
        funcs = _addr2line(tool, obj, offs) if tool else []
        for off, fn in zip(offs, funcs + ["??"] * (len(offs) - len(funcs))):
            resolved[(obj, off)] = fn if fn != "??" else f"{os.path.basename(obj)}+0x{off}"
    for obj, off in frames:
        names.append(resolved[(obj, off)])
    return names


def _addr2line(tool: str, obj: str, offs: list[str]) -> list[str]:
    try:
        proc = subprocess.run([tool, "-f", "-C", "-e", obj, *[f"0x{o}" for o in offs]], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = proc.stdout.splitlines()
    # -f: two lines a frame, the function then file:line; a C++ name loses its arguments,
    # template arguments and return type ("void f<float, long>(...)" -> "f")
    names = [re.sub(r"<.*>", "", re.sub(r"\(.*$", "", lines[i])).strip() for i in range(0, len(lines) - 1, 2)]
    return [n.split()[-1] if n else "??" for n in names]


def stack_line(stderr: str, depth: int = 8) -> str:
    """``C stack: f < g < h ...`` (innermost first, ``depth`` frames), or "" without a stack."""
    frames = c_stack(stderr)
    return f"C stack: {' < '.join(frames[:depth])}" if frames else ""

