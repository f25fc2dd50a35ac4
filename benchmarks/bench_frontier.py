"""What one frontier point costs, the judge's share of it, and batched vs one-at-a-time.

One point is ``--prompts`` prompts × ``--seeds`` seeds × ``--tokens`` new tokens of one
setting (default the sweep's defaults and gravity at λ 0.5, the costlier chain). Measured
side by side in one run:

- the batched point: one ``generate()`` of every row (the pruning core's share inside it),
  then the judge embedding prompts and continuations; goal: judge ≤ 10 % of the point.
  Wall time moves with the machine's load; the process's CPU time is what one quiet core
  would take;
- the first ``--single`` rows again one at a time, same seeds: seconds per row against the
  batched point's, and how many rows come out token for token the same (padding changes
  the logits' rounding, which can move a pick that sits on a CDF boundary);
- perplexity: read from the generating pass (free) against a teacher-forced forward of the
  same rows (its cost, and the largest difference between the two).

    .venv/bin/python benchmarks/bench_frontier.py [--prompts 12 --seeds 2 --tokens 48]
        [--setting "top_p=0.95,gravity_lambda=0.5"] [--single 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--setting", default="top_p=0.95,gravity_lambda=0.5")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--single", type=int, default=4, help="rows rerun one at a time (>= 1)")
    ap.add_argument("--split", default="test", choices=["dev", "test"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.single < 1:
        ap.error("--single must be at least 1")
    torch.set_num_threads(1)

    import semviz
    from semviz.analysis.compare import parse_side
    from semviz.analysis.judge import load_judge
    from semviz.decoding.decoder import encode_prompt
    from semviz.frontier.batched import continuation_nll, generate_batch
    from semviz.frontier.sweep import load_prompts

    lm = semviz.load_model()
    judge = load_judge()
    params = parse_side(args.setting).params.replace(temperature=args.temperature)
    prompts = load_prompts(split=args.split, n=args.prompts)
    rows = [(p, s) for p in prompts for s in range(args.seeds)]
    ids = [encode_prompt(lm, p.text) for p, _ in rows]
    seeds = [s for _, s in rows]
    judge.embed(["warm up"])
    generate_batch(lm, ids[:2], seeds[:2], params, max_new_tokens=2)  # warm up

    t0, c0 = time.perf_counter(), time.process_time()
    batch = generate_batch(lm, ids, seeds, params, max_new_tokens=args.tokens)
    t_gen = time.perf_counter() - t0
    texts = [lm.tokenizer.decode(c, skip_special_tokens=True) for c in batch.ids]
    t0 = time.perf_counter()
    judge.embed([p.text for p in prompts])
    judge.embed(texts)
    t_judge = time.perf_counter() - t0
    cpu = time.process_time() - c0  # this process's own CPU time: what a quiet core would take
    t0 = time.perf_counter()
    tf = continuation_nll(lm, ids, batch.ids)
    t_tf = time.perf_counter() - t0
    nll_diff = max(abs(a - b) for a, b in zip(batch.nll, tf, strict=True))

    k = min(args.single, len(rows))
    t0 = time.perf_counter()
    single = [
        generate_batch(lm, [ids[i]], [seeds[i]], params, max_new_tokens=args.tokens).ids[0]
        for i in range(k)
    ]
    t_single = time.perf_counter() - t0
    same = sum(a == b for a, b in zip(single, batch.ids[:k], strict=True))
    diff_tokens = sum(
        sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))
        for a, b in zip(single, batch.ids[:k], strict=True)
    )
    n_tok = sum(len(r) for r in batch.ids[:k])

    point = t_gen + t_judge
    out = {
        "setting": args.setting,
        "temperature": args.temperature,
        "rows_per_point": len(rows),
        "new_tokens": args.tokens,
        "point_seconds": point,
        "point_cpu_seconds": cpu,
        "load_average_1min": os.getloadavg()[0],
        "generate_seconds": t_gen,
        "sampler_seconds": batch.sampler_seconds,
        "judge_seconds": t_judge,
        "judge_share": t_judge / point,
        "teacher_forced_nll_seconds": t_tf,
        "teacher_forced_vs_point": t_tf / point,
        "nll_max_abs_diff": nll_diff,
        "single_rows": k,
        "single_seconds_per_row": t_single / k,
        "batched_seconds_per_row": t_gen / len(rows),
        "batched_speedup_per_row": (t_single / k) / (t_gen / len(rows)),
        "rows_identical": same,
        "tokens_differing": diff_tokens,
        "tokens_compared": n_tok,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"one point: {len(rows)} rows x {args.tokens} tokens, {args.setting}, T={args.temperature}"
    )
    print(
        f"  point               {point:7.1f} s wall, {cpu:.1f} s of CPU "
        f"(load average {out['load_average_1min']:.1f} on {os.cpu_count()} cores)"
    )
    print(
        f"  generate (batched)  {t_gen:7.1f} s   (pruning core and draws {batch.sampler_seconds:.1f} s)"
    )
    print(f"  judge               {t_judge:7.2f} s   share {out['judge_share']:.1%} (goal <= 10%)")
    print(
        f"  teacher-forced NLL  {t_tf:7.1f} s   {out['teacher_forced_vs_point']:.1%} of the point, "
        f"not spent: read from the generating pass (max |diff| {nll_diff:.1e} nats)"
    )
    print(
        f"one at a time ({k} rows): {out['single_seconds_per_row']:.2f} s/row vs batched "
        f"{out['batched_seconds_per_row']:.2f} s/row: batching is "
        f"{out['batched_speedup_per_row']:.1f}x cheaper per row"
    )
    print(
        f"  same tokens: {same}/{k} rows identical; {diff_tokens} of {n_tok} tokens differ "
        "(a padding rounding flip changes the rest of its row)"
    )


if __name__ == "__main__":
    main()
