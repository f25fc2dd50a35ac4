"""semviz.charts on a real trace from the tiny model: valid Plotly, data present, caps respected."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from semviz import charts
from semviz.decoding import Decoder, DecodeSettings
from semviz.replay import replay
from semviz.sampling import PruneParams


@pytest.fixture(scope="module")
def run(tiny_lm):
    p = PruneParams(temperature=0.9, top_k=20, top_p=0.9, gravity_lambda=0.5, fallback=True)
    dec = Decoder(tiny_lm, "Once upon a time", p, DecodeSettings(seed=3, chat=False))
    dec.run(12)
    wi = replay(dec.trace, p.replace(temperature=0.4), model=tiny_lm.model)
    return tiny_lm, dec.trace, wi, p


def validated(fig: go.Figure) -> go.Figure:
    """Re-build with Plotly's full validation: the dict-built figures must pass it."""
    return go.Figure(fig.to_dict())


def test_whatif_figures_are_valid_plotly(run):
    lm, tr, wi, p = run
    i = len(tr.steps) - 1
    rec, res = tr.steps[i], wi.results[i]
    labels = [lm.tokenizer.decode([t]) for t in rec.cand_ids[:60].tolist()]
    stages = charts.step_stages(rec, res)
    df = charts.step_frame(tr, wi.results, wi.chosen)
    figs = [
        charts.distribution_figure(labels, stages, kept=res.kept.numpy(), chosen=wi.chosen[i]),
        charts.distribution_figure(labels, stages, mode="overlay", top=10),
        charts.waterfall_figure([w.to_dict() for w in res.waterfall]),
        charts.rank_shift_figure(labels, stages["raw"][:60], stages["gravity"][:60], top=10),
        charts.entropy_figure(df, p, selected=2, first_diff=wi.first_diff),
        charts.thermo_figure(df, selected=2, first_diff=1),
        charts.entropy_scatter(df, selected=2),
        charts.chain_figure(p),
    ]
    for f in figs:
        v = validated(f)
        assert v.data and all(len(t.to_plotly_json()) for t in v.data)
    assert len(figs[0].data) == 4  # one panel per stage
    assert len(figs[0].data[0].x) == charts.TOP


def test_long_context_is_binned():
    att = np.random.default_rng(0).random((3, 2, 2500)).astype(np.float32)
    fig = charts.attention_heatmap(att, [str(i) for i in range(2500)])
    assert len(fig.data[0].x) <= charts.MAX_COLS
    fig = charts.attention_heatmap(att, [str(i) for i in range(2500)], window=(100, 356))
    assert len(fig.data[0].x) == 256


def test_chain_follows_the_settings():
    names = [n for n, _ in charts.chain_stages(PruneParams(top_k=5, min_p=0.1))]
    assert names.index("temperature") < names.index("top-k") < names.index("min-p")
    names = [n for n, _ in charts.chain_stages(PruneParams(top_k=5, order="llama.cpp"))]
    assert names.index("top-k") < names.index("temperature")
    assert "greedy" in [n for n, _ in charts.chain_stages(PruneParams(temperature=0))]


def test_step_views_from_trace(run):
    lm, tr, wi, p = run
    n = len(tr.prompt_ids) + len(tr.steps)
    assert charts.attention_flow(tr.steps, n_positions=n).data[0].z is not None
    assert charts.kv_timeline_figure(tr.steps, n_positions=n).data
    assert charts.cache_bytes_figure(tr.steps, bytes_per_token=100).data
    assert charts.timing_figure(0.1, 5, [s.t_forward for s in tr.steps]).data
    assert charts.prefill_scaling_figure([32, 64, 128, 256], [0.01, 0.02, 0.05, 0.12]).data
