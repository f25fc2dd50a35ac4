"""A class on one server: browser sessions playing at once, against one session alone.

Starts ``streamlit run app.py`` in shared mode on 127.0.0.1 (never another address) with the
real default model, and drives headless chromium:

1. **alone, before**: one session presses Play and decodes for ``--seconds``;
2. **together**: ``--sessions`` sessions (default 8), each with its own seed and temperature,
   press Play at once and decode for ``--seconds``;
3. **alone, after**: phase 1 again, so that a change in the machine's load during the run shows
   as a gap between the two; the together phase is compared with their mean;
4. **closed**: every tab is closed and the server's resident memory is read again once the app
   has dropped the closed sessions' runs (``SEMVIZ_CLOSED_SECONDS``, here 5 s).

Prints, for each phase, tokens/s (per session and in total), the server's and the browsers'
CPU seconds per token, the cores each used on average and the 1-minute load average; then the
ratios of the together phase to one session alone: total tokens/s (the goal is a ratio of at
least 1), tokens/s per session, and server CPU seconds per token. It reads the server's resident memory (model loaded and idle, peaks, after the tabs
closed) and checks every session's tokens against a ``Decoder`` run alone with its settings
(after the server has stopped): none may differ, else the exit code is 1.

    python benchmarks/bench_load.py [--sessions 8] [--seconds 60] [--threads 1] [--batch]
                                    [--browser-nice 0] [--json]

Bounded: at most 16 sessions and 300 seconds a phase, on 127.0.0.1 only. Absolute figures
depend on the machine's load (chromium shares the cores with the server), so the result is the
ratios, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAX_SESSIONS, MAX_SECONDS = 16, 300
CLOSED_SECONDS = 5  # the server drops a closed tab's run this long after it closed
GENERATED = re.compile(r"(\d+) tokens? generated")
ENDED = re.compile(r"tokens? generated · stopped")  # the run ended by itself (EOS, a limit)
PHASES = ("alone_before", "together", "alone_after")
# a plain continuation (no chat template): a chat answer ends with EOS after a sentence or two,
# which would stop a session long before its phase is over
PROMPT = "The old harbour town woke slowly that winter morning. Down by the water,"


def settings_of(i: int) -> dict[str, str]:
    """Session ``i``'s link: its own seed and temperature, a run long enough for any phase."""
    return {
        "seed": str(100 + i),
        "temperature": f"{0.7 + 0.1 * (i % 5):.1f}",
        "max_new_tokens": "4096",
        "chat": "0",
        "prompt": PROMPT,
    }


class RSS:
    """Samples a process's resident memory (MB) every ``every`` seconds in the background."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid, self.every, self.peak, self.last = pid, every, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.last = self.read()
            except OSError:
                return
            self.peak = max(self.peak, self.last)
            self._stop.wait(self.every)

    def reset_peak(self) -> None:
        self.peak = self.last

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used so far, all its threads together."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read().rsplit(")", 1)[1].split()  # fields after the command name
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def browser_pids(server: int) -> list[int]:
    """This process's descendants but the server and its own: chromium's browser, zygote,
    GPU and renderer processes, which share the machine's cores with the server."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])

    def below(pid: int, root: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 0)
        return False

    me = os.getpid()
    return [p for p in parent if p != me and below(p, me) and not below(p, server)]


def renice(server: int, nice: int) -> None:
    """Lower the browser processes' CPU priority, every thread of each (on Linux a priority
    is a thread's: the process's id alone reaches only its main thread, not a renderer's
    compositor and raster threads). Call it again for tabs opened since."""
    for pid in browser_pids(server):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def browser_cpu_seconds(server: int) -> float:
    """CPU seconds the browser processes (``browser_pids``) have used so far."""
    total = 0.0
    for pid in browser_pids(server):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            total += cpu_seconds(pid)
    return total


def generated(page) -> int:
    m = GENERATED.search(page.inner_text("body"))
    return int(m.group(1)) if m else 0


def play_for(pages: list, seconds: float, pid: int) -> dict:
    """Press Play on every page and Stop after ``seconds``: each page's tokens and time, the
    server's CPU seconds and the load average over the phase.

    A step under way when Stop is pressed still adds its token, so a session's count can be one
    high; that holds alike for every phase. A run that ends by itself (EOS) is seen once a second:
    when its Stop button has gone and its status line says it stopped, its time ends there,
    and it is marked ``ended_early``.
    """
    from playwright.sync_api import Error as PlaywrightError

    from tests.e2e.test_browser import wait_idle
    from tests.e2e.test_sessions import strip_texts

    cpu0, browsers0 = cpu_seconds(pid), browser_cpu_seconds(pid)
    # by key: while a script runs, Streamlit's header shows a "Stop" button of its own; the
    # job's Stop is drawn only while the job runs
    # (by role: Generate's Stop, sized to its text in a row of buttons, has a hidden copy)
    stops = [p.locator(".st-key-job_stop").get_by_role("button") for p in pages]
    started = []
    for p in pages:
        p.get_by_role("button", name="Play", exact=True).click()
        started.append(time.perf_counter())
    ended: list[float | None] = [None] * len(pages)
    running = [False] * len(pages)
    while time.perf_counter() < started[0] + seconds:
        time.sleep(1.0)
        for i, p in enumerate(pages):
            # a cheap look (is the job's Stop drawn?); the page's text only once it is gone:
            # reading a whole page's text every second costs each tab more CPU than its run
            if ended[i] is not None:
                continue
            if stops[i].count():
                running[i] = True
            elif running[i] and ENDED.search(p.inner_text("body")):
                ended[i] = time.perf_counter()
    stopped = []
    for i, stop in enumerate(stops):
        if ended[i] is None and stop.count():
            with contextlib.suppress(PlaywrightError):  # not seen stable on a starved tab
                stop.first.click(timeout=5_000)
        stopped.append(ended[i] or time.perf_counter())
    for stop in stops:  # a click that met a fragment's redraw is lost: press it again
        deadline = time.perf_counter() + 60
        while stop.count() and time.perf_counter() < deadline:
            time.sleep(2.0)
            if stop.count():
                with contextlib.suppress(PlaywrightError):  # gone between the two looks
                    stop.first.click(timeout=5_000)
    load = os.getloadavg()[0]
    sessions = []
    for p, t0, t1, e in zip(pages, started, stopped, ended, strict=True):
        wait_idle(p)
        n = generated(p)
        sessions.append(
            {
                "tokens": n,
                "seconds": t1 - t0,
                "tok_s": n / (t1 - t0),
                "ended_early": e is not None,
                "text": strip_texts(p),
            }
        )
    cpu = cpu_seconds(pid) - cpu0
    browsers = browser_cpu_seconds(pid) - browsers0
    tokens = sum(s["tokens"] for s in sessions)
    return {
        "sessions": sessions,
        "total_tok_s": tokens / max(s["seconds"] for s in sessions),
        "tok_s_per_session": sum(s["tok_s"] for s in sessions) / len(sessions),
        "server_cpu_s": cpu,
        "server_cpu_s_per_token": cpu / max(tokens, 1),
        "browser_cpu_s": browsers,
        "browser_cpu_s_per_token": browsers / max(tokens, 1),
        # cores in use on average: what the server got, and what the tabs took beside it
        "server_cores": cpu / max(s["seconds"] for s in sessions),
        "browser_cores": browsers / max(s["seconds"] for s in sessions),
        "load_average_1min": load,
    }


def alone_phase(browser, url: str, link: dict[str, str], seconds: float, pid: int) -> dict:
    """One fresh session on ``link`` plays for ``seconds``; its tab is closed after."""
    from tests.e2e.test_browser import open_app
    from tests.e2e.test_sessions import query

    c, p = open_app(browser, url, query(link))
    try:
        return play_for([p], seconds, pid)
    finally:
        c.close()


def same_tokens(shown: list[str], ref: list[str], n: int) -> bool:
    """The strip shows the last tokens of a long run; they must be the reference's."""
    return len(ref) == n and shown == ref[len(ref) - len(shown) :]


def check_tokens(res: dict, links: list[dict[str, str]]) -> None:
    """Mark every session with whether its tokens are a ``Decoder``'s alone (same settings)."""
    import semviz
    from tests.e2e.test_sessions import alone

    lm = semviz.load_model(device="cpu")
    runs = [
        *zip(res["alone_before"]["sessions"], [links[0]], strict=True),
        *zip(res["together"]["sessions"], links, strict=True),
        *zip(res["alone_after"]["sessions"], [links[0]], strict=True),
    ]
    for s, link in runs:
        s["same_as_decoder"] = same_tokens(s.pop("text"), alone(lm, link, s["tokens"]), s["tokens"])


def ratios(res: dict) -> dict:
    """The together phase over one session alone (the mean of before and after)."""
    before, together, after = (res[k] for k in PHASES)
    alone = {k: (before[k] + after[k]) / 2 for k in ("total_tok_s", "server_cpu_s_per_token")}
    return {
        "total_tok_s": together["total_tok_s"] / alone["total_tok_s"],
        "tok_s_per_session": together["tok_s_per_session"] / alone["total_tok_s"],
        "server_cpu_s_per_token": together["server_cpu_s_per_token"]
        / alone["server_cpu_s_per_token"],
        "alone_after_over_before": after["total_tok_s"] / before["total_tok_s"],
    }


def run(args) -> dict:
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import ARGS, CHROMIUM, serve
    from tests.e2e.test_browser import open_app, wait_idle
    from tests.e2e.test_sessions import query

    env = {
        "SEMVIZ_SHARED": "1",
        "SEMVIZ_MAX_STEPS": "4096",
        "OMP_NUM_THREADS": str(args.threads),
        "SEMVIZ_CLOSED_SECONDS": str(CLOSED_SECONDS),
        "SEMVIZ_BATCH_SESSIONS": "1" if args.batch else "0",
    }
    links = [settings_of(i) for i in range(args.sessions)]
    res: dict = {
        "sessions": args.sessions,
        "seconds": args.seconds,
        "threads": args.threads,
        "batch_sessions": args.batch,
        "browser_nice": args.browser_nice,
    }
    with serve(env, log="bench_load_server.log") as (url, pid), sync_playwright() as pw:
        rss = RSS(pid)
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        if args.browser_nice:
            renice(pid, args.browser_nice)
        try:
            c, p = open_app(browser, url, "generate")  # warm-up: load the model once
            p.get_by_role("button", name="Step", exact=True).click()
            wait_idle(p)
            c.close()
            time.sleep(CLOSED_SECONDS + 5)
            res["rss_idle_mb"] = rss.read()
            rss.reset_peak()
            res["alone_before"] = alone_phase(browser, url, links[0], args.seconds, pid)
            res["rss_peak_alone_mb"] = rss.peak
            opened = [open_app(browser, url, query(link)) for link in links]
            if args.browser_nice:
                renice(pid, args.browser_nice)  # the new tabs' renderers
            rss.reset_peak()
            res["together"] = play_for([p for _c, p in opened], args.seconds, pid)
            res["rss_peak_together_mb"] = rss.peak
            res["rss_runs_held_mb"] = rss.read()
            for c, _p in opened:
                c.close()
            res["alone_after"] = alone_phase(browser, url, links[0], args.seconds, pid)
            time.sleep(CLOSED_SECONDS + 10)  # the sweep runs every CLOSED_SECONDS / 2
            res["rss_after_close_mb"] = rss.read()
        finally:
            browser.close()
            rss.stop()
    check_tokens(res, links)
    res["ratios"] = ratios(res)
    return res


def report(res: dict) -> None:
    """The result as lines of text: each phase, then the ratios, then memory."""
    for name in PHASES:
        ph = res[name]
        print(
            f"{name.replace('_', ' ')}: {ph['total_tok_s']:.2f} tok/s in total, "
            f"{ph['server_cpu_s_per_token']:.3f} server CPU-s per token, "
            f"{ph['browser_cpu_s_per_token']:.3f} browsers' CPU-s per token, "
            f"load average {ph['load_average_1min']:.2f}; cores used: server "
            f"{ph['server_cores']:.2f}, browsers {ph['browser_cores']:.2f}"
        )
        for i, s in enumerate(ph["sessions"]):
            early = " (the run ended by itself)" if s["ended_early"] else ""
            print(
                f"  session {i}: {s['tokens']:5d} tokens in {s['seconds']:.1f} s = "
                f"{s['tok_s']:.2f} tok/s{early}; same as a Decoder alone: "
                f"{s['same_as_decoder']}"
            )
    r = res["ratios"]
    from semviz.model.queue import lanes_for

    t = res["threads"]
    lanes = lanes_for(t)  # what the server's queue takes on this machine (ui.model.fit_lanes)
    batch = "forwards shared between sessions" if res["batch_sessions"] else "forwards alone"
    batch += f", {t} thread{'s' * (t > 1)} a forward, {lanes} lane{'s' * (lanes > 1)}"
    nice = f", tabs at niceness {res['browser_nice']}" if res["browser_nice"] else ""
    print(
        f"{res['sessions']} sessions together over one alone (mean of before and after), "
        f"{res['seconds']:.0f} s a phase, {batch}{nice}:"
    )
    print(f"  total tok/s                {r['total_tok_s']:.2f}x  (goal: at least 1)")
    print(f"  tok/s of each session      {r['tok_s_per_session']:.2f}x")
    print(f"  server CPU-s per token     {r['server_cpu_s_per_token']:.2f}x")
    print(f"  alone after / alone before {r['alone_after_over_before']:.2f}x  (drift of the load)")
    if any(s["ended_early"] for name in PHASES for s in res[name]["sessions"]):
        print("  (a run ended by itself: the total tok/s of its phase is a lower bound)")
    print(
        f"server memory: {res['rss_idle_mb']:.0f} MB idle with the model, peak "
        f"{res['rss_peak_alone_mb']:.0f} MB alone, {res['rss_peak_together_mb']:.0f} MB "
        f"together, {res['rss_runs_held_mb']:.0f} MB with the runs held, "
        f"{res['rss_after_close_mb']:.0f} MB after the tabs closed"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8, help=f"1 to {MAX_SESSIONS}")
    ap.add_argument("--seconds", type=float, default=60.0, help=f"a phase, 5 to {MAX_SECONDS}")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="the server's torch threads a forward; the model's queue runs as many "
        "forwards side by side as the cores hold",
    )
    ap.add_argument(
        "--batch",
        action="store_true",
        help="the server shares forwards between sessions (SEMVIZ_BATCH_SESSIONS)",
    )
    ap.add_argument(
        "--browser-nice",
        type=int,
        default=0,
        help="run the tabs at this CPU niceness (1 to 19), so they take only the cores the "
        "server leaves: a stand-in for a class whose browsers run on their own machines",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 1 <= args.sessions <= MAX_SESSIONS:
        ap.error(f"--sessions must be from 1 to {MAX_SESSIONS}")
    if not 5 <= args.seconds <= MAX_SECONDS:
        ap.error(f"--seconds must be from 5 to {MAX_SECONDS}")
    if not 0 <= args.browser_nice <= 19:
        ap.error("--browser-nice must be from 0 to 19")
    if not 1 <= args.threads <= 64:
        ap.error("--threads must be from 1 to 64")
    res = run(args)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        report(res)
    ok = all(s["same_as_decoder"] for name in PHASES for s in res[name]["sessions"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
