"""entropix's adaptive temperature: the formula on a hand-made step, and the same temperature
from the decoder, ``generate()`` and replay on every family.

``T = clip(T0·(1 + a·(H + V) + b·(H_attn + V_attn) − c·agreement), t_min, t_max)``, every term
in bits: the raw logits' entropy and varentropy, and the last layer's attention entropy
(mean over heads), its variance over heads and the heads' agreement.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LogitsProcessor

from semviz import Decoder, DecodeSettings, PruneParams
from semviz import processors as sp
from semviz.analysis.replay import replay
from semviz.model.capture import attention_metrics
from semviz.sampling import AttentionReading, attention_reading, prune

PROMPT = "The capital of France is"
# gains that keep the tiny models' temperatures inside the clip, so that the rule is seen
P = PruneParams(
    temperature=0.7,
    adaptive="entropix",
    entropix_logits_gain=0.05,
    entropix_attention_gain=0.1,
    entropix_agreement_gain=0.5,
    adaptive_t_max=5.0,
)


def test_the_temperature_is_entropixs_formula_on_a_hand_made_step():
    # two heads over three keys: one spread (1.5 bits), one on the first key (0 bits)
    att = torch.tensor([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]]).view(1, 1, 2, 3)
    m = attention_metrics(att, torch.zeros(1, 1, 2), torch.tensor([[3]]))  # (4, 1, 1, 2)
    reading = attention_reading(m[0, 0, 0], m[2, 0, 0])
    # mean row (0.75, 0.125, 0.125): each head is 0.25 + 0.125 + 0.125 away, over 3 keys
    assert reading.entropy == pytest.approx(0.75, abs=1e-6)
    assert reading.spread == pytest.approx(0.75**2, abs=1e-6)  # heads at 1.5 and 0 bits
    assert reading.agreement == pytest.approx(0.5 / 3, abs=1e-6)

    x = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = [math.exp(v) for v in x.tolist()]
    p = [v / sum(p) for v in p]
    h = -sum(q * math.log2(q) for q in p)
    v = sum(q * (math.log2(q) + h) ** 2 for q in p)
    want = 0.7 * (1 + 0.05 * (h + v) + 0.1 * (0.75 + 0.5625) - 0.5 * 0.5 / 3)
    res = prune(x, P, attention=reading)
    assert res.temperature == pytest.approx(want, rel=1e-6)
    torch.testing.assert_close(res.probs, torch.softmax(x / want, -1), atol=1e-6, rtol=0)
    # the clip, and entropix's own gains
    capped = prune(x, P.replace(adaptive_t_max=0.8), attention=reading)
    assert capped.temperature == pytest.approx(0.8)
    own = prune(x, PruneParams(temperature=0.7, adaptive="entropix"), attention=reading)
    assert own.temperature == pytest.approx(
        min(2.0, 0.7 * (1 + 0.3 * (h + v) + 0.2 * (0.75 + 0.5625) - 0.2 * 0.5 / 3)), rel=1e-6
    )


def test_without_the_attention_it_refuses_in_one_sentence():
    with pytest.raises(ValueError, match="reads the attention metrics of the step's own query"):
        prune(torch.tensor([1.0, 0.0]), P)
    with pytest.raises(ValueError, match=r"capture_attention\(model, lens=True\)"):
        sp.EntropyAdaptiveTemperatureLogitsWarper("entropix", 0.7)
    with pytest.raises(ValueError, match="`logits_gain`=-1"):
        sp.EntropyAdaptiveTemperatureLogitsWarper("target", logits_gain=-1.0)
    from semviz.frontier.batched import SeededSampler

    with pytest.raises(ValueError, match="which a batched sweep does not capture"):
        SeededSampler([0], P)


def test_a_decoder_that_does_not_record_the_attention_refuses_before_any_step(tiny_lm):
    off = DecodeSettings(chat=False, max_new_tokens=2, lens=False)
    with pytest.raises(ValueError, match=r"does not record them \(lens off\)"):
        Decoder(tiny_lm, PROMPT, P, off)
    d = Decoder(tiny_lm, PROMPT, PruneParams(temperature=0.7), off)
    assert d.step() is not None
    with pytest.raises(ValueError, match=r"does not record them \(lens off\)"):
        d.rewind(0, P)
    assert d.n_steps == 1 and d.params == PruneParams(temperature=0.7)  # kept as it was
    # its trace holds no metrics, so a what-if with the rule cannot be replayed either
    assert d.trace.steps[0].attn_metrics is None
    with pytest.raises(ValueError, match="or an older trace"):
        replay(d.trace, P)


def _decoder(lm, params: PruneParams, tokens: list[int] | None = None, n: int = 6) -> Decoder:
    """``n`` steps, sampled with seed 0, or taking ``tokens``."""
    d = Decoder(lm, PROMPT, params, DecodeSettings(chat=False, max_new_tokens=n, seed=0))
    d.eos_ids = set()
    for i in range(n):
        d.step(None if tokens is None else tokens[i])
    return d


def _formula(rec, params: PruneParams) -> float:
    """The temperature from the record's own numbers, written out again."""
    h, v = rec.entropy / math.log(2), rec.varentropy / math.log(2) ** 2
    ent = rec.attn_metrics["entropy"][-1].double() / math.log(2)  # (H,) bits, the last layer
    agree = float(rec.attn_metrics["agreement"][-1].double().mean())
    attn = float(ent.mean()) + float(((ent - ent.mean()) ** 2).mean())
    t = params.temperature * (
        1
        + params.entropix_logits_gain * (h + v)
        + params.entropix_attention_gain * attn
        - params.entropix_agreement_gain * agree
    )
    return min(max(t, params.adaptive_t_min), params.adaptive_t_max)


class _Temperatures(LogitsProcessor):
    """After the warper: the temperatures of each of its calls."""

    def __init__(self, warper) -> None:
        self.warper, self.seen = warper, []

    def __call__(self, input_ids, scores):
        self.seen.append(float(self.warper.last_temperatures[0]))
        return scores


def test_decoder_generate_and_replay_give_the_same_temperatures(family_lm):
    # the decoder: each step's temperature is the formula on its own record
    live = _decoder(family_lm, P)
    temps = [rec.temperature for rec in live.trace.steps]
    assert temps == pytest.approx([_formula(rec, P) for rec in live.trace.steps], rel=1e-6)
    assert max(temps) - min(temps) > 0.01, "the rule should move the temperature"
    assert P.adaptive_t_min < min(temps) and max(temps) < P.adaptive_t_max

    # replay: a run recorded without the rule, replayed with it, has the temperatures a
    # decode with the rule has on the same tokens
    plain = _decoder(family_lm, PruneParams(temperature=0.7))
    w = replay(plain.trace, P)
    along = _decoder(family_lm, P, plain.trace.token_ids)
    want = [rec.temperature for rec in along.trace.steps]
    assert [r.temperature for r in w.results] == pytest.approx(want, rel=1e-6)
    assert w.token_ids[0] == live.trace.token_ids[0]  # step 0's context is the same prompt

    # generate(): the warper with an attention sink, greedy, against the decoder on its tokens
    model = family_lm.model
    ids = torch.tensor([family_lm.tokenizer(PROMPT)["input_ids"]])
    with sp.capture_attention(model, lens=True) as sink:
        warper = sp.EntropyAdaptiveTemperatureLogitsWarper(
            "entropix",
            0.7,
            logits_gain=0.05,
            attention_gain=0.1,
            agreement_gain=0.5,
            t_max=5.0,
            attention_sink=sink,
        )
        spy = _Temperatures(warper)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=6,  # no min_new_tokens: its end-of-text mask would run first
                logits_processor=[warper, spy],
                pad_token_id=0,
            )
    tokens = out[0, ids.shape[1] :].tolist()
    assert len(tokens) == len(spy.seen) >= 3
    forced = _decoder(family_lm, P, tokens, n=len(tokens))
    assert spy.seen == pytest.approx([rec.temperature for rec in forced.trace.steps], rel=1e-5)


def test_the_reading_is_in_bits_and_its_spread_is_over_heads():
    r = attention_reading(torch.tensor([0.0, 2 * math.log(2)]), torch.tensor([0.2, 0.4]))
    assert isinstance(r, AttentionReading)
    assert (r.entropy, r.spread, r.agreement) == pytest.approx((1.0, 1.0, 0.3), abs=1e-7)
