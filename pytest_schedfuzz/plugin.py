"""pytest glue: ``pytest --schedfuzz`` fuzzes ggml's scheduler. Nothing here runs without it.

The options and the hooks; the run's state is ``session.SchedfuzzSession``, what it collects ``items``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("schedfuzz", "fuzz ggml's backend scheduler against a reference model")

    def add(name: str, help: str, ini_type: str = "string", **kw: Any) -> None:
        dest = name.replace("-", "_")
        group.addoption(f"--{name}", dest=dest, default=None, help=f"{help} (ini: {dest})", **kw)
        parser.addini(dest, help, type=ini_type, default=None)  # type: ignore[arg-type]

    add("schedfuzz", "fuzz the scheduler: collect the property suite and the corpus", "bool", action="store_true")
    add("schedfuzz-profile", "dev (fast, local), ci (deterministic, time-budgeted), nightly (large)")
    add("schedfuzz-examples", "Hypothesis examples per property (overrides the profile)", type=int)
    add("schedfuzz-seed", "seed of the run (printed in the header; default: random, 0 under ci)", type=int)
    add("schedfuzz-budget", "seconds for the whole fuzzing run (overrides the profile)", type=float)
    add("schedfuzz-target", "implementation under test as MODULE:FACTORY (default: the real ggml)")
    add("schedfuzz-lib", "the ggml under test: ggml-0.25.3 (default), ggml-0.15.3, ggml-0.25.3-seed (the seeds' ggml, built on first use), "
        "or your build's folder (env SCHEDFUZZ_GGML_LIB)")
    add("schedfuzz-llama-lib", "the llama.cpp under test: llama.cpp-0.3.36 (default: llama-cpp-python's), llama.cpp-0.3.36-seed (the seeds' "
        "system, built on first use), llama.cpp-b11739 (upstream, Release, prebuilt), or your build's library folder, e.g. build/bin "
        "(env SCHEDFUZZ_LLAMA_LIB)")
    add("schedfuzz-policy", "scheduler reuse policy MODULE:CALLABLE(new, cur) -> bool (default: can_reuse)")
    add("schedfuzz-reference", "replace the reference's predict with MODULE:CALLABLE(scenario) -> Trace")
    add("schedfuzz-properties", "comma-separated property ids to fuzz (default: all)")
    add("schedfuzz-corpus", "directory of saved cases, replayed first; new findings are written there (default: corpus)")
    add("schedfuzz-db", "share the campaign with other hosts on Redis: redis://HOST:PORT/N (see docs/shared-campaign.md)")
    add("schedfuzz-known", "builtin (default): the starter corpus's known upstream bugs are not reported again; none: report them too")
    group.addoption(
        "--schedfuzz-rereserve", "--no-schedfuzz-rereserve", dest="schedfuzz_rereserve", default=None,
        action=_BoolFlag, nargs=0, help="driver re-reserves the worst case on topology changes (default on; ini: schedfuzz_rereserve)",
    )
    parser.addini("schedfuzz_rereserve", "driver re-reserves the worst case on topology changes", type="bool", default=None)  # type: ignore[arg-type]
    group.addoption(
        "--schedfuzz-keep-going", "--no-schedfuzz-keep-going", dest="schedfuzz_keep_going", default=None,
        action=_BoolFlag, nargs=0, help="campaign: after a finding, save it and fuzz on; report every distinct signature "
        "(default: on under the nightly profile; ini: schedfuzz_keep_going)",
    )
    parser.addini("schedfuzz_keep_going", "campaign mode: go on after a finding", type="bool", default=None)  # type: ignore[arg-type]
    group.addoption(
        "--schedfuzz-size-oracle", "--no-schedfuzz-size-oracle", dest="schedfuzz_size_oracle", default=None,
        action=_BoolFlag, nargs=0, help="replay every scenario, not one in ten, under GGML_SCHED_DEBUG_REALLOC=2 and compare "
        "ggml's own graph size, nodes and leafs at its first re-reservation (default: on under nightly; ini: schedfuzz_size_oracle)",
    )
    parser.addini("schedfuzz_size_oracle", "check ggml's own graph size at the first realloc", type="bool", default=None)  # type: ignore[arg-type]


class _BoolFlag(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


def option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def base_dir(config: pytest.Config) -> Path:
    """Where the corpus and the example database live: the ini file's folder when pytest was
    started inside it, else the folder pytest was started in. Never ``config.rootpath``: pytest
    derives it from path-like arguments, so ``--schedfuzz-llama-lib DIR`` would move it above DIR."""
    here = Path(config.invocation_params.dir).resolve()
    if config.inipath is not None:
        project = config.inipath.parent.resolve()
        if here == project or project in here.parents:
            return project
    return here


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "schedfuzz: a property test over the scheduler engine; runs only with --schedfuzz")
    lib = option(config, "schedfuzz_lib")
    if lib:
        # the engine of this session, with --schedfuzz or without: tests that build a GgmlTarget
        # (and their child pytest runs) load the same ggml
        from .ggml.lib import BUILT_IN, LIB_ENV, LibError, resolve_lib

        try:
            folder = resolve_lib(lib)
        except LibError as e:
            raise pytest.UsageError(str(e)) from None
        os.environ[LIB_ENV] = lib if lib in BUILT_IN else str(folder)
    if not option(config, "schedfuzz"):
        return
    if not hasattr(config, "workerinput"):  # xdist's workers start after this, and find it built
        from .compiled import prepare

        prepare()
    from .session import SchedfuzzSession

    config.pluginmanager.register(SchedfuzzSession(config), "schedfuzz-session")


@pytest.fixture(scope="session")
def schedfuzz_engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The engine under test (a ``Target``: ``run(scenario) -> Trace``), shared by the session."""
    session = request.config.pluginmanager.get_plugin("schedfuzz-session")
    if session is None:
        pytest.skip("the schedfuzz engine runs only with --schedfuzz")
    yield session.fuzzer.engines.target


@pytest.fixture(scope="session")
def schedfuzz_reference() -> Any:
    """The reference scheduler's ``predict(scenario) -> Trace``."""
    from reference.predict import predict

    return predict


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if option(config, "schedfuzz"):
        return
    skip = pytest.mark.skip(reason="schedfuzz property tests run with --schedfuzz")
    for item in items:
        if item.get_closest_marker("schedfuzz"):
            item.add_marker(skip)
