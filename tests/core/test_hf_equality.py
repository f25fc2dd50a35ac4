"""The standard warpers, in the core and as processors, equal transformers' own, ties included."""

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from semviz import processors as sp
from semviz import sampling as core

NEG = float("-inf")


def _rows(seed: int, n: int = 1000, v: int = 40) -> torch.Tensor:
    """Rows mixing continuous logits, small-integer logits (ties) and -inf entries (n, v)."""
    g = torch.Generator().manual_seed(seed)
    cont = torch.randn(n // 2, v, generator=g) * 3
    ties = torch.randint(-3, 3, (n - n // 2, v), generator=g).float()
    x = torch.cat([cont, ties])
    masked = torch.rand(x.shape, generator=g) < 0.15
    masked[:, 0] = False  # at least one finite entry per row
    return x.masked_fill(masked, NEG)


CASES = [
    ("top_k", lambda a, m: hf.TopKLogitsWarper(a, min_tokens_to_keep=m), sp.TopKLogitsWarper, core.top_k_mask, [1, 3, 7, 40, 60]),
    ("top_p", lambda a, m: hf.TopPLogitsWarper(a, min_tokens_to_keep=m), sp.TopPLogitsWarper, core.top_p_mask, [0.05, 0.3, 0.5, 0.9, 0.99, 1.0]),
    ("min_p", lambda a, m: hf.MinPLogitsWarper(a, min_tokens_to_keep=m), sp.MinPLogitsWarper, core.min_p_mask, [0.0, 0.05, 0.3, 0.9, 1.0]),
    ("typical", lambda a, m: hf.TypicalLogitsWarper(a, min_tokens_to_keep=m), sp.TypicalLogitsWarper, core.typical_mask, [0.1, 0.5, 0.9, 0.99]),
    ("epsilon", lambda a, m: hf.EpsilonLogitsWarper(a, min_tokens_to_keep=m), sp.EpsilonLogitsWarper, core.epsilon_mask, [1e-4, 0.02, 0.1, 0.5]),
    ("eta", lambda a, m: hf.EtaLogitsWarper(a, min_tokens_to_keep=m), sp.EtaLogitsWarper, core.eta_mask, [1e-4, 0.02, 0.1, 0.5]),
]  # fmt: skip


@pytest.mark.parametrize("name,make_hf,ours,mask_fn,args", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("min_keep", [1, 3])
def test_warpers_equal_transformers(name, make_hf, ours, mask_fn, args, min_keep):
    x = _rows(seed=hash(name) % 1000 + min_keep)
    for a in args:
        expected = make_hf(a, min_keep)(None, x)
        got = ours(a, min_tokens_to_keep=min_keep)(None, x)
        assert torch.equal(got, expected), (name, a)
        core_out = x.masked_fill(~mask_fn(x, a, min_keep, "hf"), NEG)
        assert torch.equal(core_out, expected), (name, a)


def test_temperature_equals_transformers():
    x = _rows(7)
    for t in [0.1, 0.7, 1.0, 2.5]:
        assert torch.equal(
            sp.TemperatureLogitsWarper(t)(None, x), hf.TemperatureLogitsWarper(t)(None, x)
        )


def test_sequential_chain_equals_hf_generate_chain():
    """combine="sequential", tie_rule="hf" replays HF's warper list row by row."""
    x = _rows(11, n=300)
    p = core.PruneParams(
        temperature=0.8,
        top_k=12,
        top_p=0.9,
        min_p=0.02,
        typical_p=0.95,
        epsilon=1e-3,
        eta=1e-3,
        combine="sequential",
        tie_rule="hf",
    )
    chain = LogitsProcessorList(
        [
            hf.TemperatureLogitsWarper(0.8),
            hf.TopKLogitsWarper(12),
            hf.TopPLogitsWarper(0.9),
            hf.MinPLogitsWarper(0.02),
            hf.TypicalLogitsWarper(0.95),
            hf.EpsilonLogitsWarper(1e-3),
            hf.EtaLogitsWarper(1e-3),
        ]
    )
    expected = torch.softmax(chain(None, x), -1)
    for i in range(x.shape[0]):
        r = core.prune(x[i], p)
        assert torch.equal(r.kept, torch.isfinite(chain(None, x[i : i + 1])[0])), i
        torch.testing.assert_close(r.index_probs["final"], expected[i], atol=1e-6, rtol=1e-5)


def test_stable_tie_rule_is_deterministic_and_exact_k():
    x = torch.zeros(1, 10)  # all tied
    assert core.top_k_mask(x, 3)[0].tolist() == [True] * 3 + [False] * 7
    assert core.top_k_mask(x, 3, tie_rule="hf")[0].all()  # hf keeps every tie
    keep = core.top_p_mask(x, 0.25)[0]  # 3 of 10 reach 0.3 >= 0.25
    assert keep.tolist() == [True] * 3 + [False] * 7
