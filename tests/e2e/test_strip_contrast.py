"""The token strip's probability chips read in both themes: every token's text against its chip,
and the strongest chip against the page, measured from the colours the browser computes.

Run with ``pytest -m e2e tests/e2e/test_strip_contrast.py``. Screenshots (1280×800, light and
dark) go to tests/e2e/artifacts/strip/.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.conftest import ARTIFACTS
from tests.e2e.test_browser import wait_idle

pytestmark = pytest.mark.e2e

SHOTS = ARTIFACTS / "strip"
STEPS = 20
# a hot run: its chips span the scale, from likely tokens to ones of p ≤ 0.001
QUERY = f"?run_n={STEPS}&temperature=1.6&seed=0"

# each token's colours, its page's, and one extra chip at the scale's strong end (value 1)
COLOURS = """
() => {
  const strip = document.querySelector('.semviz-strip');
  const page = getComputedStyle(document.querySelector('[data-testid="stApp"]')).backgroundColor;
  const toks = [...strip.querySelectorAll('.tok')];
  const probe = toks[0].cloneNode(true);
  probe.style.setProperty('--v', '1');
  strip.appendChild(probe);
  const out = toks.concat([probe]).map(t => {
    const cs = getComputedStyle(t);
    return [cs.backgroundColor, cs.color, t.textContent];
  });
  probe.remove();
  return {page, toks: out};
}
"""


def _rgba(css: str) -> tuple[float, float, float, float]:
    """``rgb(…)``, ``rgba(…)`` or ``color(srgb …)`` as 0–1 floats."""
    nums = [float(x) for x in re.findall(r"-?[\d.]+(?:e-?\d+)?", css.split("(", 1)[1])]
    rgb = nums[:3] if css.startswith("color(") else [n / 255 for n in nums[:3]]
    return rgb[0], rgb[1], rgb[2], (nums[3] if len(nums) > 3 else 1.0)


def _over(top, bottom):
    a = top[3]
    return tuple(a * t + (1 - a) * b for t, b in zip(top[:3], bottom[:3], strict=True))


def _lum(c) -> float:
    f = [u / 12.92 if u <= 0.04045 else ((u + 0.055) / 1.055) ** 2.4 for u in c[:3]]
    return 0.2126 * f[0] + 0.7152 * f[1] + 0.0722 * f[2]


def _contrast(a, b) -> float:
    hi, lo = sorted((_lum(a), _lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_probability_chips_read_in_both_themes(browser, app_url, theme):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=theme)
    page = ctx.new_page()
    try:
        page.goto(app_url + "/generate" + QUERY)
        wait_idle(page)
        page.locator(".st-key-btn_run button").first.click()
        deadline = time.time() + 300
        while page.locator(".semviz-strip .tok").count() < STEPS:
            assert time.time() < deadline, "the run did not finish"
            page.wait_for_timeout(300)
        wait_idle(page)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator(".semviz-strip").first.screenshot(path=str(SHOTS / f"strip_{theme}.png"))
        got = page.evaluate(COLOURS)
        bg = _rgba(got["page"])
        shown = [(_over(_rgba(b), bg), _rgba(f), t) for b, f, t in got["toks"]]
        text = [(round(_contrast(chip, fg), 2), t) for chip, fg, t in shown]
        assert min(text)[0] >= 4.5, (theme, sorted(text)[:3])  # WCAG AA for body text
        strongest = max(_contrast(chip, bg) for chip, _, _ in shown)
        assert strongest >= 2.6, (theme, strongest)  # the scale's end stands out from the page
    finally:
        ctx.close()
