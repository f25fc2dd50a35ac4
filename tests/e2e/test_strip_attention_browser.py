"""Attention you can follow, in a real browser on the real default model: hovering a token in
the strip lights the context tokens it read, by attention weight, with no rerun of the script.
Screenshots (1280×800 and 390×844, light and dark) go to tests/e2e/artifacts/."""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import ARTIFACTS
from tests.e2e.test_browser import no_traceback, open_app, wait_idle, wait_ready
from ui import strip

pytestmark = pytest.mark.e2e

N = 6
SIZES = ((1280, 800), (390, 844))
LIT = "rgba({}, {}, {}, 0.85)".format(*strip.ATTENDED)
NONE = "rgba({}, {}, {}, 0)".format(*strip.ATTENDED)  # unlit: the colour at no opacity

BACKGROUND = "(sel) => getComputedStyle(document.querySelector(sel)).backgroundColor"
STATE = "() => document.querySelector('[data-testid=stApp]').getAttribute('data-test-script-state')"


def _rule(page, pos: int) -> list[tuple[int, float]]:
    """The links the strip's generated style sheet sets for the token at ``pos``."""
    css = page.evaluate(
        "() => document.querySelector('.semviz-strip-root style.semviz-attn').textContent"
    )
    m = re.search(rf"\.semviz-strip:has\(\.p{pos}:hover\)\{{([^}}]*)\}}", css)
    assert m, css[:500]
    return [(int(a), float(w)) for a, w in re.findall(r"--a(\d+):([0-9.]+)", m.group(1))]


def _script_states(page) -> set[str]:
    """The script's states seen over a second after a hover: {"notRunning"} when it did not
    rerun."""
    states = set()
    for _ in range(10):
        states.add(page.evaluate(STATE))
        page.wait_for_timeout(100)
    return states


def _hover(page, pos: int) -> None:
    tok = page.locator(f".semviz-strip .tok.p{pos}")
    tok.scroll_into_view_if_needed()
    tok.hover()


def test_hovering_a_token_lights_what_it_read_without_a_rerun(browser, app_url):
    ctx, page = open_app(browser, app_url, f"?run_n={N}")
    try:
        page.get_by_role("button", name=f"Run {N}", exact=True).click()
        wait_ready(page, N)
        no_traceback(page)
        positions = [
            int(p)
            for p in page.eval_on_selector_all(
                ".semviz-strip .tok",
                "els => els.map(e => [...e.classList].find(c => /^p\\d+$/.test(c)).slice(1))",
            )
        ]
        assert len(positions) == N and positions == list(range(positions[0], positions[0] + N))
        last = positions[-1]
        read = _rule(page, last)
        assert 1 <= len(read) <= strip.LINKS and read[0][1] == 1.0
        heaviest, weakest = read[0][0], read[-1]
        unread = next(
            p
            for p in range(last)
            if p not in dict(read) and page.locator(f".semviz-strip .p{p}").count()
        )
        sel = f".semviz-strip .p{heaviest}"
        before = page.evaluate(BACKGROUND, sel)
        _hover(page, last)
        page.wait_for_timeout(300)  # the card's and the rules' paint, no round trip
        assert page.evaluate(BACKGROUND, sel) == LIT != before
        # the weakest link is lit by its weight over the heaviest (the browser keeps the
        # alpha in 8 bits)
        w = page.evaluate(BACKGROUND, f".semviz-strip .p{weakest[0]}")
        rgb, alpha = w[w.index("(") + 1 : -1].rsplit(",", 1)
        assert rgb == "{}, {}, {}".format(*strip.ATTENDED)
        assert abs(float(alpha) - weakest[1] * 0.85) <= 1 / 255, (w, weakest)
        assert page.evaluate(BACKGROUND, f".semviz-strip .p{unread}") == NONE
        # no rerun: the script stays idle through the hover
        assert _script_states(page) == {"notRunning"}
        # another token lights what it read instead
        first = positions[0]
        other = _rule(page, first)
        _hover(page, first)
        page.wait_for_timeout(300)
        assert page.evaluate(BACKGROUND, f".semviz-strip .p{other[0][0]}") == LIT
        page.mouse.move(1, 1)
        page.wait_for_timeout(500)
        assert page.evaluate(BACKGROUND, sel) == before
        assert page.evaluate(STATE) == "notRunning"

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for theme in ("light", "dark"):
            page.emulate_media(color_scheme=theme)
            for w_, h_ in SIZES:
                page.set_viewport_size({"width": w_, "height": h_})
                page.wait_for_timeout(800)
                wait_idle(page)
                _hover(page, last)
                page.wait_for_timeout(400)
                assert page.evaluate(BACKGROUND, sel) == LIT
                page.screenshot(path=str(ARTIFACTS / f"strip_attention_{theme}_{w_}x{h_}.png"))
        no_traceback(page)
    finally:
        ctx.close()


def _pick(page, key: str, option: str) -> None:
    """Choose ``option`` in the multiselect ``key`` and wait for the page to settle."""
    page.locator(f".st-key-{key}").click()
    page.get_by_role("option", name=option, exact=True).click()
    page.keyboard.press("Escape")
    wait_idle(page)


def test_on_the_attention_page_the_hover_reads_the_chosen_layer_and_head(browser, app_url):
    """The Attention page's strip lights what a token read in the layers and heads chosen
    above it (one layer and head here), and still answers with no rerun."""
    from tests.e2e.conftest import nav_click

    ctx, page = open_app(browser, app_url, f"?run_n={N}")
    try:
        page.get_by_role("button", name=f"Run {N}", exact=True).click()
        wait_ready(page, N)
        last = int(
            page.eval_on_selector_all(
                ".semviz-strip .tok",
                "els => [...els.at(-1).classList].find(c => /^p\\d+$/.test(c)).slice(1)",
            )
        )
        mean = _rule(page, last)
        nav_click(page, "Attention & gravity")
        wait_idle(page)
        page.locator(".semviz-strip .tok").first.wait_for(timeout=60_000)
        assert _rule(page, last) == mean  # nothing chosen: the mean over layers and heads
        _pick(page, "att_layers", "0")
        _pick(page, "att_heads", "3")
        assert "read light up by its attention, layer 0, head 3" in page.inner_text("body")
        one = _rule(page, last)
        assert one != mean and one[0][1] == 1.0 and len(one) <= strip.LINKS
        sel = f".semviz-strip .p{one[0][0]}"
        _hover(page, last)
        page.wait_for_timeout(300)
        assert page.evaluate(BACKGROUND, sel) == LIT
        assert _script_states(page) == {"notRunning"}
        page.screenshot(path=str(ARTIFACTS / "attention_page_strip_layer0_head3.png"))
        no_traceback(page)
    finally:
        ctx.close()
