"""The what-if at a hotter temperature tells the truth, in a real browser on the real default
model: after a run at the defaults, Temperature moved to 1.3 makes the banner, the model's
ghost decode, the Distributions page and a real decode (the CLI's ``trace`` at T 1.3, same
seed) name the same token at the first changed step.

Before every raw logit was recorded, the banner named "In" where the real decode picks
"Hello": the draw lands outside the 1,024 recorded candidates.

Run alone: ``pytest -m e2e tests/e2e/test_whatif_browser.py``.
"""

from __future__ import annotations

import re
import time
from urllib.parse import quote

import pytest

from semviz.output.style import display_token
from tests.e2e.conftest import ARTIFACTS, nav_click
from tests.e2e.test_browser import no_traceback, tokens, wait_idle
from tests.e2e.test_generate_browser import (
    cli_tokens,
    open_page,
    query,
    shown,
    wait_done,
    wait_text,
)

pytestmark = pytest.mark.e2e

PROMPT = "Explain to a ten-year-old why the sea is salty."
BANNER = r"What-if \([^)]*\): with these sliders step (\d+) would pick (≈ )?(\S+) instead of (\S+)"


def test_a_hotter_what_if_names_the_token_a_real_decode_picks(browser, app_url, tmp_path):
    ctx, page = open_page(browser, app_url, f"/generate?prompt={quote(PROMPT)}&run_n=40")
    try:
        page.get_by_role("button", name="Run 40", exact=True).click()
        wait_done(page, 40)
        recorded = shown(tokens(page))
        slider = page.get_by_role("slider", name="Temperature")
        slider.focus()
        for _ in range(10):  # 0.80 -> 1.30 in steps of 0.05
            page.keyboard.press("ArrowRight")
        deadline = time.time() + 60
        while query(page).get("temperature") != "1.3" and time.time() < deadline:
            time.sleep(0.25)
        assert query(page).get("temperature") == "1.3", query(page)
        m = wait_text(page, BANNER, 180)
        k, approx, new, old = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        assert approx is None, m.group(0)  # every raw logit is recorded: the pick is exact
        assert old == display_token(recorded[k])
        # the ghost lane, a real decode with the new sliders, starts with the same token
        ghost = page.locator(".semviz-strip .ghost")
        ghost.first.wait_for(timeout=120_000)
        assert ghost.first.get_attribute("data-step") == str(k)
        assert display_token(shown([ghost.first.inner_text()])[0]) == new
        no_traceback(page)
        page.screenshot(path=str(ARTIFACTS / "whatif_hot.png"))
        # the selected step's page names the same taken token
        page.locator(".semviz-strip .tok").nth(k).click()
        wait_idle(page)
        nav_click(page, "Distributions")
        head = wait_text(page, rf"Step {k}: “(\S+)” — the distribution at every stage")
        assert head.group(1) == new
        no_traceback(page)
    finally:
        ctx.close()
    # a real decode at T 1.3 from the same seed: the recorded tokens up to k, then the pick
    t0 = time.time()
    want = cli_tokens(PROMPT, k + 1, 0, 1.3, tmp_path)
    assert want[:k] == recorded[:k]
    assert display_token(want[k]) == new, (want[k], new, time.time() - t0)
    assert re.sub(r"\s", "", new) != ""
