"""The README's gravity-in-generate example runs as written, on the real default model."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.real_model
def test_readme_gravity_example_runs():
    text = README.read_text()
    m = re.search(r"<!-- example: gravity-generate -->\s*```python\n(.*?)```", text, re.S)
    assert m, "the README lost its gravity-generate example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(m.group(1), "README.md", "exec"), {})
    printed = out.getvalue().strip()
    assert len(printed) > 10, printed
