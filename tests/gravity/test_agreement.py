"""One gravity: the decoder, the generate processor and replay give the same G."""

from __future__ import annotations

import pytest
import torch

from semviz import eviction as ev
from semviz import gravity as gv
from semviz import processors as sp
from semviz.analysis.replay import recompute_gravity, replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.model.capture import AttentionSink
from semviz.sampling import PruneParams

PROMPT = "Write a story about a beekeeper who talks to her bees."
MASSES = ("attention", "ema", "uniform", "idf", "norm", "info")
PULL = PruneParams(temperature=1.0, gravity_lambda=1.0, gravity_kind="pull")
ANCHORS = (
    {},  # the default pull
    {"gravity_anchor": "context", "gravity_copy_cos": 0.3, "gravity_ngram": 2},
    {"gravity_anchor": "window", "gravity_window": 12},
    gv.FIRST_GRAVITY,
)


def _run(lm, params, n=5, **kw):
    d = Decoder(lm, PROMPT, params, DecodeSettings(seed=3, max_new_tokens=n), **kw)
    d.run(n)
    return d


def _processor_gravity(lm, params, d):
    """Feed the processor each step's context and the attention the decoder saw, in order."""
    sink = AttentionSink()
    hidden = sp.HiddenSink()
    proc = sp.NarrativeGravityLogitsProcessor.from_params(
        lm, params, attention_sink=sink, hidden_sink=hidden
    )
    n0 = len(d.prompt_ids)
    out = []
    for i, rec in enumerate(d.trace.steps):
        ids = torch.tensor([d.ids[: n0 + i]])  # (1, T)
        att = rec.attention.float()  # (L, H, S) as the decoder read it
        sink.rows = {layer: att[layer][None] for layer in range(att.shape[0])}  # (1, H, S)
        hidden.clear()
        hidden.add(d.hidden[None, : n0 + i])  # (1, T, d)
        out.append(proc.gravity(ids)[0][rec.cand_ids.long()])
    return out


@pytest.mark.parametrize("anchor", range(len(ANCHORS)))
@pytest.mark.parametrize("mass", MASSES)
def test_decoder_processor_and_replay_agree(tiny_lm, mass, anchor):
    p = PULL.replace(**ANCHORS[anchor]).replace(gravity_mass=mass)
    d = _run(tiny_lm, p)
    live = [rec.gravity for rec in d.trace.steps]
    assert all(g is not None and g.abs().max() > 0.1 for g in live)
    replayed = recompute_gravity(tiny_lm.model, d.trace, p, hidden=d.hidden)
    processed = _processor_gravity(tiny_lm, p, d)
    for i, g in enumerate(live):
        torch.testing.assert_close(replayed[i], g, atol=1e-6, rtol=0)
        torch.testing.assert_close(processed[i], g, atol=1e-6, rtol=0)


@pytest.mark.parametrize("space", ["hidden", "contextual"])
@pytest.mark.parametrize("mass", ["ema", "idf"])
def test_hidden_spaces_agree(tiny_lm, space, mass):
    p = PULL.replace(gravity_space=space, gravity_mass=mass)
    d = _run(tiny_lm, p, n=4)
    replayed = recompute_gravity(tiny_lm.model, d.trace, p, hidden=d.hidden)
    processed = _processor_gravity(tiny_lm, p, d)
    for i, rec in enumerate(d.trace.steps):
        torch.testing.assert_close(replayed[i], rec.gravity, atol=1e-6, rtol=0)
        torch.testing.assert_close(processed[i], rec.gravity, atol=1e-6, rtol=0)


def test_ema_after_eviction_agrees_with_replay(tiny_lm):
    """The EMA is kept by absolute position, so replay of an evicting run reproduces it."""
    p = PULL.replace(gravity_mass="ema", gravity_anchor="context")
    d = _run(tiny_lm, p, n=8, eviction=ev.make_policy("h2o", budget=40))
    assert d.trace.steps[-1].cache_len < len(d.ids) - 1  # something was evicted
    replayed = recompute_gravity(tiny_lm.model, d.trace, p, hidden=d.hidden)
    for rec, g in zip(d.trace.steps, replayed, strict=True):
        torch.testing.assert_close(g, rec.gravity, atol=1e-6, rtol=0)


def test_replay_at_the_recorded_settings_reuses_the_record(tiny_lm):
    # rerank: replay is exact (full-vocabulary gravity can move mass outside the record)
    p = PULL.replace(gravity_mass="ema", gravity_mode="rerank")
    d = _run(tiny_lm, p)
    w = replay(d.trace, p, model=tiny_lm.model)
    assert w.token_ids == d.trace.token_ids and w.first_diff is None
    # another anchor is recomputed, from the roles the trace recorded
    other = replay(d.trace, p.replace(gravity_anchor="context"), model=tiny_lm.model)
    assert other.note is None and len(other.results) == 5
    assert (
        d.trace.extra["prompt_roles"] == gv.prompt_roles(tiny_lm.tokenizer, d.prompt_ids).tolist()
    )


def test_contrast_agrees_live_and_in_replay(tiny_lm):
    p = PruneParams(temperature=1.0, gravity_lambda=0.5, gravity_contrast_k=5)  # the default
    d = _run(tiny_lm, p, n=4)
    replayed = recompute_gravity(tiny_lm.model, d.trace, p)
    for rec, g in zip(d.trace.steps, replayed, strict=True):
        torch.testing.assert_close(g, rec.gravity, atol=1e-6, rtol=0)
    # the processor, handed the same full logits, computes the same G
    proc = sp.NarrativeGravityLogitsProcessor.from_params(tiny_lm, p)
    n0 = len(d.prompt_ids)
    for i, rec in enumerate(d.trace.steps):
        ids = torch.tensor([d.ids[: n0 + i]])
        with torch.no_grad():
            full = tiny_lm.model(ids).logits[:, -1].float()  # (1, V)
        g = proc.gravity(ids, full)[0][rec.cand_ids.long()]
        torch.testing.assert_close(g, rec.gravity, atol=1e-4, rtol=1e-4)


def test_gravity_terms_sum_to_the_raw_potential(tiny_lm):
    p = PULL.replace(gravity_mass="ema")
    d = _run(tiny_lm, p, n=4)
    i, tok = 3, d.trace.steps[3].token_id
    pos, terms = gv.gravity_terms(tiny_lm.model, d.trace, i, tok, p, hidden=d.hidden)
    ctx = gv.trace_context(d.trace, i)
    cp = gv.trace_pulls(tiny_lm.model, p, d.trace, upto=i + 1)[i]
    raw = gv.candidate_matrix(tiny_lm.model, "embedding", "cosine")[tok] @ cp.pull
    assert pos.tolist() == list(range(ctx.ids.numel()))
    assert float(terms.sum()) == pytest.approx(float(raw), abs=1e-6)
    roles = torch.tensor(d.trace.extra["prompt_roles"])
    assert (terms[: roles.numel()][(roles != gv.USER).numpy()] == 0).all()
    with pytest.raises(ValueError, match="no per-token terms"):
        gv.gravity_terms(tiny_lm.model, d.trace, i, tok, p.replace(gravity_kind="contrast"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("params", [gv.FIRST_GRAVITY, {"gravity_kind": "contrast"}])
def test_decoder_on_cuda_gives_the_cpu_gravity(tiny_dir, params):
    """The first gravity and the default on a GPU: the same tokens and G as on the CPU."""
    import semviz

    p = PULL.replace(**params)
    runs = [
        _run(semviz.load_model(str(tiny_dir), dtype="float32", device=dev), p)
        for dev in ("cpu", "cuda")
    ]
    cpu, gpu = runs
    assert gpu.trace.token_ids == cpu.trace.token_ids
    for a, b in zip(cpu.trace.steps, gpu.trace.steps, strict=True):
        torch.testing.assert_close(b.gravity.cpu(), a.gravity, atol=1e-4, rtol=0)
