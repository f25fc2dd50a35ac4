"""Tour 4 in a real browser on the real default model: its button turns on the gravity the page
draws (the attention-weighted pull, as a rerank) and nothing else, the gravity the shipped run
did not record is recomputed with a progress bar, and the banner says the model ran for it.

Run alone: ``pytest -m e2e tests/e2e/test_tour_browser.py``; screenshots go to
tests/e2e/artifacts/.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import ARTIFACTS, nav_click
from tests.e2e.test_browser import no_traceback, wait_idle
from tests.e2e.test_generate_browser import open_example, open_page, query, wait_text

pytestmark = pytest.mark.e2e


def test_tour4_turns_on_only_the_gravity_it_draws(browser, app_url):
    ctx, page = open_page(browser, app_url)
    try:
        open_example(page)
        before = query(page)
        nav_click(page, "Tour 4 · Gravity rerank")
        wait_text(page, r"Turn on gravity as a rerank")
        page.get_by_role("button", name="Turn on gravity as a rerank (λ = 0.5)").click()
        wait_text(page, r"Gravity on now:", timeout=300)
        # the record lacks this gravity: a task recomputes it, then the page reruns
        wait_text(page, r"gravity recomputed with the model", timeout=300)
        no_traceback(page)
        body = page.inner_text("body")
        assert (
            "Gravity on now: kind pull (attention, cosine), λ = 0.5, over a rerank of the top 64"
            in body
        )
        assert "What pulled " in body and "no per-token terms" not in body
        assert "gravity recomputed with the model" in body
        # the sliders the run recorded stay as they were: only gravity's appear in the link
        after = query(page)
        moved = {k for k in after if after.get(k) != before.get(k)}
        # the link also keeps what the run was recorded at (rec.<slider>), for the same fields
        recorded = {k for k in moved if k.startswith("rec.")}
        assert {k.removeprefix("rec.") for k in recorded} <= moved
        moved -= recorded
        assert moved <= {"gravity_lambda", "gravity_mode", "gravity_kind", "gravity_mass", "preset"}
        assert {"gravity_lambda", "gravity_kind"} <= moved, (before, after)
        for k in ("temperature", "top_k", "top_p", "min_p"):
            assert after.get(k) == before.get(k), k
        m = wait_text(page, r"the first choice (gravity changes|that changes)")
        assert m.group(1) == "gravity changes"  # every other slider is the run's own
        page.screenshot(path=str(ARTIFACTS / "tour4.png"))
        page.get_by_text("Gravity on now:").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "tour4_gravity.png"))
        page.get_by_text("What pulled ").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "tour4_terms.png"))
        # off again: λ back to 0, the page says so
        page.get_by_role("button", name="Turn gravity off (λ = 0)").click()
        wait_text(page, r"Gravity is off \(λ = 0\)")
        wait_idle(page)
        no_traceback(page)
    finally:
        ctx.close()
