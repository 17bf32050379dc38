"""The reference, compiled with mypyc: the same source, faster (its figure: docs/install.md).

``reference/`` stays the oracle a maintainer reads and edits, in plain Python. ``compile_reference``
has mypyc (mypy's compiler) compile its hot modules (``COMPILED``), unchanged, into a cache folder
named by the digest of every source they were compiled from (``reference/`` and the data model
they read), Python's version and mypy's. ``reference/__init__.py`` asks ``compiled_path`` for that
folder when the package is imported: when it exists for the sources as they are now, it goes first
on the package's ``__path__``, and ``import reference.sched`` loads the compiled module. An edited
source has another digest: its old build is never loaded, the source is (until compiled again).

``SCHEDFUZZ_REFERENCE=source`` imports the source whatever is built: the project's suite does
(its mutation tests patch the reference's functions in place, which compiled callers do not
see), and ``tests/oracle/test_compiled.py`` compares both on drawn scenarios.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reference"
# the passes and ggml-alloc's model; not the package's __init__ and params (imported before the
# package can choose), nor predict (the loop over steps, whose caller may pass a Scheduler subclass)
COMPILED = ("graph", "backends", "alloc", "sched", "rules")
ENV = "SCHEDFUZZ_REFERENCE"  # "source": never the compiled modules
# what the last compiled_path call found (the session header prints it)
status = "source (not imported yet)"


def _mypy_version() -> str | None:
    try:
        return version("mypy")
    except PackageNotFoundError:
        return None


def digest(reference: Path = REFERENCE) -> str:
    """The build's name: the sources mypyc reads (the reference and the data model it types
    against), this Python and mypy."""
    h = hashlib.sha1(f"{sys.version}|{_mypy_version()}".encode())
    for folder in (reference, reference.parent / "pytest_schedfuzz" / "model"):
        for path in sorted(folder.glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def build_dir(reference: Path = REFERENCE) -> Path:
    from .files import cache_dir

    return cache_dir() / "reference" / digest(reference)


def compiled_path(reference: Path = REFERENCE) -> list[str]:
    """Where ``reference``'s compiled modules are, to go first on its ``__path__``: the build for
    the sources as they are, if there is one and ``SCHEDFUZZ_REFERENCE`` is not ``source``; else
    nothing (the source is imported). The build's root goes on ``sys.path``: mypyc's modules share
    one library, imported by name."""
    global status
    if os.environ.get(ENV) == "source":
        status = f"source ({ENV}=source)"
        return []
    try:
        out = build_dir(reference)
    except OSError as e:
        status = f"source (cannot read the sources or the cache: {e})"
        return []
    if not (out / "reference").is_dir():
        status = "source (not compiled for these sources: `schedfuzz device` compiles it)"
        return []
    if str(out) not in sys.path:
        sys.path.append(str(out))
    status = f"compiled with mypyc {_mypy_version()} ({out})"
    return [str(out / "reference")]


def prepare() -> None:
    """Compile the reference for these sources unless it is built, or the source is asked for;
    before anything imports it (``pytest --schedfuzz``'s configuration, ``schedfuzz device``).
    What happens is said on stderr; a failure leaves the source in use, and says why."""
    if os.environ.get(ENV) == "source" or (build_dir() / "reference").is_dir():
        return
    print("schedfuzz: compiling the reference with mypyc (about 15 s, once per version of its sources)", file=sys.stderr)
    done = compile_reference()
    if not done.startswith("compiled"):
        print(f"schedfuzz: reference {done}", file=sys.stderr)


def compile_reference(reference: Path = REFERENCE) -> str:
    """Compile ``COMPILED`` with mypyc (about 15 s, once per version of the sources); what was
    done, or why nothing was (mypy missing, a compiler error): the source is used then."""
    out = build_dir(reference)
    if (out / "reference").is_dir():
        return f"compiled already ({out})"
    if _mypy_version() is None:
        return "not compiled: mypy (its mypyc) is not installed; the source is used"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        work = Path(tmp)
        shutil.copytree(reference, work / "reference", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        # the data model the passes read, typed but not compiled (--follow-imports=silent)
        (work / "pytest_schedfuzz").symlink_to(reference.parent / "pytest_schedfuzz")
        cmd = [sys.executable, "-m", "mypyc", "--ignore-missing-imports", "--follow-imports=silent",
               *(f"reference/{m}.py" for m in COMPILED)]
        run = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env={**os.environ, "MYPYPATH": ""})
        if run.returncode != 0:
            tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
            return f"not compiled: mypyc failed; the source is used:\n{tail}"
        keep = work / "keep"
        (keep / "reference").mkdir(parents=True)
        for m in COMPILED:
            for so in (work / "reference").glob(f"{m}.*.so"):
                shutil.move(str(so), keep / "reference" / so.name)
        for so in work.glob("*__mypyc.*.so"):
            shutil.move(str(so), keep / so.name)
        try:
            os.rename(keep, out)
        except OSError:
            if not (out / "reference").is_dir():  # not another process's build, finished first
                raise
    return f"compiled ({out})"
