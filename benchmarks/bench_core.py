"""Core per-step cost against one decode forward of the default model, in the same run.

Run: ``python benchmarks/bench_core.py [--repeats 30] [--json]``

Prints, side by side:
- one decode forward (one new token on a 64-token cache) of the default model;
- one full core step on V = vocabulary: gravity (attention mass, cosine, embedding space,
  64 context tokens) + prune (temperature, top-k, top-p, min-p, free energy, target
  adaptive temperature, fallback) + choose; and its ratio to the forward (goal < 10%);
- gravity alone at 4096 and at 64 context tokens, and their ratio (goal <= 1.5).

The four are timed round-robin and each ratio is the median of per-round ratios, so
both sides of a ratio see the same machine load. Times are medians; nothing is asserted.
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
from semviz.gravity import gravity_for_step  # noqa: E402
from semviz.pruning import PruneParams, SamplerState, choose, prune  # noqa: E402


def interleaved(fns, repeats: int, warmup: int = 3):
    """Median ms of each fn, timed round-robin, plus median per-round ratios fn1/fn0, fn3/fn2."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    rounds = []
    for _ in range(repeats):
        row = []
        for fn in fns:
            t0 = time.perf_counter()
            fn()
            row.append(1e3 * (time.perf_counter() - t0))
        rounds.append(row)
    med = [statistics.median(r[i] for r in rounds) for i in range(len(fns))]
    r_core = statistics.median(r[1] / r[0] for r in rounds)
    r_grav = statistics.median(r[3] / r[2] for r in rounds)
    return (*med, r_core, r_grav)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    loaded = semviz.load_model()
    model = loaded.model.eval()
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    gen = torch.Generator().manual_seed(0)

    with torch.inference_mode():
        prompt = torch.randint(0, cfg.vocab_size, (1, 64), generator=gen)
        out = model(prompt, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[0, -1].float()  # (V,)
        V = logits.shape[0]
        nxt = logits.argmax().view(1, 1)

        def forward() -> None:
            # one new token on the 64-token cache; crop back so every call sees the same length
            model(nxt, past_key_values=cache, use_cache=True)
            cache.crop(-1)

        params = PruneParams(
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            min_p=0.05,
            gravity_lambda=0.5,
            gravity_mass="attention",
            free_energy=True,
            adaptive="target",
            fallback=True,
        )

        def context(n: int):
            ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen)
            attn = torch.softmax(torch.randn(L, H, n, generator=gen), -1)  # (L, H, N)
            return ids, attn

        ids64, attn64 = context(64)
        state = SamplerState()

        def core_step() -> None:
            g = gravity_for_step(model, params, context_ids=ids64, attention=attn64)
            r = prune(logits, params, gravity=g, state=state.copy())
            choose(r, 0.5)

        ids4k, attn4k = context(4096)

        def g64() -> None:
            gravity_for_step(model, params, context_ids=ids64, attention=attn64)

        def g4k() -> None:
            gravity_for_step(model, params, context_ids=ids4k, attention=attn4k)

        # interleaved, so each ratio compares timings taken under the same machine load
        t_forward, t_core, t_g64, t_g4k, r_core, r_grav = interleaved(
            [forward, core_step, g64, g4k], args.repeats
        )

    res = {
        "model": loaded.name,
        "vocab": V,
        "threads": torch.get_num_threads(),
        "decode_forward_ms": round(t_forward, 3),
        "core_step_ms": round(t_core, 3),
        "core_over_forward": round(r_core, 4),
        "gravity_64_ms": round(t_g64, 3),
        "gravity_4096_ms": round(t_g4k, 3),
        "gravity_4096_over_64": round(r_grav, 3),
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"model {res['model']}  V={V}  threads={res['threads']}")
    print(f"{'decode forward':<28}{t_forward:9.2f} ms")
    print(f"{'core step (full chain)':<28}{t_core:9.2f} ms   ratio {r_core:6.1%}   (goal < 10%)")
    print(f"{'gravity, 64 ctx tokens':<28}{t_g64:9.2f} ms")
    print(f"{'gravity, 4096 ctx tokens':<28}{t_g4k:9.2f} ms   ratio {r_grav:6.2f}x  (goal <= 1.5x)")


if __name__ == "__main__":
    main()
