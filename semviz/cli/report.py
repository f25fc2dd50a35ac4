"""``python -m semviz report``: a trace as report.html, PNGs, JSON and Parquet.

From a saved trace::

    python -m semviz report --trace trace.json --out report/

Or decode first (same flags as ``trace``), then write the same report::

    python -m semviz report --prompt "Once upon a time" --preset story --steps 64 --out report/

Ctrl-C while decoding keeps the tokens made so far and writes their report; Ctrl-C while
exporting PNGs keeps the images already written.
"""

from __future__ import annotations

import argparse
import signal
import sys

from semviz.cli import common


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="write report.html (offline, interactive), one PNG per chart, trace JSON and Parquet",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", default=None, help="a trace JSON written by trace/report/the app")
    src.add_argument(
        "--prompt", default=None, type=common.text_arg, help="decode this prompt first"
    )
    p.add_argument("--out", required=True, help="folder to write the report into")
    common.add_force_arg(p)
    p.add_argument(
        "--step",
        type=common.int_arg(0),
        default=None,
        help="step the per-step charts show (default: last)",
    )
    p.add_argument("--no-png", dest="png", action="store_false", help="skip the PNG export")
    p.add_argument(
        "--vector",
        action="append",
        default=[],
        choices=["svg", "pdf"],
        help="also write every chart as SVG or PDF (kaleido), into svg/ or pdf/ (repeatable)",
    )
    p.add_argument(
        "--png-engine",
        default="auto",
        choices=["auto", "kaleido", "playwright"],
        help="kaleido (Plotly's exporter) or a Playwright screenshot; auto tries kaleido first",
    )
    common.add_run_args(p, ("max_new_tokens", "seed", "kv_policy", "kv_budget"))
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        type=common.text_arg,
        help="stop string (repeatable)",
    )
    common.add_chat_arg(p)
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    common.add_model_args(p)
    common.add_prune_args(p)
    return p


def _model_for(args, trace):
    """The model whose tokenizer labels candidates and whose final norm and LM head read the
    lens: --model, else the trace's model if loadable; None when neither fits."""
    from semviz.model.load import DEFAULT_MODEL, ModelLoadError, load_model

    name = args.model
    if name is None:
        recorded = str(trace.model.get("name", ""))
        name = None if recorded in ("", DEFAULT_MODEL) else recorded
    try:
        lm = load_model(name, device="cpu", dtype=args.dtype)
    except ModelLoadError as exc:
        if args.model is not None:
            raise
        print(
            f"semviz report: candidates shown as ids, the trace's model is not here ({exc})",
            file=sys.stderr,
        )
        return None
    if trace.model.get("vocab_size") not in (None, len(lm.tokenizer)):
        print(
            "semviz report: candidates shown as ids, the model's vocabulary is not the trace's",
            file=sys.stderr,
        )
        return None
    return lm


def _no_pruning_flags(args: argparse.Namespace) -> None:
    """A saved trace is reported as recorded: pruning flags would be silently ignored."""
    import dataclasses

    from semviz.sampling import PruneParams

    given = [f.name for f in dataclasses.fields(PruneParams) if getattr(args, f.name) is not None]
    if given or args.preset:
        flag = "--" + (given[0] if given else "preset").replace("_", "-")
        raise ValueError(
            f"{flag} applies with --prompt; --trace reports the trace with its recorded settings"
        )


def run(args: argparse.Namespace) -> int:
    from semviz.output import files, report
    from semviz.output.trace import Trace

    if args.trace is not None:
        files.check_in_file(args.trace)
    files.check_out_dir(args.out, force=args.force, names=(*report.OUTPUTS, *args.vector))

    stop = {"flag": False}

    def _interrupt(signum, frame):
        if stop["flag"]:
            raise KeyboardInterrupt
        stop["flag"] = True
        print("\nsemviz report: stopping; what is done is kept…", file=sys.stderr)

    if args.trace is not None:
        _no_pruning_flags(args)
        trace = Trace.load(args.trace)
        if args.step is not None and args.step >= len(trace.steps):
            raise ValueError(f"--step {args.step}: the trace has {len(trace.steps)} steps")
        lm = _model_for(args, trace)
        tokenizer = None if lm is None else lm.tokenizer
    else:
        from semviz.decoding.decoder import Decoder, PromptError

        if args.step is not None and args.step >= args.steps:
            raise ValueError(f"--step {args.step}: the run has at most --steps {args.steps}")
        params = common.params_from_args(args)
        if not args.prompt.strip():
            raise PromptError("The prompt is empty: type some text for the model to continue.")
        run = common.run_from_args(args)
        lm = common.load(args)
        settings = run.decode_settings(stop=tuple(args.stop))
        dec = Decoder(lm, args.prompt, params, settings, eviction=run.eviction())
        old = signal.signal(signal.SIGINT, _interrupt)
        try:
            with common.progress_bar(args.steps, "decoding", enabled=not args.json) as bar:
                dec.run(
                    args.steps, on_step=lambda rec: bar.update(1), should_stop=lambda: stop["flag"]
                )
        finally:
            signal.signal(signal.SIGINT, old)
        trace, tokenizer = dec.trace, lm.tokenizer
        stop["flag"] = False  # a stop while decoding still writes the whole report
        if args.step is not None and args.step >= len(trace.steps):
            print(
                f"semviz report: the run ended after {len(trace.steps)} steps; "
                f"showing the last, not --step {args.step}",
                file=sys.stderr,
            )
            args.step = None

    def progress(msg: str, frac: float) -> None:
        if not args.json:
            print(f"[{frac:4.0%}] {msg}", file=sys.stderr)

    old = signal.signal(signal.SIGINT, _interrupt)
    try:
        rep = report.build(
            trace,
            args.out,
            tokenizer=tokenizer,
            selected=args.step,
            png=args.png,
            engine=args.png_engine,
            progress=progress,
            should_stop=lambda: stop["flag"],
            lm=lm,
            vector=tuple(dict.fromkeys(args.vector)),
        )
    except report.PngExportError as exc:
        from semviz.cli import UserError

        raise UserError(str(exc)) from None
    finally:
        signal.signal(signal.SIGINT, old)
    if args.json:
        common.print_json(report._clean(rep.manifest))
    else:
        print(trace.text)
        print(
            f"\n{len(trace.steps)} tokens, {len(rep.views)} charts, {len(rep.pngs)} PNGs"
            f"{' (stopped early)' if rep.stopped else ''} -> {rep.html}",
            file=sys.stderr,
        )
    return 0
