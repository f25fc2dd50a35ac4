"""How far is bfloat16 from float32 on the default model, and how much faster is it?

Teacher-forced over the shipped prose text: one forward pass per dtype over the same tokens,
then per position the KL divergence KL(P_fp32 ‖ P_bf16) of the next-token distributions
(computed in float32) and whether the two argmaxes agree. Speed: plain ``generate()`` greedy
tokens/s in each dtype, interleaved, median of repeats, printed as a ratio.

    .venv/bin/python benchmarks/bench_dtype.py [--tokens 1024] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from semviz.model.load import load_model

TEXT = Path(__file__).resolve().parent.parent / "data" / "pride_and_prejudice_ch1-3.txt"


def gen_speed(lm, ids, n=64) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        lm.model.generate(
            ids[:, :64],
            attention_mask=torch.ones_like(ids[:, :64]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=lm.tokenizer.pad_token_id,
        )
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    f32 = load_model(dtype="float32", device="cpu")
    b16 = load_model(dtype="bfloat16", device="cpu")
    ids = f32.tokenizer(TEXT.read_text(), return_tensors="pt").input_ids[:, : args.tokens]
    with torch.inference_mode():
        lp32 = torch.log_softmax(f32.model(ids).logits[0].float(), -1)  # (T, V)
        lp16 = torch.log_softmax(b16.model(ids).logits[0].float(), -1)  # (T, V)
    kl = (lp32.exp() * (lp32 - lp16)).sum(-1)  # (T,)
    agree = (lp32.argmax(-1) == lp16.argmax(-1)).float()  # (T,)

    gen32, gen16 = [], []
    gen_speed(f32, ids, 4), gen_speed(b16, ids, 4)  # warm-up
    for _ in range(args.repeats):
        gen32.append(gen_speed(f32, ids))
        gen16.append(gen_speed(b16, ids))
    res = {
        "tokens": int(ids.shape[1]),
        "kl_mean_nats": float(kl.mean()),
        "kl_median_nats": float(kl.median()),
        "kl_p99_nats": float(torch.quantile(kl, 0.99)),
        "kl_max_nats": float(kl.max()),
        "top1_agreement": float(agree.mean()),
        "generate_float32_tok_s": statistics.median(gen32),
        "generate_bfloat16_tok_s": statistics.median(gen16),
    }
    res["bfloat16_vs_float32_speed"] = (
        res["generate_bfloat16_tok_s"] / res["generate_float32_tok_s"]
    )
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"bfloat16 vs float32 on {res['tokens']} tokens of prose (teacher-forced):")
    print(
        f"  KL(fp32 || bf16) mean {res['kl_mean_nats']:.4f}  median {res['kl_median_nats']:.4f}"
        f"  p99 {res['kl_p99_nats']:.4f}  max {res['kl_max_nats']:.4f} nats"
    )
    print(f"  top-1 agreement {res['top1_agreement']:.1%}")
    print(
        f"  generate() greedy: float32 {res['generate_float32_tok_s']:.1f} tok/s, bfloat16 "
        f"{res['generate_bfloat16_tok_s']:.1f} tok/s, ratio {res['bfloat16_vs_float32_speed']:.2f}x"
    )


if __name__ == "__main__":
    main()
