"""The examples in docstrings run (networkx style: algorithms documented by small examples)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["reference.graph", "reference.params", "reference.rules", "pytest_schedfuzz.cases.corpus", "pytest_schedfuzz.properties.base",
           "pytest_schedfuzz.properties.aborts", "pytest_schedfuzz.properties.llama_replan", "pytest_schedfuzz.properties.llama_logits",
           "pytest_schedfuzz.model.versions"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
