"""Frontier sweeps on Ray: one worker with 2 threads against 2 workers with 1 thread each,
and Ray's cost per task against the work in one.

Both layouts run the same small sweep (``--prompts`` × ``--seeds`` rows per point, ``--tokens``
new tokens, ``--batch`` rows per task) without the judge, on a local Ray started here, one
after the other in this process. Each layout's workers load the model before the clock
starts, so the times are the sweep's alone. Printed:

- tokens/s of each layout and their ratio (2 × 1 thread over 1 × 2 threads): above 1 means
  processes scale better than torch's threads for this batch size;
- Ray's overhead per task: the round trip of a task that does nothing on a warm worker,
  against the mean seconds of a real task (one batch of the sweep).

    .venv/bin/python benchmarks/bench_ray.py [--prompts 4 --seeds 2 --tokens 32 --batch 4]
        [--model NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import time


class _Nothing:
    """A shard task that does no work: what is left is Ray's round trip."""

    def setup(self, lm):
        return None

    def run(self, state, payload, tick, should_stop):
        return payload


def _layout(cfg, model, workers: int, threads: int, out) -> dict:
    from semviz.frontier.executor import Executor, ModelSpec
    from semviz.frontier.sweep import run_sweep, sweep_task

    spec = ModelSpec(model, device="cpu", dtype="float32", threads=threads)
    with Executor(sweep_task(cfg, score=False), model=spec, workers=workers) as ex:
        ex.info()  # every worker has loaded the model (actors start together)
        import ray

        ray.get([a.info.remote() for a in ex._pool.actors])
        t0 = time.perf_counter()
        res = run_sweep(None, cfg, out, score=False, executor=ex)
        wall = time.perf_counter() - t0
    tokens = int(res.frame["n_tokens"].sum())
    tasks = len(res.frame) / res.frame["batch_rows"].iloc[0]
    return {
        "workers": workers,
        "threads": threads,
        "tokens": tokens,
        "seconds": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 2),
        "task_seconds": round(float(res.frame["gen_seconds"].sum()) / tasks, 3),
        "tasks": int(tasks),
    }


def _overhead(model, n: int = 40) -> float:
    from semviz.frontier.executor import Executor, ModelSpec, Shard, ShardTask

    class Nothing(_Nothing, ShardTask):
        pass

    spec = ModelSpec(model, device="cpu", dtype="float32", threads=1)
    with Executor(Nothing(), model=spec, workers=1) as ex:
        ex.info()
        shards = [Shard(key=i, payload=i) for i in range(n)]
        t0 = time.perf_counter()
        ex.run(shards, on_result=lambda s, r: None)
        return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4, help="rows per task")
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import tempfile
    from pathlib import Path

    from semviz.analysis.compare import parse_side
    from semviz.frontier.sweep import SweepConfig

    cfg = SweepConfig(
        settings=(parse_side("min_p=0.1"),),
        values=(0.7, 1.3),
        n_prompts=args.prompts,
        seeds=args.seeds,
        new_tokens=args.tokens,
        batch_rows=args.batch,
    )
    with tempfile.TemporaryDirectory() as tmp:
        one = _layout(cfg, args.model, 1, 2, Path(tmp) / "one.parquet")
        two = _layout(cfg, args.model, 2, 1, Path(tmp) / "two.parquet")
    per_task = _overhead(args.model)
    out = {
        "one_worker_2_threads": one,
        "two_workers_1_thread": two,
        "ratio_two_over_one": round(two["tokens_per_s"] / one["tokens_per_s"], 3),
        "ray_overhead_per_task_s": round(per_task, 4),
        "overhead_share_of_a_task": round(per_task / two["task_seconds"], 4),
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"1 worker × 2 threads: {one['tokens_per_s']:.1f} tokens/s ({one['seconds']} s)")
    print(f"2 workers × 1 thread: {two['tokens_per_s']:.1f} tokens/s ({two['seconds']} s)")
    print(f"ratio (2 × 1 thread) / (1 × 2 threads): {out['ratio_two_over_one']:.2f}")
    print(
        f"Ray per task: {per_task * 1e3:.1f} ms, {out['overhead_share_of_a_task']:.2%} of a "
        f"task of {args.batch} rows × {args.tokens} tokens ({two['task_seconds']:.2f} s)"
    )


if __name__ == "__main__":
    main()
