"""The one forward and the padded rows cache, on the tiny model."""

from __future__ import annotations

import pytest
import torch

import semviz
from semviz.model.forward import KVRows, cache_nbytes, forward, kv_bytes_per_token, prefill_scan


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_bytes_per_token_is_what_the_cache_holds(tiny_dir, dtype):
    lm = semviz.load_model(str(tiny_dir), dtype=dtype, device="cpu")
    rows = KVRows.empty(lm.model, 3)
    forward(lm.model, torch.ones(3, 5, dtype=torch.long), torch.arange(5).expand(3, -1), rows.cache)
    assert cache_nbytes(rows.cache) == 3 * 5 * kv_bytes_per_token(lm.summary())
    el = 2 if dtype == "bfloat16" else 4
    assert kv_bytes_per_token(lm.summary()) == 2 * 2 * 2 * 16 * el  # 2·L·kv_heads·head_dim·bytes


def test_rows_keep_pack_and_mask(tiny_lm):
    model = tiny_lm.model
    rows = KVRows.empty(model, 2)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    out = forward(model, ids, torch.arange(4).expand(2, -1), rows.cache, capture=True)
    assert out.hidden.shape == (2, 4, 64) and out.attention.shape == (2, 2, 4, 4)  # (L, B, H, S)
    rows.append(torch.arange(4))
    assert rows.masks(1) is None  # equal rows: the model's own mask
    keys = rows.cache.layers[0].keys.clone()  # (2, H_kv, 4, D)
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, 0, 1] = keep[0, 0, 2] = False  # row 0 drops positions 1, 2 in layer 0
    keep[1, 1, 0] = False  # row 1 drops position 0 in layer 1
    rows.keep(keep)
    assert rows.lengths == [4, 4]
    assert [p.tolist() for p in rows.row_positions(0)] == [[0, 3], [0, 1, 2, 3]]
    assert [p.tolist() for p in rows.row_positions(1)] == [[0, 1, 2, 3], [1, 2, 3]]
    got = rows.cache.layers[0].keys
    torch.testing.assert_close(got[0, :, :2], keys[0, :, [0, 3]], rtol=0, atol=0)  # packed
    torch.testing.assert_close(got[1], keys[1], rtol=0, atol=0)
    masks = rows.masks(1)  # (B, 1, T, S_l + T) per layer: padding hidden, the new token seen
    assert masks[0][:, 0, 0].tolist() == [[True, True, False, False, True], [True] * 5]
    assert masks[1][:, 0, 0].tolist() == [[True] * 5, [True, True, True, False, True]]


def test_padded_row_equals_the_row_alone(tiny_lm):
    """A row whose cache holds padding gives the hidden state of the same entries alone."""
    model = tiny_lm.model
    rows = KVRows.empty(model, 2)
    forward(model, torch.tensor([[5, 6, 7, 8]] * 2), torch.arange(4).expand(2, -1), rows.cache)
    rows.append(torch.arange(4))
    keep = torch.ones(2, 2, 4, dtype=torch.bool)
    keep[0, :, 1] = False  # row 0 forgets position 1 in both layers
    rows.keep(keep)
    batched = forward(
        model,
        torch.tensor([[9], [9]]),
        torch.tensor([[4], [4]]),
        rows.cache,
        masks=rows.masks(1),
    )
    alone = KVRows.empty(model, 1)
    forward(model, torch.tensor([[5, 6, 7, 8]]), torch.arange(4)[None], alone.cache)
    alone.append(torch.arange(4))
    drop = torch.ones(1, 2, 4, dtype=torch.bool)
    drop[0, :, 1] = False
    alone.keep(drop)
    one = forward(model, torch.tensor([[9]]), torch.tensor([[4]]), alone.cache)
    torch.testing.assert_close(batched.hidden[0], one.hidden[0], atol=1e-6, rtol=0)
    assert (batched.hidden[0] - batched.hidden[1]).abs().max() > 1e-4  # row 1 kept it


def test_stack_makes_rows_of_one_row_caches(tiny_lm):
    model = tiny_lm.model
    caches, positions = [], []
    for n in (3, 5):
        one = KVRows.empty(model, 1)
        forward(model, torch.arange(10, 10 + n)[None], torch.arange(n)[None], one.cache)
        one.append(torch.arange(n))
        caches.append(one.cache)
        positions.append(one.row_positions(0))
    rows = KVRows.stack(caches, positions)
    assert rows.lengths == [5, 5] and rows.pos[0, 0].tolist() == [0, 1, 2, -1, -1]
    torch.testing.assert_close(rows.cache.layers[1].keys[0, :, :3], caches[0].layers[1].keys[0])


def test_prefill_scan(tiny_lm):
    seen = []
    n, s = prefill_scan(tiny_lm, [4, 8], repeats=1, on_progress=lambda *a: seen.append(a))
    assert n == [4, 8] and len(s) == 2 and all(x > 0 for x in s) and seen == [(1, 2), (2, 2)]
