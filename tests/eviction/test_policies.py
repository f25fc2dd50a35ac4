"""Every policy through the real ``Decoder`` on the tiny model: budgets and thresholds are
respected, positions stay right, and the timeline accounts for every entry."""

from __future__ import annotations

import math

import pytest
import torch

from semviz import eviction as ev
from semviz.decoding.decoder import Decoder, DecodeSettings, cache_nbytes
from semviz.output.trace import Trace
from semviz.sampling import PruneParams

PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good"
STEPS = 10
KEYS = {
    "policy",
    "query_position",
    "n_seen",
    "budget",
    "threshold",
    "lengths",
    "positions",
    "scores",
    "protected",
    "evicted",
    "evicted_scores",
    "rule",
    "rules",
    "evicted_mass",
    "regret",
    "regret_is_estimate",
    "regret_method",
    "bytes",
    "cache_bytes",
    "seconds",
}

THRESHOLDS = {"window": -6, "streaming": -6, "h2o": 0.3, "tova": 1.0, "ema": 1.0, "gravity": 1.0}
MODES = {
    "tokens": lambda name: {"budget": 10},
    "fraction": lambda name: {"budget": 0.5},
    "per_layer": lambda name: {"budget": (9, 13)},
    "threshold": lambda name: {"threshold": THRESHOLDS[name]},
}
# every policy with a token budget, and each with one of the other ways to set it
_OTHER = ["fraction", "per_layer", "threshold"]
MATRIX = [("full", "none")] + [
    (name, mode)
    for i, name in enumerate(n for n in ev.POLICIES if n != "full")
    for mode in ("tokens", _OTHER[i % 3])
]
SETTINGS = DecodeSettings(max_new_tokens=STEPS, chat=False, capture=False, record_k=16)


_RUNS: dict[tuple[str, str], tuple[Decoder, ev.EvictionPolicy]] = {}


def _run(lm, name: str, mode: str) -> tuple[Decoder, ev.EvictionPolicy]:
    """One decoder run per (policy, mode), shared by the tests below (the model is seeded)."""
    if (name, mode) not in _RUNS:
        _RUNS[name, mode] = _fresh_run(lm, name, mode)
    return _RUNS[name, mode]


def _fresh_run(lm, name: str, mode: str) -> tuple[Decoder, ev.EvictionPolicy]:
    kw = {} if mode == "none" else MODES[mode](name)
    policy = ev.make_policy(name, **kw)
    d = Decoder(
        lm,
        PROMPT,
        PruneParams(temperature=0),
        SETTINGS,
        eviction=policy,
    )
    d.run(STEPS)
    return d, policy


def _held(row: torch.Tensor) -> list[int]:
    return [int(p) for p in row if p >= 0]


@pytest.mark.parametrize(("name", "mode"), MATRIX)
def test_policy_matrix(tiny_lm, name, mode):
    d, policy = _run(tiny_lm, name, mode)
    steps = d.trace.steps
    assert len(steps) == STEPS
    n_layers = tiny_lm.config.num_hidden_layers
    n_prompt = len(d.prompt_ids)
    prev: list[set[int]] | None = None
    for rec in steps:
        e = rec.eviction
        # timeline complete: every key, consistent shapes
        assert e is not None and set(e) == KEYS
        assert e["policy"] == name and e["regret_is_estimate"] is True
        n_seen = e["n_seen"]
        assert e["query_position"] == n_seen - 1 == rec.position - 1
        assert e["positions"].shape[0] == e["evicted"].shape[0] == n_layers
        assert e["rule"].shape == e["evicted"].shape
        for layer in range(n_layers):
            held = _held(e["positions"][layer])
            gone = _held(e["evicted"][layer])
            # positions stay right: sorted, unique, in range, newest kept
            assert held == sorted(set(held)) and all(0 <= p < n_seen for p in held)
            assert n_seen - 1 in held and not set(held) & set(gone)
            assert len(held) == int(e["lengths"][layer])
            # every entry is accounted for: what was held plus what arrived = held + evicted
            before = set(range(n_prompt)) if prev is None else prev[layer] | {n_seen - 1}
            assert set(held) | set(gone) == before
            # budgets respected
            b = policy.layer_budget(layer, n_seen)
            if b is not None:
                assert len(held) <= b and int(e["budget"][layer]) == b
                if mode == "tokens":
                    assert len(held) == min(b, n_seen)
            # thresholds respected (scores are float16 in the record)
            thr = policy.layer_threshold(layer)
            if thr is not None:
                s = e["scores"][layer, : len(held)].float()
                free = ~e["protected"][layer, : len(held)]
                assert bool((s[free] >= thr - 1e-2 * (1 + abs(thr))).all())
                codes = e["rule"][layer, : len(gone)].tolist()
                assert all(ev.RULES[c] == "threshold" for c in codes)
            if gone and thr is None:
                assert {ev.RULES[c] for c in e["rule"][layer, : len(gone)].tolist()} == {
                    policy.budget_rule
                }
            assert 0.0 <= float(e["evicted_mass"][layer]) <= 1.0 + 1e-6
            assert 0.0 <= float(e["regret"][layer]) < 1.0
        prev = [set(_held(e["positions"][layer])) for layer in range(n_layers)]
        assert e["cache_bytes"] == int(e["bytes"].sum())
    # the decoder's real cache matches the last record
    last = steps[-1].eviction
    for layer in range(n_layers):
        lay = d.cache.layers[layer]
        assert lay.keys.shape[-2] == lay.values.shape[-2] == d.positions[layer].numel()
    # the step after the last record fed one more token that is not evicted yet
    assert last["cache_bytes"] == cache_nbytes(d.cache) or d.n_steps == STEPS
    assert d.trace.settings["eviction"]["policy"] == name
    # the record survives the trace's JSON round trip
    back = Trace.from_json(d.trace.to_json())
    assert back == d.trace


@pytest.mark.parametrize("name", [n for n in ev.POLICIES if n != "full"])
def test_memory_really_drops(tiny_lm, name):
    d_full, _ = _run(tiny_lm, "full", "none")
    d, _ = _run(tiny_lm, name, "tokens")
    assert cache_nbytes(d.cache) < cache_nbytes(d_full.cache)
    assert d.trace.steps[-1].cache_bytes < d_full.trace.steps[-1].cache_bytes


def test_full_never_evicts(tiny_lm):
    d, _ = _run(tiny_lm, "full", "none")
    e = d.trace.steps[-1].eviction
    assert e["evicted"].numel() == 0 and e["scores"] is None
    assert int(e["lengths"][0]) == e["n_seen"]


def test_streaming_keeps_sinks_and_recent(tiny_lm):
    d, _ = _run(tiny_lm, "streaming", "tokens")
    e = d.trace.steps[-1].eviction
    n = e["n_seen"]
    assert _held(e["positions"][0]) == [0, 1, 2, 3] + list(range(n - 6, n))


def test_window_keeps_recent_only(tiny_lm):
    d, _ = _run(tiny_lm, "window", "tokens")
    e = d.trace.steps[-1].eviction
    n = e["n_seen"]
    assert _held(e["positions"][1]) == list(range(n - 10, n))


def test_h2o_keeps_heavy_hitters_and_recent_half(tiny_lm):
    d, policy = _run(tiny_lm, "h2o", "tokens")
    e = d.trace.steps[-1].eviction
    n = e["n_seen"]
    held = _held(e["positions"][0])
    assert set(range(n - 5, n)) <= set(held)  # recent = half the budget
    assert len([p for p in held if p < n - 5]) == 5


def test_gravity_protects_theme_tokens(tiny_lm):
    policy = ev.make_policy("gravity", budget=10, protect_z=0.5, protect_frac=0.5, beta=0.0)
    d = Decoder(
        tiny_lm,
        PROMPT,
        PruneParams(temperature=0),
        SETTINGS,
        eviction=policy,
    )
    d.run(6)
    e = d.trace.steps[-1].eviction
    prot = e["protected"][0]
    assert 1 <= int(prot.sum()) <= 5 + 1  # theme (≤ half the budget) + the newest token


def test_rewind_rebuilds_policy_state(tiny_lm):
    d, _ = _fresh_run(tiny_lm, "h2o", "tokens")
    want = [s.eviction["positions"] for s in d.trace.steps[6:9]]
    d.rewind(6)
    d.run(3)
    got = [s.eviction["positions"] for s in d.trace.steps[6:9]]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


# -- argument validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"budget": 0}, "budget"),
        ({"budget": -3}, "budget"),
        ({"budget": 1.5}, "budget"),
        ({"budget": True}, "budget"),
        ({"budget": []}, "budget"),
        ({"budget": (8, 0)}, "budget[1]"),
        ({"threshold": float("nan")}, "threshold"),
        ({"threshold": "x"}, "threshold"),
        ({"budget": 8, "sinks": -1}, "sinks"),
        ({"budget": 8, "recent": -1}, "recent"),
        ({"budget": 4, "sinks": 4}, "budget"),
        ({"budget": 8, "regret_decay": 2.0}, "regret_decay"),
    ],
)
def test_invalid_arguments_name_the_argument(kw, word):
    with pytest.raises(ValueError, match=word.replace("[", r"\[")):
        ev.H2OPolicy(**kw)


def test_invalid_policy_specific_arguments():
    with pytest.raises(ValueError, match="policy"):
        ev.make_policy("nope", budget=8)
    with pytest.raises(ValueError, match="full"):
        ev.make_policy("full", budget=8)
    with pytest.raises(ValueError, match="budget"):
        ev.make_policy("window")
    with pytest.raises(ValueError, match="decay"):
        ev.make_policy("ema", budget=8, decay=1.0)
    for kw, word in [({"space": "x"}, "space"), ({"mass": "x"}, "mass"), ({"sim": "x"}, "sim")]:
        with pytest.raises(ValueError, match=word):
            ev.make_policy("gravity", budget=8, **kw)
    with pytest.raises(ValueError, match="context_window"):
        ev.make_policy("gravity", budget=8, context_window=0)


def test_per_layer_length_must_match_model(tiny_lm):
    policy = ev.make_policy("tova", budget=(8, 8, 8))
    with pytest.raises(ValueError, match="budget has 3 values"):
        Decoder(tiny_lm, PROMPT, eviction=policy)


def test_parse_budget_and_to_dict():
    assert ev.parse_budget("128") == 128 and ev.parse_budget("0.25") == 0.25
    with pytest.raises(ValueError, match="budget"):
        ev.parse_budget("lots")
    d = ev.make_policy("gravity", budget=(8, 16), beta=1.0).to_dict()
    assert d["policy"] == "gravity" and d["budget"] == [8, 16] and d["beta"] == 1.0
    assert math.isinf(ev.make_policy("gravity", budget=8, protect_z=math.inf).protect_z)


@pytest.mark.parametrize(
    "module",
    [
        "semviz.eviction",
        "semviz.eviction.policies",
        "semviz.eviction.rerotate",
        "semviz.model.forward",
    ],
)
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
