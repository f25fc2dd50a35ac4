"""The head-only filter path, head-sized choose and one-pass entropy equal the full-length
reference (the core before these optimisations) on random inputs, ties and masks included."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semviz import pruning as core
from tests.core import _reference_pruning as ref
from tests.core.test_properties import logit_rows, params

# the reference shares today's helpers, so only the chain's structure is compared
for _name in ("entropy_stats", "_protect_head", "stable_head", "stable_order"):
    setattr(ref, _name, getattr(core, _name))
for _name in ("top_k_mask", "top_p_mask", "min_p_mask", "typical_mask", "epsilon_mask",
              "eta_mask", "free_energy_mask", "mirostat_mask"):  # fmt: skip
    setattr(ref, _name, getattr(core, _name))


def _same(a: core.PruneResult, b, x: torch.Tensor, us=(0.0, 0.31, 0.77, 0.999)) -> None:
    assert torch.equal(a.kept, b.kept)
    assert a.n_kept == b.n_kept and a.greedy == b.greedy and a.argmax == b.argmax
    assert [(w.name, w.n_kept) for w in a.waterfall] == [(w.name, w.n_kept) for w in b.waterfall]
    for wa, wb in zip(a.waterfall, b.waterfall, strict=True):
        assert math.isclose(wa.mass_removed, wb.mass_removed, rel_tol=1e-4, abs_tol=2e-6)
    assert a.temperature == b.temperature or math.isclose(
        a.temperature, b.temperature, rel_tol=1e-6
    )
    for name in ("raw", "gravity", "temperature", "final"):
        torch.testing.assert_close(a.index_probs[name], b.index_probs[name], atol=1e-6, rtol=1e-4)
    assert math.isclose(a.entropy_raw, b.entropy_raw, rel_tol=1e-4, abs_tol=1e-5)
    assert math.isclose(a.entropy_sampled, b.entropy_sampled, rel_tol=1e-4, abs_tol=1e-5)
    assert math.isclose(a.free_energy, b.free_energy, rel_tol=1e-5, abs_tol=1e-4)
    if not a.greedy:
        for u in us:
            assert ref.choose(b, u) == core.choose(a, u)


@settings(max_examples=200, deadline=None)
@given(logit_rows(max_size=60), params(), st.booleans())
def test_head_path_equals_reference_on_small_sets(x, p, with_gravity):
    """HEAD_MIN_K lowered so the head path (and its growth) runs on every small input."""
    g = torch.randn(x.shape[0]) if with_gravity else None
    old = core.HEAD_MIN_K, core._HEAD_START
    core.HEAD_MIN_K, core._HEAD_START = 1, 2
    try:
        a = core.prune(x, p, gravity=g, state=core.SamplerState(mirostat_mu=4.0))
    finally:
        core.HEAD_MIN_K, core._HEAD_START = old
    b = ref.prune(x, p, gravity=g, state=ref.SamplerState(mirostat_mu=4.0))
    _same(a, b, x)


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
    core.PruneParams(),
    core.PruneParams(temperature=0.0),
    core.PruneParams(temperature=0.7, top_k=50),
    core.PruneParams(temperature=0.8, top_p=0.9),
    core.PruneParams(temperature=1.3, top_p=0.999),
    core.PruneParams(min_p=0.05),
    core.PruneParams(epsilon=3e-4, eta=3e-4),
    core.PruneParams(free_energy=True, temperature=1.2, min_tokens_to_keep=3),
    core.PruneParams(
        temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, gravity_lambda=0.5,
        free_energy=True, adaptive="target", fallback=True,
    ),
    core.PruneParams(top_k=700, top_p=0.95, combine="sequential", free_energy=True),
    core.PruneParams(top_p=0.8, min_p=0.01, order="llama.cpp", adaptive="dynatemp"),
    core.PruneParams(gravity_lambda=1.0, gravity_mode="rerank", rerank_k=300, top_p=0.9),
    core.PruneParams(top_p=0.9, adaptive="mirostat", mirostat_tau=3.0),
    core.PruneParams(top_p=0.9, typical_p=0.9),  # full-length path
    core.PruneParams(top_k=40, top_p=0.9, tie_rule="hf"),  # full-length path
]  # fmt: skip


@pytest.mark.parametrize("p", CHAINS, ids=range(len(CHAINS)))
@pytest.mark.parametrize("n", [600, 5000])
def test_large_sets_equal_reference(p, n):
    for x, g in _big_rows(n, n):
        a = core.prune(x, p, gravity=g, state=core.SamplerState())
        b = ref.prune(x, p, gravity=g, state=ref.SamplerState())
        _same(a, b, x)


def test_replay_sized_candidates_with_tail_equal_reference():
    g = torch.Generator().manual_seed(3)
    full = torch.randn(4096, generator=g) * 3
    top = torch.sort(full, descending=True).values
    tail = torch.logsumexp(top[1024:], 0)
    for p in CHAINS:
        a = core.prune(top[:1024], p, tail_logsumexp=tail)
        b = ref.prune(top[:1024], p, tail_logsumexp=tail)
        _same(a, b, top[:1024])


@settings(max_examples=100, deadline=None)
@given(logit_rows(max_size=80), st.floats(0.0, 0.999999))
def test_head_sized_choose_equals_full_sort(x, u):
    r = core.prune(x, core.PruneParams())
    assert core.choose(r, u) == ref.choose(ref.prune(x, ref.PruneParams()), u)
