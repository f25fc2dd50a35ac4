"""Gravity's settings come from the ``setting()`` metadata: every field that shapes ``G`` is in
replay's key, a kind can read no other, and the ``generate()`` processor takes each one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from semviz import gravity as gv
from semviz import processors as sp
from semviz.analysis.replay import GravityCache, needs_new_gravity
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.model.capture import AttentionSink
from semviz.sampling import GRAVITY_FIELDS, SPECS, GravityParams, PruneParams

RECORDED = PruneParams(temperature=1.0, gravity_lambda=1.0, gravity_kind="pull")


def _another(name: str, v):
    """A valid value of field ``name`` other than ``v``."""
    spec = SPECS[name]
    if spec.kind == "bool":
        return not v
    if spec.kind == "choice":
        return next(c for c in spec.choices if c != v)
    if spec.kind == "indices":
        return (0,) if v is None else None
    if spec.kind == "int":
        return v + 1 if spec.hi is None or v + 1 <= spec.hi else v - 1
    return v / 2 if v > 0 else 0.5


@pytest.fixture(scope="module")
def recorded(tiny_lm):
    d = Decoder(tiny_lm, "The old clock", RECORDED, DecodeSettings(max_new_tokens=3, seed=1))
    d.run(3)
    return d.trace


def test_the_fields_are_the_ones_declared_to_shape_g():
    declared = [n for n, s in SPECS.items() if s.gravity == "shape"]
    assert GRAVITY_FIELDS == tuple(declared) and len(declared) == 16
    assert [f.name for f in dataclasses.fields(GravityParams)] == declared
    assert {n for n, s in SPECS.items() if s.gravity == "use"} == {
        "gravity_lambda",
        "gravity_mode",
        "rerank_k",
    }
    assert RECORDED.gravity_params == GravityParams(**{n: getattr(RECORDED, n) for n in declared})
    assert PruneParams().gravity_params == GravityParams()  # the same defaults


@pytest.mark.parametrize("name", GRAVITY_FIELDS)
def test_every_field_that_shapes_g_makes_replay_recompute_it(name, recorded, tiny_lm):
    assert not needs_new_gravity(recorded, RECORDED)  # the recorded G is reused as is
    p = RECORDED.replace(**{name: _another(name, getattr(RECORDED, name))})
    assert needs_new_gravity(recorded, p), name
    cache = GravityCache()
    first = cache.get(tiny_lm.model, recorded, RECORDED)
    assert cache.get(tiny_lm.model, recorded, RECORDED) is first
    assert cache.get(tiny_lm.model, recorded, p) is not first, name


def test_the_cache_names_a_run_by_its_step_records_not_by_the_trace_copy(recorded, tiny_lm):
    """A page draws a new copy of the trace after each token, sharing the step records: the
    copy hits the cache; the run grown by a step, or another run, does not."""
    p = RECORDED.replace(gravity_kind="contrast")
    cache = GravityCache()
    first = cache.get(tiny_lm.model, recorded, p)
    copy = dataclasses.replace(recorded, steps=list(recorded.steps))
    assert copy is not recorded and cache.has(copy, p)
    assert cache.get(tiny_lm.model, copy, p) is first
    assert not cache.has(dataclasses.replace(recorded, steps=recorded.steps[:-1]), p)
    other = dataclasses.replace(recorded, steps=[dataclasses.replace(recorded.steps[0])])
    assert not cache.has(other, p)


@pytest.mark.parametrize("name", ["gravity_lambda", "gravity_mode", "rerank_k"])
def test_a_field_that_only_uses_g_keeps_the_recorded_one(name, recorded):
    p = RECORDED.replace(**{name: _another(name, getattr(RECORDED, name))})
    assert not needs_new_gravity(recorded, p) and p.gravity_params == RECORDED.gravity_params


class Peek(gv.GravityKind):
    """A kind that reads a setting not declared ``gravity="shape"``."""

    name = "peek"

    def potential(self, model, params, step):
        return torch.full((step.tokens().numel(),), params.temperature)


def test_a_kind_cannot_read_a_field_outside_the_key(tiny_lm):
    """Were it able to, replay would reuse a recorded G that the field changed."""
    gv.register_kind(Peek)
    try:
        p = PruneParams(gravity_lambda=1.0, gravity_kind="peek")
        step = gv.GravityStep(
            ctx=gv.GravityContext(ids=torch.tensor([5, 6])), index=torch.arange(3)
        )
        with pytest.raises(AttributeError, match="temperature"):
            gv.compute(tiny_lm.model, p, [step])
    finally:
        gv.unregister_kind("peek")


def test_the_processor_takes_every_gravity_field(tiny_lm):
    changed = {n: _another(n, getattr(PruneParams(), n)) for n in SPECS if SPECS[n].gravity}
    p = PruneParams(**changed)
    assert p.gravity_kind == "pull" and p.gravity_space == "hidden"  # needs both sinks
    proc = sp.NarrativeGravityLogitsProcessor.from_params(
        tiny_lm, p, attention_sink=AttentionSink(), hidden_sink=sp.HiddenSink()
    )
    assert {n: getattr(proc.params, n) for n in changed} == changed
    by_keyword = sp.NarrativeGravityLogitsProcessor(
        tiny_lm,
        p.gravity_lambda,
        attention_sink=AttentionSink(),
        hidden_sink=sp.HiddenSink(),
        **{n.removeprefix("gravity_"): v for n, v in changed.items() if n != "gravity_lambda"},
    )
    assert by_keyword.params == proc.params
    import inspect

    shown = inspect.signature(sp.NarrativeGravityLogitsProcessor).parameters
    assert {n.removeprefix("gravity_") for n in changed} - {"lambda"} <= set(shown)


def test_the_processor_names_an_unknown_keyword(tiny_lm):
    with pytest.raises(ValueError, match=r"`masss` is not an argument .*did you mean `mass`"):
        sp.NarrativeGravityLogitsProcessor(tiny_lm, 0.5, masss="idf")
    with pytest.raises(ValueError, match="gravity_mass"):
        sp.NarrativeGravityLogitsProcessor(tiny_lm, 0.5, mass="nope")
