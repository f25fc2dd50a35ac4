"""The logit lens's cost: decoding with its record on against off, and its views on demand.

On the default model, in one run:

- decode steps with the lens record on against off (attention captured either way; and with
  attention capture off, as ``trace --attention off`` runs), alternating step by step in one
  decoder so a busy machine slows both alike; goal: on ≤ 5 % slower;
- the lens of one step on demand (``lens_step``: 31 rows through the final norm and LM head,
  top tokens, ranks, KL); goal: < 100 ms;
- the layers × steps grid for ``--steps`` steps (default 128), first with an empty cache,
  then cached; goals: < 3 s and < 50 ms;
- direct logit attribution of one step (blocks, the heads of one layer, promoted and
  suppressed tokens);
- the bytes a step's lens record adds, in memory and in the trace file.

    .venv/bin/python benchmarks/bench_lens.py [--steps 128] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from semviz import load_model
from semviz.analysis import lens
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output.trace import LENS_FIELDS, StepRecord, encode_tensor
from semviz.sampling import PruneParams

PROMPT = "Tell me a long story about a lighthouse keeper and a storm."


def _decode(lm, steps: int, *, capture: bool) -> tuple[float, float, Decoder]:
    """Median seconds per decode step with the lens record on and off, alternating step by
    step in one decoder, so both see the same context lengths and the same machine load."""
    d = Decoder(
        lm,
        PROMPT,
        PruneParams(temperature=0.8, top_p=0.95),
        DecodeSettings(max_new_tokens=2 * steps + 1, seed=0, capture=capture),
    )
    d.eos_ids = set()  # decode the full length
    d.step()  # the prefill is not a decode step
    on, off = [], []
    for k in range(2 * steps):
        lens_on = k % 2 == 0
        d.settings = dataclasses.replace(d.settings, lens=lens_on)
        t0 = time.perf_counter()
        d.step()
        (on if lens_on else off).append(time.perf_counter() - t0)
    return statistics.median(on), statistics.median(off), d


def _record_bytes(rec: StepRecord) -> tuple[int, int]:
    """Bytes of the step's lens fields in memory, and in the JSON file (base64)."""
    mem = disk = 0
    for name in LENS_FIELDS:
        v = getattr(rec, name)
        tensors = list(v.values()) if isinstance(v, dict) else [v]
        for t in tensors:
            if t is not None:
                mem += t.numel() * t.element_size()
                disk += len(json.dumps(encode_tensor(t)))
    return mem, disk


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    lm = load_model()
    _decode(lm, 4, capture=True)  # warm up: first forwards, allocator
    res: dict = {"steps": args.steps, "repeats": args.repeats}
    last = None
    for capture in (True, False):
        ratios, on_ms, off_ms = [], [], []
        for _ in range(args.repeats):
            on, off, d = _decode(lm, args.steps, capture=capture)
            ratios.append(on / off)
            on_ms.append(1e3 * on)
            off_ms.append(1e3 * off)
            if capture:
                last = d
        res["capture_on" if capture else "capture_off"] = {
            "step_ms_lens_off": statistics.median(off_ms),
            "step_ms_lens_on": statistics.median(on_ms),
            "on_over_off": statistics.median(ratios),
        }

    steps = [r for r in last.trace.steps if r.residual is not None][: args.steps]
    rec = steps[len(steps) // 2]

    def one_step():
        lens.clear_cache()
        lens.lens_step(lm, rec)

    res["lens_step_ms"] = 1e3 * _best(one_step, 5)
    res["logit_lens_ms"] = 1e3 * _best(lambda: lens.logit_lens(lm, rec), 5)
    lens.clear_cache()
    t0 = time.perf_counter()
    grid = lens.lens_grid(lm, steps)
    res["grid_first_s"] = time.perf_counter() - t0
    res["grid_cached_ms"] = 1e3 * _best(lambda: lens.lens_grid(lm, steps), 5)
    assert grid.top_id.shape == (len(steps[0].residual), len(steps))
    # the floor: the grid's rows through the LM head alone, one product, no norm or summary
    head = lm.model.get_output_embeddings().weight  # (V, d)
    rows = torch.randn(grid.top_id.size, head.shape[1], dtype=head.dtype)  # (n·(L+1), d)
    with torch.inference_mode():
        res["grid_head_product_s"] = _best(lambda: rows @ head.T, 1)
    res["grid_gflop"] = 2 * rows.shape[0] * head.shape[0] * head.shape[1] / 1e9

    def dla():
        lens.clear_cache()
        lens.block_attribution(lm, rec)
        lens.head_attribution(lm, rec, rec.residual.shape[0] - 2)
        lens.block_tokens(lm, rec)

    res["dla_ms"] = 1e3 * _best(dla, 3)
    mem, disk = _record_bytes(rec)
    res["bytes_per_step_memory"] = mem
    res["bytes_per_step_file"] = disk
    if args.json:
        print(json.dumps(res, indent=2))
        return
    for key, what in (("capture_on", "attention captured"), ("capture_off", "no attention")):
        r = res[key]
        print(
            f"decode step, {what}: lens off {r['step_ms_lens_off']:.1f} ms, on "
            f"{r['step_ms_lens_on']:.1f} ms, on/off {r['on_over_off']:.3f} (goal ≤ 1.05)"
        )
    print(
        f"lens of one step on demand: {res['lens_step_ms']:.0f} ms (goal < 100 ms); "
        f"logit_lens alone {res['logit_lens_ms']:.0f} ms"
    )
    print(
        f"grid of {len(steps)} steps: first {res['grid_first_s']:.2f} s (goal < 3 s), "
        f"cached {res['grid_cached_ms']:.1f} ms (goal < 50 ms)"
    )
    print(
        f"  its LM-head product alone ({res['grid_gflop']:.0f} GFLOP): "
        f"{res['grid_head_product_s']:.2f} s; grid / product "
        f"{res['grid_first_s'] / res['grid_head_product_s']:.2f}"
    )
    print(f"direct logit attribution of one step: {res['dla_ms']:.0f} ms")
    print(
        f"lens record per step: {mem / 1024:.1f} KiB in memory, {disk / 1024:.1f} KiB in the file"
    )


if __name__ == "__main__":
    main()
