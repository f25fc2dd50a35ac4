"""Every page in ``ui/nav.py`` opens without a traceback or an error, before and after a run.

The list comes from the navigation itself, so a page added there is covered here with no edit.
"""

from __future__ import annotations

import pytest

from tests.app.conftest import run_steps
from ui.nav import PAGES

# pages that draw from a run without a model call of their own, and so must show a chart
_VIEWS = {p.path for p in PAGES if p.section == "Views"}


def _clean(at, where: str) -> None:
    assert not at.exception, f"{where}: {at.exception}"
    assert not [e.value for e in at.error], f"{where}: {[e.value for e in at.error]}"


@pytest.mark.parametrize("path", [p.path for p in PAGES], ids=[p.title for p in PAGES])
def test_page_opens_before_and_after_a_run(app, path):
    at = app.switch_page(path).run()
    _clean(at, f"{path} before a run")
    run_steps(at, 4)
    at.switch_page(path).run()
    _clean(at, f"{path} after a run")
    if path in _VIEWS:
        assert at.get("plotly_chart"), f"{path} drew no chart of the run"
    assert at.session_state["semviz"].decoder.n_steps == 4  # opening a page changes no run


def test_presenter_counts_the_steps_of_the_run(app):
    # a 4-step run: its last step is number 3 of 4, not "3 of 3"
    at = app.switch_page("app_pages/presenter.py").run()
    run_steps(at, 4)
    at.switch_page("app_pages/presenter.py").run()
    bodies = [str(getattr(e, "proto", e)) for e in at.get("html")]
    assert any("Step 3 of 4 (numbered 0–3)" in b for b in bodies), bodies[:2]
