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
        "--stop",
        action="append",
        default=[],
        type=common.text_arg,
        help="stop string (repeatable)",
    )
    p.add_argument(
        "--record-k",
        type=common.int_arg(1),
        default=1024,
        help="candidates recorded per step (default 1024; fewer for a smaller file)",
    )
    p.add_argument(
        "--attention",
        choices=("on", "off"),
        default="on",
        help="record each step's last-query attention (default on; off for a smaller file)",
    )
    p.add_argument(
        "--lens",
        choices=("on", "off"),
        default="on",
        help="record what the logit lens and direct logit attribution read: the residual "
        "stream and head outputs at each step (default on; off for a smaller file)",
    )
    p.add_argument(
        "--full-logits",
        choices=("on", "off"),
        default="on",
        help="record every raw logit of each step, so that replay is exact at any setting "
        "(default on: 4 bytes a vocabulary entry a step; off for a smaller file, where replay "
        "marks the picks it cannot decide as approximate)",
    )
    common.add_chat_arg(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    common.add_model_args(p)
    common.add_prune_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from semviz.decoding.decoder import Decoder, encode_prompt
    from semviz.output import files
    from semviz.output.files import MiB
    from semviz.output.trace import MAX_BYTES

    # every check that needs no model comes before loading one
    files.check_out_file(args.out, force=args.force)
    params = common.params_from_args(args)
    if not args.prompt.strip():
        from semviz.decoding.decoder import PromptError

        raise PromptError("The prompt is empty: type some text for the model to continue.")
    run = common.run_from_args(args)
    lm = common.load(args)
    capture, lens = args.attention == "on", args.lens == "on"
    full = args.full_logits == "on"
    n_prompt = len(encode_prompt(lm, args.prompt, args.chat))
    # a file replay cannot read is refused before decoding; attention and the lens go first
    est = estimate_bytes(lm.summary(), n_prompt, args.steps, args.record_k, False, full=False)
    if est > MAX_BYTES:
        raise ValueError(
            f"the trace would be about {est / MiB:,.1f} MiB, over the {MAX_BYTES / MiB:,.1f} "
            "MiB a trace may be: ask for fewer --steps or a smaller --record-k"
        )
    # then attention and the lens (views), before the full logits (the exact what-if)
    model = lm.summary()
    est = estimate_bytes(model, n_prompt, args.steps, args.record_k, capture, lens=lens, full=full)
    if est > MAX_BYTES:
        left = [n for n, on in (("attention", capture), ("the lens", lens)) if on]
        capture = lens = False
        if estimate_bytes(model, n_prompt, args.steps, args.record_k, False, full=full) > MAX_BYTES:
            left += ["the full logits"] if full else []
            full = False
        what = " and ".join([", ".join(left[:-1]), left[-1]] if len(left) > 1 else left)
        _note(
            f"{what} left out: with them the trace would be about {est / MiB:,.1f} MiB, "
            f"over the {MAX_BYTES / MiB:,.1f} MiB a trace may be"
        )
    settings = run.decode_settings(
        stop=tuple(args.stop),
        record_k=args.record_k,
        capture=capture,
        lens=lens,
        full_logits=full,
    )
    dec = Decoder(lm, args.prompt, params, settings, eviction=run.eviction())
    stopped = False
    with common.progress_bar(args.steps, "decoding", enabled=not args.json) as bar:
        try:
            dec.run(args.steps, on_step=lambda rec: bar.update(1))
        except KeyboardInterrupt:  # keep the tokens made so far, as a valid trace
            stopped = True
            dec.trace.stop_reason = "interrupted"
    dec.trace.validate()
    dec.trace.save(args.out)
    summary = summarize(dec.trace)
    summary["out"] = args.out
    if stopped:
        _note(f"stopped; the {len(dec.trace.steps)} tokens made so far are in {args.out}")
        return 130
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


def _note(text: str) -> None:
    print(f"semviz trace: {text}", file=sys.stderr)


def estimate_bytes(
    model: dict,
    n_prompt: int,
    steps: int,
    record_k: int,
    attention: bool,
    *,
    lens: bool = False,
    full: bool = False,
) -> int:
    """An upper estimate of a trace file's size: per step its candidates (ids, logits and
    each stage's probabilities), the tail summary, the fixed fields and the ``S`` int32
    cache positions it read, and with attention an ``(L, H, S)`` float16 tensor; base64
    writes 4 bytes for 3. With the lens, each step adds its float16 residual stream
    ``(L+1, d)`` and head outputs ``(L, H, D)``, the float32 last residual and the
    attention metrics ``(4, L, H)``; with ``full``, every raw logit, ``(V,)`` float32."""
    positions = steps * n_prompt + steps * (steps + 1) // 2  # S grows by one a step
    total = steps * (record_k * 32 + 4096) + 4 * positions
    if attention:
        heads = int(model.get("num_layers", 0)) * int(model.get("num_heads", 0))
        total += 2 * heads * positions
    if lens:
        n_l, n_h = int(model.get("num_layers", 0)), int(model.get("num_heads", 0))
        d, d_head = int(model.get("hidden_size", 0)), int(model.get("head_dim", 0))
        total += steps * (2 * (n_l + 1) * d + 2 * n_l * n_h * d_head + 4 * d + 16 * n_l * n_h)
    if full:
        total += steps * 4 * int(model.get("vocab_size", 0))
    return total * 4 // 3 + 16 * 1024


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
