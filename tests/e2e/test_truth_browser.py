"""What a lecturer found misleading on screen, each reproduced in a real browser on the real
default model (items 3–6 of "Wrong or misleading on screen"; the hotter what-if, item 1, is
``test_whatif_browser.py``, and Tour 4, item 2, ``test_tour_browser.py``):

3. the front door's gravity example shows the gravity it names: its attention, and the terms
   of G that pulled each token (it once showed only "This run did not capture attention");
4. the KV timeline draws one layer's cache: H2O at budget 24 keeps 24 positions in the drawn
   layer (the union over layers showed about 50), positions not yet written are blank, the
   scale is blue against orange and the selected step is marked;
5. one step reads the same on every view: the strip's card, Presenter and Distributions name
   the same taken token with the same probabilities, and the step count is the run's;
6. the wording says what is measured: token-level predictive entropy, the query the
   attention belongs to, and a 4-bit model's probabilities.

Run alone: ``pytest -m e2e tests/e2e/test_truth_browser.py``.
"""

from __future__ import annotations

import json
import re

import pytest

from semviz.output import style
from tests.e2e.conftest import ARTIFACTS, nav_click
from tests.e2e.test_browser import no_traceback, wait_idle
from tests.e2e.test_generate_browser import open_page, wait_done, wait_text

pytestmark = pytest.mark.e2e

STORY = "A story with narrative gravity"


def _main(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def _open_story(page) -> None:
    page.get_by_role("button", name=STORY, exact=True).click()
    page.wait_for_selector(".semviz-strip .tok", timeout=120_000)
    wait_idle(page)


def _figure(page, index: int = 0) -> dict:
    """The plotly figure ``index`` on the page as drawn: its traces (typed arrays as lists,
    NaN as None), shapes and x-axis title."""
    return json.loads(
        page.evaluate(
            """(i) => { const el = document.querySelectorAll('.js-plotly-plot')[i];
                const fig = {data: el._fullData, shapes: el.layout.shapes || [],
                             xtitle: el._fullLayout.xaxis.title.text};
                return JSON.stringify(fig, (k, v) => ArrayBuffer.isView(v) ? Array.from(v) : v);
            }""",
            index,
        )
    )


def test_3_the_gravity_example_shows_the_gravity_it_names(browser, app_url):
    ctx, page = open_page(browser, app_url)
    try:
        _open_story(page)
        nav_click(page, "Attention & gravity")
        m = wait_text(page, r"What pulled “(\S+)”: the terms of G", 120)
        text = _main(page)
        assert "did not capture attention" not in text
        assert "is not a sum over the context" not in text  # contrast gravity has no terms
        assert "attention of the last query, layers × context" in text
        assert re.search(r"G\(w\) = Σ m_i·sim\(w, t_i\) = -?\d\.\d+ with mass attention", text)
        # the terms' chart: one bar per context token it sums over, not an empty chart
        terms = next(
            f
            for i in range(page.locator(".js-plotly-plot").count())
            if "m_i · sim" in (f := _figure(page, i))["xtitle"]
        )
        assert sum(len(t.get("x") or []) for t in terms["data"]) >= 16  # the 16 prompt tokens
        assert m.group(1) != ""
        no_traceback(page)
        page.screenshot(path=str(ARTIFACTS / "truth_3_story_gravity.png"), full_page=True)
    finally:
        ctx.close()


def test_4_the_kv_timeline_draws_one_layers_cache(browser, app_url):
    ctx, page = open_page(browser, app_url, "/generate?kv_policy=h2o&kv_budget=24&run_n=40")
    try:
        page.get_by_role("button", name="Run 40", exact=True).click()
        wait_done(page, 40)
        nav_click(page, "KV cache")
        wait_text(page, r"At the last step layer 0 holds 24 positions \(budget 24\)", 120)
        fig = _figure(page, 0)
        heat = fig["data"][0]
        z = heat["z"]
        assert heat["colorscale"] == style.KV_SCALE  # orange against blue, colour-blind safe
        assert (
            "red" not in json.dumps(heat["colorscale"])
            and heat["colorbar"]["title"]["text"] == "layer 0"
        )
        last = z[-1]
        assert sum(1 for v in last if v == 1) == 24  # what H2O keeps in this layer, not a union
        # the first step has written only the prompt and its own position: the rest is blank
        first = z[0]
        written = [j for j, v in enumerate(first) if v is not None]
        assert written == list(range(len(written))) and len(written) < len(first) - 30
        # the selected step (the last, by default) is marked with a line across the chart
        assert [s["y0"] for s in fig["shapes"] if s.get("type") == "line"] == [39]
        # another layer: its own cache, still 24 positions
        page.locator(".st-key-kv_layer").click()
        page.get_by_role("option", name="5", exact=True).click()
        wait_text(page, r"At the last step layer 5 holds 24 positions \(budget 24\)", 60)
        fig5 = _figure(page, 0)
        assert fig5["data"][0]["colorbar"]["title"]["text"] == "layer 5"
        assert sum(1 for v in fig5["data"][0]["z"][-1] if v == 1) == 24
        no_traceback(page)
        page.screenshot(path=str(ARTIFACTS / "truth_4_kv_layer.png"), full_page=True)
    finally:
        ctx.close()


def test_5_one_step_reads_the_same_on_every_view(browser, app_url):
    ctx, page = open_page(browser, app_url)
    try:
        _open_story(page)
        k = 20
        tok = page.locator(".semviz-strip .tok").nth(k)
        tok.hover()
        card = page.locator(".semviz-card")
        card.wait_for(timeout=10_000)
        head = re.search(r"step (\d+) · (\S+) · p (\d\.\d+)", card.inner_text())
        assert head and int(head.group(1)) == k, card.inner_text()
        token, p_raw = head.group(2), float(head.group(3))
        taken = card.locator("tr", has_text="▶").inner_text().split()
        assert taken[1] == token
        final = float(taken[-1])
        tok.click()
        wait_idle(page)
        nav_click(page, "Presenter mode")
        m = wait_text(page, rf"Step {k} of 48 \(numbered 0–47\) → (\S+)", 60)
        assert m.group(1) == token
        text = _main(page)
        raw = float(re.search(r"raw probability\s+(\d\.\d+)", text).group(1))
        after = float(re.search(r"after the chain\s+(\d\.\d+)", text).group(1))
        assert f"{raw:.3f}" == f"{p_raw:.3f}" and f"{after:.3f}" == f"{final:.3f}"
        page.get_by_role("link", name=re.compile("Leave presenter mode")).click()
        wait_idle(page)
        nav_click(page, "Distributions")
        d = wait_text(page, rf"Step {k}: “(\S+)” — the distribution at every stage", 60)
        assert d.group(1) == token
        no_traceback(page)
    finally:
        ctx.close()


def test_6_the_wording_says_what_is_measured(browser, app_url):
    ctx, page = open_page(browser, app_url)
    try:
        nav_click(page, "Tour 2 · Log entropy")
        wait_text(page, r"token-level predictive entropy", 60)
        assert "not the semantic entropy of Kuhn et al." in " ".join(_main(page).split())
        nav_click(page, "Home")
        _open_story(page)
        nav_click(page, "Attention & gravity")
        m = wait_text(page, r"The query is the one that chose step (\d+)'s token", 120)
        assert re.search(rf"Step {m.group(1)}: attention of the last query", _main(page))
        nav_click(page, "Pipeline")
        q = wait_text(
            page,
            r"dequantised to float32: its probabilities are those of the (\S+)-quantised model",
            120,
        )
        assert q.group(1) == "Q4_1"
        no_traceback(page)
    finally:
        ctx.close()
