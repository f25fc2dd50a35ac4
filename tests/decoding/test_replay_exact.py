"""On the real default model: replay with new settings picks what a live decode with those
settings picks from the same draw, or marks the step approximate.

The reference is teacher-forced: each step's whole-vocabulary logits (and gravity) are kept
from the recorded decode, and the new settings' chain runs over them with the step's
recorded draw, as a live decode from the recorded prefix would.
"""

from __future__ import annotations

import pytest

from semviz import sampling
from semviz.analysis.replay import replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams

pytestmark = pytest.mark.real_model

# (prompt, chat, recorded settings, steps, record_k): the shipped examples' prompts and
# settings (data/README.md), then prompts of other kinds
RUNS = [
    ("Write one sentence about the sea.", True, PruneParams(temperature=0.8), 40, 128),
    (
        "Once upon a time, in a village at the edge of a frozen sea,",
        False,
        PruneParams(
            temperature=0.8, top_k=50, top_p=0.95, gravity_lambda=0.5, gravity_mode="rerank"
        ),
        32,
        128,
    ),
    ("The capital of France is", False, PruneParams(temperature=0.7), 16, 128),
    ("Explain to a ten-year-old why the sea is salty.", True, PruneParams(), 40, 1024),
    ("Say café 😀 日本語 naïve", True, PruneParams(), 24, 1024),
    ("def fibonacci(n):", False, PruneParams(temperature=1.0), 32, 1024),
]

WHAT_IFS = [
    {"temperature": 0.3},
    {"temperature": 1.3},
    {"temperature": 2.0},
    {"temperature": 1.5, "top_k": 20},
    {"temperature": 1.3, "top_p": 0.9},
    {"temperature": 2.0, "top_p": 0.5},
    {"temperature": 1.3, "min_p": 0.05},
    {"temperature": 2.0, "min_p": 0.01},
]


def _record(lm, prompt, chat, params, steps, record_k, monkeypatch, full=True):
    """Decode, keeping each step's whole-vocabulary logits and gravity; ``full``: the trace
    records every raw logit too (the default), else only the candidates and the tail's bins."""
    seen = []
    real = sampling.prune

    def keep(logits, p, *, gravity=None, **kw):
        seen.append((logits.detach().clone(), None if gravity is None else gravity.clone()))
        return real(logits, p, gravity=gravity, **kw)

    settings = DecodeSettings(
        max_new_tokens=steps, seed=0, chat=chat, record_k=record_k, capture=False, full_logits=full
    )
    dec = Decoder(lm, prompt, params, settings)
    with monkeypatch.context() as m:
        m.setattr(sampling, "prune", keep)
        dec.run(steps)
    assert len(seen) == len(dec.trace.steps)
    return dec.trace, seen


def _teacher_forced(trace, seen, params):
    """The live chain's pick at each step under ``params``, from the recorded prefix."""
    state, out = sampling.SamplerState(), []
    for rec, (logits, g) in zip(trace.steps, seen, strict=True):
        res = sampling.prune(logits, params, gravity=g, state=state)
        out.append(sampling.choose(res, rec.u, state=sampling.SamplerState()))
        state.observe(res, rec.token_id, rec.token_id)
    return out


@pytest.fixture(scope="module")
def runs(real_lm):
    mp = pytest.MonkeyPatch()
    try:
        return [(_record(real_lm, *r, mp), r[2]) for r in RUNS]
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def bounded_runs(real_lm):
    mp = pytest.MonkeyPatch()
    try:
        return [(_record(real_lm, *r, mp, full=False), r[2]) for r in RUNS]
    finally:
        mp.undo()


def _agreement(runs) -> tuple[int, int, int]:
    """Steps replayed, steps whose pick equals the live decode's, steps marked approximate;
    every step that differs must be marked, with a reason."""
    total = agree = marked = 0
    for (trace, seen), recorded in runs:
        for change in WHAT_IFS:
            params = recorded.replace(**change)
            truth = _teacher_forced(trace, seen, params)
            w = replay(trace, params)
            assert len(w.approximate) == len(truth)
            marked += w.n_approximate
            for i, t in enumerate(truth):
                total += 1
                agree += w.token_ids[i] == t
                if w.token_ids[i] != t:
                    assert w.approximate[i], (trace.prompt, change, i, w.token_ids[i], t)
                    assert w.why[i]
    return total, agree, marked


def test_replay_picks_what_a_live_decode_picks(runs):
    # every raw logit recorded: the live chain decides the steps the candidates cannot,
    # tokens outside the candidates included (at T 2.0 a quarter of the draws land there)
    total, agree, marked = _agreement(runs)
    assert total >= 1000
    assert agree / total >= 0.995, (agree, total)
    assert marked == total - agree


def test_without_full_logits_replay_marks_what_it_cannot_decide(bounded_runs):
    # the candidates and the tail's bins alone: draws that land among tokens the record does
    # not hold, or so near a boundary that the bins cannot place them, are marked approximate
    total, agree, marked = _agreement(bounded_runs)
    assert total >= 1000
    assert 0.85 <= agree / total < 0.995, (agree, total)
    assert marked >= total - agree


def test_the_recorded_settings_replay_exactly(runs):
    for (trace, _), recorded in runs:
        w = replay(trace, recorded)
        assert w.token_ids == trace.token_ids and not any(w.approximate)


def test_a_hotter_replay_scales_the_draw_by_the_new_tail(bounded_runs):
    # T 0.8 recorded, T 1.3 replayed: the live decode at T 1.3 picks "Hello" from the same
    # draw, which the recorded run's tail share misplaced
    (trace, seen), recorded = bounded_runs[3]
    params = recorded.replace(temperature=1.3)
    truth = _teacher_forced(trace, seen, params)
    w = replay(trace, params)
    assert w.token_ids[0] == truth[0]
    assert not w.approximate[0]


def test_a_pick_outside_the_candidates_is_the_live_token(runs):
    # T 2.0 on a run recorded with 128 candidates: some draws land outside them; replay names
    # the live decode's token there (candidate index -1), exactly, not the recorded one
    (trace, seen), recorded = runs[0]
    params = recorded.replace(temperature=2.0)
    truth = _teacher_forced(trace, seen, params)
    w = replay(trace, params)
    outside = [i for i, c in enumerate(w.chosen) if c == -1]
    assert outside
    for i in outside:
        assert w.token_ids[i] == truth[i]
        assert int(truth[i]) not in trace.steps[i].cand_ids.tolist()
        assert not w.approximate[i]
