"""A step, a rewind or a fork either completes or leaves the decoder exactly as it was.

The app's reruns stop a script by raising a ``BaseException`` at the next Streamlit call; an
exception can therefore land anywhere inside a step. Each test breaks a step after a part of
it has already changed the decoder, then checks the state is bit-for-bit the one before, and
that continuing gives the very tokens and logits of a run that was never interrupted.
"""

from __future__ import annotations

import pytest
import torch

from semviz import sampling
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.eviction import make_policy
from semviz.sampling import PruneParams

PROMPT = "The lighthouse keeper climbed the stairs"


class Interrupted(BaseException):
    """Stands in for Streamlit's RerunException / StopException (both BaseException)."""


CONFIGS = {
    "plain": (PruneParams(temperature=0.9, top_p=0.95), None),
    "ema-gravity": (PruneParams(temperature=0.8, gravity_lambda=0.6, gravity_mass="ema"), None),
    "eviction": (PruneParams(temperature=0.8), ("h2o", 12)),
    "mirostat": (PruneParams(adaptive="mirostat"), None),
}


def make(lm, params, policy, seed=5):
    ev = make_policy(*policy) if policy is not None else None
    return Decoder(lm, PROMPT, params, DecodeSettings(seed=seed, max_new_tokens=64), eviction=ev)


def fingerprint(d: Decoder) -> dict:
    """Everything a later step depends on, as plain values and cloned tensors."""
    s = d.sampler
    return {
        "ids": list(d.ids),
        "positions": [p.clone() for p in d.positions],
        "keys": [x.keys.clone() for x in d.cache.layers],
        "values": [x.values.clone() for x in d.cache.layers],
        "hidden": None if d.hidden is None else d.hidden.clone(),
        "ema": None if d.attn_ema is None else d.attn_ema.clone(),
        "sampler": (s.mirostat_mu, s.last_temperature, list(s.tokens), list(s.entropies), s.steps),
        "generator": d.generator.get_state().clone(),
        "steps": [r.token_id for r in d.trace.steps],
        "snapshots": len(d._snapshots),
        "done": (d.done, d.stop_reason, d.trace.stop_reason),
        "pending": d._pending,
        "params": d.params,
        "trace_params": dict(d.trace.settings["params"]),
        "eviction": None if d.eviction is None else repr(vars(d.eviction)),
    }


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, list) and x and isinstance(x[0], torch.Tensor):
            assert len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y, strict=True)), k
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y), k
        elif k == "pending":
            assert x is y, k
        else:
            assert x == y, k


def after_then_raise(obj, name, monkeypatch, *, on_call=1):
    """Make ``obj.name`` run, then raise ``Interrupted`` on its ``on_call``-th call."""
    orig = getattr(obj, name)
    calls = {"n": 0}

    def wrapped(*a, **kw):
        out = orig(*a, **kw)
        calls["n"] += 1
        if calls["n"] == on_call:
            raise Interrupted()
        return out

    monkeypatch.setattr(obj, name, wrapped)
    return calls


# where the step is broken: after the forward's bookkeeping (cache grown, hidden appended,
# EMA folded, eviction applied), after sampling (generator drawn, sampler advanced), and
# after the whole step was recorded (trace and ids appended)
BREAK_AT = ["_after_forward", "choose", "_check_stop"]


@pytest.mark.parametrize("where", BREAK_AT)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_an_interrupted_step_changes_nothing(tiny_lm, monkeypatch, config, where):
    params, policy = CONFIGS[config]
    ref = make(tiny_lm, params, policy)
    ref.run(10)
    d = make(tiny_lm, params, policy)
    d.run(4)
    before = fingerprint(d)
    with monkeypatch.context() as m:
        target = sampling if where == "choose" else d
        calls = after_then_raise(target, where, m)
        with pytest.raises(Interrupted):
            d.step()
        assert calls["n"] == 1  # the break really happened inside the step
    assert_same(fingerprint(d), before)
    d.run(6)
    assert d.trace.token_ids == ref.trace.token_ids
    for a, b in zip(d.trace.steps, ref.trace.steps, strict=True):
        assert torch.equal(a.cand_logits, b.cand_logits) and a.u == b.u


@pytest.mark.parametrize("config", list(CONFIGS))
def test_an_interrupted_rewind_changes_nothing(tiny_lm, monkeypatch, config):
    params, policy = CONFIGS[config]
    d = make(tiny_lm, params, policy)
    d.run(8)
    before = fingerprint(d)
    with monkeypatch.context() as m:
        # with eviction the rewind re-feeds the kept steps: break it on the third forward;
        # without, break it at its end (cache cropped, trace cut)
        name, n = ("_forward", 3) if policy is not None else ("_check_stop", 1)
        if policy is None:
            orig = d._rewind

            def rewind_then_raise(*a, **kw):
                orig(*a, **kw)
                raise Interrupted()

            m.setattr(d, "_rewind", rewind_then_raise)
        else:
            after_then_raise(d, name, m, on_call=n)
        with pytest.raises(Interrupted):
            d.rewind(3, PruneParams(temperature=0.3))
    assert_same(fingerprint(d), before)
    # and the decoder still rewinds and continues like one that was never interrupted
    ref = make(tiny_lm, params, policy)
    ref.run(8)
    for dec in (d, ref):
        dec.rewind(3, PruneParams(temperature=0.3))
        dec.run(5)
    assert d.trace.token_ids == ref.trace.token_ids


def test_a_run_interrupted_midway_keeps_the_whole_steps(tiny_lm, monkeypatch):
    params, policy = CONFIGS["plain"]
    ref = make(tiny_lm, params, policy)
    ref.run(9)
    d = make(tiny_lm, params, policy)
    with monkeypatch.context() as m:
        after_then_raise(d, "_after_forward", m, on_call=5)
        with pytest.raises(Interrupted):
            d.run(9)
    assert d.trace.token_ids == ref.trace.token_ids[: d.n_steps]
    d.run(9 - d.n_steps)
    assert d.trace.token_ids == ref.trace.token_ids


@pytest.mark.parametrize("config", list(CONFIGS))
def test_forks_are_independent(tiny_lm, config):
    params, policy = CONFIGS[config]
    ref = make(tiny_lm, params, policy)
    ref.run(12)
    d = make(tiny_lm, params, policy)
    d.run(6)
    f = d.fork()
    before = fingerprint(d)
    # the fork branches: rewind two steps, force another token, decode on
    alt = int(d.trace.steps[4].cand_ids[1])
    f.rewind(4, PruneParams(temperature=0.5))
    f.step(force_token=alt)
    f.run(5)
    assert_same(fingerprint(d), before)  # the parent did not move
    d.run(6)
    assert d.trace.token_ids == ref.trace.token_ids
    # the fork equals the same branch made on a fresh decoder
    g = make(tiny_lm, params, policy)
    g.run(6)
    g.rewind(4, PruneParams(temperature=0.5))
    g.step(force_token=alt)
    g.run(5)
    assert f.trace.token_ids == g.trace.token_ids
    assert f.trace.token_ids[4] == alt and f.trace.token_ids[:4] == ref.trace.token_ids[:4]
