"""``python -m semviz trace``: decode a prompt step by step and write the trace."""

from __future__ import annotations

import argparse
import sys

from semviz.cli import common


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("trace", help="decode a prompt and write a trace JSON")
    p.add_argument("--prompt", required=True, type=common.text_arg, help="the text to continue")
    common.add_run_args(p, ("max_new_tokens", "seed", "kv_policy", "kv_budget"))
    p.add_argument("--out", default="trace.json", help="where to write the trace")
    common.add_force_arg(p)
    p.add_argument(
        "--stop", action="append", default=[], type=common.text_arg,
        help="stop string (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--record-k", type=common.int_arg(1), default=1024,
        help="candidates recorded per step (default 1024; fewer for a smaller file)",
    )  # fmt: skip
    p.add_argument(
        "--attention", choices=("on", "off"), default="on",
        help="record each step's last-query attention (default on; off for a smaller file)",
    )  # fmt: skip
    p.add_argument(
        "--lens", choices=("on", "off"), default="on",
        help="record what the logit lens and direct logit attribution read: the residual "
        "stream and head outputs at each step (default on; off for a smaller file)",
    )  # fmt: skip
    common.add_chat_arg(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    common.add_model_args(p)
    common.add_prune_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from semviz.decoding.decoder import Decoder
    from semviz.output import files

    # every check that needs no model comes before loading one
    files.check_out_file(args.out, force=args.force)
    params = common.params_from_args(args)
    if not args.prompt.strip():
        from semviz.decoding.decoder import PromptError

        raise PromptError("The prompt is empty: type some text for the model to continue.")
    run = common.run_from_args(args)
    lm = common.load(args)
    settings = run.decode_settings(
        stop=tuple(args.stop),
        record_k=args.record_k,
        capture=args.attention == "on",
        lens=args.lens == "on",
    )
    dec = Decoder(lm, args.prompt, params, settings, eviction=run.eviction())
    with common.progress_bar(args.steps, "decoding", enabled=not args.json) as bar:
        dec.run(args.steps, on_step=lambda rec: bar.update(1))
    dec.trace.save(args.out)
    summary = summarize(dec.trace)
    summary["out"] = args.out
    if args.json:
        common.print_json(summary)
    else:
        print(dec.trace.text)
        print(
            f"\n{summary['steps']} tokens, stop: {summary['stop_reason']}, mean entropy "
            f"{summary['mean_entropy']:.3f} nats, {summary['tokens_per_s']:.1f} tok/s -> {args.out}",
            file=sys.stderr,
        )
    return 0


def summarize(trace) -> dict:
    """Scalar summary of a trace for ``--json``."""
    df = trace.to_dataframe()
    n = len(df)
    total = float(df["t_forward_ms"].sum() + df["t_semviz_ms"].sum()) / 1e3 if n else 0.0
    return {
        "model": trace.model.get("name"),
        "prompt_tokens": len(trace.prompt_ids),
        "steps": n,
        "text": trace.text,
        "stop_reason": trace.stop_reason,
        "mean_entropy": float(df["entropy"].mean()) if n else float("nan"),
        "mean_kept": float(df["n_kept"].mean()) if n else float("nan"),
        "fallbacks": int(df["fallback"].notna().sum()) if n else 0,
        "prefill_s": trace.prefill_seconds,
        "tokens_per_s": n / total if total > 0 else float("nan"),
    }
