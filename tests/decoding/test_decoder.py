"""The instrumented decoder on the tiny random Llama: shapes, stops, isolation, rewind."""

from __future__ import annotations

import pytest
import torch

from semviz.decoding.decoder import (
    Decoder,
    DecodeSettings,
    PromptError,
    encode_prompt,
    top_candidates,
)
from semviz.sampling import PruneParams

PROMPT = "The lighthouse keeper climbed the stairs"


def make(lm, prompt=PROMPT, params=None, **kw):
    return Decoder(lm, prompt, params or PruneParams(), DecodeSettings(**kw))


def test_step_records_have_documented_shapes(tiny_lm):
    d = make(tiny_lm, max_new_tokens=5, record_k=256, seed=3)
    recs = d.run(5)
    cfg = tiny_lm.model.config
    n_prompt = len(d.prompt_ids)
    assert len(recs) == 5 and d.stop_reason == "max_new_tokens"
    for i, r in enumerate(recs):
        S = n_prompt + i  # tokens fed when these logits were computed
        assert r.index == i and r.position == n_prompt + i
        # the raw top 256, plus the chosen token if sampling went below them
        K = r.cand_ids.shape[0]
        assert K in (256, 257) and r.cand_ids.dtype == torch.int32
        assert r.cand_logits.shape == (K,) and r.cand_logits.dtype == torch.float32
        assert r.chosen_rank >= 0 and int(r.cand_ids[r.chosen_rank]) == r.token_id
        assert torch.all(r.cand_logits[:-1] >= r.cand_logits[1:])
        assert r.top_ids.shape == (64,) and r.top_probs.shape == (64,)
        assert r.attention.shape == (cfg.num_hidden_layers, cfg.num_attention_heads, S)
        assert torch.allclose(r.attention.float().sum(-1), torch.ones(2, 4), atol=2e-3)
        assert r.cache_positions.tolist() == list(range(S))
        assert r.cache_len == S
        # 2 (K and V) · layers · kv_heads · head_dim · 4 bytes per cached token
        assert r.cache_bytes == 2 * 2 * 2 * 16 * 4 * S
        assert set(r.stage_probs) >= {"raw", "final"}
        assert all(p.shape == (K,) for p in r.stage_probs.values())
        assert r.entropy > 0 and r.varentropy >= 0
        assert 0.0 <= r.u < 1.0 and r.t_forward > 0 and r.t_semviz > 0
        assert r.token_text == tiny_lm.tokenizer.decode([r.token_id])
        # the recorded raw probabilities are exact: top-K mass + tail mass = 1
        total = torch.logsumexp(torch.cat([r.cand_logits, torch.tensor([r.tail_lse])]), 0)
        assert float(total) == pytest.approx(r.lse, abs=1e-4)


def test_greedy_logits_match_a_plain_forward(tiny_lm):
    d = make(tiny_lm, PROMPT, PruneParams(temperature=0.0), max_new_tokens=6)
    d.run(6)
    ids = torch.tensor([d.prompt_ids + d.trace.token_ids])
    with torch.no_grad():
        logits = tiny_lm.model(ids).logits[0].float()  # (T, V)
    n = len(d.prompt_ids)
    for i, r in enumerate(d.trace.steps):
        ref = logits[n - 1 + i]
        assert r.token_id == int(torch.argmax(ref))
        assert torch.allclose(ref[r.cand_ids.long()], r.cand_logits, atol=1e-4)


def test_captured_attention_equals_eager_last_row(tiny_lm):
    d = make(tiny_lm, max_new_tokens=3)
    d.run(3)
    ids = torch.tensor([d.prompt_ids + d.trace.token_ids[:-1]])
    model = tiny_lm.model
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            att = model(ids, output_attentions=True).attentions  # L × (1, H, T, T)
    finally:
        model.set_attn_implementation("semviz_sdpa")
    last = torch.stack([a[0, :, -1, :] for a in att])  # (L, H, T)
    assert torch.allclose(d.trace.steps[-1].attention.float(), last, atol=1e-3)


def test_stop_on_eos_and_stop_string(tiny_lm):
    first = make(tiny_lm, params=PruneParams(temperature=0.0), max_new_tokens=8)
    tok = first.step().token_id
    d = make(tiny_lm, params=PruneParams(temperature=0.0), max_new_tokens=8)
    d.eos_ids = {tok}
    d.run(8)
    assert d.n_steps == 1 and d.stop_reason == "eos" and d.done
    assert d.step() is None

    ref = make(tiny_lm, params=PruneParams(temperature=0.0), max_new_tokens=6)
    ref.run(6)
    stop = ref.trace.steps[2].token_text
    assert stop.strip(), "need a visible token to stop on"
    d = make(tiny_lm, params=PruneParams(temperature=0.0), max_new_tokens=6, stop=(stop,))
    d.run(6)
    first_hit = next(
        i
        for i in range(6)
        if stop
        in "".join(ref.trace.text[: len("".join(s.token_text for s in ref.trace.steps[: i + 1]))])
    )
    assert d.n_steps == first_hit + 1 and d.stop_reason == f"stop:{stop}"


def test_two_interleaved_decoders_match_each_run_alone(tiny_lm):
    pa = PruneParams(temperature=1.0, top_p=0.95)
    pb = PruneParams(temperature=0.7, top_k=20)
    alone_a = make(tiny_lm, PROMPT, pa, seed=1, max_new_tokens=10)
    alone_a.run(10)
    alone_b = make(tiny_lm, "Once upon a time", pb, seed=2, max_new_tokens=10)
    alone_b.run(10)
    a = make(tiny_lm, PROMPT, pa, seed=1, max_new_tokens=10)
    b = make(tiny_lm, "Once upon a time", pb, seed=2, max_new_tokens=10)
    for _ in range(10):
        a.step()
        b.step()
    assert a.trace.token_ids == alone_a.trace.token_ids
    assert b.trace.token_ids == alone_b.trace.token_ids
    assert a.trace.token_ids != b.trace.token_ids


def test_seed_changes_samples(tiny_lm):
    runs = []
    for seed in (0, 0, 1):
        d = make(tiny_lm, params=PruneParams(temperature=1.0), seed=seed, max_new_tokens=12)
        d.run(12)
        runs.append(d.trace.token_ids)
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_rewind_then_continue_reproduces_the_run(tiny_lm):
    p = PruneParams(temperature=1.0, top_p=0.9)
    d = make(tiny_lm, params=p, seed=5, max_new_tokens=12)
    d.run(12)
    full = d.trace.token_ids
    d.rewind(4)
    assert d.trace.token_ids == full[:4] and not d.done
    d.run(12)
    assert d.trace.token_ids == full
    d.rewind(0)
    d.run(12)
    assert d.trace.token_ids == full


def test_rewind_with_new_params_changes_only_the_tail(tiny_lm):
    d = make(tiny_lm, params=PruneParams(temperature=1.0), seed=9, max_new_tokens=10)
    d.run(10)
    head = d.trace.token_ids[:5]
    d.rewind(5, PruneParams(temperature=0.0))
    d.run(10)
    assert d.trace.token_ids[:5] == head
    greedy = make(tiny_lm, params=PruneParams(temperature=0.0), max_new_tokens=10)
    greedy.run(1)
    assert d.trace.settings["params"]["temperature"] == 0.0


def test_bad_prompts_get_one_clear_sentence(tiny_lm):
    with pytest.raises(PromptError, match="The prompt is empty"):
        make(tiny_lm, "   ")
    long = "word " * 600  # the tiny model reads at most 512 tokens
    with pytest.raises(PromptError, match=r"tokens, and .* reads at most 512 with the token"):
        make(tiny_lm, long)
    # exactly the context: no room for the token it writes
    ids = [int(i) for i in tiny_lm.tokenizer("word " * 600, add_special_tokens=False)["input_ids"]]
    exact = tiny_lm.tokenizer.decode(ids[:512])
    assert len(encode_prompt(tiny_lm, tiny_lm.tokenizer.decode(ids[:511]), chat=False)) == 511
    with pytest.raises(PromptError) as e:
        encode_prompt(tiny_lm, exact, chat=False)
    assert str(e.value).startswith("The prompt is 512 tokens, and ")
    assert str(e.value).endswith(
        "reads at most 512 with the token it writes: shorten it to 511 tokens or fewer."
    )
    # characters are counted before tokenising: 16 a token the model reads
    with pytest.raises(PromptError, match=r"^The prompt is 8,193 characters, more than the 8,192"):
        encode_prompt(tiny_lm, "x" * 8193)
    with pytest.raises(
        PromptError,
        match=r"^The prompt holds a lone surrogate \(U\+D800 at "
        r"character 3\), which is not text: remove it\.$",
    ):
        make(tiny_lm, "abc\ud800def")
    with pytest.raises(PromptError, match=r"^The system prompt holds a lone surrogate"):
        encode_prompt(tiny_lm, "hi", system_prompt="\udfff")


def test_chat_template_is_on_by_default_for_chat_models(tiny_lm):
    plain = encode_prompt(tiny_lm, "hi", chat=False)
    chat = encode_prompt(tiny_lm, "hi")
    assert tiny_lm.is_chat and len(chat) > len(plain)
    assert tiny_lm.tokenizer.decode(chat).count("<|im_start|>") >= 2


def test_top_candidates_equals_stable_sort_with_ties():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        V = int(torch.randint(2, 200, (1,), generator=g))
        k = int(torch.randint(1, V + 2, (1,), generator=g))
        x = torch.randint(-2, 3, (V,), generator=g).float()
        ids, tail = top_candidates(x, k)
        order = torch.sort(x, descending=True, stable=True).indices
        assert torch.equal(ids, order[:k])
        rest = order[k:]
        want = float(torch.logsumexp(x[rest], 0)) if rest.numel() else float("-inf")
        assert tail == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(
    "mass, space, sim",
    [
        ("attention", "embedding", "cosine"),
        ("idf", "embedding", "dot"),
        ("uniform", "hidden", "cosine"),
    ],
)
def test_fused_gravity_equals_the_core(tiny_lm, mass, space, sim):
    """The decoder's G (one matmul with the LM head) equals gravity.gravity_for_step."""
    from semviz import gravity

    # the first gravity (every cached position pulls), as the reference below builds it
    p = PruneParams(temperature=1.0, gravity_lambda=1.0, **gravity.FIRST_GRAVITY).replace(
        gravity_mass=mass, gravity_space=space, gravity_sim=sim
    )
    d = make(tiny_lm, params=p, seed=2, max_new_tokens=3)
    assert gravity.fuses_with_lm_head(tiny_lm.model, space)
    d.run(3)
    rec = d.trace.steps[-1]
    n = len(d.prompt_ids) + 2  # positions fed when step 2's logits were computed
    ids = torch.tensor(d.ids[:n])
    ref = gravity.gravity_for_step(
        tiny_lm.model,
        p,
        context_ids=ids,
        attention=rec.attention.float(),
        hidden=d.hidden[:n],
    )  # (V,)
    assert torch.allclose(rec.gravity, ref[rec.cand_ids.long()], atol=2e-3)
