"""``python -m semviz frontier``: does a setting help? Coherence against diversity, A vs B.

Sweeps one knob for every setting over the prompt set, scores every continuation with an
outside judge, and says whether B's curve dominates A's at matched diversity::

    python -m semviz frontier --a top_p=0.95 --b "top_p=0.95,gravity_lambda=0.5" \\
        --knob temperature --values 0.7,1.0,1.3 --split test --out out/frontier.parquet

Settings use the compare syntax (a preset, ``plain``, or ``key=value`` overrides); repeat
``--side`` for more. Results go to Parquet after every batch: rerunning the same command
skips the rows it already has, so Ctrl-C (which finishes nothing half-way) loses at most
one batch. ``--summary`` only reads the file. Tune on ``--split dev``, report on ``test``.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys

from semviz.cli import common


def add_parser(sub) -> argparse.ArgumentParser:
    from semviz.frontier.sweep import DEFAULT_OUT

    p = sub.add_parser(
        "frontier",
        help="coherence vs diversity of two or more settings over a prompt set, judged outside",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--a", default="top_p=0.95", help='setting A (default "top_p=0.95")')
    p.add_argument(
        "--b",
        default="top_p=0.95,gravity_lambda=0.5",
        help='setting B (default "top_p=0.95,gravity_lambda=0.5")',
    )
    p.add_argument("--side", action="append", default=[], help="another setting (repeatable)")
    p.add_argument(
        "--knob", default="temperature", help="temperature (default), top_p, min_p or lambda"
    )
    p.add_argument(
        "--values", default=None, help="comma-separated knob values (default: depends on knob)"
    )
    p.add_argument("--split", default="test", choices=["dev", "test"], help="prompt half")
    p.add_argument("--prompts", type=int, default=12, help="prompts from the half (default 12)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per prompt: 0..N-1 (default 2)")
    p.add_argument("--tokens", type=int, default=48, help="new tokens per row (default 48)")
    p.add_argument(
        "--batch", type=int, default=None, help="rows per generate() call (default: a whole point)"
    )
    p.add_argument("--prompt-file", default=None, help="JSONL prompt set (id, kind, split, text)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"results Parquet (default {DEFAULT_OUT})")
    p.add_argument(
        "--x",
        default="distinct_2",
        choices=["distinct_2", "distinct_1", "dissimilarity"],
        help="diversity axis for matching (default distinct_2)",
    )
    p.add_argument("--boot", type=int, default=1000, help="bootstrap draws (default 1000)")
    p.add_argument("--summary", action="store_true", help="summarise --out only; generate nothing")
    common.add_chat_arg(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--markdown", default=None, metavar="PATH", help="write the table as Markdown")
    common.add_model_args(p)
    return p


def _config(args):
    from semviz.analysis.compare import parse_side
    from semviz.frontier.sweep import KNOBS, SweepConfig, normalize_knob

    knob = normalize_knob(args.knob)
    if args.values is None:
        values = KNOBS[knob]
    else:
        try:
            values = tuple(float(v) for v in args.values.split(",") if v.strip())
        except ValueError:
            raise ValueError(
                f"--values: expected numbers separated by commas, got {args.values!r}"
            ) from None
    specs = [args.a, args.b, *args.side]
    sides = tuple(parse_side(s) for s in specs if s is not None and s.strip())
    return SweepConfig(
        settings=sides, knob=knob, values=values, split=args.split, n_prompts=args.prompts,
        seeds=args.seeds, new_tokens=args.tokens, chat=args.chat, batch_rows=args.batch,
        prompts_path=args.prompt_file,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from semviz.frontier import sweep as fr

    if args.boot < 10:
        raise ValueError("--boot must be at least 10")
    cfg = _config(args)  # every setting and value checked before anything loads
    prompts = fr.load_prompts(cfg.prompts_path, split=cfg.split, n=cfg.n_prompts)
    if args.summary:
        df = fr.load_results(args.out)
        if not len(df):
            raise ValueError(f"{args.out} holds no results yet: run without --summary first")
        chat = df["chat"].iloc[0] if args.chat is None else args.chat
        model = df["model"].iloc[0] if args.model is None else args.model
        df = fr.select(df, cfg, model, bool(chat), prompts)
        result = None
    else:
        from semviz.analysis.judge import load_judge

        judge = load_judge()  # a missing judge is reported before the model loads
        lm = common.load(args)
        result = _sweep(lm, cfg, args, judge)
        df = result.frame
    if not len(df):
        raise ValueError(f"{args.out} has no rows for these settings, values and prompts")
    s = fr.summarize(df, x=args.x, n_boot=args.boot)
    out = s.to_dict()
    out["out"] = args.out
    out["rows"] = len(df)
    if result is not None:
        out.update(_costs(result, cfg))
    if args.markdown:
        _write_markdown(args.markdown, s, out)
    if args.json:
        common.print_json(out)
    else:
        print(markdown_table(s))
        print()
        for d in s.dominance:
            print(d.verdict)
        if result is not None:
            _print_costs(out)
    return 0


def _sweep(lm, cfg, args, judge):
    from semviz.frontier import sweep as fr

    stop = {"flag": False}

    def _interrupt(signum, frame):  # first Ctrl-C: drop the batch in flight, keep the rest
        if stop["flag"]:
            raise KeyboardInterrupt
        stop["flag"] = True
        print("\nsemviz frontier: stopping; finished batches are saved…", file=sys.stderr)

    old = signal.signal(signal.SIGINT, _interrupt)
    total = len(cfg.settings) * len(cfg.values) * cfg.n_prompts * cfg.seeds * cfg.new_tokens
    try:
        with common.progress_bar(total, "tokens", enabled=not args.json) as bar:

            def on_progress(p: fr.Progress) -> None:
                bar.n = int(p.fraction * total)
                bar.set_postfix_str(p.point, refresh=False)
                bar.refresh()

            result = fr.run_sweep(
                lm, cfg, args.out, judge=judge, on_progress=on_progress,
                should_stop=lambda: stop["flag"],
            )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, old)
    if result.stopped:
        print(
            f"semviz frontier: stopped; {result.new_rows} new rows saved to {args.out}. "
            "Rerun the same command to resume.",
            file=sys.stderr,
        )
    return result


def _costs(result, cfg) -> dict:
    t = result.timings
    pts = t.get("points", 0.0)
    if pts <= 0:
        return {"new_rows": result.new_rows, "skipped_rows": result.skipped_rows}
    total = t["generate"] + t["judge"]
    return {
        "new_rows": result.new_rows,
        "skipped_rows": result.skipped_rows,
        "stopped": result.stopped,
        "cost": {
            "seconds_per_point": total / pts,
            "generate_seconds_per_point": t["generate"] / pts,
            "sampler_seconds_per_point": t["sampler"] / pts,
            "judge_seconds_per_point": t["judge"] / pts,
            "judge_share": t["judge"] / total if total > 0 else None,
            "rows_per_point": cfg.n_prompts * cfg.seeds,
        },
    }


def _print_costs(out: dict) -> None:
    c = out.get("cost")
    print(f"\n{out['new_rows']} new rows, {out['skipped_rows']} already in {out['out']}.")
    if c:
        print(
            f"cost: {c['seconds_per_point']:.1f} s per point ({c['rows_per_point']} rows): "
            f"generate {c['generate_seconds_per_point']:.1f} s (pruning core and draws "
            f"{c['sampler_seconds_per_point']:.1f} s), judge {c['judge_seconds_per_point']:.2f} s "
            f"({c['judge_share']:.1%})"
        )


def _fmt(v: float, digits: int = 3) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def markdown_table(s) -> str:
    """The points as a Markdown table: means with 95 % CIs for coherence and the x axis."""
    cols = [
        "setting", s.knob, "coherence [95% CI]", "distinct-1", "distinct-2 [95% CI]",
        "cross-seed sim", "repeated 4-grams", "<4 words", "perplexity", "prompts",
    ]  # fmt: skip
    lines = [
        "| " + " | ".join(cols) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|",
    ]
    for r in s.points.to_dict("records"):
        cells = [
            f"`{r['setting']}`", f"{r['value']:g}",
            f"{_fmt(r['coherence'])} [{_fmt(r['coherence_lo'])}, {_fmt(r['coherence_hi'])}]",
            _fmt(r["distinct_1"]),
            f"{_fmt(r['distinct_2'])} [{_fmt(r['distinct_2_lo'])}, {_fmt(r['distinct_2_hi'])}]",
            _fmt(r["cross_sim"]), f"{_fmt(100 * r['repetition'], 1)}%", f"{_fmt(100 * r['short'], 1)}%",
            _fmt(r["ppl"], 1), str(r["prompts"]),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_markdown(path: str, s, out: dict) -> None:
    from pathlib import Path

    from semviz.cli.compare import command_line

    lines = [
        "# Does it help? Coherence against diversity",
        "",
        f"{out['rows']} continuations, {s.n_prompts} prompts, 95% CIs from {s.n_boot} "
        "bootstrap draws over prompts. Made with:",
        "",
        "```sh",
        command_line(None),
        "```",
        "",
        markdown_table(s),
        "",
        *[f"- {d.verdict}" for d in s.dominance],
        "",
    ]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines))
