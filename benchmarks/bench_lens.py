"""The logit lens's cost: decoding with its record on against off, and its views on demand.

On the default model, in one run:

- decode steps with the lens record on against off (the app's default settings, attention
  captured either way; and with attention capture off, as ``trace --attention off`` runs),
  the two interleaved run by run so a busy machine slows both alike; goal: on ≤ 5 % slower;
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
import json
import statistics
import time

from semviz import load_model
from semviz.analysis import lens
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output.trace import LENS_FIELDS, StepRecord, encode_tensor
from semviz.sampling import PruneParams

PROMPT = "Tell me a long story about a lighthouse keeper and a storm."


def _decode(lm, steps: int, *, lens_on: bool, capture: bool) -> tuple[float, Decoder]:
    """Seconds per decode step (median over the steps; the prefill is not a step)."""
    d = Decoder(
        lm, PROMPT, PruneParams(temperature=0.8, top_p=0.95),
        DecodeSettings(max_new_tokens=steps, seed=0, lens=lens_on, capture=capture),
    )  # fmt: skip
    d.eos_ids = set()  # decode the full length
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        d.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), d


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
    _decode(lm, 4, lens_on=True, capture=True)  # warm up: first forwards, allocator
    res: dict = {"steps": args.steps, "repeats": args.repeats}
    last = None
    for capture in (True, False):
        off, on = [], []
        for r in range(args.repeats):
            order = (False, True) if r % 2 == 0 else (True, False)
            for lens_on in order:
                s, d = _decode(lm, args.steps, lens_on=lens_on, capture=capture)
                (on if lens_on else off).append(s)
                if lens_on and capture:
                    last = d
        key = "capture_on" if capture else "capture_off"
        res[key] = {
            "step_ms_lens_off": 1e3 * statistics.median(off),
            "step_ms_lens_on": 1e3 * statistics.median(on),
            "on_over_off": statistics.median(on) / statistics.median(off),
        }

    steps = last.trace.steps
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
    print(f"lens of one step on demand: {res['lens_step_ms']:.0f} ms (goal < 100 ms); "
          f"logit_lens alone {res['logit_lens_ms']:.0f} ms")  # fmt: skip
    print(f"grid of {len(steps)} steps: first {res['grid_first_s']:.2f} s (goal < 3 s), "
          f"cached {res['grid_cached_ms']:.1f} ms (goal < 50 ms)")  # fmt: skip
    print(f"direct logit attribution of one step: {res['dla_ms']:.0f} ms")
    print(
        f"lens record per step: {mem / 1024:.1f} KiB in memory, {disk / 1024:.1f} KiB in the file"
    )


if __name__ == "__main__":
    main()
