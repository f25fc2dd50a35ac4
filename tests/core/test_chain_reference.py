"""Both paths of the chain, the head-only rules and the full-length masks, equal the plain
reference in ``tests/core/reference.py`` on random inputs, ties and masks included."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semviz.sampling import AttentionReading, PruneParams, SamplerState, choose, prune
from semviz.sampling import chain as chain_module
from tests.core import reference as ref
from tests.core.test_properties import logit_rows, params

US = (0.0, 0.31, 0.77, 0.999)


@contextlib.contextmanager
def path(kind: str):
    """Force the head-only path (on any length) or the full-length path (on any length)."""
    old = chain_module.HEAD_MIN_K, chain_module._HEAD_START
    if kind == "head":
        chain_module.HEAD_MIN_K, chain_module._HEAD_START = 1, 2  # grows the head too
    else:
        chain_module.HEAD_MIN_K = 10**9
    try:
        yield
    finally:
        chain_module.HEAD_MIN_K, chain_module._HEAD_START = old


def check(x, p, g=None, mu=None, tail=None, attention=None):
    """The core's kept set, stages and final distribution equal the reference's."""
    r = prune(
        x,
        p,
        gravity=g,
        state=SamplerState(mirostat_mu=mu),
        tail_logsumexp=tail,
        attention=attention,
    )
    kept, final, stages = ref.chain(x, p, g, mu, attention)
    assert torch.equal(r.kept, kept)
    assert [(s.name, s.n_kept) for s in r.waterfall if s.name != "candidates"] == stages
    torch.testing.assert_close(r.probs, final, atol=1e-6, rtol=1e-5)
    for u in US:
        assert choose(r, u) == ref.pick(r.probs, u)
    return r


@settings(max_examples=200, deadline=None)
@given(logit_rows(max_size=60), params(), st.booleans(), st.sampled_from(["head", "full"]))
def test_both_paths_equal_reference_on_small_sets(x, p, with_gravity, kind):
    p = p.replace(tie_rule="stable")
    g = torch.randn(x.shape[0]) if with_gravity else None
    with path(kind):
        check(x, p, g, mu=4.0)


@settings(max_examples=100, deadline=None)
@given(
    logit_rows(max_size=60),
    params(),
    st.tuples(*[st.sampled_from(v) for v in ((0.0, 0.02, 0.3), (0.0, 0.2), (0.0, 0.2, 1.0))]),
    st.tuples(st.floats(0, 8), st.floats(0, 4), st.floats(0, 2)),
    st.sampled_from(["head", "full"]),
)
def test_entropixs_temperature_equals_reference(x, p, gains, reading, kind):
    """entropix's rule, with any filters beside it, on both paths: its temperature reads
    the raw logits (not the gravity-adjusted scores) and the attention reading."""
    a, b, c = gains
    p = p.replace(
        tie_rule="stable",
        adaptive="entropix",
        entropix_logits_gain=a,
        entropix_attention_gain=b,
        entropix_agreement_gain=c,
        temperature=max(p.temperature, 0.3),
    )
    g = torch.randn(x.shape[0])  # on when λ ≠ 0: the rule must not read the adjusted scores
    with path(kind):
        r = check(x, p, g, attention=AttentionReading(*reading))
    assert r.temperature == pytest.approx(ref.temperature(p, x, x, AttentionReading(*reading)))


def test_a_filter_that_keeps_the_whole_head_is_counted_outside_it():
    """Found by hypothesis: min-p kept both tokens of a 2-token head, and epsilon then cut the
    head, so the head path took the head as enough and reported min-p as keeping all 12
    tokens; at T 0.3 its threshold removes the ten zeros outside the head."""
    x = torch.tensor([0.0] * 10 + [1.0, 1.0])
    p = PruneParams(
        temperature=0.3, min_p=0.1, epsilon=0.9, combine="intersection", tie_rule="stable"
    )
    with path("head"):
        r = check(x, p, mu=4.0)
    assert [(s.name, s.n_kept) for s in r.waterfall] == [("min_p", 2), ("epsilon", 1)]


def _big_rows(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    for kind in range(4):
        if kind == 0:
            x = torch.randn(n, generator=g) * 3
        elif kind == 1:  # many ties
            x = torch.randint(-4, 3, (n,), generator=g).float()
        elif kind == 2:  # peaked, long flat tail
            x = torch.randn(n, generator=g)
            x[:5] += 12
        else:  # masked entries
            x = torch.randn(n, generator=g) * 2
            x[torch.rand(n, generator=g) < 0.3] = float("-inf")
        yield x, torch.randn(n, generator=g)


CHAINS = [
    PruneParams(),
    PruneParams(temperature=0.0),
    PruneParams(temperature=0.7, top_k=50),
    PruneParams(temperature=0.8, top_p=0.9),
    PruneParams(temperature=1.3, top_p=0.999),
    PruneParams(min_p=0.05),
    PruneParams(epsilon=3e-4, eta=3e-4),
    PruneParams(free_energy=True, temperature=1.2, min_tokens_to_keep=3),
    PruneParams(
        temperature=0.8,
        top_k=50,
        top_p=0.9,
        min_p=0.05,
        gravity_lambda=0.5,
        free_energy=True,
        adaptive="target",
    ),
    PruneParams(top_k=700, top_p=0.95, combine="sequential", free_energy=True),
    PruneParams(top_p=0.8, min_p=0.01, order="llama.cpp", adaptive="dynatemp"),
    PruneParams(gravity_lambda=1.0, gravity_mode="rerank", rerank_k=300, top_p=0.9),
    PruneParams(top_p=0.9, adaptive="mirostat", mirostat_tau=3.0),
    PruneParams(top_p=0.9, typical_p=0.9),  # typical has no head rule: full-length path
    PruneParams(top_k=40, eta=0.01, combine="sequential", adaptive="edt", min_tokens_to_keep=2),
]


@pytest.mark.parametrize("p", CHAINS, ids=range(len(CHAINS)))
@pytest.mark.parametrize("n", [600, 5000])
def test_large_sets_equal_reference(p, n):
    """At these lengths the core takes the head path by itself; the full path is forced."""
    for x, g in _big_rows(n, n):
        check(x, p, g)
        with path("full"):
            check(x, p, g)


def test_replay_sized_candidates_with_tail_equal_reference():
    g = torch.Generator().manual_seed(3)
    full = torch.randn(4096, generator=g) * 3
    top = torch.sort(full, descending=True).values
    tail = torch.logsumexp(top[1024:], 0)
    for p in CHAINS:
        r = check(top[:1024], p, tail=tail)
        assert r.waterfall[0].name == "candidates"


def test_head_path_is_taken_on_long_sets():
    """The fast path is real: on a vocabulary-sized input the full-length masks never run."""
    x = torch.randn(49152, generator=torch.Generator().manual_seed(0)) * 3
    p = PruneParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, free_energy=True)
    called = []
    orig = chain_module._full_filters
    chain_module._full_filters = lambda *a: called.append(1) or orig(*a)
    try:
        r = prune(x, p)
    finally:
        chain_module._full_filters = orig
    assert not called and [s.name for s in r.waterfall] == [
        "top_k",
        "top_p",
        "min_p",
        "free_energy",
    ]
