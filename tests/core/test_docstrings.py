"""The runnable examples in the core modules' docstrings run."""

import doctest

import pytest

import semviz.gravity
import semviz.processors
import semviz.pruning


@pytest.mark.parametrize("module", [semviz.pruning, semviz.gravity, semviz.processors])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
