"""Is step time flat under eviction? Step time at position 2,000 vs 200, full cache vs streaming.

For each policy the text is prefilled up to the position (one forward; streaming then evicts
down to its budget), and the next ``--steps`` tokens are fed one at a time. Each step's time is
the forward plus the policy's eviction. Medians are printed with the ratio late/early: about 1
means flat.

    python benchmarks/bench_kv.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = ROOT / "data" / "pride_and_prejudice_ch1-3.txt"


def measure(lm, ids: list[int], policy_name: str, budget, at: int, steps: int, warmup: int):
    """Median seconds per step (and cache length) for ``steps`` steps starting at ``at``."""
    from semviz import eviction as ev

    policy = ev.make_policy(policy_name, budget=budget)
    secs, lengths = [], []
    for i, step in enumerate(
        ev.teacher_force(lm, ids[: at + warmup + steps], [policy], prefill=at)
    ):
        if i > warmup:  # 0 is the prefill
            secs.append(step.seconds + step.policy_seconds[0])
            lengths.append(int(step.events[0]["lengths"].max()))
    return statistics.median(secs), statistics.median(lengths)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--early", type=int, default=200)
    p.add_argument("--late", type=int, default=2000)
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import torch

    from semviz.model.load import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype, device="cpu")
    ids = lm.tokenizer(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    need = args.late + args.warmup + args.steps
    if len(ids) < need:
        ids = (ids * (need // len(ids) + 1))[:need]
    rows = []
    for name, budget in (("full", None), ("streaming", args.budget)):
        row = {"policy": name, "budget": budget}
        for label, at in (("early", args.early), ("late", args.late)):
            sec, length = measure(lm, ids, name, budget, at, args.steps, args.warmup)
            row[f"{label}_ms"] = 1e3 * sec
            row[f"{label}_cache_len"] = length
        row["ratio"] = row["late_ms"] / row["early_ms"]
        rows.append(row)
        print(f"{name}: done", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": lm.name, "early": args.early, "late": args.late, "rows": rows}))
        return 0
    print(f"{lm.name} ({args.dtype}), median of {args.steps} steps")
    print(
        f"{'policy':<10} {'budget':>6} {'ms@' + str(args.early):>9} {'ms@' + str(args.late):>9} "
        f"{'len@' + str(args.late):>9} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['policy']:<10} {str(r['budget'] or '-'):>6} {r['early_ms']:>9.1f} "
            f"{r['late_ms']:>9.1f} {r['late_cache_len']:>9} {r['ratio']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
