"""Every family: the decoder equals ``generate()``, capture equals eager attention, gravity
equals the core, replay reproduces the run, and eviction equals a masked full forward.

Families (tests/conftest.py ``FAMILIES``): Llama; Qwen2 (q/k/v biases, untied LM head);
Gemma (embeddings scaled by sqrt(d), (1 + w) RMSNorm, multi-query attention); GPT-2 (learned
absolute positions added at the input, no RoPE, Conv1D projections, its own attention module);
Gemma 3 (a sliding-window layer, RoPE per layer type, q/k norms, another softmax scale).
Where a family cannot do something (re-rotation without RoPE, eviction with sliding windows),
the test checks the one sentence semviz refuses with.
"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from semviz import eviction as ev
from semviz import gravity
from semviz.analysis.replay import recompute_gravity, replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.model.capture import AttentionSink, capturing
from semviz.model.load import require_rope, uses_rope
from semviz.sampling import PruneParams
from tests.eviction.test_exactness import (
    _IMPL,
    CASES,
    N,
    _layer0_keys,
    _reference_logits,
    _rerotated_layer0,
    _run,
)
from tests.families.conftest import REROTATABLE, ROPE, SLIDING

PROMPT = "The lighthouse keeper climbed the stairs"
KV_HEADS = {"llama": 2, "qwen2": 2, "gemma": 1, "gpt2": 4, "gemma3": 2}


def _eager(family_dir) -> torch.nn.Module:
    """A private copy of the family's model whose attention returns its weights."""
    return AutoModelForCausalLM.from_pretrained(
        family_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def test_summary_reads_every_family(family, family_lm):
    s = family_lm.summary()
    assert (s["num_layers"], s["num_heads"], s["head_dim"], s["hidden_size"]) == (2, 4, 16, 64)
    assert s["num_kv_heads"] == KV_HEADS[family]
    assert s["max_context"] == family_lm.max_context == 512
    assert s["vocab_size"] == len(family_lm.tokenizer)
    assert s["rope"] is (family in ROPE) is uses_rope(family_lm.model)
    assert s["sliding_window"] == SLIDING.get(family)
    # the decoder's cache holds exactly what the summary says a token costs
    d = Decoder(family_lm, PROMPT, PruneParams(temperature=0.0), DecodeSettings(max_new_tokens=1))
    rec = d.step()
    per_token = 2 * s["num_layers"] * s["num_kv_heads"] * s["head_dim"] * 4
    assert rec.cache_bytes == per_token * rec.cache_len
    # sliding-window layers too: the chat prompt is longer than the window
    assert rec.cache_len == len(d.prompt_ids) > (s["sliding_window"] or 0)


@pytest.mark.parametrize("chat", [False, True])
def test_greedy_decoder_equals_generate(family_lm, chat):
    n = 10
    d = Decoder(
        family_lm, PROMPT, PruneParams(temperature=0.0), DecodeSettings(max_new_tokens=n, chat=chat)
    )
    d.run(n)
    ids = torch.tensor([d.prompt_ids])
    with torch.inference_mode():
        out = family_lm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            return_dict_in_generate=True,
            output_logits=True,
        )
    want = out.sequences[0, ids.shape[1] :].tolist()
    assert d.trace.token_ids == want
    assert len(set(want)) > 2, "the tiny model should not just repeat one token"
    for rec, lg in zip(d.trace.steps, out.logits, strict=True):
        ref = lg[0].float()  # (V,) raw logits, before any processor
        torch.testing.assert_close(rec.cand_logits, ref[rec.cand_ids.long()], atol=1e-4, rtol=0)
        lse = float(torch.logsumexp(ref, 0))
        assert rec.lse == pytest.approx(lse, abs=1e-4)


def test_captured_attention_equals_eager_last_row(family, family_lm, family_dir):
    """At prefill (a whole prompt) and at a cached step (one token onto a cache)."""
    model = family_lm.model
    ids = family_lm.tokenizer(PROMPT + " and looked out to sea.")["input_ids"]
    with torch.no_grad():
        eager = _eager(family_dir)(torch.tensor([ids]), output_attentions=True).attentions
    want = torch.stack([a[0, :, -1, :] for a in eager])  # (L, H, T)
    assert want.shape == (2, 4, len(ids))

    with capturing(model) as sink, torch.inference_mode():
        model(torch.tensor([ids]), semviz_sink=sink)
    torch.testing.assert_close(sink.stacked()[:, 0], want, atol=1e-5, rtol=0)

    cache = DynamicCache(config=model.config)
    step = AttentionSink()
    with torch.inference_mode():
        base = model.get_decoder()
        base(input_ids=torch.tensor([ids[:-1]]), cache=cache, use_cache=True)
        pos = torch.tensor([[len(ids) - 1]])
        base(input_ids=torch.tensor([ids[-1:]]), position_ids=pos, cache=cache, semviz_sink=step)
    torch.testing.assert_close(step.stacked()[:, 0], want, atol=1e-5, rtol=0)
    # attention is not flat: the checks above compare something
    assert float(want.max()) > 2.0 / len(ids)
    if family in SLIDING:  # layer 0 slides: the prompt reaches past its window
        w = SLIDING[family]
        assert len(ids) > w and float(want[0, :, : len(ids) - w].abs().max()) == 0.0
        assert float(want[1, :, : len(ids) - w].min()) > 0.0


def _is_tied(model) -> bool:
    out = model.get_output_embeddings().weight
    return model.get_input_embeddings().weight.data_ptr() == out.data_ptr()


@pytest.mark.parametrize(
    "mass, space, sim",
    [
        ("idf", "embedding", "cosine"),
        ("uniform", "embedding", "dot"),
        ("attention", "embedding", "cosine"),
        ("idf", "hidden", "cosine"),
        ("attention", "hidden", "dot"),
    ],
)
def test_decoder_gravity_equals_the_core(family, family_lm, mass, space, sim):
    """The decoder's G (fused with the LM head when the head's weight is the candidate
    matrix, separate otherwise) equals ``gravity.gravity_for_step`` on the same context."""
    model = family_lm.model
    assert _is_tied(model) is (family != "qwen2")
    assert gravity.fuses_with_lm_head(model, space) is (space == "hidden" or _is_tied(model))
    # the first gravity (every cached position pulls), as the reference below builds it
    p = PruneParams(temperature=1.0, gravity_lambda=1.0, **gravity.FIRST_GRAVITY).replace(
        gravity_mass=mass, gravity_space=space, gravity_sim=sim
    )
    d = Decoder(family_lm, PROMPT, p, DecodeSettings(seed=2, max_new_tokens=3))
    d.run(3)
    rec = d.trace.steps[-1]
    n = len(d.prompt_ids) + 2  # positions fed when step 2's logits were computed
    ids = torch.tensor(d.ids[:n])
    # the last query's float32 attention over those positions, from a plain capture
    with capturing(model) as sink, torch.inference_mode():
        model(ids[None], semviz_sink=sink)
    attn = sink.stacked()[:, 0]  # (L, H, n)
    ref = gravity.gravity_for_step(model, p, context_ids=ids, attention=attn, hidden=d.hidden[:n])
    torch.testing.assert_close(rec.gravity, ref[rec.cand_ids.long()], atol=1e-4, rtol=0)
    # the hidden states gravity reads are the LM head's input, in every family
    with torch.inference_mode():
        logits = model.get_output_embeddings()(d.hidden[n - 1]).float()  # (V,)
    torch.testing.assert_close(rec.cand_logits, logits[rec.cand_ids.long()], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "params",
    [
        # a random model's distribution is nearly flat: top-k keeps the kept set inside the
        # recorded candidates, where replay is exact
        PruneParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01),
        PruneParams(
            temperature=1.0,
            top_p=0.9,
            gravity_lambda=0.8,
            gravity_mass="idf",
            gravity_mode="rerank",
        ),
    ],
)
def test_replay_at_the_recorded_settings_reproduces_the_picks(family_lm, params):
    d = Decoder(family_lm, PROMPT, params, DecodeSettings(max_new_tokens=16, seed=3))
    d.run(16)
    r = replay(d.trace, params, model=family_lm.model)
    assert r.token_ids == d.trace.token_ids and r.first_diff is None
    if params.gravity_lambda:
        # replay's own gravity, recomputed from the model, equals the recorded one
        again = recompute_gravity(family_lm.model, d.trace, params)
        for rec, g in zip(d.trace.steps, again, strict=True):
            torch.testing.assert_close(g, rec.gravity, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def lm64(family_dir):
    """The family's model in float64, so float32 rounding cannot hide or fake a mismatch."""
    import semviz

    return semviz.load_model(str(family_dir), dtype=torch.float64, device="cpu")


@pytest.fixture(scope="module")
def masked_model(family_dir):
    """A float64 copy of the family's model whose attention takes one boolean mask per layer."""
    return AutoModelForCausalLM.from_pretrained(
        family_dir, dtype=torch.float64, attn_implementation=_IMPL
    ).eval()


@pytest.fixture(scope="module")
def evict_ids(lm64) -> list[int]:
    text = "It is a truth universally acknowledged, that a single man in possession of a " * 8
    return lm64.tokenizer(text, add_special_tokens=False)["input_ids"][:N]


@pytest.fixture(scope="module")
def unmasked(masked_model, evict_ids) -> torch.Tensor:
    """(N, V) the oracle's logits with nothing evicted."""
    return _reference_logits(masked_model, evict_ids, [])


def _eviction_refusal(lm, family: str) -> str:
    return (
        f"KV-cache eviction needs every layer to attend to the whole cache, and {lm.name} "
        f"({type(lm.model).__name__}) has sliding-window layers ({SLIDING[family]} tokens) whose "
        "window would count cache entries instead of positions once entries are evicted: use "
        "the full cache for this model."
    )


@pytest.mark.parametrize("name", list(CASES))
def test_eviction_equals_a_masked_full_forward(
    family, lm64, masked_model, evict_ids, unmasked, name
):
    """Dropping cache entries is exact in every family without sliding windows: RoPE keys
    carry their rotation, and GPT-2's keys carry the learned position added at the input, so
    the next forward only needs the true ``position_ids`` for its own token. A model with
    sliding-window layers refuses any policy that evicts."""
    ids = evict_ids
    policy = ev.make_policy(name, **CASES[name])
    if family in SLIDING and name != "full":
        sentence = _eviction_refusal(lm64, family)
        with pytest.raises(ValueError, match=f"^{re.escape(sentence)}$"):
            next(ev.teacher_force(lm64, ids, [policy]))
        return
    (got,), (events,), _ = _run(lm64, ids, [policy], prefill=8)
    if family in SLIDING:  # the oracle's masks have no window: compare with the model itself
        with torch.no_grad():
            ref = lm64.model(torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        return
    assert sum(int((e["evicted"] >= 0).sum()) for e in events) > 0 or name == "full"
    ref = _reference_logits(masked_model, ids, events)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    if name != "full":  # the oracle's mask matters
        assert (got - unmasked).abs().max() > 1e-3


def test_rerotation_where_there_is_rope_and_one_sentence_where_not(family, family_lm):
    ids = list(range(1000, 1040))
    if family in REROTATABLE:
        keys, kept = _rerotated_layer0(family_lm, ids, budget=10)
        assert kept.tolist() == [0, 1, 2, 3, 34, 35, 36, 37, 38, 39]
        target = len(ids) - kept.numel() + torch.arange(kept.numel())  # 30, 31, ..., 39
        want = _layer0_keys(family_lm, [ids[p] for p in kept.tolist()], target)
        torch.testing.assert_close(keys, want, atol=1e-5, rtol=0)
        return
    if family in SLIDING:
        sentence = _eviction_refusal(family_lm, family)
        per_layer = (
            "Key re-rotation needs rotary position embeddings (RoPE) with one set of frequencies "
            f"over every key dimension, and {family_lm.name} ({type(family_lm.model).__name__}) "
            "uses partial or per-layer RoPE: turn it off for this model."
        )
        with pytest.raises(ValueError, match=f"^{re.escape(per_layer)}$"):
            require_rope(family_lm)
    else:
        sentence = (
            "Key re-rotation needs rotary position embeddings (RoPE) with one set of frequencies "
            f"over every key dimension, and {family_lm.name} (GPT2LMHeadModel) has none: turn it "
            "off for this model."
        )
    policy = ev.make_policy("streaming", budget=10, rerotate=True)
    with pytest.raises(ValueError, match=f"^{re.escape(sentence)}$"):
        next(ev.teacher_force(family_lm, ids, [policy]))
    with pytest.raises(ValueError, match=f"^{re.escape(sentence)}$"):
        Decoder(family_lm, PROMPT, PruneParams(), DecodeSettings(), eviction=policy)
    if family in SLIDING:
        return
    # without re-rotation the same policy runs
    d = Decoder(
        family_lm,
        PROMPT,
        PruneParams(temperature=0.0),
        DecodeSettings(max_new_tokens=6),
        eviction=ev.make_policy("streaming", budget=6),
    )
    d.run(6)
    assert d.n_steps == 6 and d.trace.steps[-1].eviction["lengths"].tolist() == [6, 6]


@pytest.mark.parametrize("family", ["gpt2"], indirect=True)  # the family without RoPE
def test_cli_kv_eval_refuses_rerotation_without_rope(family, family_dir, capsys):
    from semviz.cli import main

    code = main(
        ["kv-eval", "--model", str(family_dir), "--tokens", "16", "--budget", "8", "--rerotate"]
        + ["--policies", "streaming", "--quiet", "--json"]
    )
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.startswith("semviz")]
    assert code == 2 and len(err) == 1 and not captured.out, captured
    assert err[0].startswith("semviz kv-eval: ")
    assert "Traceback" not in captured.err
    assert "Key re-rotation needs rotary position embeddings (RoPE)" in err[0]
    assert str(family_dir) in err[0]


@pytest.mark.parametrize("family", ["gpt2", "gemma3"], indirect=True)
def test_kv_eval_refuses_before_its_reference_pass(family, family_lm):
    ids = family_lm.tokenizer(PROMPT * 4, add_special_tokens=False)["input_ids"][:24]
    calls = []
    with pytest.raises(ValueError, match=re.escape(family_lm.name)):
        ev.kv_eval(
            family_lm,
            ids,
            ["full", "streaming"],
            [8],
            policy_kwargs={"streaming": {"rerotate": True}},
            on_progress=lambda *a: calls.append(a),
        )
    assert calls == []


def test_processors_in_generate_see_what_the_decoder_sees(family_lm, family_dir):
    """``capture_hidden`` finds the LM head's input in every family (GPT-2's is ``ln_f``'s
    output, Llama's ``norm``'s), and ``capture_attention`` equals eager's last row even
    where transformers' own cache keeps only a sliding layer's window."""
    from semviz import processors as sp

    model = family_lm.model
    ids = torch.tensor([family_lm.tokenizer(PROMPT)["input_ids"]])
    with sp.capture_attention(model) as sink, sp.capture_hidden(model) as hs:
        proc = sp.NarrativeGravityLogitsProcessor(model, 0.5, mass="attention", attention_sink=sink)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=3,
                logits_processor=[proc],
                return_dict_in_generate=True,
                output_logits=True,
            )
        h = hs.get()  # (1, T, d)
        attn = sink.stacked()[:, 0]  # (L, H, T) the last forward's
    seq = out.sequences[0]
    assert h.shape == (1, seq.numel() - 1, 64) and proc.last_gravity.shape[0] == 1
    assert not model.get_decoder()._forward_hooks and not model._forward_pre_hooks
    with torch.inference_mode():
        logits = model.get_output_embeddings()(h[0, -1]).float()
    torch.testing.assert_close(logits, out.logits[-1][0].float(), atol=1e-4, rtol=0)
    with torch.no_grad():
        eager = _eager(family_dir)(seq[None, :-1], output_attentions=True).attentions
    want = torch.stack([a[0, :, -1, :] for a in eager])  # (L, H, T)
    torch.testing.assert_close(attn, want, atol=1e-5, rtol=0)


def test_soft_capping_gemma2_is_refused_in_one_sentence(tmp_path, tokenizer_dir):
    import semviz
    from semviz.model.load import ModelLoadError
    from tests.conftest import save_tiny

    path = str(save_tiny("gemma2", tmp_path / "gemma2", tokenizer_dir))
    sentence = (
        f"Could not load model {path!r}: Gemma2ForCausalLM soft-caps its logits "
        "(attn_logit_softcapping, final_logit_softcapping), which semviz's attention capture "
        "and decoder do not reproduce; choose a model without soft-capping."
    )
    with pytest.raises(ModelLoadError, match=f"^{re.escape(sentence)}$"):
        semviz.load_model(path, device="cpu")
