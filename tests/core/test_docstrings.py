"""Every semviz module with examples in its docstrings has them run, and every example runs.

Examples may use ``lm``, a loaded model (``semviz.load_model()`` in real use); here it is the
tiny random Llama, so they run fast and offline. Only examples marked ``+SKIP`` (a real model
or a file on disk is unavoidable) are left out, and the count of examples run is checked, so
a module whose examples stop being collected fails too.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import semviz


def _modules_with_examples() -> dict[str, int]:
    """Module name -> number of examples that should run (``>>>`` lines not skipped)."""
    out = {}
    for info in pkgutil.walk_packages(semviz.__path__, "semviz."):
        if info.name.endswith("__main__"):
            continue
        text = Path(importlib.util.find_spec(info.name).origin).read_text(encoding="utf-8")
        prompts = re.findall(r"^\s*>>> .*$", text, re.M)
        if prompts:
            out[info.name] = sum("doctest: +SKIP" not in p for p in prompts)
    return out


MODULES = _modules_with_examples()


def test_the_modules_that_should_have_examples_do():
    for name in (
        "semviz.sampling.chain",
        "semviz.sampling.filters",
        "semviz.sampling.params",
        "semviz.sampling.thermo",
        "semviz.processors",
        "semviz.eviction",
        "semviz.analysis.compare",
        "semviz.analysis.metrics",
        "semviz.analysis.replay",
    ):
        assert MODULES.get(name, 0) > 0, name


@pytest.mark.parametrize("name", sorted(MODULES))
def test_docstring_examples(name, tiny_lm):
    module = importlib.import_module(name)
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    result = doctest.testmod(module, extraglobs={"lm": tiny_lm}, optionflags=flags)
    assert result.failed == 0
    assert result.attempted == MODULES[name]
