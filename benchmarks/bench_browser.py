"""What a user waits for, measured in the browser: headless chromium driving the real app.

Starts ``streamlit run app.py`` on a free port (the real default model) and times, in the
page's own clock:

1. **first token**: from opening the root URL to the first generated token on screen, through
   the front door's "Generate" (model load, prefill, first decode step). The first session of a
   fresh server loads the model (cold); a second session measures it warm.
2. **slider move**: a ``--steps``-token run (default 128) is opened from a link; each press of
   ArrowLeft/ArrowRight on the temperature slider is one move. Timed from the key press to the
   first moment the app's script is idle again with the what-if drawn ("settled"), beside a
   plain rerun of the same page (switching the strip's colouring) as the baseline. Then
   ``--moves`` presses to temperatures not seen before (a what-if seen before keeps its
   ghost): from the key press to the ghost text's last token.
3. **page renders with a long prompt**: a run with a ``--long`` token prompt (default 2,000,
   from data/pride_and_prejudice_ch1-3.txt) and a short one; each page is opened from the
   sidebar and timed from the click to idle with its charts drawn. Prints the ratio long/short.
4. **Step on a new prompt** (part ``step``), the model warm: from the click on Step to the
   first token on screen, beside the model's own prefill and first step for that prompt.
5. **a link reopened, a branch, Compare** (parts ``link``, ``branch``, ``compare``), each
   beside the model doing the same work in this process, as a ratio: a ``--run``-token link
   (default 32) opened in a new browser context, from the navigation to its last token on
   screen (the model: prefill and ``--run`` steps); a branch at step ``--run`` − 8 from the
   hover card, from the click to its last token with the task ended (the model: a fork
   rewound to that step, then 8 steps); Compare's "Run both" on two ``--run``-token sides,
   from the click to "done" (the model: ``semviz.analysis.compare.compare``). The slider
   part puts the ghost continuation beside the model's own fork, rewind and steps for it.

    python benchmarks/bench_browser.py [--steps 128] [--long 2000] [--moves 6] [--json]
                                       [--parts first,step,slider,pages,link,branch,compare]
                                       [--reps 5] [--run 32]
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
from ui.runner import GHOST_TOKENS  # noqa: E402

# records every change of the app's script state with the page's clock (ms)
OBSERVE = """() => {
  const el = document.querySelector('[data-testid="stApp"]');
  if (!el || window.__semvizStates) return;
  window.__semvizStates = [[performance.now(), el.getAttribute('data-test-script-state')]];
  new MutationObserver(() => window.__semvizStates.push(
      [performance.now(), el.getAttribute('data-test-script-state')]))
    .observe(el, {attributes: true, attributeFilter: ['data-test-script-state']});
}"""


# OBSERVE from the page's start (an init script): the first script run is recorded too
OBSERVE_FROM_LOAD = (
    "document.addEventListener('DOMContentLoaded', () => {"
    " const f = () => document.querySelector('[data-testid=\"stApp\"]')"
    f" ? ({OBSERVE})() : setTimeout(f, 5); f(); }});"
)


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


def new_page(browser, width: int = 1440) -> tuple:
    """A new browser context (no cookies, no session) and its page: (context, page)."""
    ctx = browser.new_context(viewport={"width": width, "height": 900})
    return ctx, ctx.new_page()


def first_token(browser) -> float:
    ctx, page = new_page(browser)
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
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.sampling import PruneParams

    lm = model()
    browser_ms, model_ms = [], []
    for i in range(reps):
        prompt = STEP_PROMPTS[i % len(STEP_PROMPTS)] + f" ({i})"
        ctx, page = new_page(browser)
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
    ctx, page = new_page(browser, width)
    page.goto(BASE + "/generate?" + urllib.parse.urlencode(query))
    page.wait_for_selector('[data-testid="stApp"]')
    page.evaluate(OBSERVE)
    n = int(query["steps"])
    wait_for(page, f"document.querySelectorAll('.semviz-strip .tok').length >= {n}")
    wait_done(page)
    return ctx, page


# the ghost lane (ui.strip) complete: as many tokens as the ghost decodes (GHOST_TOKENS, or
# up to the run's end) after its first step, or an end the model chose ("[eos]")
GHOST_DONE = """(() => {
  const g = document.querySelectorAll('.semviz-strip .ghost');
  if (!g.length) return false;
  const p = document.querySelector('.semviz-strip .ghost-lane .pending');
  const note = p ? p.textContent : '';
  const want = Math.min(%d, %d - Number(g[0].dataset.step));
  return !note.includes('decoding') && (g.length >= want || note.includes('['));
})()"""
RUN = {"prompt": "Once upon a time", "chat": "0"}  # the links' runs (with a seed and steps)


def model():
    """The default model, loaded and warm in this process (the baselines' side)."""
    from semviz import load_model

    lm = load_model()
    model_run(lm, 0, 1)
    return lm


def model_run(lm, seed: int, n: int):
    """A run of ``RUN``'s prompt as a link with ``seed`` and ``n`` steps decodes it: the app's
    default settings; returns the decoder after its prefill and ``n`` steps."""
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.sampling import PruneParams

    p = PruneParams(temperature=0.8)
    dec = Decoder(lm, RUN["prompt"], p, DecodeSettings(seed=seed, chat=False))
    for _ in range(n):
        dec.step()
    return dec


def timed(fn, *args, **kwargs) -> float:
    """Milliseconds ``fn(*args, **kwargs)`` takes."""
    t = time.perf_counter()
    fn(*args, **kwargs)
    return 1e3 * (time.perf_counter() - t)


def continue_from(dec, k: int, n: int, params=None, token: int | None = None) -> None:
    """What a branch or a ghost costs the model: a fork of ``dec`` rewound to step ``k``
    (``params`` from there), then ``n`` steps, the first one taking ``token`` if given."""
    f = dec.fork()
    f.rewind(k, params)
    for i in range(n):
        f.step(force_token=token if i == 0 else None)


def ratio(browser_ms: list[float], model_ms: list[float], **extra) -> dict:
    b, m = statistics.median(browser_ms), statistics.median(model_ms)
    return {"browser_ms": b, "browser_max_ms": max(browser_ms), "model_ms": m,
            "ratio": b / m, "n": len(browser_ms), **extra}  # fmt: skip


def slider_moves(browser, steps: int, moves: int) -> dict:
    from semviz.sampling import PruneParams

    q = {**RUN, "seed": "0", "steps": str(steps)}
    ctx, page = open_run(browser, q)
    lm = model()
    dec = model_run(lm, 0, steps)
    plain, moved, ghost, ghost_model, ghost_tokens = [], [], [], [], []
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
            quiet(page)
        # the ghost: presses to temperatures not seen before (a what-if seen before keeps its
        # ghost), from the key press to its last token, beside the model's fork, rewind and
        # steps for the same continuation
        for _ in range(moves):
            page.get_by_role("slider", name="Temperature").focus()
            t0 = now(page)
            page.keyboard.press("ArrowLeft")
            settle(page, t0)  # the strip drawn for the new what-if, not the last one's ghost
            t1 = wait_for(page, GHOST_DONE % (GHOST_TOKENS, steps))
            at, n = page.evaluate(
                "() => { const g = document.querySelectorAll('.semviz-strip .ghost');"
                " return [+g[0].dataset.step, g.length]; }"
            )
            quiet(page)
            query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
            p = PruneParams(temperature=float(query["temperature"][0]))
            ghost.append(t1 - t0)
            ghost_tokens.append(n)
            ghost_model.append(timed(continue_from, dec, at, n, p))
    finally:
        ctx.close()
    out = {
        "steps": steps,
        "plain_rerun_ms": statistics.median(plain),
        "slider_settled_ms": statistics.median(moved),
        "slider_settled_max_ms": max(moved),
        "slider_vs_plain": statistics.median(moved) / statistics.median(plain),
    }
    if ghost:  # the key press to the ghost's last token, beside the model decoding it
        out["ghost"] = ratio(ghost, ghost_model, tokens=statistics.median(ghost_tokens))
    return out


def link_reopened(browser, n: int, reps: int) -> dict:
    """A link to an ``n``-token run opened in a new browser context: from the navigation to
    its last token on screen, beside the model's prefill and ``n`` steps. Each rep has its
    own seed, so no run is already in the server's memory."""
    lm = model()
    browser_ms, model_ms, loaded_ms = [], [], []
    for i in range(reps):
        ctx, page = new_page(browser)
        page.add_init_script(OBSERVE_FROM_LOAD)
        page.goto(BASE + "/generate?" + urllib.parse.urlencode({**RUN, "seed": 100 + i,
                                                                 "steps": n}))  # fmt: skip
        # performance.now() counts from the navigation's start
        browser_ms.append(wait_for(page, f"document.querySelectorAll('.semviz-strip .tok')"
                                         f".length >= {n}"))  # fmt: skip
        # the page loaded: the app's first script run starts (the browser's share before it)
        states = page.evaluate("window.__semvizStates")
        loaded_ms.append(next(t for t, s in states if s == "running"))
        wait_done(page)
        ctx.close()
        model_ms.append(timed(model_run, lm, 100 + i, n))
    after = [b - a for a, b in zip(loaded_ms, browser_ms, strict=True)]
    return ratio(browser_ms, model_ms, tokens=n, first_run_ms=statistics.median(loaded_ms),
                 from_first_run=statistics.median(after) / statistics.median(model_ms))  # fmt: skip


def branch(browser, n: int, reps: int, new: int = 8) -> dict:
    """A branch from the hover card at step ``n - new`` of an ``n``-token run: from the click
    on an alternative to the branch's last token on screen with its task ended, beside the
    model's fork rewound to that step and ``new`` steps; and the switch back to the run."""
    lm = model()
    k = n - new
    done = (
        "document.querySelector('.st-key-branch_pick label[data-testid=stRadioOption]"
        ":not([data-disabled])') && !document.querySelector('.st-key-job_stop') && "
        f"document.querySelectorAll('.semviz-strip .tok').length >= {n}"
    )
    browser_ms, model_ms, back_ms = [], [], []
    for i in range(reps):
        ctx, page = open_run(browser, {**RUN, "seed": str(200 + i), "steps": str(n)})
        try:
            page.locator(".semviz-strip .tok").nth(k).hover()
            alt = page.locator(".semviz-card tr.alt").first
            alt.wait_for(timeout=10_000)
            t0 = now(page)
            alt.click()
            browser_ms.append(wait_for(page, done) - t0)
            quiet(page)
            t0 = now(page)
            page.locator('.st-key-branch_pick [role="radiogroup"] label').first.click()
            back_ms.append(settle(page, t0))
        finally:
            ctx.close()
        dec = model_run(lm, 200 + i, n)
        rec = dec.trace.steps[k]
        token = next(int(t) for t in rec.cand_ids if int(t) != rec.token_id)
        model_ms.append(timed(continue_from, dec, k, new, token=token))
    return ratio(browser_ms, model_ms, tokens=new, at=k,
                 switch_back_ms=statistics.median(back_ms))  # fmt: skip


def compare_sides(browser, n: int, reps: int) -> dict:
    """Compare's "Run both" on its default sides, ``n`` tokens each: from the click to "done"
    on screen, beside ``semviz.analysis.compare.compare`` on the same sides."""
    from semviz.analysis import compare as cmp
    from ui.state import SessionData

    lm = model()
    specs = SessionData.__dataclass_fields__["compare_sides"].default
    sides = [cmp.parse_side(s) for s in specs]
    browser_ms, model_ms = [], []
    for i in range(reps):
        ctx, page = new_page(browser)
        try:
            page.goto(BASE + "/compare?" + urllib.parse.urlencode({**RUN, "seed": 300 + i}))
            page.wait_for_selector('[data-testid="stApp"]')
            page.evaluate(OBSERVE)
            button = page.get_by_role("button", name="Run both", exact=True)
            button.wait_for(timeout=600_000)
            quiet(page)
            if n != 32:  # the page's default
                box = page.get_by_label("Tokens")
                box.fill(str(n))
                box.press("Enter")
                quiet(page)
            t0 = now(page)
            button.click()
            browser_ms.append(wait_for(page, "document.body.innerText.includes("
                                             "' · done · first divergence')") - t0)  # fmt: skip
            quiet(page)
        finally:
            ctx.close()
        model_ms.append(timed(cmp.compare, lm, RUN["prompt"], sides, steps=n, seed=300 + i,
                              chat=False))  # fmt: skip
    return ratio(browser_ms, model_ms, tokens=n, sides=list(specs))


def long_prompt(n_tokens: int) -> str:
    from semviz.model.load import load_model

    tok = load_model().tokenizer
    text = (ROOT / "data" / "pride_and_prejudice_ch1-3.txt").read_text()
    ids = tok(text, add_special_tokens=False)["input_ids"][:n_tokens]
    return tok.decode(ids)


def page_renders(browser, prompt: str, steps: int) -> dict[str, float]:
    """Each page's render time (ms) on a run of ``steps`` tokens after ``prompt``; the prompt
    is typed into Generate's box (a 2,000-token prompt is too long for a request line)."""
    ctx, page = new_page(browser)
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
        default="first,step,slider,pages,link,branch,compare",
        help="what to time, comma-separated: first (first token from the root URL), step "
        "(Step on a new prompt, warm), slider, pages, link (a link reopened), branch, compare",
    )
    ap.add_argument("--reps", type=int, default=5, help="repetitions of step (3 of the rest)")
    ap.add_argument("--run", type=int, default=32, help="tokens of a link, branch or Compare")
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
        timed_parts = [("link", link_reopened), ("branch", branch), ("compare", compare_sides)]
        if not parts & {"first", "step"} and parts & {name for name, _ in timed_parts}:
            first_token(browser)  # the server loads the model: what is timed is warm
        for name, fn in timed_parts:
            if name in parts:
                out[name] = fn(browser, args.run, min(args.reps, 3))
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
            f"ms, ratio {s['slider_vs_plain']:.2f}x"
        )
    lines = {
        "ghost": "slider move to the ghost's last token ({tokens:.0f} tokens)",
        "link": "a {tokens}-token link reopened, navigation to last token",
        "branch": "a branch of {tokens} tokens at step {at}, click to last token",
        "compare": "Compare, 2 x {tokens} tokens, click to done",
    }
    for key, what in lines.items():
        r = out.get("slider", {}).get(key) if key == "ghost" else out.get(key)
        if r is None:
            continue
        print(
            f"{what.format(**r)}: {r['browser_ms']:.0f} ms median of {r['n']} (max "
            f"{r['browser_max_ms']:.0f}), the model {r['model_ms']:.0f} ms: {r['ratio']:.2f}x"
            " (goal <= 1.5x)"
            + (f"; switch back {r['switch_back_ms']:.0f} ms" if "switch_back_ms" in r else "")
            + (
                f"; the page's first script run began at {r['first_run_ms']:.0f} ms, and from "
                f"there it took {r['from_first_run']:.2f}x the model"
                if "first_run_ms" in r
                else ""
            )
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
