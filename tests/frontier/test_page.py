"""The "Does it help?" page in AppTest, on precomputed results (no model run)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from semviz.frontier.sweep import SHIPPED
from tests.frontier import synth
from ui import work

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGE = "app_pages/frontier.py"


@pytest.fixture()
def page(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception
    return at


def run_page_sweep(at, out, *, seconds: float = 600, **fields):
    """Fill the page's sweep form (``fields``: widget key without ``fr_`` → value), press
    Run sweep, and run the page (the task panel's ticks) until the sweep has ended; returns
    what the page kept of it (a ``ui.work.Ended``)."""
    import time

    from ui import work

    for key, value in {**fields, "out": str(out)}.items():
        w = (
            at.text_input(key=f"fr_{key}")
            if isinstance(value, str)
            else at.number_input(key=f"fr_{key}")
        )
        w.set_value(value)
    at.button(key="fr_run").click().run()
    sess = at.session_state["semviz"]
    deadline = time.monotonic() + seconds
    while work.running(sess, "fr") and time.monotonic() < deadline:
        time.sleep(0.3)
        at.run()  # the task panel's tick: it reads the sweep's progress into the page
    at.run()
    assert not work.running(sess, "fr") and not work.error(sess, "fr"), work.error(sess, "fr")
    return work.ended(sess, "fr")


def _values(v) -> list:
    """A Plotly array from the figure JSON (plotly 6 sends numbers as base64 typed arrays)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return list(v)


def _figure(at) -> dict:
    charts = at.get("plotly_chart")
    assert len(charts) == 1
    return json.loads(charts[0].proto.spec)


def test_opens_on_the_shipped_frontier(page):
    assert SHIPPED.is_file()
    assert page.title[0].value == "Does it help?"
    fig = _figure(page)
    assert len(fig["data"]) >= 2  # one curve per setting
    assert all(len(_values(tr["x"])) == 3 for tr in fig["data"])  # T 0.7, 1.0, 1.3
    assert all(0 < y < 1 for tr in fig["data"] for y in _values(tr["y"]))
    verdicts = [e.value for e in [*page.success, *page.info]]
    assert any(" dominates " in v or "neither" in v for v in verdicts), verdicts
    assert not page.error


def test_a_results_file_with_picked_settings_and_sample_continuations(page, tmp_path):
    df = synth.rows(
        {
            "A": {0.7: ([0.5, 0.6], [0.80, 0.85]), 1.3: ([0.4, 0.5], [0.90, 0.95])},
            "B": {0.7: ([0.6, 0.7], [0.80, 0.85]), 1.3: ([0.5, 0.6], [0.90, 0.95])},
            "C": {0.7: ([0.1, 0.2], [0.80, 0.85]), 1.3: ([0.1, 0.1], [0.90, 0.95])},
        }
    )
    path = tmp_path / "r.parquet"
    df.to_parquet(path)
    page.radio(key="fr_source").set_value("A results file").run()
    page.text_input(key="fr_path").set_value(str(path)).run()
    assert not page.exception and not page.error
    assert [t["name"] for t in _figure(page)["data"]] == ["A", "B", "C"]
    assert any(
        s.value.startswith("B dominates A:") and "0.100 more" in s.value for s in page.success
    )
    page.multiselect(key="fr_settings").set_value(["C", "A"]).run()
    assert [t["name"] for t in _figure(page)["data"]] == ["C", "A"]
    assert any(s.value.startswith("A dominates C") for s in page.success)
    page.selectbox(key="fr_point").set_value(1).run()  # C at T 1.3
    table = page.dataframe[-1].value
    assert len(table) == 4  # 2 prompts x 2 seeds
    assert set(table["continuation"]) == {
        f"text of C at 1.3 for prompt {p} seed {s}" for p in (0, 1) for s in (0, 1)
    }
    assert {"coherence", "distinct_2", "repetition", "perplexity"} <= set(table.columns)


def test_a_missing_or_broken_file_is_one_message(page, tmp_path):
    page.radio(key="fr_source").set_value("A results file").run()
    page.text_input(key="fr_path").set_value(str(tmp_path / "none.parquet")).run()
    assert not page.exception
    assert any("No results at" in i.value for i in page.info)
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    page.text_input(key="fr_path").set_value(str(bad)).run()
    assert not page.exception
    assert [e.value for e in page.error] and "not a readable results file" in page.error[0].value


def test_a_bad_sweep_setting_is_one_message_and_starts_nothing(page):
    page.text_input(key="fr_b").set_value("top_pp=0.9").run()
    page.button(key="fr_run").click().run()
    assert not page.exception
    assert work.slot(page.session_state["semviz"], "fr").task is None
    assert any("top_pp" in e.value for e in page.error)


def test_opens_on_the_default_gravitys_sweep_on_its_best_resolved_axis(page):
    from semviz.frontier import sweep as fr

    assert SHIPPED.name == "frontier_contrast_test.parquet"  # the default gravity's sweep
    assert page.radio(key="fr_source").value == "Shipped: " + next(iter(fr.SHIPPED_SWEEPS))
    assert page.selectbox(key="fr_x").value == fr.AUTO
    s = fr.summarize(fr.load_results(SHIPPED), n_boot=500)
    assert any(
        c.value.startswith(f"Axis: **{fr.X_AXES[s.x]}**, the one this sweep resolves best")
        for c in page.caption
    )
    # the verdict on every axis: one sentence, and one table row per axis
    assert s.agreement[0] in [m.value for m in page.markdown]
    table = page.dataframe[0].value
    assert list(table["axis"]) == list(fr.X_AXES.values())
    assert list(table["winner"]) == [
        {"a": d.a, "b": d.b, "neither": "neither", "none": "no common range"}[d.winner]
        for a in fr.X_AXES
        for d in s.by_axis[a]
    ]
    assert table["coherence B − A"].tolist() == pytest.approx(
        [d.gap for a in fr.X_AXES for d in s.by_axis[a]]
    )


def test_the_first_gravitys_sweep_and_one_chosen_axis(page):
    from semviz.frontier import sweep as fr

    first = "Shipped: " + list(fr.SHIPPED_SWEEPS)[1]
    page.radio(key="fr_source").set_value(first).run()
    page.selectbox(key="fr_x").set_value("dissimilarity").run()
    assert not page.exception and not page.error
    fig = _figure(page)
    assert len(fig["data"]) == 3  # plain and the first gravity at λ 0.5 and 1
    verdicts = [e.value for e in [*page.success, *page.info]]
    assert verdicts and all("cross-seed similarity" in v for v in verdicts), verdicts
    assert not any(c.value.startswith("Axis: **") for c in page.caption)
