"""The first five minutes and direct manipulation, in a real browser on the real default model.

Front door; an example run with no model run; clicking a token selects its step; a branch from
an alternative with the old branch kept; what-if ghost text; a link with ``steps`` reproducing
the tokens; Stop on a long task; ten fast Step clicks giving exactly the CLI's tokens.

Run one file at a time: ``pytest -m e2e tests/e2e/test_generate_browser.py``. Screenshots go
to tests/e2e/artifacts/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from semviz.output.style import display_token
from tests.e2e.conftest import ARTIFACTS, ROOT, nav_click
from tests.e2e.test_browser import no_traceback, tokens, wait_idle
from ui.state import DEFAULT_PROMPT

pytestmark = pytest.mark.e2e

EXAMPLE = "sea.json"
EXAMPLE_TITLE = "The sea, at the app's defaults"
PROMPT = DEFAULT_PROMPT  # the example was recorded from it, at the defaults


def shown(texts: list[str]) -> list[str]:
    """Strip texts back to token texts (the strip shows ↵ before a newline, ∅ for empty)."""
    return ["" if t == "∅" else t.replace("↵\n", "\n") for t in texts]


def open_page(browser, url: str, path: str = "/", **kw):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, **kw)
    page = ctx.new_page()
    page.goto(url + path)
    wait_idle(page)
    return ctx, page


def wait_text(page, pattern: str, timeout: float = 600.0) -> re.Match:
    pat = re.compile(pattern)
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = pat.search(page.inner_text("body"))
        if m:
            wait_idle(page)
            return m
        time.sleep(0.25)
    raise TimeoutError(f"{pattern!r} not on the page: {page.inner_text('body')[:800]}")


def wait_done(page, n: int | None = None, timeout: float = 600.0) -> int:
    """Wait for a settled run (no task running); return its length."""
    num = r"\d+" if n is None else str(n)
    m = wait_text(page, rf"\b({num}) tokens? generated · (ready|stopped)", timeout)
    return int(m.group(1))


def query(page) -> dict[str, str]:
    from urllib.parse import parse_qsl, urlparse

    return dict(parse_qsl(urlparse(page.evaluate("location.href")).query))


def open_example(page) -> list[str]:
    t0 = time.perf_counter()
    page.get_by_role("button", name=EXAMPLE_TITLE, exact=True).click()
    page.wait_for_selector(".semviz-strip .tok", timeout=120_000)
    wait_idle(page)
    (ARTIFACTS / "example_open_seconds.txt").write_text(f"{time.perf_counter() - t0:.2f}\n")
    return tokens(page)


def test_front_door_and_an_example_without_a_model_run(browser, app_url):
    ctx, page = open_page(browser, app_url)
    try:
        no_traceback(page)
        body = page.inner_text("body")
        assert "Watch a real language model choose its next token" in body
        for way in ("Try a prompt", "Take the tour", "Open an example run"):
            assert way in body
        assert page.get_by_role("button", name="Generate", exact=True).count() == 1
        assert page.get_by_role("link", name="Start the tour").count() == 1
        page.screenshot(path=str(ARTIFACTS / "home.png"))

        got = open_example(page)
        recorded = json.loads((ROOT / "data" / "examples" / EXAMPLE).read_text())
        assert recorded["prompt"] == PROMPT
        assert shown(got) == [s["token_text"] for s in recorded["steps"]]
        assert "no model run" in page.inner_text("body")
        assert query(page)["steps"] == str(len(recorded["steps"]))
        no_traceback(page)
        page.screenshot(path=str(ARTIFACTS / "generate_example.png"))
    finally:
        ctx.close()


def test_click_a_token_then_branch_from_an_alternative(browser, app_url):
    ctx, page = open_page(browser, app_url)
    try:
        before = open_example(page)
        # clicking a token selects its step everywhere: the URL's step follows
        page.locator(".semviz-strip .tok").nth(5).click()
        wait_idle(page)
        assert query(page)["step"] == "5"
        assert page.locator(".semviz-strip .tok.sel").get_attribute("data-step") == "5"
        nav_click(page, "Distributions")
        wait_idle(page)
        assert query(page)["step"] == "5"
        nav_click(page, "Generate")
        page.wait_for_selector(".semviz-strip .tok", timeout=60_000)
        wait_idle(page)

        # hover a token: the card lists the alternatives at every stage
        page.locator(".semviz-strip .tok").nth(3).hover()
        card = page.locator(".semviz-card")
        card.wait_for(timeout=10_000)
        assert card.locator("th").all_inner_texts()[:2] == ["token", "raw"]
        alt = card.locator("tr.alt").first
        alt_text = alt.locator("td").first.inner_text()  # shown as style.display_token
        page.screenshot(path=str(ARTIFACTS / "generate_hover.png"))
        alt.click()  # branch from step 3 with that token
        options = page.locator('.st-key-branch_pick [role="radiogroup"] label')
        enabled = '.st-key-branch_pick label[data-testid="stRadioOption"]:not([data-disabled])'
        page.wait_for_selector(enabled, timeout=600_000)  # the branch's task has ended
        wait_done(page)
        no_traceback(page)
        after = shown(tokens(page))
        assert after[:3] == shown(before)[:3]
        assert display_token(after[3]) == alt_text
        assert options.count() == 2
        page.screenshot(path=str(ARTIFACTS / "generate_branch.png"))
        # the old branch is still there: switch back
        options.first.click()
        wait_idle(page)
        assert tokens(page) == before
    finally:
        ctx.close()


def test_slider_move_shows_ghost_text_the_model_decodes(browser, app_url, tmp_path):
    ctx, page = open_page(browser, app_url)
    try:
        recorded = shown(open_example(page))
        slider = page.get_by_role("slider", name="Temperature")
        slider.focus()
        for _ in range(16):  # 0.8 -> 0.0: greedy
            page.keyboard.press("ArrowLeft")
        wait_text(page, r"What-if \([^)]*\): with these sliders step \d+ would pick", 120)
        ghost = page.locator(".semviz-strip .ghost")
        ghost.first.wait_for(timeout=60_000)
        assert "what-if" in page.locator(".semviz-strip .ghost-lane").inner_text().lower()
        assert page.locator(".semviz-strip .tok.first").count() == 1
        # the continuation is decoded for real and streams in
        deadline = time.time() + 300
        while time.time() < deadline and "decoding" in page.locator(".semviz-strip").inner_text():
            time.sleep(0.5)
        wait_idle(page)
        assert ghost.count() > 1
        k = int(page.locator(".semviz-strip .tok.first").get_attribute("data-step"))
        assert ghost.first.get_attribute("data-step") == str(k)
        got = shown(ghost.all_inner_texts())
        page.screenshot(path=str(ARTIFACTS / "generate_ghost.png"))
    finally:
        ctx.close()
    # The ghost is the model's own continuation, not the replay's per-step picks: at T = 0 the
    # recorded steps before k are the greedy ones (k is the first the sliders change), so a
    # greedy CLI run from the prompt is the recorded run up to k, then exactly the ghost.
    want = cli_tokens(PROMPT, k + len(got), 0, 0.0, tmp_path)
    assert want[:k] == recorded[:k]
    assert want[k:] == got


def test_a_link_with_steps_reproduces_the_tokens(browser, app_url):
    ctx, page = open_page(browser, app_url, "/generate?seed=4&temperature=0.9&run_n=6")
    try:
        no_traceback(page)
        page.screenshot(path=str(ARTIFACTS / "generate_before_run.png"))
        page.get_by_role("button", name="Run 6", exact=True).click()
        wait_done(page, 6)
        no_traceback(page)
        assert len(tokens(page)) == 6  # the strip shows the run with no reload
        page.screenshot(path=str(ARTIFACTS / "generate_after_run.png"))
        # the page scrolls inside Streamlit's main block, not the document: scroll to the
        # selected step's details for the second picture
        head = page.get_by_role("heading", name="Top alternatives")
        head.evaluate("(e) => e.scrollIntoView({block: 'start'})")
        page.locator(".js-plotly-plot").first.hover()  # the modebar shows, over the top right
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "generate_after_run_details.png"))
        page.locator(".semviz-strip .tok").nth(2).click()
        wait_idle(page)
        nav_click(page, "Thermodynamics")
        wait_idle(page)
        link = page.evaluate("location.href")
        assert query(page)["steps"] == "6" and query(page)["step"] == "2"
        nav_click(page, "Generate")
        wait_idle(page)
        made = tokens(page)
    finally:
        ctx.close()
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    try:
        page.goto(link)
        wait_text(page, r"regenerating it with the link's settings", 120)
        page.wait_for_selector(".js-plotly-plot", timeout=600_000)  # the views, once regenerated
        wait_idle(page)
        no_traceback(page)
        assert "/thermodynamics" in page.evaluate("location.href") and query(page)["step"] == "2"
        assert page.locator(".js-plotly-plot").count() >= 1
        nav_click(page, "Generate")
        wait_idle(page)
        assert tokens(page) == made
    finally:
        ctx.close()


@pytest.mark.parametrize("button", ["Run 24", "Play"])
def test_a_reload_during_a_run_brings_its_tokens_back(browser, app_url, button):
    """Run 24 and Play (to the run's length, 24 here) both go on to the same end after a
    reload, with the tokens made before it unchanged."""
    # a continuation without the chat template: the model does not end it within 24 tokens
    url = (
        "/generate?seed=1&run_n=24&max_new_tokens=24&chat=0"
        "&prompt=The+history+of+the+lighthouse+keepers"
    )
    ctx, page = open_page(browser, app_url, url)
    try:
        page.get_by_role("button", name=button, exact=True).click()
        deadline = time.time() + 300
        while len(tokens(page)) < 8 and time.time() < deadline:
            time.sleep(0.2)
        before = shown(tokens(page))
        assert 8 <= len(before) < 24, "the run ended before the reload"
        assert query(page)["steps"] == "24"  # the link names the whole run from its start
        page.reload()
        wait_done(page, 24)
        after = shown(tokens(page))
        assert after[: len(before)] == before and len(after) == 24
        no_traceback(page)
    finally:
        ctx.close()


def test_a_link_after_a_branch_and_a_slider_move_reopens_both(browser, app_url):
    ctx, page = open_page(browser, app_url, "/generate?seed=2&run_n=10")
    try:
        page.get_by_role("button", name="Run 10", exact=True).click()
        wait_done(page, 10)
        page.locator(".semviz-strip .tok").nth(4).hover()
        page.locator(".semviz-card").wait_for(timeout=10_000)
        page.locator(".semviz-card tr.alt").first.click()  # branch at step 4 with it
        enabled = '.st-key-branch_pick label[data-testid="stRadioOption"]:not([data-disabled])'
        page.wait_for_selector(enabled, timeout=600_000)  # the branch's task has ended
        wait_done(page, 10)
        branch = shown(tokens(page))
        slider = page.get_by_role("slider", name="Temperature")
        slider.focus()
        for _ in range(6):  # 0.8 -> 1.1
            page.keyboard.press("ArrowRight")
        wait_text(page, r"What-if \(recorded at Temperature 0\.8, viewing at 1\.1\)", 120)
        link = page.evaluate("location.href")
        assert query(page)["take"].startswith("4.") and query(page)["rec.temperature"] == "0.8"
    finally:
        ctx.close()
    ctx, page = open_page(browser, link, "")
    try:
        wait_text(page, r"What-if \(recorded at Temperature 0\.8, viewing at 1\.1\)", 300)
        nav_click(page, "Generate")
        wait_done(page, 10)
        assert shown(tokens(page)) == branch
        page.screenshot(path=str(ARTIFACTS / "link_branch_whatif.png"))
        no_traceback(page)
    finally:
        ctx.close()


def until(cond, timeout: float = 30.0) -> None:
    """Poll ``cond`` until it holds or ``timeout`` s pass (the caller asserts it)."""
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.2)


def test_back_returns_to_the_step_selected_before(browser, app_url):
    ctx, page = open_page(browser, app_url, "/generate?seed=3&run_n=6")
    try:
        page.get_by_role("button", name="Run 6", exact=True).click()
        wait_done(page, 6)
        for k in (2, 4):
            page.locator(".semviz-strip .tok").nth(k).click()
            wait_idle(page)
            assert query(page)["step"] == str(k)

        def selected() -> str | None:
            return page.locator(".semviz-strip .tok.sel").get_attribute("data-step")

        assert selected() == "4"
        page.go_back()
        page.wait_for_function("new URLSearchParams(location.search).get('step') === '2'")
        until(lambda: selected() == "2")
        wait_idle(page)
        assert selected() == "2" and query(page)["step"] == "2" and len(tokens(page)) == 6
        page.go_forward()
        until(lambda: selected() == "4")
        assert selected() == "4"
        no_traceback(page)
    finally:
        ctx.close()


def press_stop_once(page, made, title: str) -> int:
    """While the task streams on page ``title``, press its Stop once; return how many tokens
    it kept.

    The ticks redraw the progress and the strip but not Stop, so the button under the pointer
    is the same one from press to release (inside the ticking fragment it could be swapped for
    its new copy in between). Checked: the same DOM node is there after a few more ticks."""

    def ticks(k: int) -> None:
        n, deadline = made(), time.time() + 300
        while time.time() < deadline and made() < n + k:
            time.sleep(0.2)
        assert made() >= n + k, "the task did not stream"

    page.wait_for_function(f"document.querySelector('h1')?.innerText.includes({title!r})")
    ticks(5)  # the page has drawn (a page left behind can linger a moment, marked stale)
    # by role: a button sized to its text in a row also has a hidden copy, for measuring
    stop = page.locator(".st-key-job_stop").get_by_role("button")
    handle = stop.element_handle()
    ticks(3)
    assert stop.count() == 1 and handle.evaluate("e => e.isConnected")
    handle.click()
    return int(wait_text(page, r"stopped after (\d+) tokens; they are kept", 30).group(1))


def test_stop_on_a_long_task(browser, app_url):
    # a continuation without the chat template: the model does not end it within seconds
    long = "/generate?run_n=400&seed=0&chat=0&prompt=The+history+of+the+lighthouse+keepers"
    ctx, page = open_page(browser, app_url, long)
    try:
        page.get_by_role("button", name="Run 400", exact=True).click()
        kept = press_stop_once(page, lambda: len(tokens(page)), "Generate")
        n = wait_done(page)
        assert n == kept and 3 <= n < 400
        no_traceback(page)
        page.get_by_role("button", name="Step", exact=True).click()  # still usable
        n = wait_done(page, n + 1)
        # on another page the task's panel (progress and Stop) heads the page
        page.get_by_role("button", name="Run 400", exact=True).click()
        page.wait_for_selector(".st-key-job_stop", timeout=120_000)
        nav_click(page, "Thermodynamics")

        def made() -> int:
            m = re.search(r"Run 400: decoding · (\d+) of 400 tokens", page.inner_text("body"))
            return int(m.group(1)) if m else 0

        def status_steps() -> int:  # the status line: "… · **N** steps · working…"
            return int(re.search(r"(\d+) steps · working", page.inner_text("body")).group(1))

        page.wait_for_function("document.querySelector('h1')?.innerText.includes('Thermo')")
        page.wait_for_function("document.body.innerText.includes('working')")
        first, k, deadline = status_steps(), made(), time.time() + 300
        while made() < k + 3 and time.time() < deadline:
            time.sleep(0.2)
        assert status_steps() > first  # it ticks with the task, not only when it ends
        kept = press_stop_once(page, made, "Thermodynamics")
        no_traceback(page)
        nav_click(page, "Generate")
        assert wait_done(page) == n + kept
    finally:
        ctx.close()


def cli_tokens(prompt: str, n: int, seed: int, temperature: float, tmp: Path) -> list[str]:
    out = tmp / "cli.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SEMVIZ_MODEL", None)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "semviz",
            "trace",
            "--prompt",
            prompt,
            "--steps",
            str(n),
            "--seed",
            str(seed),
            "--temperature",
            str(temperature),
            "--chat",
            "on",
            "--out",
            str(out),
            "--json",
        ],
        check=True,
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=900,
    )
    return [s["token_text"] for s in json.loads(out.read_text())["steps"]]


def test_ten_fast_step_clicks_give_the_cli_tokens(browser, app_url, tmp_path):
    # on a fresh prompt: the first click's prefill is a Step job, and the clicks that come
    # while it runs are queued on it (Step stays enabled), so none is lost
    ctx, page = open_page(browser, app_url, "/generate?seed=0")
    try:
        step = page.get_by_role("button", name="Step", exact=True)
        for _ in range(10):
            step.click(timeout=2_000)  # a disabled Step would time out here
            time.sleep(0.2)
        # clicks that arrived during a step wait for it and then run, in order: the page can
        # read "ready" between two of them, so wait until the count holds still
        n = wait_done(page)
        while True:
            time.sleep(3)
            again = wait_done(page)
            if again == n:
                break
            n = again
        got = shown(tokens(page))
        no_traceback(page)
        assert not page.locator('[data-testid="stAlertContentError"]').count()
    finally:
        ctx.close()
    want = cli_tokens(PROMPT, 10, 0, 0.8, tmp_path)
    (ARTIFACTS / "fast_clicks.json").write_text(json.dumps({"app": got, "cli": want}, indent=1))
    assert got == want and n == 10
