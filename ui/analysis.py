"""Computations the pages need beyond the trace: prefill timing, bytes per token."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def prefill_scan(
    lm,
    lengths: list[int],
    *,
    repeats: int = 2,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[int], list[float]]:
    """Measured prefill seconds (best of ``repeats``) for prompts of each length."""
    vocab = lm.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    out_n, out_s = [], []
    total = len(lengths) * repeats
    done = 0
    for n in lengths:
        ids = torch.randint(100, vocab, (1, n), generator=gen)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.inference_mode():
                lm.model.get_decoder()(input_ids=ids, use_cache=False)
            best = min(best, time.perf_counter() - t0)
            done += 1
            if on_progress is not None:
                on_progress(done, total)
        out_n.append(n)
        out_s.append(best)
    return out_n, out_s


def bytes_per_token(summary: dict, element_size: int) -> int:
    """``2 · layers · kv_heads · head_dim · bytes``: keys and values of one token."""
    return 2 * summary["num_layers"] * summary["num_kv_heads"] * summary["head_dim"] * element_size
