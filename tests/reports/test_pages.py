"""The report, compare, tour and presenter pages on the tiny model; a copied link reproduces
the same tokens and views in a new session."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import pytest

from tests.app.conftest import APP, TIMEOUT, run_steps, run_until, settle
from ui import work
from ui.page import GRAVITY

NEW_PAGES = [
    "app_pages/compare.py",
    "app_pages/report.py",
    "app_pages/tour_1_baseline.py",
    "app_pages/tour_2_entropy.py",
    "app_pages/tour_3_distribution.py",
    "app_pages/tour_4_gravity.py",
    "app_pages/tour_5_ab.py",
    "app_pages/presenter.py",
]


@pytest.fixture()
def new_app(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def make(query: dict | None = None):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        if query:
            at.query_params.update(query)
        at.run()
        assert not at.exception
        return at

    return make


def specs(at) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def no_errors(at) -> None:
    assert not at.exception, at.exception
    assert not [e.value for e in at.error], [e.value for e in at.error]


def test_pages_without_and_with_a_run(new_app):
    at = new_app()
    for p in NEW_PAGES:
        at.switch_page(p).run()
        no_errors(at)
    at.switch_page("app_pages/generate.py").run()
    run_steps(at, 6)
    for p in NEW_PAGES:
        at.switch_page(p).run()
        no_errors(at)
        if p not in (
            "app_pages/tour_4_gravity.py",
            "app_pages/tour_5_ab.py",
            "app_pages/compare.py",
        ):
            assert at.get("plotly_chart"), f"{p} drew no chart"


def test_copied_link_reproduces_tokens_and_views(new_app):
    a = new_app()
    for k, v in {
        "s_temperature": 0.6,
        "s_top_k": 30,
        "s_seed": 7,
        "s_prompt": "A quiet harbour",
        "s_gravity_lambda": 0.4,
    }.items():
        a.session_state[k] = v
    a.run()
    run_steps(a, 6)
    a.session_state["semviz"].selected = 2
    a.switch_page("app_pages/distributions.py").run()
    link = dict(a.query_params)
    assert link["seed"] == "7" and link["top_k"] == "30" and link["step"] == "2"
    assert link["prompt"] == "A quiet harbour" and link["run_n"] == "6" and link["steps"] == "6"
    views_a = specs(a)
    tokens_a = a.session_state["semviz"].decoder.trace.token_ids

    b = new_app(link)  # another session opening the copied link
    sb = b.session_state["settings"]
    assert (sb.temperature, sb.top_k, sb.seed, sb.prompt) == (0.6, 30, 7, "A quiet harbour")
    settle(b)  # the link's ``steps`` regenerates the run by itself
    assert b.session_state["semviz"].decoder.trace.token_ids == tokens_a
    b.switch_page("app_pages/distributions.py").run()
    assert b.session_state["semviz"].selected_step() == 2
    assert specs(b) == views_a
    assert dict(b.query_params) == link


def test_report_page_builds_a_zip_and_reloads_a_trace(new_app, tmp_path):
    from semviz.output import report
    from semviz.output.trace import Trace
    from tests.reports.conftest import embedded_figures

    at = new_app()
    at.session_state["s_prompt"] = "Begin here. " + " ".join(f"word{i}" for i in range(40))
    at.run()
    run_steps(at, 5)
    at.switch_page("app_pages/report.py").run()
    no_errors(at)
    run = at.session_state["semviz"].decoder.trace
    assert len(run.prompt_ids) > 40 and "Begin here." in run.prompt_text
    assert at.code[0].value == run.prompt_text + "⟨" + run.text + "⟩"  # the whole prompt
    at.toggle(key="report_png").set_value(False).run()
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("semviz-report-*"))
    at.button(key="report_build").click().run()
    sess = at.session_state["semviz"]
    run_until(at, lambda: work.ended(sess, "report") is not None)
    no_errors(at)
    assert set(tmp.glob("semviz-report-*")) == before  # the page keeps the zip, not the folder
    made = work.ended(sess, "report").result
    assert made.complete and made.pngs == 0
    assert at.success[0].value.startswith("Report complete: report.html, trace.json")
    with zipfile.ZipFile(io.BytesIO(made.zip)) as z:
        names = set(z.namelist())
        page = z.read("report.html").decode()
    assert {"report.html", "report.json", "trace.json", "trace.parquet"} <= names
    in_report = embedded_figures(page)
    assert list(in_report.values()) == specs(at)  # the page shows what the report holds
    # reload the saved trace: the same views again
    trace = at.session_state["semviz"].decoder.trace
    trace.save(tmp_path / "t.json")
    at2 = new_app()
    at2.switch_page("app_pages/report.py").run()
    at2.radio(key="report_source").set_value("a saved trace").run()
    at2.text_input(key="report_path").input(str(tmp_path / "t.json")).run()
    no_errors(at2)
    assert specs(at2) == list(in_report.values())
    lm = at.session_state["semviz"].decoder.lm
    again = report.views(Trace.load(tmp_path / "t.json"), tokenizer=lm.tokenizer, lm=lm)
    assert [v.json() for v in again] == specs(at2)
    assert {"lens_layers", "lens_blocks"} <= {v.name for v in again}  # the page passes its model
    # the file written again (a longer run): the page reads it again, not the copy it had
    run_steps(at, 2)
    at.session_state["semviz"].decoder.trace.save(tmp_path / "t.json")
    at2.run()
    assert len(at2.session_state["semviz"].report_trace.steps) == 7
    at2.text_input(key="report_path").input(str(tmp_path / "missing.json")).run()
    assert any("Trace not read" in e.value for e in at2.error)


def test_compare_page_runs_and_stops(new_app):
    at = new_app()
    for p in ("app_pages/frontier.py", "app_pages/compare.py"):  # neither needs a run
        at.switch_page(p).run()
        assert not [c.value for c in at.caption if "No run yet" in c.value], p
    assert any("Press **Run both**" in i.value for i in at.info)
    # with a run and the sliders moved off it, the run's status and what-if stay off this page
    run_steps(at, 3)
    at.session_state["s_temperature"] = 0.2
    at.switch_page("app_pages/compare.py").run()
    assert not [w.value for w in at.warning if "What-if" in w.value]
    assert not [c.value for c in at.caption if "**3** steps" in c.value]
    at.switch_page("app_pages/distributions.py").run()  # where the run is shown, both are
    assert [w.value for w in at.warning if "What-if" in w.value]
    assert [c.value for c in at.caption if "**3** steps" in c.value]
    at.switch_page("app_pages/compare.py").run()
    at.number_input(key="cmp_steps").set_value(4).run()
    at.button(key="cmp_run").click().run()
    sess = at.session_state["semviz"]
    run_until(at, lambda: not work.running(sess, "cmp"))
    no_errors(at)
    res = work.result(sess, "cmp")
    assert res.steps == 4 and len(res.traces) == 2
    assert at.get("plotly_chart") and at.dataframe
    table = at.dataframe[0].value
    assert list(table.columns) == ["A", "B", "means"]
    assert table.loc["mean max gravity", "A"] == "–"  # side A has gravity off: not "None"
    assert float(table.loc["mean max gravity", "B"])  # B's rerank has a value
    kept = res.metrics()[0].mean_kept
    assert table.loc["mean kept set", "A"] == f"{kept:,.1f}"  # 49,152.0 rather than 49152
    y = specs(at)[0]["layout"]["yaxis2"]
    assert y["tickformat"] == ",d"
    assert y["type"] == "linear" or y["tickvals"][:3] == [1, 10, 100]
    # a long run stopped after the first tick keeps its tokens
    at.number_input(key="cmp_steps").set_value(200).run()
    at.button(key="cmp_run").click().run()
    res = lambda: work.result(sess, "cmp")  # noqa: E731
    run_until(at, lambda: res() is not None and len(res().traces[0].steps))
    at.button(key="cmp_stop").click().run()
    made = [len(t.steps) for t in res().traces]
    assert not work.running(sess, "cmp") and res().stopped and 1 <= min(made) <= max(made) < 200
    assert work.ended(sess, "cmp").stopped
    # a bad side is one message, nothing else breaks
    at.text_input(key="cmp_b").input("top_pp=0.9").run()
    at.button(key="cmp_run").click().run()
    assert any("top_p" in e.value for e in at.error)


def test_presenter_freezes_the_step(new_app):
    at = new_app()
    run_steps(at, 4)
    at.session_state["semviz"].selected = 1
    at.switch_page("app_pages/presenter.py").run()
    no_errors(at)
    assert not at.sidebar.slider and not at.sidebar.text_area  # no settings sidebar
    assert at.query_params["step"] == "1"
    assert any("Step 1 " in h.value for h in at.html)
    at.session_state["semviz"].decoder.run(2)  # new tokens do not move the frozen step
    at.run()
    assert at.query_params["step"] == "1"
    at.button(key="pres_next").click().run()
    assert at.query_params["step"] == "2"


def test_tour_applies_its_settings(new_app):
    at = new_app()
    at.switch_page("app_pages/tour_1_baseline.py").run()
    at.button(key="tour1_apply").click().run()
    s = at.session_state["settings"]
    assert (s.temperature, s.top_k, s.top_p, s.gravity_lambda) == (0.8, 50, 0.95, 0.0)
    at.switch_page("app_pages/generate.py").run()
    run_steps(at, 4)
    at.switch_page("app_pages/tour_4_gravity.py").run()
    at.button(key="tour4_apply").click().run()
    sess = at.session_state["semviz"]
    run_until(at, lambda: not work.running(sess, GRAVITY))  # the gravity the run lacks
    no_errors(at)
    s = at.session_state["settings"]
    assert (s.temperature, s.top_k, s.top_p) == (0.8, 50, 0.95)  # tour 1's, kept
    assert (s.gravity_lambda, s.gravity_mode, s.gravity_kind, s.gravity_mass) == (
        0.5,
        "rerank",
        "pull",
        "attention",
    )
    assert len(at.get("plotly_chart")) >= 3  # rank shift, the terms of G, the replayed entropy
    at.switch_page("app_pages/tour_5_ab.py").run()
    at.button(key="tour5_setup").click().run()
    at.switch_page("app_pages/compare.py").run()
    assert at.text_input(key="cmp_b").value == (
        "temperature=0.8,top_k=50,top_p=0.95,gravity_lambda=0.5,gravity_mode=rerank,"
        "gravity_kind=pull,gravity_mass=attention"
    )
