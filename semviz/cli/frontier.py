"""``python -m semviz frontier``: does a setting help? Coherence against diversity, A vs B.

Sweeps one knob for every setting over the prompt set, scores every continuation with an
outside judge, and says whether B's curve dominates A's at matched diversity::

    python -m semviz frontier --a top_p=0.95 --b "top_p=0.95,gravity_lambda=0.5" \\
        --knob temperature --values 0.7,1.0,1.3 --split test --out out/frontier.parquet

Settings use the compare syntax (a preset, ``plain``, or ``key=value`` overrides); repeat
``--side`` for more. Results go to Parquet after every batch: rerunning the same command
skips the rows it already has, so Ctrl-C (which finishes nothing half-way) loses at most
the batches in flight. ``--summary`` only reads the file. Tune on ``--split dev``, report on
``test``.

``--workers N`` runs the batches on N Ray workers of a local Ray started in this process
(each loads the model once, one torch thread each, a GPU each when there are GPUs);
``--address ADDR`` joins an existing Ray cluster. ``--no-judge`` writes the rows without the
judge's scores (a machine without the judge); ``--score`` then fills them in, here.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys

from semviz.cli import common


def add_parser(sub) -> argparse.ArgumentParser:
    from semviz.frontier.sweep import DEFAULT_OUT, X_AXES

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
    p.add_argument(
        "--prompts", type=int, default=None, help="the first N prompts of the half (default all)"
    )
    p.add_argument("--seeds", type=int, default=4, help="seeds per prompt: 0..N-1 (default 4)")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per row (default 128)")
    p.add_argument(
        "--batch", type=int, default=None, help="rows per generate() call (default: a whole point)"
    )
    p.add_argument("--prompt-file", default=None, help="JSONL prompt set (id, kind, split, text)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"results Parquet (default {DEFAULT_OUT})")
    p.add_argument(
        "--x",
        default="auto",
        choices=["auto", *X_AXES],
        help="diversity axis of the headline verdict (default auto: the one the sweep's "
        "points span in the most CI widths); every axis gets a verdict either way",
    )
    p.add_argument("--boot", type=int, default=1000, help="bootstrap draws (default 1000)")
    p.add_argument("--summary", action="store_true", help="summarise --out only; generate nothing")
    p.add_argument(
        "--no-judge",
        action="store_true",
        help="write rows without the judge's scores (fill them later with --score)",
    )
    p.add_argument(
        "--score",
        action="store_true",
        help="fill the judge's scores of --out's rows that lack them, then summarise",
    )
    common.add_ray_args(p, "the batches")
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
        settings=sides,
        knob=knob,
        values=values,
        split=args.split,
        n_prompts=args.prompts,
        seeds=args.seeds,
        new_tokens=args.tokens,
        chat=args.chat,
        batch_rows=args.batch,
        prompts_path=args.prompt_file,
    )


def run(args: argparse.Namespace) -> int:
    from semviz.frontier import sweep as fr

    if args.boot < 10:
        raise ValueError("--boot must be at least 10")
    if sum([args.summary, args.score, args.no_judge]) > 1:
        raise ValueError("--summary, --score and --no-judge exclude each other: pick one")
    if (args.workers or args.address) and (args.summary or args.score):
        raise ValueError("--workers and --address run a sweep; --summary and --score do not")
    cfg = _config(args)  # every setting and value checked before anything loads
    prompts = fr.load_prompts(cfg.prompts_path, split=cfg.split, n=cfg.n_prompts)
    result = None
    if args.summary or args.score:
        if args.score:
            from semviz.analysis.judge import load_judge

            if not fr.load_results(args.out).shape[0]:
                raise ValueError(f"{args.out} holds no results yet: run a sweep first")
            n = _score(args, load_judge())
            if not args.json:
                print(f"scored {n} rows of {args.out}", file=sys.stderr)
        df = fr.load_results(args.out)
        if not len(df):
            raise ValueError(f"{args.out} holds no results yet: run without --summary first")
        chat = df["chat"].iloc[0] if args.chat is None else args.chat
        model = df["model"].iloc[0] if args.model is None else args.model
        df = fr.select(df, cfg, model, bool(chat), prompts)
    else:
        judge = None
        if not args.no_judge:
            from semviz.analysis.judge import load_judge

            judge = load_judge()  # a missing judge is reported before the model loads
        result = _sweep(cfg, args, judge, len(prompts))
        df = result.frame
    if not len(df):
        raise ValueError(f"{args.out} has no rows for these settings, values and prompts")
    if df["coherence"].isna().all():
        out = {"out": args.out, "rows": len(df), "scored": 0, **_costs(result, cfg, len(prompts))}
        if args.json:
            common.print_json(out)
        else:
            print(
                f"{len(df)} rows in {args.out}, none scored yet: run the same command with "
                "--score where the judge is installed"
            )
            _print_costs(out)
        return 0
    s = fr.summarize(df, x=args.x, n_boot=args.boot)
    out = s.to_dict()
    out["out"] = args.out
    out["rows"] = len(df)
    out["scored"] = int(df["coherence"].notna().sum())
    if result is not None:
        out.update(_costs(result, cfg, len(prompts)))
    if args.markdown:
        _write_markdown(args.markdown, s, out)
    if args.json:
        common.print_json(out)
    else:
        print(markdown_table(s))
        print()
        print(f"Headline axis: {fr.X_AXES[s.x]} ({_resolution_note(s)}).")
        for d in s.dominance:
            print(d.verdict)
        print()
        for sentence in s.agreement:
            print(sentence)
        if result is not None:
            _print_costs(out)
    return 0


def _resolution_note(s) -> str:
    """Why the headline axis: its matched range in CI widths, against the others'."""
    r = s.resolution.get(s.x, math.nan)
    return f"its matched range spans {_fmt(r, 1)} point CIs; " + ", ".join(
        f"{k} {_fmt(v, 1)}" for k, v in s.resolution.items() if k != s.x
    )


def _score(args, judge) -> int:
    from semviz.frontier import sweep as fr

    stop = {"flag": False}
    with _sigint(stop), common.progress_bar(1, "rows", enabled=not args.json) as bar:

        def on_progress(p: fr.Progress) -> None:
            bar.total = p.rows_total
            bar.n = int(p.rows_done)
            bar.refresh()

        return fr.score_results(
            args.out, judge, on_progress=on_progress, should_stop=lambda: stop["flag"]
        )


class _sigint:
    """First Ctrl-C sets ``stop['flag']`` (finished batches are kept); a second one raises."""

    def __init__(self, stop: dict) -> None:
        self.stop = stop

    def _handler(self, signum, frame) -> None:
        if self.stop["flag"]:
            raise KeyboardInterrupt
        self.stop["flag"] = True
        print("\nsemviz frontier: stopping; finished batches are saved…", file=sys.stderr)

    def __enter__(self) -> None:
        self.old = signal.signal(signal.SIGINT, self._handler)

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self.old)


def _sweep(cfg, args, judge, n_prompts: int):
    from semviz.frontier import sweep as fr
    from semviz.frontier.executor import Executor, ModelSpec

    stop = {"flag": False}
    total = len(cfg.settings) * len(cfg.values) * n_prompts * cfg.seeds * cfg.new_tokens
    task = fr.sweep_task(cfg, score=judge is not None, judge=judge)
    if args.workers or args.address:
        spec = ModelSpec(args.model, args.device, args.dtype, threads=1)
        executor = Executor(task, model=spec, workers=args.workers, address=args.address)
    else:
        executor = Executor(task, lm=common.load(args))
    with _sigint(stop), executor:
        with common.progress_bar(total, "tokens", enabled=not args.json) as bar:

            def on_progress(p: fr.Progress) -> None:
                bar.n = int(p.fraction * total)
                bar.set_postfix_str(p.point, refresh=False)
                bar.refresh()

            result = fr.run_sweep(
                None,
                cfg,
                args.out,
                score=judge is not None,
                on_progress=on_progress,
                should_stop=lambda: stop["flag"],
                executor=executor,
            )
    if result.stopped:
        print(
            f"semviz frontier: stopped; {result.new_rows} new rows saved to {args.out}. "
            "Rerun the same command to resume.",
            file=sys.stderr,
        )
    return result


def _costs(result, cfg, n_prompts: int) -> dict:
    if result is None:
        return {}
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
            "rows_per_point": n_prompts * cfg.seeds,
        },
    }


def _print_costs(out: dict) -> None:
    if "new_rows" not in out:
        return
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
    """The points as a Markdown table: coherence with its 95 % CI, then every diversity axis
    (the headline axis with its CI), repetition, short texts and perplexity."""
    from semviz.frontier.sweep import X_AXES

    axes = ["distinct_2", "pooled_distinct_2", "bleu_diversity", "dissimilarity", "distinct_1"]
    head = {
        "distinct_2": "distinct-2",
        "pooled_distinct_2": "pooled distinct-2",
        "bleu_diversity": "1 − self-BLEU",
        "dissimilarity": "1 − cross-seed sim",
        "distinct_1": "distinct-1",
    }
    assert set(axes) == set(X_AXES)
    cols = [
        "setting",
        s.knob,
        "coherence [95% CI]",
        *[head[a] + (" [95% CI]" if a == s.x else "") for a in axes],
        "repeated 4-grams",
        "<4 words",
        "perplexity",
        "prompts",
    ]
    lines = [
        "| " + " | ".join(cols) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|",
    ]
    for r in s.points.to_dict("records"):
        ax = [
            f"{_fmt(r[a])} [{_fmt(r[a + '_lo'])}, {_fmt(r[a + '_hi'])}]" if a == s.x else _fmt(r[a])
            for a in axes
        ]
        cells = [
            f"`{r['setting']}`",
            f"{r['value']:g}",
            f"{_fmt(r['coherence'])} [{_fmt(r['coherence_lo'])}, {_fmt(r['coherence_hi'])}]",
            *ax,
            f"{_fmt(100 * r['repetition'], 1)}%",
            f"{_fmt(100 * r['short'], 1)}%",
            _fmt(r["ppl"], 1),
            str(r["prompts"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict_table(s) -> str:
    """Every compared setting against the first, on every axis: the gap and its CI."""
    from semviz.frontier.sweep import X_AXES

    lines = [
        "| setting vs A | diversity axis | coherence gap B − A [95% CI] | matched range | verdict |",
        "|---|---|---:|---:|---|",
    ]
    for axis, doms in s.by_axis.items():
        for d in doms:
            gap = f"{d.gap:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]" if math.isfinite(d.gap) else "–"
            rng = f"{d.x_lo:.3f}–{d.x_hi:.3f}" if math.isfinite(d.gap) else "none"
            who = {
                "a": f"{d.a} dominates",
                "b": f"{d.b} dominates",
                "neither": "neither",
                "none": "no common range",
            }[d.winner]
            lines.append(f"| `{d.b}` | {X_AXES[axis]} | {gap} | {rng} | {who} |")
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
        verdict_table(s),
        "",
        *[f"- {a}" for a in s.agreement],
        "",
    ]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines))
