"""The processors validate, never touch their input, and run inside generate with batches."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor, LogitsProcessorList

from semviz import processors as sp
from semviz.sampling import PruneParams, SamplerState, active_filters, choose, prune
from tests.core import reference as ref

NEG = float("-inf")


def all_processors(model=None, emb=None):
    emb = torch.randn(32, 8) if emb is None else emb
    return [
        sp.TemperatureLogitsWarper(0.7),
        sp.TopKLogitsWarper(5),
        sp.TopPLogitsWarper(0.8),
        sp.MinPLogitsWarper(0.1),
        sp.TypicalLogitsWarper(0.9),
        sp.EpsilonLogitsWarper(0.01),
        sp.EtaLogitsWarper(0.01),
        sp.FreeEnergyLogitsWarper(1.0),
        sp.EntropyAdaptiveTemperatureLogitsWarper("target"),
        sp.EntropyAdaptiveTemperatureLogitsWarper("edt"),
        sp.EntropyAdaptiveTemperatureLogitsWarper("dynatemp"),
        sp.MirostatLogitsWarper(2.0),
        sp.NarrativeGravityLogitsProcessor(embedding=emb, gravity_lambda=1.0, mass="idf"),
        sp.NarrativeGravityLogitsProcessor(
            embedding=emb, gravity_lambda=1.0, mass="norm", mode="rerank", rerank_k=4
        ),
    ]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(0, 10_000))
def test_no_processor_modifies_its_input(b, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, 32, generator=g)
    scores[:, 3] = NEG
    ids = torch.randint(0, 32, (b, 6), generator=g)
    for proc in all_processors():
        s0, i0 = scores.clone(), ids.clone()
        out = proc(ids, scores)
        assert torch.equal(scores, s0) and torch.equal(ids, i0), type(proc).__name__
        assert out.shape == scores.shape and out is not scores
        assert torch.isfinite(out).any(-1).all(), type(proc).__name__


@pytest.mark.parametrize(
    "make,arg",
    [
        (lambda: sp.TemperatureLogitsWarper(0.0), "temperature"),
        (lambda: sp.TopKLogitsWarper(0), "top_k"),
        (lambda: sp.TopPLogitsWarper(1.5), "top_p"),
        (lambda: sp.TopPLogitsWarper(0.5, min_tokens_to_keep=0), "min_tokens_to_keep"),
        (lambda: sp.MinPLogitsWarper(-0.1), "min_p"),
        (lambda: sp.TypicalLogitsWarper(1.0), "mass"),
        (lambda: sp.EpsilonLogitsWarper(0.0), "epsilon"),
        (lambda: sp.EtaLogitsWarper(1.0), "epsilon"),
        (lambda: sp.TopKLogitsWarper(3, tie_rule="random"), "tie_rule"),
        (lambda: sp.FreeEnergyLogitsWarper(-1.0), "kappa"),
        (lambda: sp.MirostatLogitsWarper(tau=0.0), "tau"),
        (lambda: sp.MirostatLogitsWarper(eta=-1.0), "eta"),
        (lambda: sp.EntropyAdaptiveTemperatureLogitsWarper("warm"), "mode"),
        (lambda: sp.EntropyAdaptiveTemperatureLogitsWarper(target_entropy=-1.0), "target_entropy"),
        (lambda: sp.NarrativeGravityLogitsProcessor(), "model"),
        (
            lambda: sp.NarrativeGravityLogitsProcessor(embedding=torch.eye(3), mass="attention"),
            "attention_sink",
        ),
        (
            lambda: sp.NarrativeGravityLogitsProcessor(embedding=torch.eye(3), mass="tfidf"),
            "gravity_mass",
        ),
        (
            lambda: sp.NarrativeGravityLogitsProcessor(embedding=torch.eye(3), sim="l2"),
            "gravity_sim",
        ),
        (
            lambda: sp.NarrativeGravityLogitsProcessor(embedding=torch.eye(3), rerank_k=0),
            "rerank_k",
        ),
    ],
)
def test_init_validates_and_names_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_gravity_lambda_zero_is_identity():
    proc = sp.NarrativeGravityLogitsProcessor(embedding=torch.randn(32, 8), gravity_lambda=0.0)
    s = torch.randn(2, 32)
    assert torch.equal(proc(torch.zeros(2, 3, dtype=torch.long), s), s)


def test_mirostat_updates_mu_from_the_chosen_token():
    w = sp.MirostatLogitsWarper(tau=1.0, eta=0.5)
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05]]))
    out = w(torch.tensor([[0], [0]]), scores)
    assert torch.equal(w.mu, torch.tensor([2.0, 2.0]))
    q = torch.softmax(out, -1)
    w(torch.tensor([[0, 1], [0, 0]]), scores)
    expect = 2.0 - 0.5 * (-torch.log2(torch.stack([q[0, 1], q[1, 0]])) - 1.0)
    torch.testing.assert_close(w.mu, expect)


def _generate(model, procs, batch=2, **kw):
    ids = torch.randint(3, 256, (batch, 6), generator=torch.Generator().manual_seed(1))
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=4,
        logits_processor=LogitsProcessorList(procs),
        pad_token_id=0,
        **kw,
    )
    assert out.shape == (batch, 10)
    return out


class Recorder(LogitsProcessor):
    """First in the list: keeps the raw scores generate hands to the processors (B, V)."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        self.rows.append(scores.detach().float().clone())
        return scores


class InverseCDF(LogitsProcessor):
    """Last in the list: picks each row's token by inverse CDF of the processed distribution
    with a uniform from its own seeded generator, and returns that token alone (0 there,
    -inf elsewhere), so generate's own multinomial draw can only take it. The core gets the
    same uniforms, so both sides sample with the same randomness."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.us: list[list[float]] = []
        self.probs: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        p = torch.softmax(scores.float(), -1)  # (B, V)
        us = torch.rand(scores.shape[0], generator=self.gen, dtype=torch.float64).tolist()
        out = torch.full_like(scores, NEG)
        for b, u in enumerate(us):
            out[b, ref.pick(p[b], u)] = 0.0
        self.us.append(us)
        self.probs.append(p)
        return out


SAME_CHAIN = [  # (processors, the same chain as core parameters)
    (lambda: [sp.TemperatureLogitsWarper(0.7)], dict(temperature=0.7)),
    (lambda: [sp.TopKLogitsWarper(5)], dict(top_k=5)),
    (lambda: [sp.TopKLogitsWarper(5, tie_rule="stable")], dict(top_k=5, tie_rule="stable")),
    (lambda: [sp.TopPLogitsWarper(0.8)], dict(top_p=0.8)),
    (lambda: [sp.MinPLogitsWarper(0.1)], dict(min_p=0.1)),
    (lambda: [sp.TypicalLogitsWarper(0.9)], dict(typical_p=0.9)),
    (lambda: [sp.EpsilonLogitsWarper(0.01)], dict(epsilon=0.01)),
    (lambda: [sp.EtaLogitsWarper(0.01)], dict(eta=0.01)),
    (lambda: [sp.FreeEnergyLogitsWarper(1.0)], dict(free_energy=True)),
    (lambda: [sp.EntropyAdaptiveTemperatureLogitsWarper("target")], dict(adaptive="target")),
    (lambda: [sp.EntropyAdaptiveTemperatureLogitsWarper("edt")], dict(adaptive="edt")),
    (lambda: [sp.EntropyAdaptiveTemperatureLogitsWarper("dynatemp")], dict(adaptive="dynatemp")),
    (
        lambda: [sp.TemperatureLogitsWarper(0.8), sp.MirostatLogitsWarper(tau=2.0)],
        dict(temperature=0.8, adaptive="mirostat", mirostat_tau=2.0),
    ),
    (
        lambda: [
            sp.TemperatureLogitsWarper(0.8),
            sp.TopKLogitsWarper(20),
            sp.TopPLogitsWarper(0.9),
            sp.MinPLogitsWarper(0.05),
            sp.EtaLogitsWarper(0.001),
        ],
        dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, eta=0.001),
    ),
]


def generate_and_replay(model, procs, params, seed=0, steps=6):
    """Tokens from generate with ``procs``, and the core's prune + choose on the same raw
    scores with the same uniforms: ``(generated (B, steps), core picks (B, steps),
    [(processed distribution (V,), the core's PruneResult)])``."""
    rec, pick = Recorder(), InverseCDF(seed)
    ids = torch.randint(3, 256, (2, 6), generator=torch.Generator().manual_seed(seed + 1))
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=steps,
        min_new_tokens=steps,
        logits_processor=LogitsProcessorList([rec, *procs, pick]),
        pad_token_id=0,
    )
    states = [SamplerState(), SamplerState()]
    core_picks, pairs = [], []
    for raw, us, probs in zip(rec.rows, pick.us, pick.probs, strict=True):
        row = []
        for b in range(2):
            r = prune(raw[b], params, state=states[b])
            row.append(choose(r, us[b], state=states[b]))
            pairs.append((probs[b], r))
        core_picks.append(row)
    return out[:, ids.shape[1] :], torch.tensor(core_picks).T, pairs


@pytest.mark.parametrize("make,kw", SAME_CHAIN, ids=[str(sorted(kw)) for _, kw in SAME_CHAIN])
def test_processors_in_generate_pick_the_cores_tokens(peaked_llama, make, kw):
    """Inside model.generate(do_sample=True) the processors sample exactly the tokens the
    core's prune + choose picks from the same logits with the same uniform draws."""
    params = PruneParams(**{"combine": "sequential", "tie_rule": "hf", **kw})
    for seed in (0, 1):
        generated, core_picks, pairs = generate_and_replay(peaked_llama, make(), params, seed)
        assert torch.equal(generated, core_picks), (generated, core_picks)
        for theirs, r in pairs:
            torch.testing.assert_close(theirs, r.probs, atol=1e-6, rtol=1e-5)
        if active_filters(params) or params.adaptive == "mirostat":  # the filters did cut
            assert any(r.n_kept < 256 for _, r in pairs)


# every context position may pull, no guards, signed z-score: the seed's plain potential
PLAIN = dict(
    kind="pull",
    anchor="context",
    sinks=0,
    skip_template=False,
    ngram=0,
    copy_cos=0.0,
    attract_only=False,
)


class Spy(LogitsProcessor):
    """After the processor under test: keeps its output, the ids it saw, and what the sinks
    held at that call (attention (L, B, H, S), hidden states (B, N, d))."""

    def __init__(self, sink=None, hidden=None) -> None:
        self.sink, self.hidden, self.calls = sink, hidden, []

    def __call__(self, input_ids, scores):
        att = None if self.sink is None else self.sink.stacked().float().clone()
        hs = None if self.hidden is None else self.hidden.get().clone()
        self.calls.append((input_ids.clone(), scores.detach().float().clone(), att, hs))
        return scores


def _in_generate(model, proc, sink=None, hidden=None):
    """``[(input_ids (B, N), raw scores (B, V), processed (B, V), attention, hidden)]``, one
    per step of a sampled generate with ``proc`` between a Recorder and a Spy."""
    rec, spy = Recorder(), Spy(sink, hidden)
    _generate(model, [rec, proc, spy])
    return [
        (ids, raw, out, a, h) for raw, (ids, out, a, h) in zip(rec.rows, spy.calls, strict=True)
    ]


def _zscore(g):
    g = g.double()
    return (g - g.mean()) / g.std(unbiased=False)


def _plain_pull(cand, ctx, mass):
    """``z(Σ_i m_i cos(w, t_i))`` over the candidates, by brute force. (V,) float64"""
    from tests.core.test_gravity import brute

    return _zscore(brute(cand, ctx, mass / mass.sum(), "cosine"))


def test_every_processor_runs_in_generate_as_the_core_does(tiny_llama):
    """Every processor but gravity has a twin in SAME_CHAIN, which samples the core's tokens in
    generate; gravity inside generate adds exactly λ·G, G from the seed's formula by brute
    force (idf and norm masses) or from the model run on the last k tokens (contrast)."""
    emb = tiny_llama.get_input_embeddings().weight.detach()
    twins = {type(p) for make, _ in SAME_CHAIN for p in make()}
    assert {type(p) for p in all_processors(emb=emb)} - twins == {
        sp.NarrativeGravityLogitsProcessor
    }

    def idf(ids):
        c = torch.tensor([(ids == t).sum() for t in ids], dtype=torch.float64)
        return torch.log((1.0 + ids.numel()) / (1.0 + c)) + 1.0

    def norm(ids):
        return emb[ids].double().norm(dim=-1)

    for mass, weigh, rerank in (("idf", idf, None), ("norm", norm, 4)):
        kw = {} if rerank is None else dict(mode="rerank", rerank_k=rerank)
        proc = sp.NarrativeGravityLogitsProcessor(
            embedding=emb, gravity_lambda=1.0, mass=mass, **PLAIN, **kw
        )
        for ids, raw, out, _, _ in _in_generate(tiny_llama, proc):
            for b in range(ids.shape[0]):
                g = _plain_pull(emb, emb[ids[b]], weigh(ids[b]))  # (V,)
                want = torch.log_softmax(raw[b].double(), -1) + g
                if rerank is not None:
                    keep = torch.zeros(256, dtype=torch.bool)
                    keep[torch.topk(raw[b], rerank).indices] = True
                    want = want.masked_fill(~keep, NEG)
                torch.testing.assert_close(out[b].double(), want, atol=1e-4, rtol=0)

    proc = sp.NarrativeGravityLogitsProcessor(
        tiny_llama, 0.5, kind="contrast", contrast_k=3, ngram=0
    )
    for ids, raw, out, _, _ in _in_generate(tiny_llama, proc):
        for b in range(ids.shape[0]):
            with torch.no_grad():
                short = tiny_llama(ids[b, -3:][None]).logits[0, -1]  # the last 3 tokens alone
            lp = torch.log_softmax(raw[b].double(), -1)
            want = lp + 0.5 * (lp - torch.log_softmax(short.double(), -1))
            torch.testing.assert_close(out[b].double(), want, atol=1e-4, rtol=0)


def test_attention_and_hidden_gravity_in_generate(tiny_llama):
    """Mass from the attention generate computed, and an EMA of it over the steps; context
    vectors from generate's own hidden states: each step's output is λ·G from the seed's
    formula by brute force, on what the sinks held at that step."""
    w = tiny_llama.get_output_embeddings().weight.detach()  # (V, d) the hidden space's rows
    emb = tiny_llama.get_input_embeddings().weight.detach()
    with sp.capture_attention(tiny_llama) as sink:
        a = sp.NarrativeGravityLogitsProcessor(
            tiny_llama, 0.5, mass="attention", attention_sink=sink, **PLAIN
        )
        steps = _in_generate(tiny_llama, a, sink=sink)
    for ids, raw, out, att, _ in steps:
        assert att.shape[:3] == (2, 2, 4) and att.shape[-1] == ids.shape[1]  # (L, B, H, N)
        for b in range(2):
            m = att[:, b].half().float().mean(dim=(0, 1))  # (N,) at the trace's precision
            want = torch.log_softmax(raw[b].double(), -1) + 0.5 * _plain_pull(emb, emb[ids[b]], m)
            torch.testing.assert_close(out[b].double(), want, atol=1e-4, rtol=0)

    with sp.capture_attention(tiny_llama) as sink, sp.capture_hidden(tiny_llama) as hs:
        e = sp.NarrativeGravityLogitsProcessor(
            tiny_llama,
            0.5,
            mass="ema",
            space="hidden",
            attention_sink=sink,
            hidden_sink=hs,
            mode="rerank",
            rerank_k=16,
            ema_decay=0.8,
            **PLAIN,
        )
        steps = _in_generate(tiny_llama, e, sink=sink, hidden=hs)
    ema = [None, None]
    for _, raw, out, att, h in steps:
        for b in range(2):
            now = att[:, b].half().float().mean(dim=(0, 1))  # (N,)
            prev = ema[b]
            if prev is not None:
                now = 0.8 * torch.cat([prev, torch.zeros(1)]) + 0.2 * now
            ema[b] = now
            g = _plain_pull(w, h[b], now)  # candidates: LM head rows; context: hidden states
            want = torch.log_softmax(raw[b].double(), -1) + 0.5 * g
            keep = torch.zeros(256, dtype=torch.bool)
            keep[torch.topk(raw[b], 16).indices] = True
            torch.testing.assert_close(
                out[b].double(), want.masked_fill(~keep, NEG), atol=1e-4, rtol=0
            )
    assert not tiny_llama._forward_pre_hooks and not tiny_llama.model._forward_hooks


def test_gravity_processor_matches_core(tiny_llama):
    """The processor's adjusted scores equal log P + λ·Ĝ from the core gravity."""
    from semviz.gravity import gravity_for_step

    ids = torch.tensor([[5, 6, 7, 7]])
    scores = torch.randn(1, 256)
    proc = sp.NarrativeGravityLogitsProcessor(tiny_llama, 0.7, kind="pull", mass="idf")
    p = PruneParams(gravity_lambda=0.7, gravity_kind="pull", gravity_mass="idf")
    g = gravity_for_step(tiny_llama, p, context_ids=ids[0])
    torch.testing.assert_close(proc(ids, scores)[0], torch.log_softmax(scores[0], -1) + 0.7 * g)
