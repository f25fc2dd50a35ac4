"""Eviction on the real cache is exact: decoding after eviction equals a full forward pass whose
per-layer attention mask hides the evicted positions; policies run as rows of one batch equal
the same policies run alone; re-rotated keys equal keys made at the cache-relative positions."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, DynamicCache, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from semviz import eviction as ev
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams

N = 72
_IMPL = "semviz_test_layer_masks"


def _layer_masked_sdpa(module, query, key, value, attention_mask, **kwargs):
    masks = kwargs.pop("layer_masks")
    kwargs.pop("semviz_sink", None)
    return sdpa_attention_forward(module, query, key, value, masks[module.layer_idx], **kwargs)


AttentionInterface.register(_IMPL, _layer_masked_sdpa)


@pytest.fixture(scope="module")
def masked_model(tiny_dir):
    """A private copy of the tiny model whose attention takes one boolean mask per layer."""
    return LlamaForCausalLM.from_pretrained(
        tiny_dir, dtype=torch.float32, attn_implementation=_IMPL
    ).eval()


@pytest.fixture(scope="module")
def ids(tiny_lm):
    text = "It is a truth universally acknowledged, that a single man in possession of a " * 8
    return tiny_lm.tokenizer(text, add_special_tokens=False)["input_ids"][:N]


def _reference_logits(model, ids: list[int], events: list[dict]) -> torch.Tensor:
    """(N, V) logits of one forward pass in which query t cannot see, in layer l, any key
    that layer l evicted after a forward whose query came before t."""
    n, n_layers = len(ids), model.config.num_hidden_layers
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool)).repeat(n_layers, 1, 1)
    for e in events:
        q = e["query_position"]
        for layer in range(n_layers):
            gone = e["evicted"][layer]
            gone = gone[gone >= 0].long()
            allowed[layer, q + 1 :, gone] = False
    masks = [allowed[i][None, None] for i in range(n_layers)]  # (1, 1, N, N) each
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.arange(n)[None],
            layer_masks=masks,
            use_cache=False,
        )
    return out.logits[0].float()


CASES = {
    "full": {},
    "window": {"budget": 12},
    "streaming": {"budget": 12},
    "h2o": {"budget": 12},
    "tova": {"budget": (10, 16)},  # per-layer budgets: layers differ in length
    "ema": {"threshold": (1.0, 0.98), "recent": 4},  # thresholds: lengths vary by step
    "gravity": {"budget": 0.25, "beta": 1.0, "protect_z": 1.0},
}


def _run(lm, ids, policies, prefill: int) -> tuple[list[torch.Tensor], list[list[dict]], int]:
    """Teacher-force ``ids`` with one row per policy: per row (N, V) logits by position and
    the events; and how many forwards needed a padding mask."""
    rows = len(policies)
    logits: list[dict[int, torch.Tensor]] = [{} for _ in range(rows)]
    events: list[list[dict]] = [[] for _ in range(rows)]
    padded = 0
    for step in ev.teacher_force(lm, ids, policies, prefill=prefill):
        for r in range(rows):
            for i, p in enumerate(step.positions):
                logits[r][p] = step.logits[r, i]
            events[r].append(step.events[r])
        padded += step.rows.masks(1) is not None
    out = [torch.stack([lg[p] for p in range(len(ids))]) for lg in logits]
    return out, events, padded


@pytest.mark.parametrize("name", list(CASES))
def test_decoding_after_eviction_matches_masked_full_forward(tiny_lm, masked_model, ids, name):
    logits, events, _ = _run(tiny_lm, ids, [ev.make_policy(name, **CASES[name])], prefill=8)
    assert sum(int((e["evicted"] >= 0).sum()) for e in events[0]) > 0 or name == "full"
    ref = _reference_logits(masked_model, ids, events[0])
    torch.testing.assert_close(logits[0], ref, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def batched(tiny_lm, ids):
    """Every policy (and a re-rotated one) as rows of one batch, and each run alone."""
    make = [lambda n=n: ev.make_policy(n, **CASES[n]) for n in CASES]
    make.append(lambda: ev.make_policy("streaming", budget=10, rerotate=True))
    together = _run(tiny_lm, ids, [m() for m in make], prefill=8)
    alone = [_run(tiny_lm, ids, [m()], prefill=8) for m in make]
    return together, alone


@pytest.mark.parametrize("row", range(len(CASES) + 1))
def test_batched_rows_equal_unbatched_runs(batched, row):
    (logits, events, padded), alone = batched
    a_logits, a_events, _ = alone[row]
    assert padded > 0  # rows held different numbers of entries: padding was masked
    torch.testing.assert_close(logits[row], a_logits[0], atol=1e-5, rtol=0)
    assert len(events[row]) == len(a_events[0])
    for got, want in zip(events[row], a_events[0], strict=True):
        for key in ("positions", "evicted", "lengths", "rule", "protected", "budget"):
            assert torch.equal(got[key], want[key]), key
        assert got["peak_bytes"] == want["peak_bytes"]
        assert got["cache_bytes"] == want["cache_bytes"]


def test_batched_rows_match_the_masked_oracle(batched, masked_model, ids):
    (logits, events, _), _ = batched
    for row in range(len(CASES)):  # the re-rotated row changes keys, not masks
        ref = _reference_logits(masked_model, ids, events[row])
        torch.testing.assert_close(logits[row], ref, atol=1e-5, rtol=0)


def test_reference_mask_matters(tiny_lm, masked_model, ids):
    """Sanity check of the oracle: without the eviction mask, the logits differ."""
    logits, _, _ = _run(tiny_lm, ids, [ev.make_policy("window", budget=8)], prefill=1)
    plain = _reference_logits(masked_model, ids, [])
    assert (logits[0][-1] - plain[-1]).abs().max() > 1e-3


def _layer0_keys(lm, tokens: list[int], positions: torch.Tensor) -> torch.Tensor:
    cache = DynamicCache(config=lm.model.config)
    with torch.no_grad():
        lm.model.get_decoder()(
            input_ids=torch.tensor([tokens]),
            position_ids=positions[None],
            cache=cache,
            use_cache=True,
        )
    return cache.layers[0].keys  # (1, H_kv, S, D)


def _rerotated_layer0(lm, ids: list[int], budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed ``ids`` one token at a time to a decoder that streams with re-rotation; return
    layer 0's keys (1, H_kv, S, D) and the positions it kept (S,)."""
    policy = ev.make_policy("streaming", budget=budget, rerotate=True)
    settings = DecodeSettings(max_new_tokens=64, chat=False, capture=False, record_k=8)
    d = Decoder(lm, "", PruneParams(), settings, eviction=policy, prompt_ids=ids[:1])
    for tok in ids[1:]:
        d.step(force_token=tok)
    d.step()  # feeds the last forced token
    assert d.trace.settings["eviction"]["rerotate"] is True
    return d.cache.layers[0].keys.clone(), d.positions[0].clone()


def _check_rerotated(lm, ids, keys: torch.Tensor, kept: torch.Tensor) -> None:
    """Layer-0 keys depend on the token and its position only, so the re-rotated cache must
    equal layer-0 keys computed afresh at the cache-relative positions."""
    assert kept.tolist() == [0, 1, 2, 3, 34, 35, 36, 37, 38, 39]
    target = len(ids) - kept.numel() + torch.arange(kept.numel())  # 30, 31, ..., 39
    want = _layer0_keys(lm, [ids[p] for p in kept.tolist()], target)
    torch.testing.assert_close(keys, want, atol=1e-5, rtol=0)
    # only the sinks were displaced: the window is already at its cache-relative distance
    at_true = _layer0_keys(lm, [ids[p] for p in kept.tolist()], kept)
    torch.testing.assert_close(keys[:, :, 4:], at_true[:, :, 4:], atol=1e-6, rtol=0)
    assert (keys[:, :, :4] - at_true[:, :, :4]).abs().max() > 1e-3


def test_rerotated_keys_sit_at_cache_relative_positions_in_a_decoder(tiny_lm):
    ids = list(range(1000, 1040))
    _check_rerotated(tiny_lm, ids, *_rerotated_layer0(tiny_lm, ids, budget=10))


def test_rerotated_keys_sit_at_cache_relative_positions_in_a_batch(tiny_lm):
    """The re-rotated row beside a row that holds more entries (padding in between)."""
    ids = list(range(1000, 1040))
    policies = [ev.make_policy("streaming", budget=10, rerotate=True), ev.make_policy("full")]
    rows = list(ev.teacher_force(tiny_lm, ids, policies))[-1].rows
    kept = rows.row_positions(0)[0]
    keys = rows.cache.layers[0].keys[:1, :, : kept.numel()]
    assert rows.cache.layers[0].keys.shape[2] == len(ids)  # the full row sets the width
    _check_rerotated(tiny_lm, ids, keys, kept)
