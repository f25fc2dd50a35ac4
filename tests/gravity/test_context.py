"""What gravity reads: prompt roles, which positions get mass, the n-gram guard."""

from __future__ import annotations

import pytest
import torch

from semviz import gravity as gv
from semviz.decoding.decoder import encode_prompt
from semviz.sampling import PruneParams

PROMPT = "Write a story about a beekeeper."
T, S, U = gv.TEMPLATE, gv.SYSTEM, gv.USER


def test_prompt_roles_of_a_chat_prompt(tiny_lm):
    tok = tiny_lm.tokenizer
    ids = encode_prompt(tiny_lm, PROMPT, chat=True)
    roles = gv.prompt_roles(tok, ids).tolist()
    text = [tok.decode([i]) for i in ids]
    user = [t for t, r in zip(text, roles, strict=True) if r == U]
    system = [t for t, r in zip(text, roles, strict=True) if r == S]
    assert "".join(user) == PROMPT
    # the template's default system prompt, and its role name, never get mass
    assert (
        "".join(system)
        == "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    )
    assert [t for t, r in zip(text, roles, strict=True) if r == T] == [
        "<|im_start|>",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "user",
        "\n",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "ass",
        "istant",
        "\n",
    ]


def test_prompt_roles_with_a_system_prompt_and_without_chat(tiny_lm):
    tok = tiny_lm.tokenizer
    ids = encode_prompt(tiny_lm, PROMPT, chat=True, system_prompt="Be brief.")
    roles = gv.prompt_roles(tok, ids)
    user = [i for i, r in zip(ids, roles.tolist(), strict=True) if r == U]
    assert tok.decode(user) == PROMPT
    assert tok.decode([i for i, r in zip(ids, roles.tolist(), strict=True) if r == S]).endswith(
        "Be brief."
    )
    plain = encode_prompt(tiny_lm, PROMPT, chat=False)
    assert gv.prompt_roles(tok, plain).tolist() == [U] * len(plain)


def test_defaults_give_sinks_template_and_system_no_mass(tiny_lm):
    """PruneParams()' gravity: only the user's words carry mass, never the first token."""
    ids = torch.tensor(encode_prompt(tiny_lm, PROMPT, chat=True))
    roles = gv.prompt_roles(tiny_lm.tokenizer, ids)
    n = ids.numel()
    attn = torch.softmax(torch.randn(2, 4, n), -1)
    attn[..., 0] += 5.0  # a sink: most attention on the first token
    attn = attn / attn.sum(-1, keepdim=True)
    ctx = gv.GravityContext(ids=ids, roles=roles, attention=attn, ema=None)
    for mass in ("attention", "ema", "uniform", "idf", "norm"):
        cp = gv.context_pull(tiny_lm.model, PruneParams(gravity_mass=mass), ctx)
        assert float(cp.mass[0]) == 0.0, mass
        assert torch.all(cp.mass[roles != U] == 0), mass
        assert float(cp.mass[roles == U].sum()) == pytest.approx(1.0), mass


def test_information_mass_is_surprise_above_the_stopword_level(tiny_lm):
    model = tiny_lm.model
    info = gv.information_mass(model)
    bos = model.generation_config.bos_token_id
    with torch.no_grad():
        surprise = -torch.log_softmax(model(torch.tensor([[bos]])).logits[0, -1].float(), -1)
    want = (surprise - torch.quantile(surprise, gv.INFO_QUANTILE)).clamp_min(0.0)
    torch.testing.assert_close(info, want, atol=1e-4, rtol=1e-4)
    assert info is gv.information_mass(model)  # one forward per model
    assert 0.04 < float((info == 0).float().mean()) < 0.06


def test_anchor_sinks_and_template_masks():
    roles = torch.tensor([T, S, S, T, U, U, U, T], dtype=torch.int8)
    ids = torch.arange(10, 22)  # 8 prompt positions, then 4 generated
    ctx = gv.GravityContext(ids=ids, roles=roles)

    def mask(**kw):
        return gv.mass_mask(PruneParams(**kw), ctx).nonzero()[:, 0].tolist()

    assert mask(gravity_anchor="prompt", gravity_skip_template=True) == [4, 5, 6]
    assert mask(gravity_anchor="context", gravity_skip_template=True) == [4, 5, 6, 8, 9, 10, 11]
    assert mask(gravity_anchor="window", gravity_window=5, gravity_skip_template=True) == [
        8,
        9,
        10,
        11,
    ]
    assert mask(gravity_anchor="context", gravity_skip_template=False, gravity_sinks=2) == list(
        range(2, 12)
    )
    assert mask(gravity_anchor="prompt", gravity_skip_template=False, gravity_sinks=0) == list(
        range(8)
    )
    # after eviction only the held positions are asked about, by absolute position
    held = gv.GravityContext(ids=ids, roles=roles, positions=torch.tensor([0, 5, 9, 11]))
    got = gv.mass_mask(PruneParams(gravity_anchor="context", gravity_skip_template=True), held)
    assert got.tolist() == [False, True, True, True]


def test_repeat_tokens_and_guard():
    ids = torch.tensor([4, 5, 6, 9, 5, 7, 4, 5])
    assert gv.repeat_tokens(ids, 3).tolist() == [6]  # "4 5" was followed by 6
    assert gv.repeat_tokens(ids, 2).tolist() == [6, 7]  # "5" was followed by 6 and by 7
    assert gv.repeat_tokens(ids, 1).tolist() == [4, 5, 6, 7, 9]
    assert gv.repeat_tokens(ids, 4).tolist() == []  # "7 4 5" never occurred before
    assert gv.repeat_tokens(torch.tensor([3]), 2).tolist() == []
    g = torch.tensor([0.0, 1.0, -1.0, 2.0, 3.0, -2.0, 4.0, 5.0])
    out = gv.ngram_guard(g, ids, 2)
    assert out.tolist() == [0.0, 1.0, -1.0, 2.0, 3.0, -2.0, 0.0, 0.0]  # 6 and 7 lose their pull
    assert g[6] == 4.0  # not in place
    g5 = torch.tensor([1.0, -1.0, 2.0])
    assert gv.ngram_guard(g5, ids, 2, index=torch.tensor([6, 3, 7])).tolist() == [0.0, -1.0, 0.0]
    assert torch.equal(gv.ngram_guard(g, ids, 0), g)


def test_guard_stops_the_pull_towards_a_loop(tiny_lm):
    """With n = 2, the token that would repeat the last bigram gets no positive gravity."""
    ids = torch.tensor([100, 200, 300, 100, 200, 300, 100])
    p = PruneParams(
        gravity_kind="pull",
        gravity_anchor="context",
        gravity_skip_template=False,
        gravity_sinks=0,
        gravity_mass="uniform",
        gravity_ngram=2,
        gravity_copy_cos=0.0,
        gravity_attract_only=False,
    )
    g = gv.gravity_for_step(tiny_lm.model, p, gv.GravityContext(ids=ids))
    free = gv.gravity_for_step(
        tiny_lm.model, p.replace(gravity_ngram=0), gv.GravityContext(ids=ids)
    )
    assert float(free[200]) > 0 and float(g[200]) == 0.0
    keep = torch.ones_like(g, dtype=torch.bool)
    keep[200] = False
    assert torch.equal(g[keep], free[keep])


def test_copy_guard_drops_near_copies_of_context_tokens(tiny_lm):
    model = tiny_lm.model
    unit = gv.candidate_matrix(model, "embedding", "cosine")
    ids = torch.tensor([100, 200])
    got = gv.near_copies(model, ids, 0.3)
    want = (((unit[[100, 200]] @ unit.T) >= 0.3 - 1e-6).any(0)).nonzero()[:, 0]
    assert torch.equal(got, want) and {100, 200} <= set(got.tolist())
    assert gv.near_copies(model, ids, 1.0).tolist() == [100, 200]  # only the tokens themselves
    p = PruneParams(
        gravity_kind="pull",
        gravity_anchor="context",
        gravity_skip_template=False,
        gravity_sinks=0,
        gravity_mass="uniform",
        gravity_copy_cos=0.3,
        gravity_attract_only=False,
    )
    g = gv.gravity_for_step(model, p, gv.GravityContext(ids=ids))
    free = gv.gravity_for_step(model, p.replace(gravity_copy_cos=0.0), gv.GravityContext(ids=ids))
    hit = torch.zeros_like(g, dtype=torch.bool)
    hit[want] = True
    assert torch.all(g[hit] <= 0) and float(free[100]) > 0
    assert torch.equal(g[~hit], free[~hit])
    assert torch.equal(g[hit & (free <= 0)], free[hit & (free <= 0)])  # no reward, no penalty


def test_attract_only_pulls_above_the_floor_and_pushes_nothing(tiny_lm):
    ids = torch.tensor([100, 200, 300])
    p = PruneParams(
        gravity_kind="pull",
        gravity_anchor="context",
        gravity_skip_template=False,
        gravity_sinks=0,
        gravity_mass="uniform",
        gravity_ngram=0,
        gravity_copy_cos=0.0,
        gravity_attract_only=False,
    )
    signed = gv.gravity_for_step(tiny_lm.model, p, gv.GravityContext(ids=ids))
    att = gv.gravity_for_step(
        tiny_lm.model,
        p.replace(gravity_attract_only=True, gravity_floor=1.5),
        gv.GravityContext(ids=ids),
    )
    assert torch.equal(att, (signed - 1.5).clamp_min(0.0))
    assert float(att.min()) == 0.0 and float((att > 0).float().mean()) < 0.2


def test_contrast_is_the_log_ratio_of_full_and_short(tiny_lm):
    ids = torch.tensor(encode_prompt(tiny_lm, PROMPT, chat=True))
    model = tiny_lm.model
    with torch.no_grad():
        full = model(ids[None]).logits[0, -1].float()
        short = model(ids[None, -4:]).logits[0, -1].float()
    p = PruneParams(gravity_kind="contrast", gravity_contrast_k=4, gravity_ngram=0)
    g = gv.gravity_for_step(model, p, gv.GravityContext(ids=ids), logits=full)
    want = torch.log_softmax(full, -1) - torch.log_softmax(short, -1)
    torch.testing.assert_close(g, want, atol=1e-4, rtol=1e-4)
