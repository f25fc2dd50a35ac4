"""``python -m semviz compare``: settings side by side on the same prompts and seed.

Two sides::

    python -m semviz compare --prompt "Once upon a time" --a top_p=0.9 \\
        --b "top_p=0.9,gravity_lambda=0.5" --steps 48 --json

Any number of sides (repeat ``--side``) over several prompts, with a Markdown table::

    python -m semviz compare --side code --side story --side qa --side brainstorm \\
        --prompt "…" --prompt "…" --markdown docs/compare_presets.md

A side is a preset name, ``plain``, comma-separated ``key=value`` PruneParams overrides, or a
preset followed by overrides (see ``semviz.analysis.compare``). Ctrl-C stops early and still prints
(and writes) the metrics of what was generated.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys

from semviz.cli import common


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compare",
        help="run two or more settings on the same prompt and seed; metrics side by side",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    text = common.text_arg
    p.add_argument("--a", default=None, type=text, help='side A, e.g. "top_p=0.9" or "story"')
    p.add_argument(
        "--b", default=None, type=text, help='side B, e.g. "top_p=0.9,gravity_lambda=0.5"'
    )
    p.add_argument(
        "--side",
        action="append",
        default=[],
        type=text,
        help="another side (repeatable; after --a/--b)",
    )
    p.add_argument(
        "--prompt",
        action="append",
        default=[],
        type=text,
        help="prompt (repeatable; metrics are averaged)",
    )
    common.add_run_args(p, ("max_new_tokens", "seed"), {"max_new_tokens": 48})
    common.add_chat_arg(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--markdown", default=None, metavar="PATH", help="write the metrics table")
    common.add_force_arg(p)
    common.add_model_args(p)
    return p


def _sides(args) -> list:
    from semviz.analysis.compare import parse_side

    specs = [s for s in (args.a, args.b) if s is not None] + list(args.side)
    if not specs:
        raise ValueError("give the sides to compare: --a SPEC --b SPEC (or --side SPEC …)")
    labels = [s.strip() for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError("two sides have the same spec: nothing to compare")
    return [parse_side(s) for s in specs]


def run(args: argparse.Namespace) -> int:
    from semviz.analysis import compare as cmp_mod
    from semviz.decoding.decoder import PromptError
    from semviz.output import files

    sides = _sides(args)  # fail on a bad spec before loading the model
    prompts = list(args.prompt)
    if not prompts:
        raise ValueError("give at least one --prompt")
    if any(not p.strip() for p in prompts):
        raise PromptError("A prompt is empty: type some text for the model to continue.")
    if args.markdown:
        files.check_out_file(args.markdown, force=args.force)
    lm = common.load(args)
    for s in sides:
        lm.check_params(s.params)

    stop = {"flag": False}

    def _interrupt(signum, frame):  # first Ctrl-C: finish the current token, keep results
        if stop["flag"]:
            raise KeyboardInterrupt
        stop["flag"] = True
        print("\nsemviz compare: stopping after this token…", file=sys.stderr)

    old = signal.signal(signal.SIGINT, _interrupt)
    results = []
    try:
        total = len(prompts) * len(sides) * args.steps
        with common.progress_bar(total, "decoding", enabled=not args.json) as bar:
            for prompt in prompts:
                if stop["flag"]:
                    break
                c = cmp_mod.compare(
                    lm,
                    prompt,
                    sides,
                    steps=args.steps,
                    seed=args.seed,
                    chat=args.chat,
                    on_step=lambda i, rec: bar.update(1),
                    should_stop=lambda: stop["flag"],
                )
                c.release()  # the tables need the traces, not the caches
                results.append(c)
    finally:
        signal.signal(signal.SIGINT, old)

    labels = [s.label for s in sides]
    rows = cmp_mod.mean_rows([c.metrics() for c in results], labels)
    out = {
        "model": lm.name,
        "seed": args.seed,
        "steps": args.steps,
        "stopped": stop["flag"],
        "sides": [{"label": s.label, "changes": s.changes()} for s in sides],
        "mean": [cmp_mod._finite(r) for r in rows],
        "runs": [c.to_dict() for c in results],
    }
    if args.markdown:
        write_markdown(args.markdown, out, rows, command_line(args))
    if args.json:
        common.print_json(out)
    else:
        for c in results:
            print(f"\n=== prompt: {c.prompt!r}")
            for s, t in zip(c.sides, c.traces, strict=True):
                print(f"--- {s.label}: {t.text!r}")
            if len(sides) >= 2:
                print(f"first divergence (A vs B): step {c.first_divergence()}")
        print()
        print(cmp_mod.markdown_table(rows))
        if stop["flag"]:
            print("(stopped early: metrics of the tokens generated so far)", file=sys.stderr)
    return 0


def command_line(args) -> str:
    """The command as typed (argv), for the table's provenance line."""
    return "python -m semviz " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def write_markdown(path: str, out: dict, rows: list[dict], command: str) -> None:
    """The metrics table with the command that made it and what each side set."""
    from semviz.analysis.compare import markdown_table
    from semviz.analysis.metrics import METRIC_INFO
    from semviz.output import files

    lines = [
        "# Presets compared",
        "",
        f"Model `{out['model']}`, seed {out['seed']}, {out['steps']} new tokens per prompt and "
        f"side, {len(out['runs'])} prompts; metrics are averaged over the prompts "
        "(tokens: the total). Tokens/s counts the model forward and semviz's own work per token "
        "on the machine that ran the command, so it moves with that machine and its load.",
        "",
        "Made with:",
        "",
        "```sh",
        command,
        "```",
        "",
        markdown_table(rows),
        "",
    ]
    if out["stopped"]:
        lines += ["Stopped early: the table covers the tokens generated before the stop.", ""]
    lines += ["What each column means:", ""]
    for label, unit in METRIC_INFO.values():
        lines.append(f"- **{label}**" + (f": {unit}" if unit else ""))
    lines += ["", "What each side sets (differences from plain sampling):", ""]
    for s in out["sides"]:
        ch = ", ".join(f"{k}={v}" for k, v in s["changes"].items()) or "plain sampling"
        lines.append(f"- `{s['label']}`: {ch}")
    lines += ["", "Prompts and texts:", ""]
    for r in out["runs"]:
        lines.append(f"- prompt {r['prompt']!r}")
        for s in r["sides"]:
            lines.append(f"  - `{s['label']}`: {s['text']!r}")
    files.write_text(path, "\n".join(lines) + "\n")
