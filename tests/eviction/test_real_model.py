"""The StreamingLLM finding on the real default model: a plain window collapses once the first
tokens leave the cache; keeping 4 attention sinks fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest

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
