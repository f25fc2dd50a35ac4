"""Behaviour of the chain: stages, waterfall, free energy, adaptive temperature, fallback."""

import math

import pytest
import torch

from semviz import sampling as core
from semviz.sampling import PruneParams, SamplerState, choose, prune
from semviz.sampling.presets import PRESETS, get_preset


def test_defaults_are_plain_sampling():
    x = torch.randn(100)
    r = prune(x, PruneParams())
    torch.testing.assert_close(r.index_probs["final"], torch.softmax(x, -1))
    assert r.waterfall == [] and r.n_kept == 100 and not r.greedy
    assert math.isclose(r.entropy_sampled, r.entropy_raw, rel_tol=1e-5)


def test_computes_in_float32_and_leaves_dtype():
    x = torch.randn(50, dtype=torch.bfloat16)
    r = prune(x, PruneParams(top_p=0.8))
    assert r.index_probs["final"].dtype == torch.float32


def test_greedy_lowest_index_on_ties_ignores_u():
    x = torch.tensor([1.0, 3.0, 3.0, 0.0])
    r = prune(x, PruneParams(temperature=0.0))
    assert r.greedy and choose(r, 0.0) == 1 and choose(r, 0.99) == 1
    assert r.entropy_sampled == 0.0


def test_entropy_raw_and_sampled_differ_with_temperature():
    x = torch.randn(200) * 2
    r = prune(x, PruneParams(temperature=0.5))
    h_t, _ = core.entropy_stats(x / 0.5)
    assert math.isclose(r.entropy_raw, float(core.entropy_stats(x)[0]), rel_tol=1e-5)
    assert math.isclose(r.entropy_sampled, float(h_t), rel_tol=1e-4)
    assert r.entropy_sampled < r.entropy_raw
    assert math.isclose(r.effective_candidates, math.exp(r.entropy_sampled))
    assert math.isclose(r.entropy_raw_bits, r.entropy_raw / math.log(2))


@pytest.mark.parametrize(
    "params",
    [
        PruneParams(temperature=0.7),  # no filter: every token kept
        PruneParams(temperature=1.1, top_p=0.9),  # the filters on a short head
        PruneParams(temperature=0.9, top_k=40, order="llama.cpp"),
    ],
    ids=["plain", "top_p", "llama_cpp"],
)
def test_the_final_distribution_and_its_statistics_over_a_whole_vocabulary(params):
    """Over a vocabulary-sized set, where the head path and the reuse of the temperature
    step's softmax apply: the final distribution is softmax(x/T) over the kept tokens,
    bit for bit, and the argmax, entropy and free energy (computed on first read) are
    their definitions."""
    x = torch.randn(49152, generator=torch.Generator().manual_seed(3)) * 3
    r = prune(x, params)
    t = params.temperature
    kept = torch.nonzero(r.kept).flatten()
    q = torch.softmax(x / t, -1) if kept.numel() == x.numel() else torch.softmax(x[kept] / t, -1)
    assert torch.equal(r.index_probs["final"][kept], q)
    assert not r.index_probs["final"][~r.kept].any()  # nothing outside the kept
    assert r.n_kept == kept.numel() and torch.equal(r._support[0], kept)
    assert r.argmax == int(x.argmax())  # the kept set always holds the raw argmax here
    assert math.isclose(r.entropy_sampled, float(-(q * q.log()).sum()), rel_tol=1e-4)
    assert math.isclose(r.free_energy, -t * float(torch.logsumexp(x[kept] / t, -1)), rel_tol=1e-5)


def test_intersection_of_top_k_and_top_p():
    x = torch.log(torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1]))
    both = prune(x, PruneParams(top_k=3, top_p=0.5)).kept
    k = core.top_k_mask(x, 3)[0]
    p = core.top_p_mask(x, 0.5)[0]
    assert torch.equal(both, k & p)
    # sequential would renormalise after top-k: 0.3/0.75 = 0.4 < 0.5 still needs 2 tokens
    assert both.tolist() == [True, True, False, False, False]


def test_waterfall_records_each_active_stage_in_order():
    x = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04]))
    r = prune(x, PruneParams(top_k=4, top_p=0.8, free_energy=True))
    assert [s.name for s in r.waterfall] == ["top_k", "top_p", "free_energy"]
    assert r.waterfall[0].n_kept == 4
    assert math.isclose(r.waterfall[0].mass_removed, 0.04, rel_tol=1e-4)
    assert r.waterfall[1].n_kept == 3
    assert math.isclose(r.waterfall[1].mass_removed, 0.06 / 0.96, rel_tol=1e-4)
    r2 = prune(x, PruneParams(top_k=2, order="llama.cpp"))
    assert [s.name for s in r2.waterfall] == ["top_k", "temperature"]


def test_free_energy_window_grows_with_entropy():
    peaked = torch.log(torch.tensor([0.97, 0.01, 0.01, 0.01]))
    flat = torch.log(torch.tensor([0.3, 0.28, 0.22, 0.2]))
    p = PruneParams(free_energy=True)
    assert prune(peaked, p).n_kept == 1  # decisive
    assert prune(flat, p).n_kept == 4  # tolerant
    # the exact rule: keep iff p(w) >= p_max * exp(-kappa * T * H)
    x = torch.randn(300) * 2
    for kappa, t in [(1.0, 1.0), (0.5, 0.7), (2.0, 1.5)]:
        r = prune(x, PruneParams(free_energy=True, free_energy_kappa=kappa, temperature=t))
        probs = torch.softmax(x, -1)
        h = float(core.entropy_stats(x)[0])
        expect = probs >= probs.max() * math.exp(-kappa * t * h) * (1 - 1e-5)
        assert torch.equal(r.kept, expect) or (r.kept ^ expect).sum() <= 1


def test_free_energy_of_chosen_set():
    x = torch.randn(20)
    r = prune(x, PruneParams(temperature=0.8, top_k=5))
    q = r.index_probs["final"][r.kept].double()
    u = -x[r.kept].double()
    f = float((q * u).sum() - 0.8 * -(q * q.log()).sum())  # <U> - T·H
    assert math.isclose(r.free_energy, f, rel_tol=1e-4, abs_tol=1e-4)


def test_rerank_restricts_to_top_candidates_and_reorders():
    x = torch.tensor([3.0, 2.9, 2.8, 0.0, -1.0])
    g = torch.tensor([-1.0, -1.0, 2.0, 5.0, 0.0])
    r = prune(x, PruneParams(gravity_lambda=2.0, gravity_mode="rerank", rerank_k=3), gravity=g)
    assert r.kept.tolist() == [True, True, True, False, False]
    assert r.argmax == 2
    assert r.waterfall[0].name == "rerank"
    full = prune(x, PruneParams(gravity_lambda=2.0), gravity=g)
    assert full.argmax == 3 and full.index_probs["gravity"].argmax() == 3


def test_adaptive_temperatures():
    x = torch.randn(1000)
    h = float(core.entropy_stats(x)[0])
    r = prune(x, PruneParams(adaptive="target", target_entropy=h - 1, controller_gain=0.2))
    assert math.isclose(r.temperature, 1.0 - 0.2 * 1.0, rel_tol=1e-4)  # sign -1: cools
    r = prune(x, PruneParams(adaptive="target", target_entropy=h - 1, controller_sign=1))
    assert r.temperature > 1.0
    r = prune(x, PruneParams(adaptive="edt", edt_theta=1.0, edt_n=0.8, temperature=1.2))
    assert math.isclose(r.temperature, 1.2 * 0.8 ** (1.0 / h), rel_tol=1e-4)
    r = prune(x, PruneParams(adaptive="dynatemp", dynatemp_range=0.5, temperature=1.0))
    assert math.isclose(r.temperature, 0.5 + 1.0 * h / math.log(1000), rel_tol=1e-4)


def test_mirostat_state_per_sequence():
    x = torch.randn(500) * 3
    p = PruneParams(adaptive="mirostat", mirostat_tau=3.0, mirostat_eta=0.1)
    st = SamplerState()
    r = prune(x, p, state=st)
    assert r.mirostat_mu == 6.0  # starts at 2·tau
    surprise = -torch.log_softmax(x, -1) / math.log(2)
    assert torch.equal(r.kept, surprise <= 6.0)
    i = choose(r, 0.3, state=st)
    q = float(r.index_probs["final"][i])
    assert math.isclose(st.mirostat_mu, 6.0 - 0.1 * (-math.log2(q) - 3.0), rel_tol=1e-6)
    other = st.copy()
    choose(prune(x, p, state=other), 0.9)  # advancing a copy leaves the original alone
    assert other.mirostat_mu != st.mirostat_mu and len(st.tokens) == 1


def test_fallback_fires_and_records_why():
    x = torch.randn(50)
    p = PruneParams(gravity_lambda=50.0, fallback=True, fallback_gravity_ratio=2.0)
    r = prune(x, p, gravity=torch.randn(50))
    assert r.fallback and "gravity" in r.fallback
    assert r.gravity is None and r.params.gravity_lambda == 0.0
    torch.testing.assert_close(r.index_probs["final"], torch.softmax(x, -1))
    st = SamplerState(tokens=[1, 2, 3, 4] * 3)
    r = prune(x, PruneParams(fallback=True), state=st)
    assert r.fallback and "4-gram" in r.fallback
    peaked = torch.full((50,), -30.0)
    peaked[0] = 30.0
    st = SamplerState(entropies=[0.0] * 7)
    r = prune(peaked, PruneParams(fallback=True, temperature=0.0), state=st)
    assert r.fallback and "entropy" in r.fallback and not r.greedy  # back to sampling
    assert prune(x, PruneParams(fallback=True), state=SamplerState()).fallback is None


def test_tail_logsumexp_keeps_raw_probabilities_exact():
    full = torch.randn(1000) * 2
    top = torch.sort(full, descending=True).values
    k = 50
    tail = torch.logsumexp(top[k:], 0)
    r = prune(top[:k], PruneParams(top_k=10), tail_logsumexp=tail)
    torch.testing.assert_close(r.index_probs["raw"], torch.softmax(top, -1)[:k])
    assert r.waterfall[0].name == "candidates"
    assert math.isclose(r.tail_mass, float(torch.softmax(top, -1)[k:].sum()), rel_tol=1e-4)
    assert r.entropy_raw <= float(core.entropy_stats(top)[0]) + 1e-5  # lumped tail: lower bound
    assert r.n_kept == 10


def test_params_validation_names_field():
    for kw, name in [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_tokens_to_keep": 0}, "min_tokens_to_keep"),
        ({"order": "vllm"}, "order"),
        ({"gravity_mass": "tfidf"}, "gravity_mass"),
        ({"controller_sign": 0}, "controller_sign"),
        ({"edt_n": 1.5}, "edt_n"),
    ]:
        with pytest.raises(ValueError, match=name):
            PruneParams(**kw)
    with pytest.raises(ValueError, match="bogus"):
        PruneParams.from_dict({"temperature": 1.0, "bogus": 1})
    p = PruneParams(gravity_layers=[1, 2])
    assert p.gravity_layers == (1, 2) and PruneParams.from_dict(p.to_dict()) == p


def test_bad_logits_rejected():
    with pytest.raises(ValueError, match="1-D"):
        prune(torch.zeros(2, 3), PruneParams())
    with pytest.raises(ValueError, match="finite"):
        prune(torch.full((3,), float("-inf")), PruneParams())
    with pytest.raises(ValueError, match="u must"):
        choose(prune(torch.zeros(3), PruneParams()), 1.0)


def test_presets():
    assert set(PRESETS) == {"code", "story", "qa", "brainstorm"}
    for name, p in PRESETS.items():
        assert p.name == name and isinstance(p.params, PruneParams)
        assert p.why and "\n" not in p.why and p.explanation and p.example_prompt
        prune(torch.randn(100), p.params, gravity=torch.randn(100), state=SamplerState())
    with pytest.raises(ValueError, match="story"):
        get_preset("poem")


@pytest.mark.parametrize("seed", range(5))
def test_the_final_distribution_and_pick_do_not_depend_on_the_tokens_around_the_kept(seed):
    """Over the whole vocabulary or over a subset that holds the kept set, the final
    probabilities of the kept tokens are the same floats and every draw picks the same
    token: replay's exact what-if runs the chain over both and compares their picks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5000, generator=g) * 3  # (V,)
    p = PruneParams(temperature=0.7, top_k=40)
    sub = torch.sort(torch.randperm(5000, generator=g)[:700]).values  # (700,) ascending
    top = torch.topk(x, 40).indices
    sub = torch.unique(torch.cat([sub, top]))  # ascending, holds the top 40
    whole, part = prune(x, p), prune(x[sub], p)
    assert whole.n_kept == part.n_kept == 40
    assert torch.equal(whole.index_probs["final"][sub], part.index_probs["final"])
    assert whole.entropy_sampled == part.entropy_sampled
    assert whole.free_energy == part.free_energy
    for u in torch.rand(200, generator=g).tolist():
        assert choose(whole, u, state=SamplerState()) == int(
            sub[choose(part, u, state=SamplerState())]
        )


@pytest.mark.parametrize(
    "params",
    [
        PruneParams(temperature=0.7, top_k=40),
        PruneParams(temperature=1.3),  # everything kept
        PruneParams(temperature=0.05, top_k=3000),  # kept tokens whose probability is 0
    ],
)
def test_the_pick_from_the_kept_support_equals_the_pick_from_the_whole_distribution(params):
    """``choose`` reads the kept indices and probabilities that ``prune`` found instead of
    scanning the (K,) final distribution: the same token for every draw, including where a
    kept token's probability underflows to 0 and cannot be picked."""
    from semviz.sampling.chain import _inverse_cdf

    g = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=g) * 8  # (V,)
    res = prune(x, params)
    final = res.index_probs["final"]
    idx, q = res._support
    assert torch.equal(idx, torch.nonzero(res.kept).flatten()) and torch.equal(final[idx], q)
    if params.top_k == 3000:
        assert bool((q == 0).any())  # the case the support must drop
    for u in [*torch.rand(300, generator=g).tolist(), 0.0, 1.0 - 1e-12]:
        assert _inverse_cdf(final, u, res._support) == _inverse_cdf(final, u)


def _pick_by_definition(probs: torch.Tensor, u: float) -> int:
    """The inverse CDF over the whole stable descending order of the tokens with p > 0."""
    p = probs.double()
    live = torch.nonzero(p > 0).flatten()
    q = p[live]
    order = torch.sort(q, descending=True, stable=True).indices
    cdf = q[order].cumsum(0)
    target = torch.tensor([u * float(q.sum())], dtype=torch.float64)
    pos = int(torch.searchsorted(cdf, target, right=True))
    return int(live[order[min(pos, order.numel() - 1)]])


@pytest.mark.parametrize("shape", ["flat", "peaked", "ties", "small"])
def test_the_pick_equals_the_inverse_cdf_over_the_whole_stable_order(shape, monkeypatch):
    """``choose`` sorts only the head of the order that the draw needs (the first 256
    tokens, else the tokens above a mass threshold): the same index as the definition, for
    draws deep in the tail too, where that threshold decides, and without falling back to
    sorting the whole vocabulary."""
    from semviz.sampling import chain
    from semviz.sampling.chain import _inverse_cdf

    sizes = []
    head = chain.stable_head
    monkeypatch.setattr(chain, "stable_head", lambda x, k: sizes.append(k) or head(x, k))

    g = torch.Generator().manual_seed(7)
    n = {"small": 40}.get(shape, 49152)
    x = torch.randn(n, generator=g) * {"flat": 1.0, "peaked": 6.0}.get(shape, 2.0)
    if shape == "ties":
        x = (x * 2).round() / 2  # many equal probabilities: ties go to the lower index
    probs = torch.softmax(x, -1)
    us = [*torch.rand(150, generator=g).tolist(), 0.0, 0.5, 0.999, 0.999999, 1.0 - 1e-12]
    for u in us:
        assert _inverse_cdf(probs, u) == _pick_by_definition(probs, u), u
    assert set(sizes) == {256}  # the threshold's head held every draw beyond the first 256
