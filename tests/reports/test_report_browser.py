"""report.html opened from disk in chromium with the network off: every chart draws.

The screenshot goes to tests/reports/artifacts/report_offline.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from semviz.output.report import BROWSER_ARGS, chromium_path
from tests.reports.conftest import ARTIFACTS

pytestmark = [pytest.mark.e2e, pytest.mark.real_model]

# the same browser and flags the report's PNG export uses
CHROMIUM = chromium_path() or "/usr/bin/chromium"
ARGS = BROWSER_ARGS


def test_report_html_draws_offline(real_report):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    trace, rep = real_report
    blocked: list[str] = []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            ctx = b.new_context(viewport={"width": 1280, "height": 900}, offline=True)
            page = ctx.new_page()
            page.route("**/*", route)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(rep.html.resolve().as_uri())
            page.wait_for_function(
                "window.semvizCharts > 0 && window.semvizDrawn === window.semvizCharts",
                timeout=60_000,
            )
            assert not errors, errors
            assert page.evaluate("window.semvizCharts") == len(rep.views)
            for v in rep.views:
                div = page.locator(f"#chart-{v.name}")
                assert div.locator("svg.main-svg").count() >= 1, v.name
                box = div.bounding_box()
                assert box["height"] == pytest.approx(v.height, abs=2), v.name
                # drawn marks: bars, lines, points, heatmap images or shapes
                marks = div.locator(
                    "g.trace path, g.trace rect, g.points path, image, g.heatmaplayer *"
                ).count()
                assert marks > 0, f"{v.name} drew no marks"
            assert page.locator("#text .tok").count() == len(trace.steps)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report_offline.png"), full_page=True)
            page.locator("#chart-distribution").screenshot(
                path=str(ARTIFACTS / "report_offline_distribution.png")
            )
        finally:
            b.close()
    assert not blocked, f"the page tried the network: {blocked[:3]}"
