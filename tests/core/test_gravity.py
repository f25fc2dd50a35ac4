"""Gravity equals the brute-force sum, costs one matvec, and keeps models apart."""

import gc

import pytest
import torch

from semviz import gravity as gv
from semviz.gravity import projection
from semviz.sampling import PruneParams

# every position may pull: the seed's plain potential, to compare with brute force
PLAIN = dict(
    gravity_kind="pull",
    gravity_anchor="context",
    gravity_sinks=0,
    gravity_skip_template=False,
    gravity_ngram=0,
    gravity_copy_cos=0.0,
    gravity_attract_only=False,
)


def brute(cand, ctx, mass, sim):
    out = torch.zeros(cand.shape[0], dtype=torch.float64)
    for i in range(ctx.shape[0]):
        if sim == "cosine":
            s = torch.nn.functional.cosine_similarity(
                cand.double(), ctx[i].double()[None], dim=-1, eps=1e-8
            )
        else:
            s = cand.double() @ ctx[i].double()
        out += mass[i].double() * s
    return out


@pytest.mark.parametrize("sim", ["cosine", "dot"])
@pytest.mark.parametrize("n", [1, 7, 50])
def test_gravity_equals_brute_force(sim, n):
    g = torch.Generator().manual_seed(n)
    cand, ctx = torch.randn(300, 16, generator=g), torch.randn(n, 16, generator=g)
    mass = torch.rand(n, generator=g)
    mass = mass / mass.sum()
    got = gv.gravity_potential(cand, ctx, mass, sim)
    torch.testing.assert_close(got.double(), brute(cand, ctx, mass, sim), atol=1e-5, rtol=1e-5)


def test_gravity_with_cached_unit_rows(tiny_llama):
    ids = torch.tensor([5, 9, 9, 200])
    cand = gv.candidate_matrix(tiny_llama, "embedding", "cosine")
    emb = tiny_llama.get_input_embeddings().weight.detach()
    mass = gv.context_mass("idf", context_ids=ids)
    got = gv.gravity_potential(cand, emb[ids], mass, "cosine", normalized=True)
    torch.testing.assert_close(
        got.double(), brute(emb, emb[ids], mass, "cosine"), atol=1e-5, rtol=1e-5
    )


def test_normalize_gravity_zscore():
    g = torch.tensor([1.0, 2.0, 3.0, float("-inf")])
    z = gv.normalize_gravity(g)
    assert z[3] == 0
    torch.testing.assert_close(z[:3].mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(z[:3].pow(2).mean(), torch.tensor(1.0))
    assert torch.equal(gv.normalize_gravity(torch.full((5,), 3.0)), torch.zeros(5))


def test_context_mass_sources():
    attn = torch.softmax(torch.randn(3, 4, 6), -1)  # (L, H, N) already softmaxed
    m = gv.context_mass("attention", attention=attn)
    torch.testing.assert_close(m, attn.mean((0, 1)))  # no second softmax
    m2 = gv.context_mass("attention", attention=attn, layers=(1,), heads=(0, 2))
    torch.testing.assert_close(m2, attn[1, [0, 2]].mean(0))
    e = gv.context_mass("ema", attention=attn, ema=torch.tensor([1.0, 0, 0, 0]), ema_decay=0.5)
    want = 0.5 * torch.tensor([1.0, 0, 0, 0, 0, 0]) + 0.5 * attn.mean((0, 1))
    torch.testing.assert_close(e, want)  # new positions enter at zero: already sums to 1
    ids = torch.tensor([1, 1, 1, 2])
    idf = gv.context_mass("idf", context_ids=ids)
    assert idf[3] > idf[0] and abs(float(idf.sum()) - 1) < 1e-6
    emb = torch.tensor([[1.0, 0], [3.0, 4.0], [0, 1.0]])
    nm = gv.context_mass("norm", context_ids=torch.tensor([0, 1]), embed=emb)
    torch.testing.assert_close(nm, torch.tensor([1 / 6, 5 / 6]))
    torch.testing.assert_close(gv.context_mass("uniform", n=4), torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="attention"):
        gv.context_mass("attention")


def test_ema_mass_enters_new_positions_at_zero():
    first = gv.ema_mass(None, torch.tensor([0.5, 0.5]), 0.9)
    assert torch.equal(first, torch.tensor([0.5, 0.5]))
    nxt = gv.ema_mass(first, torch.tensor([0.2, 0.2, 0.6]), 0.9)
    torch.testing.assert_close(nxt, torch.tensor([0.47, 0.47, 0.06]))
    assert float(nxt.sum()) == pytest.approx(1.0)


def test_candidate_cache_keyed_per_model(tiny_llama):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
        )
    )
    a = gv.candidate_matrix(tiny_llama, "embedding", "cosine")
    b = gv.candidate_matrix(other, "embedding", "cosine")
    assert a is gv.candidate_matrix(tiny_llama, "embedding", "cosine")  # cached
    assert not torch.equal(a, b)
    assert not torch.equal(a, gv.candidate_matrix(tiny_llama, "embedding", "dot"))
    n = len(projection._CACHE)
    del other, b
    gc.collect()
    assert len(projection._CACHE) == n - 1  # the entry dies with its model


def test_hidden_space_uses_lm_head_rows(tiny_llama):
    """Dot gravity in hidden space with all mass on one position is that position's logits."""
    h = torch.randn(3, 64)
    p = PruneParams(
        gravity_lambda=1.0,
        gravity_space="hidden",
        gravity_sim="dot",
        gravity_mass="attention",
        **PLAIN,
    )
    attn = torch.zeros(2, 4, 3)
    attn[..., 2] = 1.0
    ctx = gv.GravityContext(ids=torch.tensor([5, 6, 7]), attention=attn, hidden=h)
    g = gv.gravity_for_step(tiny_llama, p, ctx, normalize=False)
    torch.testing.assert_close(g, tiny_llama.lm_head(h[2]).detach(), atol=1e-5, rtol=1e-5)


def test_contextual_space_reads_the_state_before_each_token(tiny_llama):
    """Contextual space: token i is read as h_{i-1}, the state that predicted it."""
    h = torch.randn(3, 64)
    p = PruneParams(
        gravity_lambda=1.0,
        gravity_space="contextual",
        gravity_sim="dot",
        gravity_mass="attention",
        **PLAIN,
    )
    attn = torch.zeros(2, 4, 3)
    attn[..., 2] = 1.0
    ctx = gv.GravityContext(ids=torch.tensor([5, 6, 7]), attention=attn, hidden=h)
    g = gv.gravity_for_step(tiny_llama, p, ctx, normalize=False)
    torch.testing.assert_close(g, tiny_llama.lm_head(h[1]).detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sim", ["cosine", "dot"])
def test_context_pull_sums_context_rows_from_the_cache(tiny_llama, sim):
    ids = torch.tensor([5, 9, 9, 200, 3])
    attn = torch.softmax(torch.randn(2, 4, 5), -1)
    p = PruneParams(gravity_lambda=1.0, gravity_sim=sim, gravity_mass="attention", **PLAIN)
    got = gv.gravity_for_step(
        tiny_llama, p, gv.GravityContext(ids=ids, attention=attn), normalize=False
    )
    emb = tiny_llama.get_input_embeddings().weight.detach()
    mass = attn.half().float().mean((0, 1))  # attention is read at the trace's float16
    torch.testing.assert_close(got.double(), brute(emb, emb[ids], mass, sim), atol=1e-5, rtol=1e-5)


def test_normalize_gravity_dense_path_matches_masked_path():
    g = torch.randn(5000) * 0.03 + 0.2
    dense = gv.normalize_gravity(g)
    masked = gv.normalize_gravity(torch.cat([g, torch.tensor([float("-inf")])]))[:-1]
    torch.testing.assert_close(dense, masked, atol=1e-5, rtol=1e-5)
    assert torch.equal(gv.normalize_gravity(torch.full((7,), 0.25)), torch.zeros(7))
