"""The suite's folders mirror the packages (``tests/ggml`` for ``pytest_schedfuzz/ggml``,
``tests/oracle`` for ``reference/``...). This file puts ``tests/`` itself on ``sys.path`` (pytest
does so for a conftest's folder), so that tests in every folder import the planted faults
(``planted.py``) and subprocesses name them as ``planted:NAME``."""
