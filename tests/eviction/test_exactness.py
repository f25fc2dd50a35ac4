"""Eviction on the real cache is exact: decoding after eviction equals a full forward pass whose
per-layer attention mask hides the evicted positions; re-rotated keys equal keys made at the
cache-relative positions."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, DynamicCache, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from semviz import eviction as ev

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
    "ema": {"threshold": (1.0, 0.98), "recent": 4},
    "gravity": {"budget": 0.25, "beta": 1.0, "protect_z": 1.0},
}


@pytest.mark.parametrize("name", list(CASES))
def test_decoding_after_eviction_matches_masked_full_forward(tiny_lm, masked_model, ids, name):
    policy = ev.make_policy(name, **CASES[name])
    logits, events = {}, []
    for pos, lg, event, _ in ev.teacher_force(tiny_lm, ids, policy, prefill=8):
        for i, p in enumerate(pos):
            logits[p] = lg[i]
        events.append(event)
    assert sum(int((e["evicted"] >= 0).sum()) for e in events) > 0 or name == "full"
    ref = _reference_logits(masked_model, ids, events)
    got = torch.stack([logits[p] for p in range(len(ids))])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_reference_mask_matters(tiny_lm, masked_model, ids):
    """Sanity check of the oracle: without the eviction mask, the logits differ."""
    policy = ev.make_policy("window", budget=8)
    got = {}
    for pos, lg, _, _ in ev.teacher_force(tiny_lm, ids, policy, prefill=1):
        got[pos[0]] = lg[0]
    plain = _reference_logits(masked_model, ids, [])
    assert (got[len(ids) - 1] - plain[-1]).abs().max() > 1e-3


def _rerotated_layer0(lm, ids, budget):
    """Stream ``ids`` with re-rotation; return layer 0's keys and kept positions."""
    from semviz.capture import AttentionSink

    policy = ev.make_policy("streaming", budget=budget, rerotate=True)
    session = ev.CacheSession(
        lm=lm,
        cache=DynamicCache(config=lm.model.config),
        positions=[torch.zeros(0, dtype=torch.long) for _ in range(lm.config.num_hidden_layers)],
        ids=[],
    )
    policy.reset(session)
    for p, tok in enumerate(ids):
        sink = AttentionSink()
        with torch.inference_mode():
            lm.model.get_decoder()(
                input_ids=torch.tensor([[tok]]),
                position_ids=torch.tensor([[p]]),
                cache=session.cache,
                use_cache=True,
                semviz_sink=sink,
            )
        session.ids.append(tok)
        policy.after_forward(session, ev._attention_rows(sink))
    return session.cache.layers[0].keys.clone(), session.positions[0].clone()


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


def test_rerotated_keys_sit_at_cache_relative_positions(tiny_lm):
    """Layer-0 keys depend on the token and its position only, so the re-rotated cache must
    equal layer-0 keys computed afresh at the cache-relative positions."""
    ids = list(range(1000, 1040))
    keys, kept = _rerotated_layer0(tiny_lm, ids, budget=10)
    assert kept.tolist() == [0, 1, 2, 3, 34, 35, 36, 37, 38, 39]
    target = len(ids) - kept.numel() + torch.arange(kept.numel())  # 30, 31, ..., 39
    want = _layer0_keys(tiny_lm, [ids[p] for p in kept.tolist()], target)
    torch.testing.assert_close(keys, want, atol=1e-5, rtol=0)
    # only the sinks were displaced: the window is already at its cache-relative distance
    at_true = _layer0_keys(tiny_lm, [ids[p] for p in kept.tolist()], kept)
    torch.testing.assert_close(keys[:, :, 4:], at_true[:, :, 4:], atol=1e-6, rtol=0)
    assert (keys[:, :, :4] - at_true[:, :, :4]).abs().max() > 1e-3
