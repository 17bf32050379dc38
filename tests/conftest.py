"""The suite's folders mirror the packages (``tests/ggml`` for ``pytest_schedfuzz/ggml``,
``tests/oracle`` for ``reference/``...). This file puts ``tests/`` itself on ``sys.path`` (pytest
does so for a conftest's folder), so that tests in every folder import the planted faults
(``planted.py``) and subprocesses name them as ``planted:NAME``."""

# pytester's fixture puts sys.modules back as it was after each test that uses it, and numpy (a C
# extension) cannot be imported twice in one process: imported here, before any test, it is never
# dropped (a subset such as tests/test_plugin.py with tests/campaign failed on it)
import importlib
import os

import pytest

importlib.import_module("numpy")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The suite imports the reference's source, not its compiled modules
    (``pytest_schedfuzz.compiled``): mutation tests patch its functions in place, which compiled
    callers would not see; its child processes inherit the choice. The fuzzing job alone
    (``pytest --schedfuzz`` without paths: this folder is not collected) runs compiled."""
    if not (config.getoption("schedfuzz") and config.args_source == pytest.Config.ArgsSource.TESTPATHS):
        os.environ["SCHEDFUZZ_REFERENCE"] = "source"


@pytest.fixture
def no_module_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis also draws constants of the modules loaded (a suite run loads more of them than a
    test alone, and every change to the project changes them): without them, and with its cache of
    them emptied, a test's draws under a fixed seed are the same wherever it runs, and after any
    change elsewhere."""
    from hypothesis.internal.cache import LRUCache
    from hypothesis.internal.conjecture import providers

    monkeypatch.setattr(providers, "_get_local_constants", lambda: providers.Constants(
        integers=providers.SortedSet(), floats=providers.SortedSet(key=providers.float_to_int), bytes=providers.SortedSet(),
        strings=providers.SortedSet()))
    # the constants an earlier test drew are cached per kind of choice (``CONSTANTS_CACHE``): without a
    # cache of its own, a test's draws would still depend on what ran before it in the process
    monkeypatch.setattr(providers, "CONSTANTS_CACHE", LRUCache(1024))
