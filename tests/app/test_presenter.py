"""Presenter mode's link: opened alone, in a new session, it shows the run at its step."""

from __future__ import annotations

import re

from tests.app.conftest import APP, TIMEOUT, run_steps, settle

PRESENTER = "app_pages/presenter.py"


def _sess(at):
    return at.session_state["semviz"]


def _title(at) -> str:
    """The step and token on show: the page's big title, as plain text."""
    for e in at.get("html"):
        body = str(getattr(e, "proto", e))
        if "semviz-title" in body:
            text = body.split("semviz-title", 1)[1].split("</p>", 1)[0]
            return re.sub(r"<[^>]+>", "", text[text.index(">") + 1 :])
    raise AssertionError("no presenter title on the page")


def _finish(at) -> None:
    settle(at)


def test_presenter_link_alone_reopens_its_run_at_its_step(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    a = AppTest.from_file(APP, default_timeout=TIMEOUT)
    a.run()
    a.session_state["s_seed"] = 3
    a.session_state["s_temperature"] = 1.1
    a.session_state["s_prompt"] = "A quiet harbour"
    a.run()
    run_steps(a, 7)
    _sess(a).selected = 2
    a.query_params.clear()  # the sidebar's page link opens Presenter with no query string
    a.switch_page(PRESENTER).run()
    a.button(key="pres_next").click().run()  # ▶: the link follows the step on show
    assert not a.exception
    shown = _title(a)
    assert shown.startswith("Step 3 of 7")
    link = dict(a.query_params)
    assert link["step"] == "3" and link["steps"] == "7"
    assert link["seed"] == "3" and link["temperature"] == "1.1"
    assert link["prompt"] == "A quiet harbour"

    b = AppTest.from_file(APP, default_timeout=TIMEOUT)
    b.query_params.update(link)
    b.switch_page(PRESENTER)  # the presenter link, not the root URL
    b.run()
    assert not b.exception and not b.error
    _finish(b)
    assert not b.exception and not b.error
    assert _sess(b).decoder.trace.token_ids == _sess(a).decoder.trace.token_ids
    assert _title(b) == shown
    assert dict(b.query_params) == link


def test_presenter_link_with_a_bad_step_shows_the_last_step(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    b = AppTest.from_file(APP, default_timeout=TIMEOUT)
    b.query_params.update({"steps": "3", "step": "oops", "seed": "1"})
    b.switch_page(PRESENTER)
    b.run()
    assert any("step='oops'" in w.value for w in b.warning)  # the unusable value is named
    _finish(b)
    assert not b.exception and not b.error
    assert len(_sess(b).decoder.trace.steps) == 3
    assert _title(b).startswith("Step 2 of 3")
