"""Writing files that other processes may read at any moment (corpus cases, cached models, the
compiled scheduler hook): a temporary file in the same folder, synced, then renamed into place,
so a reader sees the old file or the whole new one and concurrent writers lose nothing."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(target: Path, write: Callable[[Path], None], mode: int = 0o666) -> Path:
    """Create ``target`` by ``write(temporary path)``; it gets ``mode`` less the umask, as
    ``open`` would give it (``mkstemp`` alone leaves 0600)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, mode & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def cache_dir() -> Path:
    """Where built models and the compiled hook live (``$SCHEDFUZZ_CACHE``, else the user's cache)."""
    base = os.environ.get("SCHEDFUZZ_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "schedfuzz")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path
