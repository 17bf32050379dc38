"""Cached builds (``builds.compile.publish_build``): several processes asking for one build at once
(pytest-xdist workers, a campaign's hosts) get it built once, and none deletes a folder another
is building in."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from pytest_schedfuzz.builds.compile import publish_build


def _make_slowly(folder: Path) -> None:
    """A build that takes a while and checks, before it publishes, that its files are still there."""
    lib = folder / "lib"
    lib.mkdir(parents=True)
    (lib / "libggml-base.so").write_text("built by one process\n")
    with open(folder.parent / "builders.log", "a") as log:
        log.write(f"{folder.name}\n")
    time.sleep(0.5)
    assert (lib / "libggml-base.so").exists(), "another builder deleted this build's folder"
    (lib / "BUILT").write_text("[]\n")


def _build(out: str, in_place: bool) -> str:
    return str(publish_build(Path(out), _make_slowly, in_place=in_place))


@pytest.mark.parametrize("in_place", [False, True], ids=["renamed", "in-place"])
def test_two_processes_building_one_cache_key_both_succeed(tmp_path: Path, in_place: bool):
    out = tmp_path / "builds" / "ggml-0.25.3-0123456789abcdef"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.starmap(_build, [(str(out), in_place)] * 2)
    assert results == [str(out)] * 2
    assert (out / "lib" / "BUILT").exists() and (out / "lib" / "libggml-base.so").exists()
    assert len((out.parent / "builders.log").read_text().splitlines()) == 1, "the second process built again"
    assert [p.name for p in out.parent.iterdir() if p.name.endswith(".building")] == []


def test_a_failed_build_leaves_nothing_half_built(tmp_path: Path):
    out = tmp_path / "builds" / "x"

    def fail(folder: Path) -> None:
        (folder / "lib").mkdir(parents=True)
        raise RuntimeError("cmake failed")

    with pytest.raises(RuntimeError, match="cmake failed"):
        publish_build(out, fail)
    assert not out.exists() and not any(p.name.endswith(".building") for p in out.parent.iterdir())
    assert publish_build(out, _make_slowly) == out and (out / "lib" / "BUILT").exists()
