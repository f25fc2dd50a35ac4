"""What gravity costs per decode step of the default model, against a plain step, in one run.

Run: ``python benchmarks/bench_gravity.py [--steps 48] [--json]``

One ``Decoder`` per setting, all on the same prompt and seed, each stepped once per round,
round-robin, so every ratio compares steps taken under the same machine load:

- ``plain``: gravity off (λ = 0), no attention capture;
- ``default``: ``PruneParams()``' gravity at λ 0.5 (the recommended variant);
- ``first``: the first gravity (attention mass over every cached token, λ 0.5), which needs
  the attention capture;
- ``contrast k=8`` / ``k=32``: coherence boosting, whose second forward reads the last k
  tokens with no cache.

Prints each setting's median step time and the median of its per-round ratio to the plain
step. Nothing is asserted: timings on a shared machine are noisy, only ratios are compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import semviz  # noqa: E402
from semviz.decoding.decoder import Decoder, DecodeSettings  # noqa: E402
from semviz.gravity import FIRST_GRAVITY  # noqa: E402
from semviz.sampling import PruneParams  # noqa: E402

PROMPT = "Write a short story about a beekeeper who talks to her bees."


def settings() -> dict[str, PruneParams]:
    base = PruneParams(temperature=0.8, top_p=0.95)
    return {
        "plain": base,
        "default": base.replace(gravity_lambda=0.5),
        "first": base.replace(gravity_lambda=0.5, **FIRST_GRAVITY),
        "contrast k=8": base.replace(gravity_lambda=0.5, gravity_kind="contrast"),
        "contrast k=32": base.replace(
            gravity_lambda=0.5, gravity_kind="contrast", gravity_contrast_k=32
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=48, help="timed rounds (one step each)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    lm = semviz.load_model()
    total = args.warmup + args.steps
    run = DecodeSettings(seed=0, max_new_tokens=total + 1, capture=False)
    decs = {name: Decoder(lm, PROMPT, p, run) for name, p in settings().items()}
    rounds = []
    for r in range(total):
        row = {}
        for name, d in decs.items():
            t0 = time.perf_counter()
            if d.step() is None:  # an early end of text: start the same run again
                d.rewind(0)
                d.step()
            row[name] = 1e3 * (time.perf_counter() - t0)
        if r >= args.warmup:
            rounds.append(row)
    med = {n: statistics.median(row[n] for row in rounds) for n in decs}
    ratio = {n: statistics.median(row[n] / row["plain"] for row in rounds) for n in decs}
    res = {
        "model": lm.name,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "prompt_tokens": len(decs["plain"].prompt_ids),
        "step_ms": {n: round(v, 2) for n, v in med.items()},
        "over_plain": {n: round(v, 3) for n, v in ratio.items()},
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"model {res['model']}  threads={res['threads']}  steps={args.steps}")
    for n in decs:
        extra = f"   +{ratio[n] - 1:6.1%} per step" if n != "plain" else ""
        print(f"{n:<16}{med[n]:9.2f} ms   ratio {ratio[n]:5.2f}x{extra}")


if __name__ == "__main__":
    main()
