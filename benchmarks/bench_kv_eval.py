"""How long does kv-eval take, against the full-cache reference pass, and what does batching buy?

One run, on one machine, interleaved so that load changes hit every measurement alike:

1. the full-cache reference alone, as kv-eval now runs it: one prefill over the text
   (measured before, between and after the others; the median is used);
2. the whole batched kv-eval: every policy (full, window, streaming, h2o, tova, ema, gravity)
   at one budget, the six evicting policies as rows of one batch, one forward per token;
3. one full-cache teacher-forced pass, one token per forward: the reference as kv-eval used
   to run it, and what each policy cost on its own before batching.

Then, on a shorter text, kv-eval batched against kv-eval unbatched (``batch_size=1``, each
policy its own pass), with a check that both give the same rows.

    python benchmarks/bench_kv_eval.py --threads 1 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = ROOT / "data" / "pride_and_prejudice_ch1-3.txt"
EXACT = ("tokens", "peak_cache_bytes", "mean_cache_len")
CLOSE = ("ppl", "nll", "top1_agree", "kl", "evicted_mass", "regret_est")


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def one_token_pass(lm, ids: list[int]) -> None:
    """The full cache fed one token per forward, logits and record included."""
    from semviz import eviction as ev

    for _ in ev.teacher_force(lm, ids, [ev.make_policy("full")]):
        pass


def max_difference(a: list[dict], b: list[dict]) -> tuple[float, list[str]]:
    """Largest relative difference over the CLOSE columns; EXACT columns that differ."""
    worst, bad = 0.0, []
    for x, y in zip(a, b, strict=True):
        for k in EXACT:
            if x[k] != y[k]:
                bad.append(f"{x['policy']}.{k}")
        for k in CLOSE:
            worst = max(worst, abs(x[k] - y[k]) / max(abs(y[k]), 1e-6))
    return worst, bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--short", type=int, default=128, help="tokens of the batched/unbatched run")
    p.add_argument("--short-budget", type=int, default=32)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import torch

    from semviz import eviction as ev
    from semviz.model.load import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype, device="cpu")
    text = TEXT.read_text(encoding="utf-8")
    ids = ev.teacher_forced_ids(lm, text, args.tokens)
    names = list(ev.POLICIES)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    times: dict[str, list[float]] = {"reference": [], "batched": [], "one_pass": []}
    rows: list[dict] = []
    for what in ("reference", "batched", "reference", "one_pass", "reference"):
        if what == "reference":
            sec, _ = timed(lambda: ev.kv_eval(lm, ids, ["full"]))
        elif what == "batched":
            sec, rows = timed(lambda: ev.kv_eval(lm, ids, names, (args.budget,)))
        else:
            sec, _ = timed(lambda: one_token_pass(lm, ids))
        times[what].append(sec)
        log(f"{what}: {sec:.1f} s")
    ref_s, ref = times["reference"], statistics.median(times["reference"])
    batched_s, one_pass_s = times["batched"][0], times["one_pass"][0]

    short = ids[: args.short]
    b = (args.short_budget,)
    short_batched_s, short_rows = timed(lambda: ev.kv_eval(lm, short, names, b))
    log(f"short batched: {short_batched_s:.1f} s")
    short_alone_s, alone_rows = timed(lambda: ev.kv_eval(lm, short, names, b, batch_size=1))
    log(f"short unbatched: {short_alone_s:.1f} s")
    worst, bad = max_difference(short_rows, alone_rows)

    out = {
        "model": lm.name,
        "threads": torch.get_num_threads(),
        "tokens": len(ids),
        "budget": args.budget,
        "policies": names,
        "reference_prefill_s": ref_s,
        "batched_kv_eval_s": batched_s,
        "one_token_full_pass_s": one_pass_s,
        "batched_over_reference_prefill": batched_s / ref,
        "batched_over_one_token_full_pass": batched_s / one_pass_s,
        "short_tokens": len(short),
        "short_batched_s": short_batched_s,
        "short_unbatched_s": short_alone_s,
        "short_batched_over_unbatched": short_batched_s / short_alone_s,
        "short_max_rel_difference": worst,
        "short_exact_columns_differ": bad,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(out))
        return 0 if not bad and worst < 1e-5 else 1
    print(
        f"{lm.name} ({args.dtype}, {out['threads']} threads), {len(ids)} tokens, budget "
        f"{args.budget}, policies {','.join(names)}"
    )
    print(f"reference prefill      {ref:8.1f} s  (runs: {', '.join(f'{s:.1f}' for s in ref_s)})")
    print(f"one-token full pass    {one_pass_s:8.1f} s")
    print(f"batched kv-eval        {batched_s:8.1f} s")
    print(f"  / reference prefill  {batched_s / ref:8.2f}x")
    print(f"  / one-token pass     {batched_s / one_pass_s:8.2f}x  (goal <= 2.5x)")
    print(
        f"{len(short)} tokens: batched {short_batched_s:.1f} s, unbatched {short_alone_s:.1f} s, "
        f"ratio {short_batched_s / short_alone_s:.2f}x; largest relative difference "
        f"{worst:.1e}{'; DIFFER: ' + ', '.join(bad) if bad else ''}"
    )
    return 0 if not bad and worst < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
