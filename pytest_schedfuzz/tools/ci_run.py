"""A profile's run of the plugin on one library folder, in a fresh folder with a copy of the
corpus: what ``schedfuzz mutate`` and ``schedfuzz coverage`` measure."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def run_ci_profile(lib: Path, corpus: Path, budget: float | None, profile: str = "ci", properties: Sequence[str] = (),
                   extra: Sequence[str] = (), tag: str = "run") -> subprocess.CompletedProcess[str]:
    """``pytest --schedfuzz --schedfuzz-profile=PROFILE --schedfuzz-lib=LIB`` in a temporary folder
    holding a copy of ``corpus``; its output and exit status."""
    with tempfile.TemporaryDirectory(prefix=f"schedfuzz-{tag}-") as tmp:
        shutil.copytree(corpus, Path(tmp) / "corpus")
        cmd = [sys.executable, "-m", "pytest", "--schedfuzz", f"--schedfuzz-profile={profile}", f"--schedfuzz-lib={lib}",
               "-m", "schedfuzz", "-p", "no:cacheprovider", "-q", "-rf", *extra]
        if properties:
            cmd.append(f"--schedfuzz-properties={','.join(properties)}")
        if budget is not None:
            cmd.append(f"--schedfuzz-budget={budget}")
        return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
