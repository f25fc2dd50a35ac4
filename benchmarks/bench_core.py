"""Core per-step cost against one decode forward of the default model, in the same run.

Run: ``python benchmarks/bench_core.py [--repeats 30] [--json]``

Prints, side by side:
- one decode forward (one new token on a 64-token cache) of the default model;
- one full core step on V = vocabulary: gravity (attention mass, cosine, embedding space,
  64 context tokens; as the decoder computes it, one extra row of the LM head's matmul) +
  prune (temperature, top-k, top-p, min-p, free energy, target adaptive temperature,
  fallback) + choose; and its ratio to the forward (goal < 10%);
- gravity alone at 4096 and at 64 context tokens, and their ratio (goal <= 1.5);
- prune + choose for greedy (T=0) and plain sampling (T=1), as the decoder calls them, over
  the forward (each should be a small fraction: the decoder's overhead goal is <= 15%);
- the what-if replay's core work: 256 recorded steps of K=1024 candidates (goal < 1 s).

Everything is timed round-robin and each ratio is the median of per-round ratios, so both
sides of a ratio see the same machine load. Times are medians; nothing is asserted.
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
from semviz.gravity import (  # noqa: E402
    GravityContext,
    context_pull,
    gravity_for_step,
    logits_and_gravity,
    normalize_gravity,
)
from semviz.sampling import PruneParams, SamplerState, choose, prune  # noqa: E402


def interleaved(fns: dict, repeats: int, ratios: dict, warmup: int = 3, extra=None):
    """Median ms of each fn, timed round-robin, and median per-round ratios ``a / b``.

    ``ratios`` maps a name to ``(a, b)``, names of ``fns``; ``extra`` maps a name to a
    function of one round's timings.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    rounds = []
    for _ in range(repeats):
        row = {}
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            row[name] = 1e3 * (time.perf_counter() - t0)
        rounds.append(row)
    med = {name: statistics.median(r[name] for r in rounds) for name in fns}
    rat = {k: statistics.median(r[a] / r[b] for r in rounds) for k, (a, b) in ratios.items()}
    for k, fn in (extra or {}).items():
        rat[k] = statistics.median(fn(r) for r in rounds)
    return med, rat


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
            gravity_kind="pull",
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
        ids4k, attn4k = context(4096)
        state = SamplerState()
        h_last = model.get_decoder()(prompt).last_hidden_state[0, -1]  # (d,)
        head = model.get_output_embeddings()

        # The decoder computes G in the LM head's matmul (one extra row: the weight is read
        # once for both). Gravity's share of a step is therefore
        #   pull vector + (fused head - plain head) + z-score,
        # and the core step adds prune + choose. The plain head is part of `forward`.
        def head_plain() -> None:
            head(h_last[None])

        def fused(ids, attn):
            pull = context_pull(model, params, GravityContext(ids=ids, attention=attn)).pull  # (d,)
            lg, g = logits_and_gravity(model, h_last, pull, "embedding", "cosine")
            return lg, normalize_gravity(g)

        def core_step() -> None:
            _, g = fused(ids64, attn64)
            r = prune(logits, params, gravity=g, state=state.copy())
            choose(r, 0.5)

        def g64() -> None:
            fused(ids64, attn64)

        def g4k() -> None:
            fused(ids4k, attn4k)

        def g_unfused() -> None:  # the stand-alone (V, d) float32 product, for reference
            gravity_for_step(model, params, context_ids=ids64, attention=attn64)

        greedy_p, plain_p = PruneParams(temperature=0.0), PruneParams()

        def greedy() -> None:
            choose(prune(logits, greedy_p, state=state.copy()), 0.5)

        def plain() -> None:
            choose(prune(logits, plain_p, state=state.copy()), 0.5)

        # what-if replay: 256 recorded steps, top-1024 candidates with the tail's logsumexp
        steps = []
        for _ in range(256):
            x = torch.randn(V, generator=gen) * 3
            top = torch.topk(x, 1024)
            rest = x.scatter(0, top.indices, float("-inf"))
            steps.append((top.values, torch.logsumexp(rest, 0), torch.randn(1024, generator=gen)))
        whatif_p = PruneParams(temperature=0.8, top_p=0.95, gravity_lambda=0.3)

        def replay256() -> None:
            st = SamplerState()
            for cand, tail, g in steps:
                choose(prune(cand, whatif_p, gravity=g, state=st, tail_logsumexp=tail), 0.5)

        # interleaved, so each ratio compares timings taken under the same machine load
        fns = {
            "forward": forward,
            "head": head_plain,
            "core": core_step,
            "g64": g64,
            "g4k": g4k,
            "g_unfused": g_unfused,
            "greedy": greedy,
            "plain": plain,
            "replay": replay256,
        }
        ratios = {
            "greedy": ("greedy", "forward"),
            "plain": ("plain", "forward"),
        }
        extra = {  # per round: the head's own row is the model's, not the core's
            "core": lambda r: (r["core"] - r["head"]) / r["forward"],
            "gravity": lambda r: r["g4k"] / r["g64"],
            "unfused": lambda r: r["g_unfused"] / r["forward"],
        }
        med, rat = interleaved(fns, args.repeats, ratios, extra=extra)

    res = {
        "model": loaded.name,
        "vocab": V,
        "threads": torch.get_num_threads(),
        "decode_forward_ms": round(med["forward"], 3),
        "lm_head_ms": round(med["head"], 3),
        "core_step_ms": round(med["core"] - med["head"], 3),
        "unfused_gravity_over_forward": round(rat["unfused"], 4),
        "core_over_forward": round(rat["core"], 4),
        "gravity_64_ms": round(med["g64"], 3),
        "gravity_4096_ms": round(med["g4k"], 3),
        "gravity_4096_over_64": round(rat["gravity"], 3),
        "greedy_prune_ms": round(med["greedy"], 3),
        "greedy_over_forward": round(rat["greedy"], 4),
        "plain_prune_ms": round(med["plain"], 3),
        "plain_over_forward": round(rat["plain"], 4),
        "replay_256x1024_ms": round(med["replay"], 2),
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    r = rat
    print(f"model {res['model']}  V={V}  threads={res['threads']}  repeats={args.repeats}")
    print(f"{'decode forward':<28}{med['forward']:9.2f} ms")
    core_ms = med["core"] - med["head"]
    print(
        f"{'core step (full chain)':<28}{core_ms:9.2f} ms   ratio {r['core']:6.1%}   (goal < 10%)"
    )
    print(
        f"{'  unfused (V,d) gravity':<28}{med['g_unfused']:9.2f} ms   ratio {r['unfused']:6.1%}"
        "   (for reference: what fusing with the LM head saves)"
    )
    print(f"{'gravity, 64 ctx tokens':<28}{med['g64']:9.2f} ms")
    print(
        f"{'gravity, 4096 ctx tokens':<28}{med['g4k']:9.2f} ms   ratio {r['gravity']:6.2f}x  (goal <= 1.5x)"
    )
    print(f"{'prune+choose, greedy':<28}{med['greedy']:9.2f} ms   ratio {r['greedy']:6.1%}")
    print(f"{'prune+choose, T=1':<28}{med['plain']:9.2f} ms   ratio {r['plain']:6.1%}")
    print(f"{'replay 256 steps, K=1024':<28}{med['replay']:9.2f} ms   (goal < 1000 ms)")


if __name__ == "__main__":
    main()
