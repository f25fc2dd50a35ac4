"""How long a report takes: chart building, the HTML page, and the PNG export per engine.

A trace is generated once (default: the real default model, 64 steps), then the report is
built with each PNG engine. Prints seconds per stage and per chart.

    python benchmarks/bench_report.py [--model DIR] [--steps 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import semviz
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output import report
from semviz.sampling.presets import PRESETS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    lm = semviz.load_model(args.model, device="cpu")
    p = PRESETS["story"]
    dec = Decoder(lm, p.example_prompt, p.params, DecodeSettings(max_new_tokens=args.steps))
    dec.run(args.steps)
    trace = dec.trace

    out: dict = {"steps": len(trace.steps)}
    t0 = time.perf_counter()
    vs = report.views(trace, tokenizer=lm.tokenizer)
    out["views_s"] = time.perf_counter() - t0
    out["charts"] = len(vs)
    t0 = time.perf_counter()
    page = report.report_html(trace, vs)
    out["html_s"] = time.perf_counter() - t0
    out["html_mb"] = len(page.encode()) / 2**20
    for engine in ("kaleido", "playwright"):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            rep = report.build(trace, Path(d), tokenizer=lm.tokenizer, engine=engine)
            total = time.perf_counter() - t0
            out[f"{engine}_total_s"] = total
            out[f"{engine}_per_chart_s"] = total / max(len(rep.pngs), 1)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:>24}: {v:.3f}" if isinstance(v, float) else f"{k:>24}: {v}")


if __name__ == "__main__":
    main()
