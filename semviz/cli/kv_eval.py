"""``python -m semviz kv-eval``: teacher-forced quality of KV-cache eviction policies.

Reads the text once with the full cache (one prefill) and once with every (policy, budget) as
a row of one batch, eviction live, one token per forward, and prints perplexity, top-1
agreement and KL divergence against the full cache, peak cache bytes and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from semviz.cli.common import add_model_args, add_ray_args, int_arg, print_json, progress_bar

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "data" / "pride_and_prejudice_ch1-3.txt"
MAX_TEXT_BYTES = 64 << 20  # never read more of --text than this, whatever --tokens asks


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "kv-eval",
        help="measure KV-cache eviction policies against the full cache",
        description=(
            "Teacher-force a text through the model with every policy as a row of one batch, "
            "eviction live, and report perplexity, top-1 agreement and KL divergence from the "
            "full cache's next-token distribution, peak cache bytes and tokens/s."
        ),
    )
    add_model_args(p)
    # exact comparisons against the full cache, and on CPU float32 is the faster path
    p.set_defaults(dtype="float32")
    p.add_argument(
        "--threads",
        type=int_arg(1, 1024),
        default=None,
        help="torch CPU threads (default: torch's)",
    )
    p.add_argument(
        "--text",
        action="append",
        default=None,
        help="a UTF-8 text file; repeat for a grid over several texts (default: the shipped "
        "Pride and Prejudice chapters)",
    )
    add_ray_args(p, "the grid's (text, budget) shards")
    p.add_argument(
        "--tokens", type=int_arg(2, 1 << 20), default=1024, help="tokens of the text to read"
    )
    p.add_argument(
        "--budget",
        default="128",
        help="cache budget per layer: tokens (128) or a fraction of the tokens read (0.25)",
    )
    p.add_argument(
        "--budgets",
        default=None,
        help="comma-separated budgets to sweep (overrides --budget), e.g. 64,128,256",
    )
    p.add_argument(
        "--policies",
        default="all",
        help="comma-separated policy names, or all (every policy semviz.eviction registers: "
        "full is the reference, the others are evaluated against it)",
    )
    p.add_argument(
        "--prefill",
        type=int_arg(1),
        default=1,
        help="tokens in the first forward (then one at a time); fewer than --tokens",
    )
    p.add_argument(
        "--rerotate",
        action="store_true",
        help="streaming: cache-relative positions by re-rotating keys (StreamingLLM §3.2)",
    )
    p.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        metavar="POLICY.KEY=VALUE",
        help="extra policy setting, repeatable, e.g. gravity.beta=1.0 or h2o.recent=0.25",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def parse_policy_args(items: list[str]) -> dict[str, dict]:
    """``["gravity.beta=1", "h2o.recent=0.25"]`` → ``{"gravity": {"beta": 1}, ...}``."""
    from semviz.cli import UserError
    from semviz.sampling.params import parse_scalar

    out: dict[str, dict] = {}
    for item in items:
        key, sep, val = item.partition("=")
        name, dot, attr = key.partition(".")
        if not sep or not dot or not name or not attr:
            raise UserError(f"--policy-arg must look like POLICY.KEY=VALUE, got {item!r}")
        out.setdefault(name.strip(), {})[attr.strip()] = parse_scalar(val)
    return out


def run(args: argparse.Namespace) -> int:
    from semviz.cli import UserError
    from semviz.cli.common import load
    from semviz.eviction import POLICIES, kv_eval, parse_budgets, teacher_forced_ids
    from semviz.output import files

    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    if policies == ["all"]:
        policies = list(POLICIES)
    unknown = [p for p in policies if p not in POLICIES]
    if not policies or unknown:
        raise UserError(f"--policies takes names from {', '.join(POLICIES)}; got {args.policies!r}")
    flag, raw = ("--budgets", args.budgets) if args.budgets else ("--budget", args.budget)
    try:
        budgets = parse_budgets(raw)
    except ValueError as exc:
        raise UserError(f"{flag} {raw}: {exc}") from None
    if args.prefill >= args.tokens:
        raise UserError(f"--prefill {args.prefill} must be fewer than --tokens {args.tokens}")
    paths = [Path(t) for t in args.text] if args.text else [DEFAULT_TEXT]
    if len({p.name for p in paths}) != len(paths):
        raise UserError("--text: two texts have the same file name; rows are keyed by it")
    for path in paths:
        files.check_in_file(path)  # before loading the model
    kw = parse_policy_args(args.policy_arg)
    for name in kw:
        if name not in POLICIES:
            raise UserError(f"--policy-arg names unknown policy {name!r}")
    if args.rerotate:
        kw.setdefault("streaming", {})["rerotate"] = True

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    lm = load(args)
    if len(paths) > 1 or args.workers or args.address:
        return _grid(args, lm, paths, policies, budgets, kw)
    path = paths[0]
    ids = read_ids(path, lm.tokenizer, args.tokens)  # bounded: reads only what it needs
    try:
        ids = teacher_forced_ids(lm, ids, args.tokens)
    except ValueError as exc:
        raise UserError(f"{path.name}: {exc} (--tokens)") from None

    bar = progress_bar(0, "kv-eval", enabled=not args.quiet)

    def on_progress(done: int, total: int, label: str) -> None:
        if bar.total != total:
            bar.total = total
        bar.set_description(label, refresh=False)
        bar.update(done - bar.n)

    try:
        rows = kv_eval(
            lm,
            ids,
            policies,
            budgets,
            prefill=args.prefill,
            policy_kwargs=kw,
            on_progress=on_progress,
        )
    except TypeError as exc:  # a --policy-arg the policy does not take
        raise UserError(f"bad --policy-arg: {exc}") from None
    finally:
        bar.close()

    if args.json:
        print_json(
            {
                "model": lm.name,
                "text": path.name,
                "tokens": len(ids),
                "prefill": args.prefill,
                "policy_args": kw,
                "rows": rows,
            }
        )
        return 0
    _print_table(rows, lm.name, path.name, len(ids))
    return 0


def _grid(args, lm, paths, policies, budgets, kw) -> int:
    """Policies × budgets × texts through the executor: here, or on Ray workers."""
    from semviz.cli import UserError
    from semviz.eviction import teacher_forced_ids
    from semviz.frontier.executor import Executor, ModelSpec
    from semviz.frontier.kvgrid import KVGridTask, kv_grid

    texts = {}
    for path in paths:
        try:
            ids = read_ids(path, lm.tokenizer, args.tokens)
            texts[path.name] = teacher_forced_ids(lm, ids, args.tokens)
        except ValueError as exc:
            raise UserError(f"{path.name}: {exc} (--tokens)") from None
    task = KVGridTask(args.prefill, kw)
    if args.workers or args.address:
        spec = ModelSpec(args.model, args.device, args.dtype, threads=1)
        executor = Executor(task, model=spec, workers=args.workers, address=args.address)
    else:
        executor = Executor(task, lm=lm)
    bar = progress_bar(0, "kv-eval", enabled=not args.quiet)

    def on_progress(done: float, total: float, label: str) -> None:
        bar.total = int(total)
        bar.set_description(label, refresh=False)
        bar.update(int(done) - bar.n)

    try:
        with executor:
            rows, _ = kv_grid(
                texts,
                policies,
                budgets,
                executor=executor,
                prefill=args.prefill,
                policy_kwargs=kw,
                on_progress=on_progress,
            )
    except TypeError as exc:  # a --policy-arg the policy does not take
        raise UserError(f"bad --policy-arg: {exc}") from None
    finally:
        bar.close()
    if args.json:
        print_json(
            {
                "model": lm.name,
                "texts": {k: len(v) for k, v in texts.items()},
                "prefill": args.prefill,
                "policy_args": kw,
                "rows": rows,
            }
        )
        return 0
    for name, ids in texts.items():
        _print_table([r for r in rows if r["text"] == name], lm.name, name, len(ids))
    return 0


def read_ids(path: Path, tokenizer, n: int) -> list[int]:
    """The first ``n`` token ids of the text file, reading only as much of it as they need."""
    from semviz.output import files

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return files.read_tokens(path, encode, n, limit=MAX_TEXT_BYTES)


def _print_table(rows: list[dict], model: str, text: str, n: int) -> None:
    head = (
        f"{'policy':<10} {'budget':>7} {'ppl':>9} {'top1':>7} {'KL':>8} "
        f"{'peak KiB':>9} {'mean len':>9} {'tok/s':>7}"
    )
    print(f"{model} · {text} · {n:,} tokens, teacher-forced")
    print(head)
    print("-" * len(head))
    for r in rows:
        b = "-" if r["budget"] is None else json.dumps(r["budget"])
        print(
            f"{r['policy']:<10} {b:>7} {r['ppl']:>9.3f} {r['top1_agree']:>7.3f} "
            f"{r['kl']:>8.4f} {r['peak_cache_bytes'] / 1024:>9.0f} "
            f"{r['mean_cache_len']:>9.1f} {r['tokens_per_s']:>7.1f}"
        )
    sys.stdout.flush()
