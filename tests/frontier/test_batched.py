"""Batched generate(): per-row seeds, batched == one at a time == the Decoder, free perplexity."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import semviz.frontier.batched
from semviz.decoding.decoder import Decoder, DecodeSettings, encode_prompt
from semviz.frontier.batched import (
    SeededSampler,
    continuation_nll,
    cut_at_eos,
    eos_ids,
    generate_batch,
    processor_chain,
)
from semviz.sampling import PruneParams, choose, prune

PROMPTS = [
    "Once upon a time",
    "Explain how a refrigerator keeps food cold, step by step, for a curious child.",
    "Why?",
    "Write a Python function that checks whether a string is a palindrome.",
]
CHAINS = {
    "plain": PruneParams(temperature=0.8, top_p=0.9),
    "gravity-attention": PruneParams(gravity_lambda=1.0, top_p=0.95),
    "gravity-uniform": PruneParams(gravity_lambda=0.5, gravity_mass="uniform", min_p=0.05),
}


def _rows(lm):
    return [encode_prompt(lm, p) for p in PROMPTS]


def test_sampler_returns_a_one_hot_row_and_leaves_scores_alone():
    x = torch.log_softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), -1)
    before = x.clone()
    out = SeededSampler([1, 2, 3], PruneParams(top_p=0.9))(None, x)
    assert torch.equal(x, before)
    assert out.shape == x.shape
    assert ((out == 0).sum(-1) == 1).all()
    assert (torch.isinf(out) | (out == 0)).all()


def test_sampler_picks_what_choose_picks_with_the_row_s_own_first_uniform():
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(1)) * 3
    params = PruneParams(temperature=0.7, top_p=0.9)
    seeds = [11, 12, 13, 14]
    picks = SeededSampler(seeds, params)(None, x).argmax(-1).tolist()
    want = []
    for b, s in enumerate(seeds):
        u = float(torch.rand((), generator=torch.Generator().manual_seed(s)))
        want.append(choose(prune(x[b], params), u))
    assert picks == want


def test_rows_do_not_share_randomness():
    x = torch.zeros(2, 1000)  # uniform: the pick is the uniform's position
    solo = SeededSampler([5])(None, x[:1]).argmax(-1)
    pair = SeededSampler([5, 6])(None, x).argmax(-1)
    assert int(pair[0]) == int(solo[0])
    assert int(pair[0]) != int(pair[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seeds": []}, "one seed per batch row"),
        ({"seeds": [True]}, "must be ints"),
        ({"seeds": [0], "params": PruneParams(gravity_lambda=0.5)}, "gravity on"),
        ({"seeds": [0], "params": {"top_p": 0.9}}, "must be a PruneParams"),
    ],
)
def test_sampler_validates_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SeededSampler(**kwargs)


def test_sampler_refuses_a_batch_of_another_size():
    with pytest.raises(ValueError, match="3 rows but the sampler was given 2 seeds"):
        SeededSampler([0, 1])(None, torch.zeros(3, 5))


def test_chain_puts_gravity_before_the_sampler_and_refuses_fallback_with_gravity(peaked_lm):
    names = [
        type(p).__name__ for p in processor_chain(peaked_lm.model, CHAINS["gravity-uniform"], [0])
    ]
    assert names == ["RawLogProb", "NarrativeGravityLogitsProcessor", "SeededSampler"]
    with pytest.raises(ValueError, match="fallback"):
        processor_chain(peaked_lm.model, PruneParams(gravity_lambda=0.5, fallback=True), [0])


@pytest.mark.parametrize("chain", list(CHAINS))
def test_batched_equals_one_at_a_time_equals_the_decoder(peaked_lm, chain):
    params, rows, seeds = CHAINS[chain], _rows(peaked_lm), [0, 1, 2, 3]
    assert len({len(r) for r in rows}) == len(rows)  # real left padding in the batch
    batch = generate_batch(peaked_lm, rows, seeds, params, max_new_tokens=16)
    single = [
        generate_batch(peaked_lm, [r], [s], params, max_new_tokens=16)
        for r, s in zip(rows, seeds, strict=True)
    ]
    assert batch.ids == [o.ids[0] for o in single]
    for r, s, o in zip(rows, seeds, single, strict=True):
        d = Decoder(
            peaked_lm,
            "",
            params,
            DecodeSettings(seed=s, max_new_tokens=16, capture=False),
            prompt_ids=r,
        )
        d.run(16)
        assert o.ids[0] == d.trace.token_ids
        assert o.uniforms[0] == pytest.approx([st.u for st in d.trace.steps], abs=0)


def test_perplexity_from_the_generating_pass_equals_teacher_forcing(peaked_lm):
    rows = _rows(peaked_lm)
    out = generate_batch(
        peaked_lm, rows, [3, 4, 5, 6], CHAINS["gravity-attention"], max_new_tokens=12
    )
    ref = continuation_nll(peaked_lm, rows, out.ids)
    assert out.nll == pytest.approx(ref, abs=2e-4)
    assert all(math.isfinite(v) and v > 0 for v in out.nll)


def test_stop_request_and_progress_ticks(peaked_lm):
    ticks = []
    out = generate_batch(
        peaked_lm,
        _rows(peaked_lm)[:2],
        [0, 1],
        PruneParams(),
        max_new_tokens=20,
        on_token=ticks.append,
        should_stop=lambda: len(ticks) >= 3,
    )
    assert out.stopped and ticks == [1, 2, 3]
    assert all(len(r) <= 3 for r in out.ids)


def test_a_row_ends_at_its_first_eos():
    rows = [[7, 2, 9, 2], [2, 0, 0, 0], [7, 8, 9, 10], [7, 3, 0, 0]]
    ids, stops = cut_at_eos(rows, eos=[2, 3])
    assert ids == [[7, 2], [2], [7, 8, 9, 10], [7, 3]]
    assert stops == ["eos", "eos", "length", "eos"]


def test_the_model_s_eos_ids_are_the_decoder_s(peaked_lm):
    d = Decoder(peaked_lm, "Hi", PruneParams(), DecodeSettings(capture=False))
    assert set(eos_ids(peaked_lm)) == d.eos_ids


def test_padding_uses_an_id_that_no_prompt_contains(peaked_lm):
    rows = _rows(peaked_lm)
    pad = semviz.frontier.batched._pad_id(peaked_lm, rows)
    assert all(pad not in r for r in rows)
    assert peaked_lm.tokenizer.pad_token_id in {t for r in rows for t in r}  # the naive choice


def test_bad_batches_are_refused(peaked_lm):
    rows = _rows(peaked_lm)
    with pytest.raises(ValueError, match="one seed per prompt"):
        generate_batch(peaked_lm, rows, [0], PruneParams(), max_new_tokens=4)
    with pytest.raises(ValueError, match="context"):
        generate_batch(peaked_lm, rows[:1], [0], PruneParams(), max_new_tokens=10_000)


def test_batched_docstring_examples():
    result = doctest.testmod(semviz.frontier.batched, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.real_model
def test_real_model_batched_equals_one_at_a_time_equals_the_decoder(real_lm):
    params = PruneParams(top_p=0.95, gravity_lambda=1.0)
    rows, seeds = _rows(real_lm)[1:], [0, 1, 2]
    batch = generate_batch(real_lm, rows, seeds, params, max_new_tokens=12)
    for r, s, got in zip(rows, seeds, batch.ids, strict=True):
        d = Decoder(
            real_lm,
            "",
            params,
            DecodeSettings(seed=s, max_new_tokens=12, capture=False),
            prompt_ids=r,
        )
        d.run(12)
        assert got == d.trace.token_ids


TENSOR_CHAINS = {
    "temperature": PruneParams(temperature=0.8),
    "top-p": PruneParams(temperature=1.3, top_p=0.9),
    "min-p": PruneParams(temperature=1.6, min_p=0.1),
    "top-p and min-p": PruneParams(temperature=1.0, top_p=0.8, min_p=0.05),
    "adaptive target": PruneParams(temperature=1.0, adaptive="target", top_p=0.95),
    "edt": PruneParams(temperature=1.0, adaptive="edt"),
    "free energy": PruneParams(temperature=1.2, free_energy=True),
    "greedy by edt": PruneParams(temperature=1e-5),
}


@pytest.mark.parametrize("chain", list(TENSOR_CHAINS))
def test_tensor_rows_pick_what_the_core_picks(chain):
    params = TENSOR_CHAINS[chain]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 500, generator=g) * 3  # (B, V) peaked enough to make sets differ
    x[0, :2] = 20.0  # a tie at the top: the lower index wins
    x[1] = 0.0  # a flat row
    seeds = list(range(100, 164))
    for step in range(3):  # the draws advance per row as the loop's do
        loop = SeededSampler(seeds, params, rows="loop")
        tensor = SeededSampler(seeds, params, rows="tensor")
        for _ in range(step + 1):
            a = loop(None, x).argmax(-1)
            b = tensor(None, x).argmax(-1)
        assert torch.equal(a, b)
        assert loop.uniforms == tensor.uniforms


def test_tensor_rows_finish_a_row_at_eos_as_the_loop_does():
    x = torch.zeros(3, 10)
    x[:, 7] = 5.0  # eos is the likely pick
    samp = {
        r: SeededSampler([0, 1, 2], PruneParams(), eos_token_ids=[7], rows=r)
        for r in ("loop", "tensor")
    }
    for _ in range(4):
        outs = [samp[r](None, x).argmax(-1) for r in ("loop", "tensor")]
        assert torch.equal(*outs)
        assert samp["loop"].done == samp["tensor"].done
        assert samp["loop"].uniforms == samp["tensor"].uniforms


@pytest.mark.parametrize(
    "params",
    [
        PruneParams(top_k=40),
        PruneParams(adaptive="mirostat"),
        PruneParams(top_p=0.9, min_p=0.1, combine="sequential"),
        PruneParams(tie_rule="hf", top_p=0.9),
    ],
)
def test_tensor_rows_refuse_chains_they_do_not_run(params):
    with pytest.raises(ValueError, match="needs rows='loop'"):
        SeededSampler([0], params, rows="tensor")


def test_auto_rows_run_the_core_on_cpu_scores():
    with pytest.raises(ValueError, match="`rows` must be auto, loop or tensor"):
        SeededSampler([0], rows="gpu")
    s = SeededSampler([0, 1], PruneParams(top_k=5))  # not tensor-able: auto still runs it
    assert s(None, torch.randn(2, 30)).shape == (2, 30)


def test_batched_tensor_rows_equal_the_loop_on_a_model(peaked_lm):
    rows, seeds = _rows(peaked_lm), [0, 1, 2, 3]
    params = PruneParams(temperature=1.2, min_p=0.05)
    a = generate_batch(peaked_lm, rows, seeds, params, max_new_tokens=12, rows="loop")
    b = generate_batch(peaked_lm, rows, seeds, params, max_new_tokens=12, rows="tensor")
    assert a.ids == b.ids
    assert a.uniforms == b.uniforms
