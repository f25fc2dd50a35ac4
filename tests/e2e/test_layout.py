"""Layout in a real browser on the real default model: no label or metric cut, both themes,
presenter mode on one screen, a click on a step-axis chart selects the step.

Run with ``pytest -m e2e tests/e2e/test_layout.py``. Screenshots of the pages checked
(1280×800 and 1440×900, light and dark; the first screen and the whole page) go to
tests/e2e/artifacts/layout/.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.conftest import ARTIFACTS, nav_click
from tests.e2e.test_browser import wait_idle
from ui import nav

pytestmark = pytest.mark.e2e

SHOTS = ARTIFACTS / "layout"
SIZES = [(1280, 800), (1440, 900)]
THEMES = ("light", "dark")
PAGES = [
    "generate",
    "distributions",
    "thermodynamics",
    "attention",
    "pipeline",
    "report",
    "tour_1_baseline",
    "tour_2_entropy",
    "tour_3_distribution",
    "tour_4_gravity",
    "tour_5_ab",
    "kv_cache",
    "compare",
    "frontier",
    "presenter",
]
STEPS = 16
# a hot run, so some steps take a token from below the top candidates
QUERY = f"?run_n={STEPS}&temperature=1.3&gravity_lambda=0.5"

# Text that a container with overflow hidden/clip (or an ellipsis) cuts: the element's box
# against each clipping ancestor's box, and its own scroll size against its client size.
CLIPPED_TEXT = """
(rootSel) => {
  const out = [];
  const root = document.querySelector(rootSel);
  if (!root) return out;
  const clips = (cs) => ['hidden', 'clip'].includes(cs.overflowX) || ['hidden', 'clip'].includes(cs.overflowY);
  // a selectbox shows its value in an input: a cut value ("attentio") is a cut label
  for (const el of root.querySelectorAll('[data-testid="stSelectbox"] input')) {
    if (el.value && el.getClientRects().length && el.scrollWidth > el.clientWidth + 1)
      out.push(`${el.value} (selectbox value: ${el.scrollWidth} > ${el.clientWidth})`);
  }
  for (const el of root.querySelectorAll('*')) {
    const own = [...el.childNodes].some(n => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
    // svg: checked per chart below; katex-mathml: KaTeX's visually hidden copy for readers
    if (!own || el.closest('svg, .katex-mathml') || !el.getClientRects().length) continue;
    const cs = getComputedStyle(el);
    if (cs.visibility === 'hidden' || cs.opacity === '0') continue;
    const text = el.textContent.trim().slice(0, 50);
    if ((cs.textOverflow === 'ellipsis' || clips(cs)) && el.scrollWidth > el.clientWidth + 1) {
      out.push(`${text} (scroll ${el.scrollWidth} > ${el.clientWidth})`);
      continue;
    }
    const r = el.getBoundingClientRect();
    for (let a = el.parentElement; a && a !== root.parentElement; a = a.parentElement) {
      const acs = getComputedStyle(a);
      if (!clips(acs)) continue;
      const b = a.getBoundingClientRect();
      const x = ['hidden', 'clip'].includes(acs.overflowX);
      const y = ['hidden', 'clip'].includes(acs.overflowY);
      if ((x && (r.left < b.left - 1 || r.right > b.right + 1)) ||
          (y && (r.top < b.top - 1 || r.bottom > b.bottom + 1))) {
        out.push(`${text} (cut by ${a.getAttribute('data-testid') || a.className})`);
        break;
      }
    }
  }
  return out;
}
"""

# Every label a Plotly chart draws (ticks, axis titles, legend, annotations, bar and point
# text, colour bars) inside the chart's own SVG, and every chart inside the main column.
CLIPPED_CHART_TEXT = """
() => {
  const out = [];
  const main = document.querySelector('[data-testid="stMainBlockContainer"]').getBoundingClientRect();
  const sel = ['.xtick text', '.ytick text', '.g-xtitle text', '.g-ytitle text', '.g-y2title text',
               '.legendtext', '.annotation-text', '.gtitle', '.textpoint text', '.bartext',
               '.colorbar text'].join(', ');
  document.querySelectorAll('.js-plotly-plot').forEach((gd, k) => {
    const svg = gd.querySelector('.main-svg');
    if (!svg) return;
    const box = svg.getBoundingClientRect();
    if (box.right > main.right + 1) out.push(`chart ${k} is wider than the page column`);
    gd.querySelectorAll(sel).forEach(t => {
      const r = t.getBoundingClientRect();
      if (!r.width || !r.height || !t.textContent.trim()) return;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 ||
          r.bottom > box.bottom + 1)
        out.push(`chart ${k}: "${t.textContent.slice(0, 40)}" outside its figure`);
    });
  });
  return out;
}
"""


def _goto(page, slug: str) -> None:
    """Open a page in the same session (presenter mode hides the sidebar: leave it first)."""
    leave = page.get_by_text("Leave presenter mode")
    if leave.count():
        leave.first.click()
        wait_idle(page)
    title = next(p.title for p in nav.PAGES if p.path == f"app_pages/{slug}.py")
    nav_click(page, title)
    wait_idle(page)


def _make_run(page, url: str, n: int) -> None:
    """A run of ``n`` tokens through the Generate page's Run button."""
    page.goto(url + "/generate" + QUERY)
    wait_idle(page)
    page.locator(".st-key-btn_run button").first.click()
    deadline = time.time() + 600
    while page.locator(".semviz-strip .tok").count() < n:
        assert time.time() < deadline, "the run did not finish"
        time.sleep(0.5)
    wait_idle(page)


OVERHANG = """
() => {
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  const right = main ? main.getBoundingClientRect().right : 1e9;
  return Math.max(0, ...[...document.querySelectorAll('.js-plotly-plot .main-svg')]
    .map(s => s.getBoundingClientRect().right - right));
}
"""


# every chart drawn as wide as its box: true again once Plotly has re-laid out after a resize
# (measured on every page with charts: within 0.31 s of it)
CHARTS_FIT = """
() => [...document.querySelectorAll('.js-plotly-plot')].every(gd => {
  const svg = gd.querySelector('.main-svg');
  return !svg || Math.abs(svg.getBoundingClientRect().width - gd.getBoundingClientRect().width) <= 1;
})
"""


def _settle(page, timeout: float = 8.0) -> None:
    """Wait for the charts to re-lay out after a resize (Plotly redraws them at the new width
    a moment later), then for one more paint."""
    time.sleep(0.1)  # the resize observers' turn
    deadline = time.time() + timeout
    while time.time() < deadline and not (
        page.evaluate(CHARTS_FIT) and page.evaluate(OVERHANG) <= 1
    ):
        time.sleep(0.05)
    time.sleep(0.15)


def _shoot(page, name: str, w: int, h: int, whole: bool = True) -> None:
    """The first screen, and with ``whole`` the whole page (the main block scrolls inside the
    viewport)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}_{w}x{h}.png"))
    full = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    if whole and full > h + 10:
        page.set_viewport_size({"width": w, "height": min(full, 8000)})
        _settle(page)
        page.screenshot(path=str(SHOTS / f"{name}_{w}x{h}_full.png"))
        page.set_viewport_size({"width": w, "height": h})
        _settle(page)


@pytest.fixture(scope="module")
def run_page(browser, app_url):
    """One session with a run, shared by the layout checks."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    page = ctx.new_page()
    _make_run(page, app_url, STEPS)
    yield page
    ctx.close()


def test_no_label_or_metric_is_cut(run_page):
    page = run_page
    problems = []
    for slug in PAGES:
        _goto(page, slug)
        for theme in THEMES:
            page.emulate_media(color_scheme=theme)
            for w, h in SIZES:
                page.set_viewport_size({"width": w, "height": h})
                _settle(page)
                where = f"{slug} {w}×{h} {theme}"
                cut = page.evaluate(CLIPPED_TEXT, '[data-testid="stMain"]')
                cut += page.evaluate(CLIPPED_CHART_TEXT)
                problems += [f"{where}: {c}" for c in cut]
                # the whole page at the last size only: each tall shot re-lays out the charts
                _shoot(page, f"{slug}_{theme}", w, h, whole=(w, h) == SIZES[-1])
    assert not problems, f"{len(problems)} cut:\n" + "\n".join(problems[:60])


def test_sidebar_choices_are_not_cut(run_page):
    page = run_page
    _goto(page, "distributions")
    page.locator('[data-testid="stSidebar"] summary', has_text="Gravity").first.click()
    wait_idle(page)
    for w, h in SIZES:
        page.set_viewport_size({"width": w, "height": h})
        _settle(page)
        cut = page.evaluate(CLIPPED_TEXT, '[data-testid="stSidebar"]')
        assert not cut, f"{w}×{h}: " + "; ".join(cut)


def _luminance(rgb: str) -> float:
    r, g, b = (int(v) / 255 for v in re.findall(r"\d+", rgb)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_theme_follows_the_viewer_and_no_deploy_button(run_page):
    page = run_page
    _goto(page, "thermodynamics")
    bg = {}
    for theme in THEMES:
        page.emulate_media(color_scheme=theme)
        time.sleep(0.8)
        bg[theme] = _luminance(
            page.evaluate(
                "() => getComputedStyle(document.querySelector('.stApp')).backgroundColor"
            )
        )
    assert bg["light"] > 0.8 and bg["dark"] < 0.2, bg
    assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
    assert page.get_by_role("button", name="Deploy").count() == 0


def test_click_on_a_step_axis_point_selects_that_step(run_page):
    page = run_page
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1440, "height": 900})
    _goto(page, "thermodynamics")
    chart = page.locator(".js-plotly-plot").first
    chart.scroll_into_view_if_needed()
    point = chart.locator(".scatterlayer .trace").first.locator("path.point").nth(5)
    point.click(force=True)
    wait_idle(page)
    url = page.evaluate("location.href")
    assert re.search(r"[?&]step=5(&|$)", url), url
    _goto(page, "distributions")
    assert page.get_by_role("heading", name=re.compile(r"^Step 5:")).count() == 1


def _presenter_state(page) -> dict:
    return page.evaluate(
        """() => {
          const main = document.querySelector('[data-testid="stMain"]');
          const gd = document.querySelector('.js-plotly-plot');
          const btn = (k) => document.querySelector(`.st-key-${k} button`).getBoundingClientRect();
          return {
            scroll: main.scrollHeight - main.clientHeight,
            chartBottom: gd.getBoundingClientRect().bottom,
            title: document.querySelector('.semviz-title').textContent,
            rows: gd.data[0].y.length,
            prev: btn('pres_prev').width, next: btn('pres_next').width,
            nextHeight: btn('pres_next').height,
          };
        }"""
    )


@pytest.mark.parametrize(("w", "h"), [(1440, 900), (1920, 1080)])
def test_presenter_fits_one_screen_and_steps_with_the_keys(browser, app_url, w, h):
    ctx = browser.new_context(viewport={"width": w, "height": h})
    page = ctx.new_page()
    try:
        _make_run(page, app_url, STEPS)
        _goto(page, "presenter")
        seen_extra = False
        for k in range(STEPS):
            st = _presenter_state(page)
            assert st["scroll"] <= 1, f"step {k}: the page scrolls by {st['scroll']} px"
            assert st["chartBottom"] <= h, f"step {k}: the chart ends below the screen"
            assert min(st["prev"], st["next"], st["nextHeight"]) >= 64, st
            if st["rows"] > 8:  # the token taken ranks below the drawn 8: its own bar, a note
                seen_extra = True
                assert page.get_by_text(re.compile(r"so it has its own bar")).count() == 1
            if k == 0:
                _shoot(page, "presenter_screen", w, h)
            before = st["title"]
            page.keyboard.press("ArrowLeft")
            wait_idle(page)
            if k < STEPS - 1:
                assert _presenter_state(page)["title"] != before, "← did not move the step"
        assert seen_extra, "no step took a token from below the top 8 in this run"
    finally:
        ctx.close()


MODEBARS = """
() => [...document.querySelectorAll('.js-plotly-plot .modebar-container')]
  .map(m => getComputedStyle(m).display)
"""


def test_on_a_phone_no_chart_toolbar_covers_a_title(run_page):
    """At 390 px Plotly's modebar sat over the first subplot's title; it is hidden there, and a
    tap still shows a point's hover label."""
    page = run_page
    _goto(page, "thermodynamics")
    page.set_viewport_size({"width": 390, "height": 844})
    _settle(page)
    plot = page.locator(".js-plotly-plot").first
    plot.scroll_into_view_if_needed()
    plot.hover()
    shown = page.evaluate(MODEBARS)
    assert shown and set(shown) == {"none"}, shown
    page.set_viewport_size({"width": 1440, "height": 900})
    _settle(page)
    assert "none" not in set(page.evaluate(MODEBARS))
