"""``python -m semviz replay trace.json --temperature … --gravity-lambda …``.

Re-prunes the recorded steps with new settings through the same core the app's sliders use,
without running the model (the model is loaded only when the new settings need a gravity
the trace did not record). Prints, per step, the new kept-set size, the new entropy and the
token that would be chosen, and the first step at which the choice changes.
"""

from __future__ import annotations

import argparse
import time

from semviz.cli import common
from semviz.output import style


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("replay", help="re-prune a recorded trace with new settings (no model run)")
    p.add_argument("trace", help="a trace JSON written by `semviz trace` or the app")
    p.add_argument("--json", action="store_true", help="print the per-step table as JSON")
    p.add_argument(
        "--show",
        type=common.int_arg(0, 1000),
        default=5,
        help="kept tokens listed per step (default 5)",
    )
    common.add_model_args(p)
    common.add_prune_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from semviz.analysis.replay import needs_new_gravity, replay
    from semviz.model.load import DEFAULT_MODEL
    from semviz.output.trace import Trace
    from semviz.sampling import PruneParams, check_model_shape

    trace = Trace.load(args.trace)
    if args.model is None and trace.model.get("name") == DEFAULT_MODEL:
        # its labels come from the default's tokenizer: the vocabulary must be that one
        tok = _tokenizer(trace)
        if tok is not None and trace.model.get("vocab_size") != len(tok):
            raise ValueError(
                f"the trace names {DEFAULT_MODEL}, whose vocabulary has {len(tok):,} tokens, "
                f"but records {_count(trace.model.get('vocab_size'))}: pass --model with the "
                "model the trace was made with"
            )
    recorded = PruneParams.from_dict(trace.settings.get("params", {}))
    params = common.params_from_args(args, base=recorded)
    shape = trace.model
    if "num_layers" in shape and "num_heads" in shape:  # the recorded attention's (L, H)
        check_model_shape(params, n_layers=shape["num_layers"], n_heads=shape["num_heads"])
    model = None
    if needs_new_gravity(trace, params):
        if args.model is None and trace.model.get("name") != DEFAULT_MODEL:
            raise ValueError(
                "these gravity settings were not recorded and need the model's embeddings: "
                "pass --model with the model the trace was made with"
            )
        lm = common.load(args)
        _check_same_model(trace, lm.summary())
        model = lm.model
    t0 = time.perf_counter()
    r = replay(trace, params, model=model)
    seconds = time.perf_counter() - t0
    rows = []
    for i, (rec, res, new_id) in enumerate(zip(trace.steps, r.results, r.token_ids, strict=True)):
        kept = res.index_probs["final"]
        top = kept.argsort(descending=True)[: args.show]
        rows.append(
            {
                "step": i,
                "recorded_token": _text(trace, rec, rec.token_id),
                "token": _text(trace, rec, new_id),
                "changed": new_id != rec.token_id,
                **({"approximate": True, "why": r.why[i]} if r.approximate[i] else {}),
                "n_kept": res.n_kept,
                "recorded_n_kept": rec.n_kept,
                "entropy_sampled": res.entropy_sampled,
                "recorded_entropy_sampled": rec.entropy_sampled,
                "temperature": res.temperature,
                "fallback": res.fallback,
                "kept_top": [
                    [_text(trace, rec, int(rec.cand_ids[j])), float(kept[j])]
                    for j in top.tolist()
                    if kept[j] > 0
                ],
            }
        )
    out = {
        "trace": args.trace,
        "steps": len(rows),
        "first_divergence": r.first_diff,
        "approximate_steps": r.n_approximate,
        "replay_seconds": seconds,
        "note": r.note,
        "params": params.to_dict(),
        "rows": rows,
    }
    if args.json:
        common.print_json(out)
        return 0
    print(f"{'step':>4}  {'recorded':>14}  {'replayed':>14}  {'kept':>6}  {'H_sampled':>9}  T")
    for row in rows:
        mark = ("*" if row["changed"] else " ") + ("~" if row.get("approximate") else " ")
        print(
            f"{row['step']:4d}{mark}{row['recorded_token']!r:>14}  {row['token']!r:>14}  "
            f"{row['n_kept']:6d}  {max(row['entropy_sampled'], 0.0):9.3f}  {row['temperature']:.2f}"
        )
    fd = r.first_diff
    print(
        f"first divergence: {'none' if fd is None else f'step {fd}'}; "
        f"{len(rows)} steps replayed in {seconds * 1e3:.1f} ms"
        + (
            f"; {r.n_approximate} approximate (~): their pick depends on tokens the trace "
            "does not record"
            if r.n_approximate
            else ""
        )
        + (f"; note: {r.note}" if r.note else "")
    )
    return 0


def _count(v) -> str:
    return f"{v:,}" if type(v) is int else "no vocabulary size"


def _check_same_model(trace, summary: dict) -> None:
    """The model must have the trace's vocabulary and attention shape: its embeddings are
    indexed by the recorded ids and its layers by the recorded attention."""
    for key in ("vocab_size", "num_layers", "num_heads"):
        if key in trace.model and trace.model[key] != summary[key]:
            raise ValueError(
                f"the trace was made with a model with {key} {trace.model[key]}, but "
                f"{summary['name']} has {summary[key]}: pass --model with the trace's model"
            )


def _text(trace, rec, token_id: int) -> str:
    """Token text from the trace itself (recorded steps), else the model-free id."""
    for s in [rec, *trace.steps]:
        if s.token_id == token_id:  # a piece of a character shows as its bytes, <E6 97>
            return s.token_text if s.token_hex is None else style.step_token(s)
    return _decode(trace, token_id)


def _decode(trace, token_id: int) -> str:
    from semviz.decoding.decoder import token_hex

    tok = _tokenizer(trace)
    if tok is None:
        return f"<{token_id}>"
    h = token_hex(tok, token_id)
    return tok.decode([token_id]) if h is None else style.display_token("", h)


_TOK: dict = {}


def _tokenizer(trace):
    """The tokenizer (cheap to load, no model weights) for showing counterfactual tokens."""
    name = trace.model.get("name")
    if name in _TOK:
        return _TOK[name]
    tok = None
    try:
        from transformers import AutoTokenizer

        from semviz.model.load import DEFAULT_MODEL, ensure_default_converted

        if name == DEFAULT_MODEL:
            tok = AutoTokenizer.from_pretrained(ensure_default_converted())
    except Exception:  # a missing tokenizer only costs the pretty token text
        tok = None
    _TOK[name] = tok
    return tok
