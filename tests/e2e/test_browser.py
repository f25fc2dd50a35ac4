"""The app in a real browser (chromium) on the real default model.

Run with ``pytest -m e2e tests/e2e``. Screenshots (1280×800) go to tests/e2e/artifacts/.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.e2e.conftest import ARTIFACTS, nav_click

pytestmark = pytest.mark.e2e

PAGES = [
    ("Generate", "generate"),
    ("Distributions", "distributions"),
    ("Thermodynamics", "thermodynamics"),
    ("Attention & gravity", "attention"),
    ("KV cache", "kv_cache"),
    ("Pipeline", "pipeline"),
]


def wait_idle(page, timeout: float = 180.0) -> None:
    """Wait until Streamlit has not been running the script for a moment."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
    deadline = time.time() + timeout
    idle_since = None
    while time.time() < deadline:
        state = page.get_attribute('[data-testid="stApp"]', "data-test-script-state")
        if state == "notRunning":
            idle_since = idle_since or time.time()
            if time.time() - idle_since > 0.8:
                return
        else:
            idle_since = None
        time.sleep(0.1)
    raise TimeoutError("app did not become idle")


def wait_url(page, ok, timeout: float = 120.0) -> None:
    """Poll the address (the app rewrites its query string without a navigation)."""
    # read from the page: ``page.url`` is only updated while playwright handles events, which
    # a sleeping poll does not let it do, so it can keep a superseded address
    deadline = time.time() + timeout
    while not ok(url := page.evaluate("location.href")):
        assert time.time() < deadline, f"the link did not follow the slider: {url}"
        page.wait_for_timeout(200)


def no_traceback(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, page.inner_text("body")[:2000]
    assert "Traceback" not in page.inner_text("body")


def open_app(browser, url: str, query: str = ""):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    page.goto(url + "/" + query)
    wait_idle(page)
    return ctx, page


def goto(page, title: str) -> None:
    nav_click(page, title)
    wait_idle(page)


def tokens(page) -> list[str]:
    return page.locator(".semviz-strip .tok").all_inner_texts()


def plot_data(page, index: int = 0) -> str:
    return page.evaluate(
        "(i) => JSON.stringify(document.querySelectorAll('.js-plotly-plot')[i].data)", index
    )


def click(page, name: str) -> None:
    page.get_by_role("button", name=name, exact=True).click()
    wait_idle(page)


def wait_ready(page, n: int, timeout: float = 600.0) -> None:
    deadline = time.time() + timeout
    pat = re.compile(rf"\b{n} tokens? generated · (ready|stopped)")
    while time.time() < deadline:
        if pat.search(page.inner_text("body")):
            wait_idle(page)
            return
        time.sleep(0.25)
    raise TimeoutError(f"{n} tokens not generated in time: {page.inner_text('body')[:500]}")


def test_pages_step_slider_screenshots(browser, app_url):
    ctx, page = open_app(browser, app_url, "?run_n=11")
    try:
        no_traceback(page)
        click(page, "Step")
        # the first Step builds the decoder as a task whose ticks can be more than the idle
        # wait apart on a loaded machine: wait for the header to say it is done
        wait_ready(page, 1)
        assert len(tokens(page)) == 1, "Step produced no token"
        page.get_by_role("button", name="Run 11", exact=True).click()
        wait_ready(page, 12)
        no_traceback(page)
        assert len(tokens(page)) == 12

        # a slider move changes a chart (the what-if replay, no model run)
        goto(page, "Distributions")
        before = plot_data(page, 0)
        slider = page.get_by_role("slider", name="Temperature")
        slider.focus()
        for _ in range(6):  # a person's key repeat, not six events in one millisecond
            page.keyboard.press("ArrowLeft", delay=50)
            time.sleep(0.15)
        wait_url(page, lambda url: re.search(r"temperature=0\.5(&|$)", url))  # six steps, none lost
        wait_idle(page)
        time.sleep(0.5)
        wait_idle(page)
        after = plot_data(page, 0)
        assert before != after, "moving the temperature slider did not change the chart"
        for _ in range(6):
            page.keyboard.press("ArrowRight", delay=50)
            time.sleep(0.15)
        wait_url(page, lambda url: "temperature=" not in url)
        wait_idle(page)

        # every page loads without a traceback; one 1280×800 screenshot each
        for title, slug in PAGES:
            goto(page, title)
            no_traceback(page)
            if slug == "pipeline":
                body = page.inner_text("body")
                assert "dequantised to float32" in body and "Q4_1-quantised model" in body
                click(page, "Measure prefill times")  # a task: its chart comes when it ends
                page.wait_for_selector("text=Attention compares every token", timeout=300_000)
                wait_idle(page)
            if slug == "kv_cache":
                page.get_by_role("button", name="Run kv-eval").click()
                page.wait_for_selector("text=kv-eval: done", timeout=600_000)
                wait_idle(page)
            assert page.locator(".js-plotly-plot").count() >= 1, f"{title}: no chart"
            page.screenshot(path=str(ARTIFACTS / f"{slug}.png"))
            # the app scrolls inside its main block: a second shot with the charts in view
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
            time.sleep(0.5)
            page.screenshot(path=str(ARTIFACTS / f"{slug}_charts.png"))
    finally:
        ctx.close()


def _run_alone(browser, url: str, query: str, n: int) -> list[str]:
    ctx, page = open_app(browser, url, query)
    try:
        page.get_by_role("button", name=f"Run {n}", exact=True).click()
        wait_ready(page, n)
        return tokens(page)
    finally:
        ctx.close()


def test_two_sessions_get_their_own_tokens(browser, app_url):
    n = 6
    qa, qb = f"?run_n={n}&seed=1", f"?run_n={n}&seed=2&temperature=1.2"
    alone_a = _run_alone(browser, app_url, qa, n)
    alone_b = _run_alone(browser, app_url, qb, n)
    assert len(alone_a) == n and len(alone_b) == n

    ca, pa = open_app(browser, app_url, qa)
    cb, pb = open_app(browser, app_url, qb)
    try:
        # start both, then wait for both: their play ticks interleave on the server
        pa.get_by_role("button", name=f"Run {n}", exact=True).click()
        pb.get_by_role("button", name=f"Run {n}", exact=True).click()
        wait_ready(pa, n)
        wait_ready(pb, n)
        both_a, both_b = tokens(pa), tokens(pb)
    finally:
        ca.close()
        cb.close()
    (ARTIFACTS / "two_sessions.json").write_text(
        json.dumps({"alone": [alone_a, alone_b], "together": [both_a, both_b]}, indent=1)
    )
    assert both_a == alone_a
    assert both_b == alone_b
    assert alone_a != alone_b
