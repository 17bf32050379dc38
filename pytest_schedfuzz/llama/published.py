"""Any published upstream build by name: ``llama.cpp-bNNNN`` is llama.cpp's build bNNNN as the
Release libraries of ``llama-cpp-py-sync==0.NNNN`` (the package follows llama.cpp's master build
by build). On first use the wheel is fetched with pip into the cache and its libraries, its
binding's declarations and its version facts are kept in ``published/llama.cpp-bNNNN``; from
there ``upstream.prebuilt_lib_dir`` makes them loadable, as for the installed ``llama.cpp-b11739``
(which is taken from the installed package, so that it needs no fetch).

What the package tells of a build (``PublishedBuild``): its tag and llama.cpp commit
(``_version.py``, read as text, never imported), and the date its files were packed (the wheel's
own timestamps). The harness checks the rest at the worker's start: its declarations against
the library, its ggml version, whether it has ggml's realloc callback, an RPC library.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from ..builds.compile import BuildError, pip_download
from ..builds.names import PUBLISHED, UPSTREAM
from ..engine import TargetError
from ..files import cache_dir
from .upstream import installed_dir

DISTRIBUTION, PACKAGE = "llama-cpp-py-sync", "llama_cpp_py_sync"
# what is kept of a wheel: its libraries, its binding's declarations and what it says of itself
KEPT = re.compile(rf"{PACKAGE}/(lib[\w-]+\.so(\.\d+)*|_cffi_bindings\.py|_version\.py|native_manifest\.json)")
FACTS = "build.json"


@dataclass(frozen=True)
class PublishedBuild:
    """A published build as its package tells it."""

    name: str  # llama.cpp-bNNNN
    tag: str  # llama.cpp's tag, bNNNN
    commit: str  # llama.cpp's commit (the manifest's full hash where it has one)
    packed: str  # the date the wheel's files were packed, YYYY-MM-DD

    def describe(self) -> str:
        return f"{self.name} ({self.commit[:9] or 'commit unknown'}, packed {self.packed or 'on an unknown date'})"


def number(name: str) -> int:
    """The build number of a published build's name."""
    found = PUBLISHED.fullmatch(name)
    if found is None:
        raise TargetError(f"{name!r} is not a published llama.cpp build's name (llama.cpp-bNNNN)")
    return int(found["number"])


def published_folder(name: str) -> Path:
    """The folder of ``name``'s wheel contents in the cache, fetched and unpacked on first use
    (seconds: about 5 MB)."""
    folder = cache_dir() / "published" / name
    if (folder / FACTS).is_file():
        return folder
    version = f"0.{number(name)}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".tmp-{name}-") as tmp:
        try:
            wheel = pip_download(f"{DISTRIBUTION}=={version}", Path(tmp), source=False)
        except BuildError as e:
            raise TargetError(f"{name}: {e}\n(the published builds are {DISTRIBUTION}'s versions: pip index versions {DISTRIBUTION})") from None
        staging = Path(tmp) / name
        facts = _unpack(wheel, staging)
        (staging / FACTS).write_text(json.dumps(asdict(PublishedBuild(name, *facts)), indent=1) + "\n")
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / FACTS).is_file():  # not another process having made it first
                raise
    return folder


def _unpack(wheel: Path, into: Path) -> tuple[str, str, str]:
    """The wheel's libraries, declarations and version facts, flat in ``into``; (tag, commit,
    date packed)."""
    into.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        kept = [i for i in z.infolist() if KEPT.fullmatch(i.filename)]
        for info in kept:
            with z.open(info) as src, open(into / Path(info.filename).name, "wb") as out:
                shutil.copyfileobj(src, out)
        stamp = next((i.date_time for i in kept if i.filename.endswith("_version.py")), None)
    packed = datetime(*stamp).date().isoformat() if stamp and stamp[0] > 1980 else ""
    return (*_version_facts(into), packed)


def _version_facts(folder: Path) -> tuple[str, str]:
    """(tag, commit) as the package's ``_version.py`` and ``native_manifest.json`` give them."""
    version = (folder / "_version.py").read_text() if (folder / "_version.py").is_file() else ""
    tag = re.search(r"__llama_cpp_tag__\s*=\s*['\"]([^'\"]*)", version)
    commit = re.search(r"__llama_cpp_commit__\s*=\s*['\"]([^'\"]*)", version)
    manifest = folder / "native_manifest.json"
    full = json.loads(manifest.read_text()).get("llama_cpp_commit", "") if manifest.is_file() else ""
    return tag[1] if tag else "", full or (commit[1] if commit else "")


def build_facts(name: str, fetch: bool = False) -> PublishedBuild | None:
    """What the package told of a published build: None where it was not fetched (``fetch``:
    fetch it now). The installed ``llama.cpp-b11739`` not fetched: without the date its wheel was
    packed, which only the wheel tells."""
    facts = cache_dir() / "published" / name / FACTS
    if not facts.is_file() and fetch:
        published_folder(name)
    if facts.is_file():
        return PublishedBuild(**json.loads(facts.read_text()))
    folder = installed_dir() if name == UPSTREAM else None
    return None if folder is None else PublishedBuild(name, *_version_facts(folder), "")


def published_names() -> list[str]:
    """Every published build's name, the oldest first, as the package index lists the package's
    versions (``pip index versions``); a ``TargetError`` where it cannot be asked."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "--disable-pip-version-check", DISTRIBUTION]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    listed = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or listed is None:
        said = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("WARNING"))[-800:]
        raise TargetError(f"pip could not list {DISTRIBUTION}'s versions (the published builds):\n{said}")
    numbers = {int(m[1]) for v in listed[1].split(",") if (m := re.fullmatch(r"\s*0\.(\d+)\s*", v))}  # 0.10330.2: a re-release, skipped
    return [f"llama.cpp-b{n}" for n in sorted(numbers)]
