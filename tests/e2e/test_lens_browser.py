"""Inside the choice in a real browser on the real default model: the page draws the lens of
the run, and a click on the grid selects a step. Screenshots (1280×800 and 390×844, light and
dark, the whole page) go to tests/e2e/artifacts/."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import ARTIFACTS
from tests.e2e.test_browser import goto, no_traceback, open_app, wait_idle, wait_ready

pytestmark = pytest.mark.e2e

N = 6
SIZES = ((1280, 800), (390, 844))


# the page coordinates of the centre of cell (step, row) of chart number i
CELL = """
([i, step, row]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[i];
  const fl = gd._fullLayout, box = gd.getBoundingClientRect();
  const y = fl.yaxis.d2p(fl.yaxis._categories[row]);
  return [box.left + fl._size.l + fl.xaxis.d2p(step), box.top + fl._size.t + y];
}
"""


def _plots(page) -> list[dict]:
    return json.loads(
        page.evaluate(
            "() => JSON.stringify([...document.querySelectorAll('.js-plotly-plot')]"
            ".map(p => ({data: p.data.map(d => ({type: d.type, z: d.z, y: d.y}))})))"
        )
    )


def _wait_plots(page, n: int, timeout: float = 120.0) -> list[dict]:
    deadline = time.time() + timeout
    while len(plots := _plots(page)) < n:
        assert time.time() < deadline, f"{len(plots)} of {n} charts drawn"
        time.sleep(0.25)
    return plots


def test_lens_page_in_the_browser(browser, app_url):
    ctx, page = open_app(browser, app_url, f"?run_n={N}")
    try:
        page.get_by_role("button", name=f"Run {N}", exact=True).click()
        wait_ready(page, N)
        goto(page, "Inside the choice")
        no_traceback(page)
        plots = _wait_plots(page, 6)
        ranks = plots[0]["data"][0]["y"]
        assert len(ranks) == 31  # the embedding and 30 layers of SmolLM2-135M
        grid = plots[1]["data"][0]
        assert grid["type"] == "heatmap" and len(grid["z"]) == 31
        assert all(len(row) == N for row in grid["z"])
        # the head view: one toggle per head of SmolLM2-135M (9), lines that a toggle hides
        hv = page.locator("#lens-hv")
        assert hv.locator('input[type="checkbox"]').count() == 9
        shown = (
            "() => [...document.querySelectorAll('#lens-hv img.hv-h0')]"
            ".map(l => getComputedStyle(l).display !== 'none')"
        )
        before = page.evaluate(shown)
        assert len(before) > 0 and all(before), before
        hv.locator('label[for="lens-hv-h0"]').click()
        assert not any(page.evaluate(shown)), "the toggle did not hide head 0"
        hv.locator('label[for="lens-hv-h0"]').click()
        assert all(page.evaluate(shown))
        body = page.inner_text("body")
        assert "rose through the layers" in body and "each block's share of the logit" in body
        # a click on a cell of the grid's step-2 column selects step 2 on every page
        page.evaluate("document.querySelectorAll('.js-plotly-plot')[1].scrollIntoView()")
        time.sleep(1.0)
        xy = page.evaluate(CELL, [1, 2, 10])
        page.mouse.click(xy[0], xy[1])
        deadline = time.time() + 60
        while "Step 2: how" not in page.inner_text("body"):
            assert time.time() < deadline, "a click on the grid did not select its step"
            time.sleep(0.25)
        wait_idle(page)
        no_traceback(page)
        assert len(_wait_plots(page, 6)[1]["data"][0]["z"][0]) == 3  # the grid ends at step 2
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for theme in ("light", "dark"):
            page.emulate_media(color_scheme=theme)
            for w, h in SIZES:
                page.set_viewport_size({"width": w, "height": h})
                time.sleep(1.0)
                wait_idle(page)
                page.screenshot(path=str(ARTIFACTS / f"lens_{theme}_{w}x{h}.png"))
                full = page.evaluate(
                    "() => document.querySelector('[data-testid=stMain]').scrollHeight"
                )
                page.set_viewport_size({"width": w, "height": min(full, 8000)})
                time.sleep(1.0)
                page.screenshot(path=str(ARTIFACTS / f"lens_{theme}_{w}x{h}_full.png"))
        no_traceback(page)
    finally:
        ctx.close()
