"""pytest glue: ``pytest --schedfuzz`` fuzzes ggml's scheduler. Nothing here runs without it.

The options and the hooks; the run's state is ``session.SchedfuzzSession``, what it collects ``items``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    from .options import add_to_pytest

    add_to_pytest(parser)  # one table for pytest and ``schedfuzz run``: ``options.OPTIONS``


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """A misspelled ``--schedfuzz-*`` option is an error that names the option meant (pytest's own
    says only "unrecognized arguments")."""
    from . import options

    known = options.pytest_flags()
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag.startswith(("--schedfuzz", "--no-schedfuzz")) and flag not in known:
            raise pytest.UsageError(f"{flag}: no such option{options.did_you_mean(flag, known)}; `pytest --help` lists the schedfuzz group")


def option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "schedfuzz: a property test over the scheduler engine; runs only with --schedfuzz")
    from .options import OptionError, from_pytest, in_user_words

    try:
        given = from_pytest(config)
    except OptionError as e:
        raise pytest.UsageError(str(e)) from None
    if "lib" in given:
        # the engine of this session, with --schedfuzz or without: tests that build a GgmlTarget
        # (and their child pytest runs) load the same ggml
        from .ggml.lib import BUILT_IN, LIB_ENV, LibError, resolve_lib

        lib = given["lib"].value
        try:
            folder = resolve_lib(lib)
        except LibError as e:
            raise pytest.UsageError(in_user_words(str(e), given, lambda o: o.pytest_flag)) from None
        os.environ[LIB_ENV] = lib if lib in BUILT_IN else str(folder)
    if not option(config, "schedfuzz"):
        return
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        # `pytest --schedfuzz` with no paths is the fuzzing job, not the project's own tests that
        # `testpaths` names (name them to run both): nothing of them is collected
        config.args = []
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
    yield session.campaign.fuzzer.engines.target


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
