"""Replaying recorded steps with new settings against decoding them, in one run.

Decodes ``--steps`` tokens (default 256) of the default model with gravity on, then replays
the trace through the core with other settings (temperature, top-p, λ) several times, without
running the model. Prints both times and their ratio; the goal is a replay under 1 s.

    .venv/bin/python benchmarks/bench_replay.py [--steps 256] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from semviz import load_model
from semviz.analysis.replay import replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    lm = load_model()
    live = PruneParams(temperature=0.9, top_p=0.95, gravity_lambda=0.3, gravity_mass="idf")
    dec = Decoder(
        lm,
        "Tell me a long story about a lighthouse keeper and a storm.",
        live,
        DecodeSettings(max_new_tokens=args.steps, seed=0),
    )
    dec.eos_ids = set()  # decode the full length
    t0 = time.perf_counter()
    dec.run(args.steps)
    decode_s = time.perf_counter() - t0

    variants = [
        live.replace(temperature=1.2, top_p=0.8),
        live.replace(gravity_lambda=0.8),
        live.replace(top_k=20, min_p=0.05, free_energy=True),
    ]
    times = []
    for i in range(args.repeats):
        p = variants[i % len(variants)]
        t0 = time.perf_counter()
        r = replay(dec.trace, p, model=lm.model)
        times.append(time.perf_counter() - t0)
        assert len(r.results) == args.steps
    res = {
        "steps": args.steps,
        "decode_s": decode_s,
        "replay_s_median": statistics.median(times),
        "replay_s_max": max(times),
        "replay_over_decode": statistics.median(times) / decode_s,
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"decode {args.steps} steps: {decode_s:.2f} s")
    print(
        f"replay {args.steps} steps with new settings: median {res['replay_s_median'] * 1e3:.0f} ms "
        f"(max {res['replay_s_max'] * 1e3:.0f} ms), ratio {res['replay_over_decode']:.3f} (goal: < 1 s)"
    )


if __name__ == "__main__":
    main()
