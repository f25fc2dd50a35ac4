"""Property tests (hypothesis) for the pruning core."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semviz import sampling as core
from semviz.gravity import normalize_gravity

SETTINGS = settings(max_examples=60, deadline=None)

finite_f = st.floats(-30, 30, allow_nan=False, width=32)


@st.composite
def logit_rows(draw, min_size=2, max_size=40, allow_masked=True):
    """1-D float32 logits; some entries -inf, at least one finite; small ints force ties."""
    n = draw(st.integers(min_size, max_size))
    if draw(st.booleans()):
        vals = draw(st.lists(st.integers(-3, 3).map(float), min_size=n, max_size=n))
    else:
        vals = draw(st.lists(finite_f, min_size=n, max_size=n))
    x = torch.tensor(vals, dtype=torch.float32)
    if allow_masked and n > 1:
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        m = torch.tensor(mask)
        m[draw(st.integers(0, n - 1))] = False
        x = x.masked_fill(m, float("-inf"))
    return x


@st.composite
def params(draw):
    return core.PruneParams(
        temperature=draw(st.sampled_from([0.0, 0.3, 1.0, 2.0])),
        top_k=draw(st.sampled_from([0, 1, 3, 10])),
        top_p=draw(st.sampled_from([1.0, 0.9, 0.5, 0.01])),
        min_p=draw(st.sampled_from([0.0, 0.1, 0.9, 1.0])),
        typical_p=draw(st.sampled_from([1.0, 0.9, 0.2])),
        epsilon=draw(st.sampled_from([0.0, 0.01, 0.9])),
        eta=draw(st.sampled_from([0.0, 0.01, 0.9])),
        order=draw(st.sampled_from(["hf", "llama.cpp"])),
        combine=draw(st.sampled_from(["intersection", "sequential"])),
        tie_rule=draw(st.sampled_from(["stable", "hf"])),
        min_tokens_to_keep=draw(st.sampled_from([1, 2, 5])),
        gravity_lambda=draw(st.sampled_from([0.0, 0.5, 5.0])),
        gravity_mode=draw(st.sampled_from(["full", "rerank"])),
        rerank_k=draw(st.sampled_from([1, 4, 64])),
        free_energy=draw(st.booleans()),
        free_energy_kappa=draw(st.sampled_from([0.0, 1.0])),
        adaptive=draw(st.sampled_from(["none", "target", "edt", "dynatemp", "mirostat"])),
        mirostat_tau=draw(st.sampled_from([0.1, 3.0])),
    )


@SETTINGS
@given(logit_rows(allow_masked=False), st.floats(0.05, 10))
def test_temperature_preserves_ranking(x, t):
    p1 = torch.softmax(x, -1)
    pt = torch.softmax(x / t, -1)
    o1 = core.stable_order(p1.unsqueeze(0))[0]
    # same order on every strict pair (ties may become ties through rounding, not swaps)
    for i, j in zip(o1[:-1].tolist(), o1[1:].tolist(), strict=True):
        assert pt[i] >= pt[j]


@SETTINGS
@given(st.integers(1, 5000), st.floats(-50, 50, width=32))
def test_entropy_of_uniform_is_ln_n(n, c):
    h, v = core.entropy_stats(torch.full((n,), c))
    assert math.isclose(float(h), math.log(n), rel_tol=1e-5, abs_tol=1e-5)
    assert float(v) < 1e-5


@SETTINGS
@given(logit_rows())
def test_entropy_finite_with_masked_tokens(x):
    h, v = core.entropy_stats(x)
    assert math.isfinite(float(h)) and math.isfinite(float(v)) and float(h) >= 0
    n_finite = int(torch.isfinite(x).sum())
    assert float(h) <= math.log(n_finite) + 1e-4


@SETTINGS
@given(logit_rows(), st.floats(0.01, 1.0))
def test_top_p_keeps_smallest_prefix_reaching_p(x, p):
    keep = core.top_p_mask(x, p)[0]
    probs = torch.softmax(x.double(), -1)
    order = core.stable_order(x.unsqueeze(0))[0]
    kept_sorted = keep[order]
    n = int(keep.sum())
    assert kept_sorted[:n].all() and not kept_sorted[n:].any()  # a prefix
    mass = probs[order].cumsum(0)
    tol = 1e-5
    assert float(mass[n - 1]) >= p - tol  # reaches p
    if n > 1:
        assert float(mass[n - 2]) < p + tol  # one fewer would not


@SETTINGS
@given(logit_rows(), params(), st.floats(-3, 3, width=32))
def test_lambda_zero_is_identity(x, p, gshift):
    p0 = p.replace(gravity_lambda=0.0)
    g = torch.randn(x.shape[0]) + gshift
    a = core.prune(x, p0, gravity=g)
    b = core.prune(x, p0)
    assert torch.equal(a.index_probs["final"], b.index_probs["final"])
    assert torch.equal(a.kept, b.kept)


@SETTINGS
@given(logit_rows(), params(), st.floats(-100, 100, width=32))
def test_context_independent_similarity_changes_nothing(x, p, c):
    """Every candidate equally similar to the context: G is constant, normalises to 0."""
    g = normalize_gravity(torch.full(x.shape, c))
    assert torch.equal(g, torch.zeros_like(g))
    p = p.replace(gravity_mode="full", gravity_lambda=max(p.gravity_lambda, 1.0))
    a = core.prune(x, p, gravity=g)
    b = core.prune(x, p.replace(gravity_lambda=0.0))
    torch.testing.assert_close(a.index_probs["final"], b.index_probs["final"])
    # unnormalised constant gravity too: a shift of every score
    a2 = core.prune(x, p, gravity=torch.full(x.shape, c))
    assert torch.equal(a2.kept, b.kept)
    torch.testing.assert_close(
        a2.index_probs["final"], b.index_probs["final"], atol=1e-5, rtol=1e-4
    )


@settings(max_examples=150, deadline=None)
@given(logit_rows(), params(), st.floats(0, 0.999999))
def test_no_stage_leaves_zero_tokens(x, p, u):
    g = torch.randn(x.shape[0])
    st_ = core.SamplerState(mirostat_mu=0.0)  # mu=0 would cut everything without the guard
    r = core.prune(x, p, gravity=g, state=st_)
    n_finite = int(torch.isfinite(x).sum())
    if r.greedy:
        assert r.n_kept == 1
    else:
        assert r.n_kept >= min(p.min_tokens_to_keep, n_finite) >= 1
    assert all(s.n_kept >= 1 for s in r.waterfall)
    assert math.isclose(float(r.index_probs["final"].sum()), 1.0, rel_tol=1e-5)
    assert torch.isfinite(x[r.kept]).all()
    idx = core.choose(r, u)
    assert bool(r.kept[idx])
    for name, probs in r.index_probs.items():
        assert torch.isfinite(probs).all(), name
    assert math.isfinite(r.entropy_raw) and math.isfinite(r.entropy_sampled)


@SETTINGS
@given(logit_rows(), params())
def test_prune_never_modifies_inputs(x, p):
    g = torch.randn(x.shape[0])
    x0, g0 = x.clone(), g.clone()
    core.prune(x, p, gravity=g, state=core.SamplerState())
    assert torch.equal(x, x0) and torch.equal(g, g0)


@SETTINGS
@given(logit_rows(), st.floats(0.0, 0.999999))
def test_choose_is_inverse_cdf(x, u):
    r = core.prune(x, core.PruneParams())
    i = core.choose(r, u)
    probs = r.index_probs["final"].double()
    order = core.stable_order(probs.unsqueeze(0))[0].tolist()
    pos = order.index(i)
    before = float(probs[order[:pos]].sum())
    assert before <= u + 1e-6
    assert u < before + float(probs[i]) + 1e-6


@SETTINGS
@given(logit_rows(), params())
def test_params_round_trip(x, p):
    assert core.PruneParams.from_dict(p.to_dict()) == p
    assert hash(p) == hash(core.PruneParams.from_dict(p.to_dict()))


@SETTINGS
@given(
    st.integers(8, 400).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-4, 4).map(float), min_size=n, max_size=n)
            | st.lists(finite_f, min_size=n, max_size=n),
            st.integers(1, n),
        )
    )
)
def test_stable_head_is_the_stable_order_up_to_its_last_tie(case):
    """The head is a prefix of the stable order that holds every entry tied with the k-th
    value: ties straddling the k-th place (the small integers force them) and clear cuts
    alike. Exactly that prefix where a top-k does the work; a short row is sorted whole."""
    from semviz.sampling.filters import stable_head, stable_order

    vals, k = case
    x = torch.tensor(vals, dtype=torch.float32)
    full = stable_order(x.unsqueeze(0))[0]
    kth = x[full[k - 1]]
    through = int((x >= kth).sum())
    head = stable_head(x, k)
    assert torch.equal(head, full[: head.numel()])
    assert head.numel() == (through if k < x.numel() // 4 else x.numel())
