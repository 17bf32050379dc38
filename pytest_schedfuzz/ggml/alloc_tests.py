"""ggml's own allocator tests (``tests/test-alloc.cpp`` of ggml 0.25.3) translated to C
(``alloc_tests.c``), built against a ggml and run in a process of their own: what ggml-alloc did
in each case, for ``tests/oracle/test_ggml_alloc_tests.py`` to hold the reference allocator to.

The program links the ``libggml-base`` it is built for (by that folder, its rpath) and includes
that ggml's internal headers (``ggml-backend-impl.h``: the test's dummy backend implements the
interfaces; ``graph_optimize``'s parameters make it 0.25.3's or newer), found as ``build_fake_gpu``
finds them (``build.ggml_source_for``). A crash in ggml ends that process only:
``run_alloc_tests`` raises ``AllocTestsCrash`` with ggml's message.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from ..builds.compile import compiler, ggml_source_for, run_tool
from ..builds.installed import base_library
from ..files import atomic_write, cache_dir

ALLOC_TESTS_SOURCE = Path(__file__).with_name("alloc_tests.c")


class AllocTestsCrash(RuntimeError):
    """The allocator tests' process did not exit cleanly (ggml aborted in a case); the message
    holds what it printed on stderr."""


def build_alloc_tests(lib_dir: Path) -> Path:
    """``schedfuzz-alloc-tests`` (``alloc_tests.c``) compiled against the headers of the ggml whose
    ``libggml-base`` is in ``lib_dir`` and linked to it; cached by the source, the headers it
    includes and the folder, published by an atomic rename."""
    lib_dir = lib_dir.resolve()
    base = base_library(lib_dir)
    src = ggml_source_for(str(base))
    headers = [src / "src" / "ggml-backend-impl.h", src / "src" / "ggml-impl.h", src / "include" / "ggml.h",
               src / "include" / "ggml-backend.h", src / "include" / "ggml-alloc.h"]
    text = ALLOC_TESTS_SOURCE.read_bytes() + b"".join(h.read_bytes() for h in headers) + str(lib_dir).encode()
    digest = hashlib.sha1(text).hexdigest()[:16]
    out = cache_dir() / "alloc_tests" / digest / "schedfuzz-alloc-tests"
    if out.exists():
        return out
    cc = compiler("ggml's allocator tests")

    def compile_to(tmp: Path) -> None:
        # ggml-impl.h (ggml_op_can_inplace) defines static helpers the program does not use
        run_tool([cc, "-std=c11", "-D_GNU_SOURCE", "-O1", "-Wall", "-Werror", "-Wno-unused-function", "-I", str(src / "include"),
                  "-I", str(src / "src"), "-o", str(tmp), str(ALLOC_TESTS_SOURCE), "-L", str(lib_dir), f"-l:{base.name}",
                  f"-Wl,-rpath,{lib_dir}", "-Wl,--disable-new-dtags"])

    return atomic_write(out, compile_to, 0o777)


def run_alloc_tests(program: Path, case: str | None = None, timeout: float = 60.0) -> dict[str, list[dict[str, Any]]]:
    """Run ``program`` (every case, or ``case`` alone): each case's snapshots, in order, by the
    case's name; ``AllocTestsCrash`` when the program does not exit cleanly."""
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    cmd = [str(program), *([case] if case else [])]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        done = proc.stdout.count("\n")
        raise AllocTestsCrash(f"{program.name} exited with {proc.returncode} after {done} snapshots:\n{proc.stderr[-4000:]}")
    out: dict[str, list[dict[str, Any]]] = {}
    for line in proc.stdout.splitlines():
        snapshot = json.loads(line)
        out.setdefault(snapshot["case"], []).append(snapshot)
    return out
