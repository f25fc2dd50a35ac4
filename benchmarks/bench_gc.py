"""What one full garbage collection costs in the app's server process, and what freezing the
imported modules saves.

Streamlit collects all garbage (``gc.collect(2)``) after every script run, fragment ticks
included, unless ``runner.postScriptGC`` is off (it is, in ``.streamlit/config.toml``); Python's
own collector still runs full collections now and then. A collection holds the GIL, so every
session's decoding waits for it. This imports what a page needs (torch, transformers, plotly
and the app's modules), loads the default model and times a full collection three ways, side
by side in one process:

1. everything collectable (Streamlit's default, and ``app.py`` before ``gc.freeze``);
2. after ``gc.freeze()`` of the imports, as ``app.py`` does once per process, with the model
   loaded afterwards (so a model dropped from the cache can still be collected);
3. the same, with a decoded run of ``--tokens`` tokens alive (a session's trace).

    python benchmarks/bench_gc.py [--tokens 128] [--repeat 5]

Prints the median of ``--repeat`` collections for each and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def collect_ms(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gc.collect(2)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128, help="tokens of the live run (1 to 2048)")
    ap.add_argument("--repeat", type=int, default=5, help="collections timed per case (1 to 50)")
    args = ap.parse_args()
    if not 1 <= args.tokens <= 2048:
        ap.error("--tokens must be from 1 to 2048")
    if not 1 <= args.repeat <= 50:
        ap.error("--repeat must be from 1 to 50")

    import importlib

    for name in ("ui.runner", "semviz.output.charts", "ui.views"):  # app.py's HEAVY
        importlib.import_module(name)
    from semviz import Decoder, DecodeSettings, load_model

    imports = len(gc.get_objects())
    thawed = collect_ms(args.repeat)  # the imports alone, nothing frozen
    gc.freeze()
    lm = load_model()
    frozen = collect_ms(args.repeat)
    prompt = "The old harbour town woke slowly that winter morning."
    dec = Decoder(lm, prompt, settings=DecodeSettings(max_new_tokens=args.tokens))
    for _ in range(args.tokens):
        if dec.step() is None:
            break
    with_run = collect_ms(args.repeat)
    gc.unfreeze()
    everything = collect_ms(args.repeat)  # imports, model and run all collectable
    print(
        f"objects: {imports:,} from the imports (frozen in case 2 and 3), "
        f"{len(gc.get_objects()) - imports:,} since (model, run)"
    )
    print(f"full collection, median of {args.repeat}:")
    print(f"  1. nothing frozen, model and a {dec.n_steps}-token run alive  {everything:8.1f} ms")
    print(f"     (the imports alone, before the model loaded       {thawed:8.1f} ms)")
    print(f"  2. imports frozen, model loaded                      {frozen:8.1f} ms")
    print(f"  3. imports frozen, model and a {dec.n_steps}-token run alive  {with_run:8.1f} ms")
    print(f"ratio 1 / 3: {everything / max(with_run, 1e-3):.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
