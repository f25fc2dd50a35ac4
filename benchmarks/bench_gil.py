"""A decode beside a page's Python: what the interpreter's switch interval does to both.

Every torch op releases the GIL while it computes and must win it back after. While another
thread runs pure Python (a page's script drawing a rerun), each of those hand-backs waits for
that thread to give the GIL up, which it does every ``sys.getswitchinterval()`` seconds: 5 ms
by default. A token of SmolLM2-135M takes about a thousand ops, so beside a busy thread a
token can take seconds. A shorter interval shortens each wait and slows the busy thread.

The app keeps Python's default: in the whole app, four browser sessions playing at once
(``bench_load.py --sessions 4 --seconds 20``, two runs each way, alternated), a 0.5 ms interval
gave no more tokens a second than 5 ms. There a page's script holds the GIL for a small part
of each tick, and chromium shares the cores.

For each interval (``--intervals``, in ms), run alternately for ``--seconds`` each:

- **alone**: a ``Decoder`` steps in a thread while the main thread sleeps;
- **beside a busy thread**: the main thread runs a pure-Python loop all the time (the worst
  case: page reruns back to back);
- **beside ticks**: the main thread runs the loop for ``--busy-ms`` out of every 500 ms, like
  a page whose panel reruns twice a second while it plays.

Prints the decoder's tokens/s in each case as a ratio to alone, and the main thread's loop
speed as a ratio to the same loop with no decoder beside it (what the page's script pays for
the shorter interval).

    python benchmarks/bench_gil.py [--intervals 5,0.1] [--seconds 4] [--rounds 2]
                                   [--busy-ms 100] [--json]

Ratios are measured side by side in one run; absolute figures depend on the machine's load.
Run it with ``OMP_NUM_THREADS=1``, as the README starts a class's server on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ui.work import TICK_EVERY as TICK  # noqa: E402  (the panel's rerun period while a task runs)


def spin(seconds: float) -> int:
    """A pure-Python loop for ``seconds``; the iterations it made."""
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += 1
    return n


def decode_beside(lm, seconds: float, main: str, busy_ms: float) -> tuple[float, int]:
    """Tokens/s of a decoder stepping in a thread while the main thread does ``main`` (sleep,
    busy or ticks); and the main thread's loop iterations a second while it spun."""
    from semviz import Decoder, DecodeSettings, PruneParams

    dec = Decoder(
        lm, "Once upon a time", PruneParams(), DecodeSettings(seed=0, max_new_tokens=8192)
    )
    dec.run(2)  # the prefill and a first step, outside the timing
    stop = threading.Event()
    counts = [0, 0.0]

    def work() -> None:
        t0 = time.perf_counter()
        while not stop.is_set() and not dec.done:
            dec.step()
            counts[0] += 1
        counts[1] = time.perf_counter() - t0

    th = threading.Thread(target=work)
    th.start()
    rate = main_loop(seconds, main, busy_ms)
    stop.set()
    th.join()
    return counts[0] / counts[1], rate


def main_loop(seconds: float, main: str, busy_ms: float) -> float:
    """The main thread for ``seconds``: asleep, busy, or busy ``busy_ms`` of every tick; the
    loop's iterations a second while it spun (0 asleep)."""
    iters, spun, end = 0, 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        if main == "sleep":
            time.sleep(0.05)
            continue
        t0 = time.perf_counter()
        iters += spin(min(TICK, end - t0) if main == "busy" else busy_ms / 1000)
        spun += time.perf_counter() - t0
        if main == "ticks":
            time.sleep(max(0.0, TICK - busy_ms / 1000))
    return iters / spun if spun else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", default="5,0.1", help="switch intervals to compare, in ms")
    ap.add_argument("--seconds", type=float, default=4.0, help="each measurement")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the intervals")
    ap.add_argument("--busy-ms", type=float, default=100.0, help="Python per 500 ms tick")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    intervals = [float(v) for v in args.intervals.split(",")]

    import semviz

    lm = semviz.load_model(device="cpu")
    old = sys.getswitchinterval()
    rows: dict[float, dict[str, list[float]]] = {
        ms: {"alone": [], "busy": [], "ticks": [], "loop_busy": [], "loop_ticks": []}
        for ms in intervals
    }
    spin(2.0)  # the first seconds after the model's load run the loop slower: not timed
    try:
        for _ in range(args.rounds):
            for ms in intervals:
                sys.setswitchinterval(ms / 1000)
                r = rows[ms]
                r["alone"].append(decode_beside(lm, args.seconds, "sleep", args.busy_ms)[0])
                for main in ("busy", "ticks"):
                    alone = main_loop(args.seconds, main, args.busy_ms)  # no decoder beside
                    tps, rate = decode_beside(lm, args.seconds, main, args.busy_ms)
                    r[main].append(tps)
                    r[f"loop_{main}"].append(rate / alone)
    finally:
        sys.setswitchinterval(old)
    out = {str(ms): {k: statistics.median(v) for k, v in r.items()} for ms, r in rows.items()}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"a decoder (SmolLM2-135M, 1 thread) beside the main thread's Python; median of "
        f"{args.rounds} rounds of {args.seconds:.0f} s, intervals alternated"
    )
    for ms, m in out.items():
        print(
            f"switch interval {float(ms):g} ms: alone {m['alone']:.1f} tok/s; beside a busy "
            f"thread {m['busy']:.2f} tok/s ({m['busy'] / m['alone']:.2f}x alone), the loop at "
            f"{m['loop_busy']:.2f}x its speed alone; beside {args.busy_ms:.0f} ms of Python "
            f"per {TICK * 1000:.0f} ms tick {m['ticks']:.1f} tok/s "
            f"({m['ticks'] / m['alone']:.2f}x alone), the loop at {m['loop_ticks']:.2f}x"
        )


if __name__ == "__main__":
    main()
