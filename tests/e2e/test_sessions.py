"""Several people on one server, in a real browser (chromium) on the real default model.

Four sessions step as fast as they can at the same time, and each gets exactly the tokens a
``Decoder`` makes alone for its settings. A shared server (``SEMVIZ_SHARED=1``) refuses a model
outside its list when a link asks for it, and takes traces by upload only.

Run with ``pytest -m e2e tests/e2e/test_sessions.py``.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import ARTIFACTS, CHROMIUM, serve
from tests.e2e.test_browser import goto, no_traceback, open_app, wait_idle, wait_ready

pytestmark = pytest.mark.e2e

LINKS = [
    {"seed": "11", "temperature": "1.0", "run_n": "6"},
    {"seed": "12", "temperature": "1.3", "top_p": "0.9", "run_n": "6"},
    {
        "seed": "13",
        "temperature": "0.7",
        "top_k": "20",
        "run_n": "6",
        "prompt": "Name three colours.",
    },
    {"seed": "14", "gravity_lambda": "0.5", "run_n": "6"},
]
STEPS = 6  # Step presses per session, each as soon as the session's last token is shown
# Presses Step ``k`` times, each as soon as the previous press's token is on screen, then sets
# window.__done; runs in the page, so the sessions step at the same time.
STEP_LOOP = """(k) => {
  const count = () => document.querySelectorAll('.semviz-strip .tok').length;
  const step = () => [...document.querySelectorAll('button')]
    .find(b => b.innerText.trim() === 'Step');
  window.__done = false;
  (async () => {
    for (let i = 0; i < k; i++) {
      const before = count();
      step().click();
      const t0 = performance.now();
      while (count() <= before && performance.now() - t0 < 120000) {
        await new Promise(r => setTimeout(r, 10));
      }
    }
    window.__done = true;
  })();
}"""


def query(link: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return "?" + urlencode(link)


def strip_texts(page) -> list[str]:
    """The generated tokens as the strip holds them (its DOM text, not the rendered layout)."""
    return page.locator(".semviz-strip .tok").all_text_contents()


def shown(text: str) -> str:
    """A token's text as the strip writes it."""
    return text.replace("\n", "↵\n") or "∅"


def alone(lm, link: dict[str, str], n: int) -> list[str]:
    """The tokens a Decoder makes alone for a link's settings (as the app builds it)."""
    from semviz import Decoder, DecodeSettings
    from ui.state import Settings

    s = Settings.from_query_params(link)
    dec = Decoder(
        lm,
        s.prompt,
        s.prune_params(),
        DecodeSettings(seed=s.seed, max_new_tokens=s.max_new_tokens, chat=s.chat),
    )
    dec.run(n)
    return [shown(r.token_text) for r in dec.trace.steps]


def test_four_sessions_stepping_at_once_get_their_own_tokens(browser, app_url, real_lm):
    refs = [alone(real_lm, link, 3 * STEPS + 6) for link in LINKS]
    assert len({tuple(r[:STEPS]) for r in refs}) == len(LINKS), "the settings should differ"
    opened = [open_app(browser, app_url, query(link)) for link in LINKS]
    pages = [p for _c, p in opened]
    seen: dict[str, list] = {}
    try:
        # 1. each session presses Step as fast as its tokens come, all four at once
        for p in pages:
            p.evaluate(STEP_LOOP, STEPS)
        deadline = time.time() + 600
        while not all(p.evaluate("window.__done") for p in pages) and time.time() < deadline:
            time.sleep(0.2)
        for p in pages:
            wait_idle(p)
        seen["stepped"] = [strip_texts(p) for p in pages]
        # 2. Run 6 in every session at once (play ticks interleave on the server)
        for p in pages:
            p.get_by_role("button", name="Run 6", exact=True).click()
        for p in pages:
            wait_ready(p, 2 * STEPS)
            no_traceback(p)
        seen["ran"] = [strip_texts(p) for p in pages]
        # 3. Step pressed without waiting at all: presses that land while the page is still
        # running may merge, but whatever is made is still the session's own sequence
        for _ in range(STEPS):
            for p in pages:
                p.get_by_role("button", name="Step", exact=True).click()
        for p in pages:
            wait_idle(p)
            no_traceback(p)
        seen["hammered"] = [strip_texts(p) for p in pages]
    finally:
        for c, _p in opened:
            c.close()
        (ARTIFACTS / "four_sessions.json").write_text(json.dumps({"alone": refs, **seen}, indent=1))
    for i, ref in enumerate(refs):
        assert seen["stepped"][i] == ref[:STEPS], i
        assert seen["ran"][i] == ref[: 2 * STEPS], i
        hammered = seen["hammered"][i]
        assert 2 * STEPS <= len(hammered) <= 3 * STEPS and hammered == ref[: len(hammered)], i


# -- shared mode -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_url():
    from pathlib import Path

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    env = {"SEMVIZ_SHARED": "1", "SEMVIZ_MAX_STEPS": "16", "SEMVIZ_MAX_UPLOAD_MB": "1"}
    with serve(env, log="shared_server.log") as (url, _pid):
        yield url


def test_shared_mode_a_link_cannot_load_another_model(browser, shared_url, tiny_dir):
    ctx, page = open_app(browser, shared_url, query({"model": str(tiny_dir), "run_n": "3"}))
    try:
        no_traceback(page)
        body = page.inner_text("body")
        assert f"Ignored model='{tiny_dir}': this server runs only SmolLM2-135M-Instruct." in body
        assert page.get_by_label("Model").count() == 0  # nothing to type a name into
        page.get_by_role("button", name="Run 3", exact=True).click()
        wait_ready(page, 3)
        assert "model SmolLM2-135M-Instruct" in page.inner_text("body")
        page.screenshot(path=str(ARTIFACTS / "shared_model_refused.png"))
    finally:
        ctx.close()


def test_shared_mode_takes_traces_by_upload_only(browser, shared_url, real_lm, tmp_path):
    from semviz import Decoder, DecodeSettings, PruneParams

    # without the full logits and the lens: a 3-step trace under the 1 MB upload limit
    settings = DecodeSettings(seed=1, max_new_tokens=3, full_logits=False, lens=False)
    dec = Decoder(real_lm, "Hello.", PruneParams(), settings)
    dec.run(3)
    small = tmp_path / "small.json"
    dec.trace.save(small)
    big = tmp_path / "big.json"
    big.write_text(" " * (2 * 2**20) + "{}")
    ctx, page = open_app(browser, shared_url)
    try:
        goto(page, "Report")
        page.get_by_text("a saved trace", exact=True).click()
        wait_idle(page)
        assert page.get_by_label("…or a trace file on this machine").count() == 0
        assert "This server takes traces by upload only." in page.inner_text("body")
        upload = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
        upload.set_input_files(str(big))
        wait_idle(page)
        alert = page.locator('[data-testid="stFileUploader"] [role="alert"]')
        assert alert.all_text_contents() == ["Error: File must be 1.0MB or smaller."]
        assert "3 tokens" not in page.inner_text("body")  # nothing was read
        page.screenshot(path=str(ARTIFACTS / "shared_upload_too_big.png"))
        upload.set_input_files(str(small))
        wait_idle(page)
        no_traceback(page)
        assert "3 tokens" in page.inner_text("body")
    finally:
        ctx.close()
