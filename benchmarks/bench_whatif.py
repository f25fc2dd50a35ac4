"""How long the app's server side takes to re-render the what-if views after a slider move.

A 128-step trace is generated once on the model (default: the real default model). Each
"slider move" then times what a rerun does with no model run: ``semviz.analysis.replay`` of every
recorded step with the new settings, plus building and serialising the figures of the views
that follow the sliders (Generate's alternatives, Distributions' stages / waterfall / rank
shifts, Thermodynamics' three charts, Pipeline's chain). Prints the median (target < 300 ms),
and beside it, move by move, the same re-render of a record without every raw logit (replay
then bounds each pick from the tail summary), as a ratio.

    python benchmarks/bench_whatif.py [--model DIR] [--steps 128] [--moves 15]
                                      [--gravity-lambda 0.3] [--temperature-only] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import semviz
from semviz.analysis.replay import replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output import charts
from semviz.sampling import PruneParams


def render(lm, trace, params: PruneParams) -> dict:
    """One rerun's server work after a slider move; returns the stage timings (s)."""
    t0 = time.perf_counter()
    wi = replay(trace, params, model=lm.model)
    t1 = time.perf_counter()
    i = len(trace.steps) - 1
    rec, res = trace.steps[i], wi.results[i]
    labels = [lm.tokenizer.decode([int(t)]) for t in rec.cand_ids[:200].tolist()]
    stages = charts.step_stages(rec, res)
    figs = [
        charts.distribution_figure(labels, stages, kept=res.kept.numpy(), chosen=wi.chosen[i]),
        charts.distribution_figure(
            labels, {k: stages[k] for k in ("raw", "final")}, mode="overlay", top=15
        ),
        charts.waterfall_figure([w.to_dict() for w in res.waterfall]),
        charts.rank_shift_figure(labels, stages["raw"][:200], stages["gravity"][:200], top=15),
        charts.chain_figure(params),
    ]
    df = charts.step_frame(trace, wi.results, wi.chosen)
    figs += [
        charts.entropy_figure(df, params, selected=i, first_diff=wi.first_diff),
        charts.thermo_figure(df, selected=i, first_diff=wi.first_diff),
        charts.entropy_scatter(df, selected=i),
    ]
    t2 = time.perf_counter()
    size = sum(len(f.to_json()) for f in figs)  # st.plotly_chart sends the figure as JSON
    t3 = time.perf_counter()
    return {"replay": t1 - t0, "figures": t2 - t1, "json": t3 - t2, "total": t3 - t0, "bytes": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model name or folder (default: offline default)")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--moves", type=int, default=15)
    ap.add_argument(
        "--gravity-lambda",
        type=float,
        default=0.3,
        help="the run's gravity (default 0.3, full mode; 0: the app's default, off)",
    )
    ap.add_argument(
        "--temperature-only",
        action="store_true",
        help="move the temperature alone, with no filter (the app's default sliders)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    lm = semviz.load_model(a.model)
    top_p = 1.0 if a.temperature_only else 0.95
    base = PruneParams(temperature=0.8, top_p=top_p, gravity_lambda=a.gravity_lambda)
    dec = Decoder(
        lm,
        "Tell me a short story about a lighthouse keeper.",
        base,
        DecodeSettings(seed=0, max_new_tokens=a.steps, chat=lm.is_chat),
    )
    t = time.perf_counter()
    while dec.n_steps < a.steps:
        if dec.done:  # an early EOS: keep the trace growing to the requested length
            dec.done = False
        dec.step()
    gen = time.perf_counter() - t
    trace = dec.trace
    render(lm, trace, base)  # warm caches (tokenizer, plotly)
    full = [rec.full_logits for rec in trace.steps]
    tails = [rec.tail_summary() for rec in trace.steps]  # what a record without them keeps
    moves, summary_only = [], []
    for k in range(a.moves):  # temperature and top-p sliders, as a user drags them
        p = base.replace(temperature=0.3 + 0.07 * k)
        if not a.temperature_only:
            p = p.replace(top_p=0.99 - 0.02 * k)
        moves.append(render(lm, trace, p))
        # side by side: the same move on a record without every raw logit (tail summary only)
        for rec, t in zip(trace.steps, tails, strict=True):
            rec.full_logits, rec.tail = None, t
        summary_only.append(render(lm, trace, p))
        for rec, f in zip(trace.steps, full, strict=True):
            rec.full_logits, rec.tail = f, None
    med = {key: statistics.median(m[key] for m in moves) for key in moves[0]}
    med_summary = statistics.median(m["total"] for m in summary_only)
    out = {
        "model": lm.name,
        "steps": len(trace.steps),
        "generate_seconds": gen,
        "moves": a.moves,
        "median_ms": {k: 1e3 * v for k, v in med.items() if k != "bytes"},
        "figure_json_bytes": int(med["bytes"]),
        "target_ms": 300,
        "summary_only_median_ms": 1e3 * med_summary,
        "ratio_to_summary_only": med["total"] / med_summary,
    }
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        m = out["median_ms"]
        print(
            f"what-if re-render, {out['steps']}-step trace on {out['model']}, "
            f"median of {a.moves} slider moves: {m['total']:.0f} ms "
            f"(replay {m['replay']:.0f} · figures {m['figures']:.0f} · JSON {m['json']:.0f}); "
            f"target < 300 ms. Side by side, a record without every raw logit: "
            f"{out['summary_only_median_ms']:.0f} ms ({out['ratio_to_summary_only']:.2f}×)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
