"""The page list and the sidebar's settings share one screen: on a 1280×900 window the
Temperature slider is in view without scrolling, and every page is one or two clicks away.

Run with ``pytest -m e2e tests/e2e/test_navigation.py``. Screenshots (1280×800 and 390×844,
light and dark) go to tests/e2e/artifacts/navigation/.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import ARTIFACTS, nav_click
from tests.e2e.test_browser import no_traceback, wait_idle
from ui import nav

pytestmark = pytest.mark.e2e

SHOTS = ARTIFACTS / "navigation"


def _open(browser, url: str, w: int, h: int, theme: str = "light"):
    ctx = browser.new_context(viewport={"width": w, "height": h}, color_scheme=theme)
    page = ctx.new_page()
    page.goto(url + "/generate")
    wait_idle(page)
    no_traceback(page)
    return ctx, page


def _in_view(page, locator) -> bool:
    box = locator.bounding_box()
    vh = page.evaluate("innerHeight")
    return (
        box is not None and box["height"] > 0 and 0 <= box["y"] and box["y"] + box["height"] <= vh
    )


def test_temperature_slider_is_in_view_at_1280_by_900(browser, app_url):
    ctx, page = _open(browser, app_url, 1280, 900)
    try:
        slider = page.locator('[data-testid="stSidebar"] [data-testid="stSlider"]').filter(
            has_text="Temperature"
        )
        assert slider.count() == 1
        scrolled = page.evaluate(
            "document.querySelector('[data-testid=\"stSidebarContent\"]').scrollTop"
        )
        assert scrolled == 0
        assert _in_view(page, slider), slider.bounding_box()
        # the pages stay in plain sight: Generate's link is on the first screen too
        link = page.locator('a[href$="/generate"]').filter(has_text="Generate").first
        assert _in_view(page, link)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "generate_1280x900_light.png"))
    finally:
        ctx.close()


def test_every_page_is_reachable_from_the_navigation(browser, app_url):
    ctx, page = _open(browser, app_url, 1280, 900)
    try:
        for spec in nav.PAGES[2:]:  # Home and Generate: checked above and on the front door
            slug = spec.path.rsplit("/", 1)[1].removesuffix(".py")
            if slug == "presenter":
                continue  # it leaves the navigation behind; test_layout opens it
            nav_click(page, spec.title)
            wait_idle(page)
            assert page.evaluate("location.pathname").endswith("/" + slug), spec.title
            no_traceback(page)
    finally:
        ctx.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize(("w", "h"), [(1280, 800), (390, 844)])
def test_screenshots_of_the_navigation(browser, app_url, w, h, theme):
    ctx, page = _open(browser, app_url, w, h, theme)
    try:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"generate_{w}x{h}_{theme}.png"))
        if w < 500:  # on a phone the sidebar opens over the page
            page.locator('[data-testid="stExpandSidebarButton"]').first.click()
            page.wait_for_timeout(500)
            page.screenshot(path=str(SHOTS / f"sidebar_{w}x{h}_{theme}.png"))
    finally:
        ctx.close()
