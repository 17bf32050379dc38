"""The suite's folders mirror the packages (``tests/ggml`` for ``pytest_schedfuzz/ggml``,
``tests/oracle`` for ``reference/``...). This file puts ``tests/`` itself on ``sys.path`` (pytest
does so for a conftest's folder), so that tests in every folder import the planted faults
(``planted.py``) and subprocesses name them as ``planted:NAME``."""

# pytester's fixture puts sys.modules back as it was after each test that uses it, and numpy (a C
# extension) cannot be imported twice in one process: imported here, before any test, it is never
# dropped (a subset such as tests/test_plugin.py with tests/campaign failed on it)
import importlib
import os

importlib.import_module("numpy")

# the reference's source, not its compiled modules (pytest_schedfuzz.compiled): mutation tests
# patch its functions in place, which compiled callers would not see; children inherit it
os.environ["SCHEDFUZZ_REFERENCE"] = "source"
