"""What a user waits for, measured in the browser: headless chromium driving the real app.

Starts ``streamlit run app.py`` on a free port (the real default model) and times, in the
page's own clock:

1. **first token**: from opening the root URL to the first generated token on screen, through
   the front door's "Generate" (model load, prefill, first decode step). The first session of a
   fresh server loads the model (cold); a second session measures it warm.
2. **slider move**: a ``--steps``-token run (default 128) is opened from a link; each press of
   ArrowLeft/ArrowRight on the temperature slider is one move. Timed from the key press to the
   first moment the app's script is idle again with the what-if drawn ("settled"), beside a
   plain rerun of the same page (switching the strip's colouring) as the baseline. The
   ghost-text continuation streams in afterwards; its completion is timed too.
3. **page renders with a long prompt**: a run with a ``--long`` token prompt (default 2,000,
   from data/pride_and_prejudice_ch1-3.txt) and a short one; each page is opened from the
   sidebar and timed from the click to idle with its charts drawn. Prints the ratio long/short.
4. **Step on a new prompt** (part ``step``), the model warm: from the click on Step to the
   first token on screen, beside the model's own prefill and first step for that prompt.

    python benchmarks/bench_browser.py [--steps 128] [--long 2000] [--moves 6] [--json]
                                       [--parts first,step,slider,pages] [--reps 5]
                                       [--url http://host:port]  # an app already running

Absolute times depend on the machine's load; run it on a quiet machine. The ratios are
measured side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import ARTIFACTS, nav_click, serve  # noqa: E402
from tests.e2e.test_browser import PAGES  # noqa: E402  (the pages the browser tests walk)

# records every change of the app's script state with the page's clock (ms)
OBSERVE = """() => {
  const el = document.querySelector('[data-testid="stApp"]');
  if (!el || window.__semvizStates) return;
  window.__semvizStates = [[performance.now(), el.getAttribute('data-test-script-state')]];
  new MutationObserver(() => window.__semvizStates.push(
      [performance.now(), el.getAttribute('data-test-script-state')]))
    .observe(el, {attributes: true, attributeFilter: ['data-test-script-state']});
}"""


def now(page) -> float:
    return page.evaluate("performance.now()")


def settle(page, t0: float, timeout: float = 120.0) -> float:
    """Milliseconds from ``t0`` (page clock) to the end of the first script run that started
    after it: the moment the page is drawn again and usable."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = page.evaluate("window.__semvizStates || []")
        before = [s for t, s in states if t < t0]
        # a click that lands while a run is under way (a fragment's tick) makes Streamlit
        # start the new run in its place, with no "notRunning" between the two
        ran = [t0] if before and before[-1] == "running" else []
        ran += [t for t, s in states if t >= t0 and s == "running"]
        if ran:
            idle = [t for t, s in states if t > ran[0] and s == "notRunning"]
            if idle:
                return idle[0] - t0
        time.sleep(0.02)
    states = page.evaluate("(window.__semvizStates || []).slice(-4)")
    raise TimeoutError(
        f"the page did not settle in {timeout:.0f} s: {page.evaluate('location.href')}, "
        f"clicked at {t0:.0f} ms, last script states {states}"
    )


def quiet(page, idle_ms: float = 1500.0, timeout: float = 1800.0) -> None:
    """Until the script has been idle for ``idle_ms`` (page clock)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = page.evaluate("window.__semvizStates || []")
        if states and states[-1][1] == "notRunning" and now(page) - states[-1][0] >= idle_ms:
            return
        time.sleep(0.05)
    raise TimeoutError("the page did not become idle")


def wait_for(page, js: str, timeout: float = 900.0) -> float:
    """Page-clock time at which ``js`` (an expression) first became true (polled)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if page.evaluate(f"() => Boolean({js})"):
            return now(page)
        time.sleep(0.02)
    raise TimeoutError(js)


def wait_done(page, timeout: float = 1800.0) -> None:
    """Until no task runs (no Stop button) and the script is idle."""
    wait_for(page, "!document.querySelector('.st-key-job_stop')", timeout)
    quiet(page)


def first_token(browser) -> float:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(BASE + "/")
    page.get_by_role("button", name="Generate", exact=True).click(timeout=600_000)
    page.wait_for_selector(".semviz-strip .tok", timeout=900_000)
    dt = time.perf_counter() - t0
    ctx.close()
    return dt


STEP_PROMPTS = [
    "A lighthouse keeper writes to her brother about the winter storms.",
    "Describe the smell of a bakery at six in the morning.",
    "Why do cats knead blankets? Answer in two sentences.",
    "List three things a new gardener gets wrong about tomatoes.",
    "Write the first line of a letter from a ship's cook.",
]


def step_first_token(browser, reps: int) -> dict:
    """What a class does first: Step on a new prompt, model warm. From the click (page clock)
    to the first generated token on screen, on Generate opened with a prompt not run before;
    beside it, the model's own prefill and first step for the same prompt (``Decoder`` then
    ``step()`` in this process, at the app's default settings)."""
    from semviz import load_model
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.sampling import PruneParams

    lm = load_model()
    Decoder(lm, "warm up", PruneParams(temperature=0.8), DecodeSettings(seed=0)).step()
    browser_ms, model_ms = [], []
    for i in range(reps):
        prompt = STEP_PROMPTS[i % len(STEP_PROMPTS)] + f" ({i})"
        ctx = browser.new_context(viewport={"width": 1440, "height": 900})
        page = ctx.new_page()
        page.goto(BASE + "/generate?" + urllib.parse.urlencode({"prompt": prompt}))
        page.wait_for_selector('[data-testid="stApp"]')
        page.evaluate(OBSERVE)
        quiet(page)
        t0 = now(page)
        page.get_by_role("button", name="Step", exact=True).click()
        browser_ms.append(wait_for(page, "document.querySelector('.semviz-strip .tok')") - t0)
        wait_done(page)
        ctx.close()
        t = time.perf_counter()
        Decoder(lm, prompt, PruneParams(temperature=0.8), DecodeSettings(seed=0)).step()
        model_ms.append(1e3 * (time.perf_counter() - t))
    b, m = statistics.median(browser_ms), statistics.median(model_ms)
    return {
        "step_click_to_token_ms": b,
        "step_click_max_ms": max(browser_ms),
        "model_prefill_and_step_ms": m,
        "ratio": b / m,
    }


def open_run(browser, query: dict, width: int = 1440) -> tuple:
    ctx = browser.new_context(viewport={"width": width, "height": 900})
    page = ctx.new_page()
    page.goto(BASE + "/generate?" + urllib.parse.urlencode(query))
    page.wait_for_selector('[data-testid="stApp"]')
    page.evaluate(OBSERVE)
    n = int(query["steps"])
    wait_for(page, f"document.querySelectorAll('.semviz-strip .tok').length >= {n}")
    wait_done(page)
    return ctx, page


def slider_moves(browser, steps: int, moves: int) -> dict:
    q = {"prompt": "Once upon a time", "chat": "0", "seed": "0", "steps": str(steps)}
    ctx, page = open_run(browser, q)
    plain, moved, ghost = [], [], []
    try:
        for i in range(moves):
            name = "entropy" if i % 2 == 0 else "probability"
            colour = page.locator(".st-key-color_by button", has_text=name)
            t0 = now(page)
            colour.click()  # a plain rerun of the page: the strip's colours, no what-if change
            plain.append(settle(page, t0))
            quiet(page)
            page.get_by_role("slider", name="Temperature").focus()
            t0 = now(page)
            page.keyboard.press("ArrowLeft" if i % 2 == 0 else "ArrowRight")
            moved.append(settle(page, t0))
            t1 = wait_for(
                page,
                "!(document.querySelector('.semviz-strip .pending') || "
                "{textContent: ''}).textContent.includes('decoding')",
            )
            ghost.append(t1 - t0)
            quiet(page)
    finally:
        ctx.close()
    return {
        "steps": steps,
        "plain_rerun_ms": statistics.median(plain),
        "slider_settled_ms": statistics.median(moved),
        "slider_settled_max_ms": max(moved),
        "ghost_complete_ms": statistics.median(ghost),
        "slider_vs_plain": statistics.median(moved) / statistics.median(plain),
    }


def long_prompt(n_tokens: int) -> str:
    from semviz.model.load import load_model

    tok = load_model().tokenizer
    text = (ROOT / "data" / "pride_and_prejudice_ch1-3.txt").read_text()
    ids = tok(text, add_special_tokens=False)["input_ids"][:n_tokens]
    return tok.decode(ids)


def page_renders(browser, prompt: str, steps: int) -> dict[str, float]:
    """Each page's render time (ms) on a run of ``steps`` tokens after ``prompt``; the prompt
    is typed into Generate's box (a 2,000-token prompt is too long for a request line)."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    page = ctx.new_page()
    page.goto(BASE + f"/generate?chat=0&seed=0&run_n={steps}")
    page.wait_for_selector('[data-testid="stApp"]')
    page.evaluate(OBSERVE)
    quiet(page)
    box = page.get_by_role("textbox", name="Prompt")
    box.fill(prompt)
    box.press("Control+Enter")  # commit the text area
    quiet(page)
    page.get_by_role("button", name=f"Run {steps}", exact=True).click()
    wait_for(page, f"document.querySelectorAll('.semviz-strip .tok').length >= {steps}")
    wait_done(page)
    out = {}
    try:
        # Generate last: the run is made there, and a click on the page already open reruns
        # nothing, so timing it first waited for a run that never came
        for title, slug in sorted(PAGES, key=lambda p: p[1] == "generate"):
            t0 = now(page)
            nav_click(page, title)
            ms = settle(page, t0)
            wait_for(page, "document.querySelector('.js-plotly-plot')", 120)
            out[slug] = ms
            quiet(page)
    finally:
        ctx.close()
    return out


def main() -> None:
    global BASE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128, help="trace length for slider moves")
    ap.add_argument("--long", type=int, default=2000, help="long prompt, tokens")
    ap.add_argument("--moves", type=int, default=6)
    ap.add_argument("--url", default=None, help="time a running app instead of starting one")
    ap.add_argument(
        "--debug-log",
        action="store_true",
        help="the started app logs each script run (adds a little to every rerun)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--parts",
        default="first,step,slider,pages",
        help="what to time, comma-separated: first (first token from the root URL), step "
        "(Step on a new prompt, warm), slider, pages",
    )
    ap.add_argument("--reps", type=int, default=5, help="Steps on new prompts (part step)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    # the app's log is kept: with --debug-log it has one line per script run, which tells a
    # click lost in the browser (no run logged after it) from one lost on the server
    log = "bench_browser_server.log"
    debug = ("--logger.level", "debug") if args.debug_log else ()
    server = (
        contextlib.nullcontext((args.url.rstrip("/"), None))
        if args.url
        else serve({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}, log, debug)
    )
    out: dict = {}
    with server as (BASE, _pid):
        try:
            measure(args, parts, out)
        except TimeoutError:
            if not args.url:
                print(f"the app's log: {ARTIFACTS / log}", file=sys.stderr)
            raise
    report(args, out)


def measure(args, parts: set[str], out: dict) -> None:
    """Time the ``parts`` in one chromium, into ``out``."""
    from playwright.sync_api import sync_playwright

    from semviz.output.report import BROWSER_ARGS, chromium_path

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path() or "/usr/bin/chromium", args=BROWSER_ARGS
        )
        if parts & {"first", "step"}:  # the second also warms the model for "step"
            out["first_token_cold_s"] = first_token(browser)
            out["first_token_warm_s"] = first_token(browser)
        if "step" in parts:
            out["step"] = step_first_token(browser, args.reps)
        if "slider" in parts:
            out["slider"] = slider_moves(browser, args.steps, args.moves)
        if "pages" in parts:
            short = page_renders(browser, "Once upon a time", 8)
            longp = page_renders(browser, long_prompt(args.long), 8)
            out["pages_short_ms"] = short
            out[f"pages_{args.long}_tokens_ms"] = longp
            out["pages_long_vs_short"] = {k: longp[k] / short[k] for k in short}
        browser.close()


def report(args, out: dict) -> None:
    if args.json:
        print(json.dumps(out, indent=2))
        return
    if "first_token_cold_s" in out:
        print(
            f"first token from the root URL: cold {out['first_token_cold_s']:.2f} s, "
            f"warm {out['first_token_warm_s']:.2f} s"
        )
    if "step" in out:
        st = out["step"]
        print(
            f"Step on a new prompt, warm, click to first token: {st['step_click_to_token_ms']:.0f}"
            f" ms median of {args.reps} (max {st['step_click_max_ms']:.0f}; goal < 1000); the "
            f"model's prefill and first step {st['model_prefill_and_step_ms']:.0f} ms, "
            f"ratio {st['ratio']:.2f}x"
        )
    if "slider" in out:
        s = out["slider"]
        print(
            f"slider move, {s['steps']}-step trace: settled {s['slider_settled_ms']:.0f} ms "
            f"(max {s['slider_settled_max_ms']:.0f}), plain rerun {s['plain_rerun_ms']:.0f} "
            f"ms, ratio {s['slider_vs_plain']:.2f}x; ghost continuation complete "
            f"{s['ghost_complete_ms']:.0f} ms"
        )
    if "pages_short_ms" not in out:
        return
    print(f"page render (click to idle), short prompt vs {args.long}-token prompt:")
    for k in out["pages_short_ms"]:
        a, b = out["pages_short_ms"][k], out[f"pages_{args.long}_tokens_ms"][k]
        print(f"  {k:>15}: {a:7.0f} ms  {b:7.0f} ms  ({b / a:.2f}x)")


BASE = ""

if __name__ == "__main__":
    main()
