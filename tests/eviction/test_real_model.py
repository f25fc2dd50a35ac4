"""On the real default model: the StreamingLLM finding (a plain window collapses once the first
tokens leave the cache; keeping 4 attention sinks fixes it), and batched rows equal unbatched
runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from semviz import eviction as ev

TEXT = Path(__file__).resolve().parents[2] / "data" / "pride_and_prejudice_ch1-3.txt"


@pytest.mark.real_model
def test_streaming_beats_window_and_attention_policies_track_full(real_lm_f32):
    lm = real_lm_f32
    ids = lm.tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"][:256]
    rows = {
        r["policy"]: r for r in ev.kv_eval(lm, ids, ["full", "window", "streaming", "tova"], (32,))
    }
    full, window, streaming = rows["full"], rows["window"], rows["streaming"]
    assert window["ppl"] > 1.3 * streaming["ppl"]
    assert window["kl"] > 2 * streaming["kl"]
    assert rows["tova"]["ppl"] < 1.2 * full["ppl"]
    assert streaming["peak_cache_bytes"] < full["peak_cache_bytes"] / 4


@pytest.mark.real_model
def test_batched_rows_equal_unbatched_runs_on_the_real_model(real_lm_f32):
    """Every policy as a row of one batch (full beside them, so rows are padded) against each
    policy run alone: the same entries evicted at every step, logits equal to float rounding.

    Float rounding, not 1e-5 absolute: CPU BLAS sums a one-row product (gemv) in another order
    than a several-row one (gemm), so a plain forward of one row and of that row twice already
    differ by about 3e-5 on logits whose largest is about 30, and through 30 layers and a
    growing cache that reaches 1e-4 (up to 1e-3 for ``window``, which without attention sinks
    amplifies any change). Padding adds nothing: a padded key's weight is exactly zero. The
    tiny-model tests hold every policy to 1e-5 absolute."""
    lm = real_lm_f32
    ids = lm.tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"][:48]
    names = list(ev.POLICIES)

    def make():
        return [ev.make_policy(n, None if n == "full" else 12) for n in names]

    together = list(ev.teacher_force(lm, ids, make(), prefill=8))
    assert together[-1].rows.masks(1) is not None  # the rows' caches were padded
    for row, policy in enumerate(make()):
        alone = list(ev.teacher_force(lm, ids, [policy], prefill=8))
        for got, want in zip(together, alone, strict=True):
            assert torch.equal(got.events[row]["positions"], want.events[0]["positions"])
            assert torch.equal(got.events[row]["evicted"], want.events[0]["evicted"])
            scale = float(want.logits[0].abs().max())
            assert float((got.logits[row] - want.logits[0]).abs().max()) <= 1e-4 * scale
