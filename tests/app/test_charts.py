"""semviz.output.charts on a real trace from the tiny model: valid Plotly, data present, caps respected."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from semviz.analysis.replay import replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output import charts, style
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


# -- what the charts promise ---------------------------------------------------------------------


def test_display_token_makes_whitespace_and_special_tokens_visible():
    from semviz.output.style import display_token

    assert display_token(" the") == "·the"
    assert display_token("\n\n") == "↵↵"
    assert display_token("\t") == "⇥"
    assert display_token("<|im_start|>") == "⟨im_start⟩"
    assert display_token("</s>") == "⟨s⟩"
    assert display_token("") == "∅"
    assert display_token("a\x0cb") == "a\\x0cb"  # a raw form feed breaks the exported SVG
    assert display_token("x\u200by") == "x\\u200by"
    assert charts._show(" " + "a" * 20) == "·" + "a" * 12 + "…"


def test_fmt_prob_never_shows_a_small_probability_as_zero():
    assert charts.fmt_prob(0.153) == "0.153"
    assert charts.fmt_prob(0.0042) == "0.0042"
    assert charts.fmt_prob(3.14e-5) == "3.1e-05"
    assert charts.fmt_prob(0.0) == "0.000"


def test_waterfall_draws_the_filters_and_says_when_none_is_on():
    wf = [
        {"name": "candidates", "n_kept": 1024, "mass_removed": 0.007},
        {"name": "gravity", "n_kept": 1024, "mass_removed": 0.0},
        {"name": "top-k", "n_kept": 50, "mass_removed": 0.25},
        {"name": "top-p", "n_kept": 12, "mass_removed": 0.05},
        {"name": "temperature", "n_kept": 12, "mass_removed": 0.0},
    ]
    fig = validated(charts.waterfall_figure(wf))
    (bar,) = fig.data
    assert list(bar.y) == ["top-k → 50 left", "top-p → 12 left"]
    assert list(bar.x) == [25.0, 5.0]
    assert list(bar.text) == ["25.0%", "5.0%"]
    assert fig.layout.xaxis.range == (0, 118)  # room for the labels past a 100% bar
    assert "yaxis2" not in fig.layout.to_plotly_json()  # one axis, no log ticks
    (empty,) = validated(charts.waterfall_figure(wf[:2])).data
    assert list(empty.y) == ["no filter on"] and list(empty.x) == [0.0]
    assert list(empty.text) == ["nothing removed: every candidate kept"]


def test_rank_shift_keeps_the_top_readable_beside_an_outlier():
    raw = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.05, 0.04, 0.03, 0.02, 0.01, 0.005, 0.001])
    adj = raw.copy()
    adj[[0, 1]] = adj[[1, 0]]  # t0 and t1 swap their scores
    adj[11] = 0.5  # the last one jumps to rank 1: t11, t1, t0, t2, t3 after gravity
    labels = [f"t{i}" for i in range(len(raw))]
    fig = validated(charts.rank_shift_figure(labels, raw, adj, top=5))
    title = "4 of the top 5 moved, 1 rose from below"
    assert fig.layout.title.text == title  # t1 kept rank 2
    ys = {tr.text[0].split()[0]: tuple(tr.y) for tr in fig.data}
    assert ys["t11"] == (6.0, 1.0)  # raw rank 12 sits in the first lane under the top
    assert fig.data[0].text[0] == "t11  12"  # labelled with its real rank
    assert ys["t0"] == (1.0, 3.0)
    assert ys["t4"] == (5.0, 6.0)  # rank 6 after gravity: the first lane on the right
    assert fig.layout.yaxis.range == (6.6, 0.4)  # not stretched to rank 12
    colour = {tr.text[0].split()[0]: tr.line.color for tr in fig.data}
    assert (colour["t11"], colour["t0"], colour["t1"]) == (style.KEPT, style.CUT, style.REFERENCE)


def test_attention_uses_one_log_scale_in_both_views(run):
    lm, tr, wi, p = run
    rec = tr.steps[-1]
    att = rec.attention.float().numpy()
    labels = [str(i) for i in range(att.shape[-1])]
    heat = validated(charts.attention_heatmap(att, labels)).data[0]
    m = att.mean(1)  # (L, S) mean over heads
    want = np.log10(np.maximum(m, charts.ATT_FLOOR))
    np.testing.assert_allclose(np.array(heat.z, float), want, rtol=1e-5, atol=1e-6)
    assert heat.text[0][0] == f"{m[0, 0]:.4f}"  # the hover gives the mass itself
    n = len(tr.prompt_ids) + len(tr.steps)
    flow = validated(charts.attention_flow(tr.steps, n_positions=n)).data[0]
    for h in (heat, flow):
        assert (h.zmin, h.zmax) == (-4, 0)
        assert h.colorbar.ticktext[-1] == "1"
    assert heat.colorscale == flow.colorscale
    # a short context is labelled with its tokens; x is the position number
    short = validated(charts.attention_heatmap(att[:, :, :5], ["a", " b", "\n", "d", "e"]))
    assert list(short.layout.xaxis.ticktext) == ["0 a", "1 ·b", "2 ↵", "3 d", "4 e"]
    assert list(short.data[0].x) == [0, 1, 2, 3, 4]


def test_the_model_view_has_a_row_for_every_head_of_every_layer(run):
    lm, tr, wi, p = run
    att = tr.steps[-1].attention.float().numpy()  # (L, H, S)
    L, H, S = att.shape
    labels = [str(i) for i in range(S)]
    heat = validated(charts.attention_heatmap(att, labels, per_head=True)).data[0]
    assert list(heat.y) == [f"L{la} H{h}" for la in range(L) for h in range(H)]
    want = np.log10(np.maximum(att.reshape(L * H, S), charts.ATT_FLOOR))
    np.testing.assert_allclose(np.array(heat.z, float), want, rtol=1e-5, atol=1e-6)
    # chosen layers and heads: only their rows, in that order
    sub = validated(charts.attention_heatmap(att, labels, layers=[1, 0], heads=[1], per_head=True))
    assert list(sub.data[0].y) == ["L1 H1", "L0 H1"]
    np.testing.assert_allclose(
        np.array(sub.data[0].z, float)[0],
        np.log10(np.maximum(att[1, 1], charts.ATT_FLOOR)),
        rtol=1e-5,
        atol=1e-6,
    )
    assert list(sub.layout.yaxis.ticktext) == ["L1", "L0"]


def test_distribution_draws_a_chosen_token_below_the_top_and_marks_the_pruned():
    k = 40
    p = np.linspace(1.0, 0.1, k)
    p = p / p.sum()
    stages = {"raw": p, "final": np.where(np.arange(k) < 3, p, 0.0)}
    kept = np.arange(k) < 3
    labels = [f"w{i}" for i in range(k)]
    fig = validated(charts.distribution_figure(labels, stages, kept=kept, chosen=25, top=10))
    raw_bars, final_bars = fig.data
    assert list(raw_bars.x)[-1] == "26. w25"  # the chosen token, after the top 10
    assert len(raw_bars.x) == 11
    assert list(final_bars.marker.pattern.shape) == [""] * 3 + ["/"] * 8
    # a cut candidate's final bar is a ghost at the height the filters cut it from
    assert final_bars.y[5] == pytest.approx(p[5]) and final_bars.y[0] == pytest.approx(p[0])
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert {(s.x0, s.x1) for s in bands} == {(9.5, 10.5)}  # the highlighter on that bar
    horiz = validated(
        charts.distribution_figure(labels, stages, chosen=1, mode="overlay", top=5, horizontal=True)
    )
    assert horiz.data[0].orientation == "h" and len(horiz.data[0].y) == 5


def test_log_axis_shows_the_tail_of_a_peaked_distribution():
    k = 30
    p = np.r_[0.999, np.geomspace(1e-4, 1e-7, k - 1)]  # one token takes nearly all the mass
    stages = {"raw": p, "temperature": p, "final": np.where(np.arange(k) < 5, p, 0.0)}
    kept = np.arange(k) < 5
    labels = [f"w{i}" for i in range(k)]
    lin = validated(charts.distribution_figure(labels, stages, kept=kept, top=k)).layout
    assert lin.yaxis.type is None and lin.yaxis3.type is None  # linear unless asked
    fig = validated(charts.distribution_figure(labels, stages, kept=kept, top=k, log=True))
    axes = [fig.layout.yaxis, fig.layout.yaxis2, fig.layout.yaxis3]
    assert [a.type for a in axes] == ["log"] * 3
    # one range in every panel, from the tail's decade (1e-7) up to p = 1
    assert {tuple(a.range) for a in axes} == {(-7, 0.05)}
    assert axes[0].dtick == 1 and axes[0].exponentformat == "power"
    # the cut ghosts keep their pre-cut height, so the final panel's tail is drawn too
    assert fig.data[2].y[-1] == pytest.approx(p[-1])
    assert fig.data[0].customdata[-1] == "p=1.0e-07"  # a hover a reader can tell from zero
    over = validated(charts.distribution_figure(labels, stages, mode="overlay", log=True))
    assert over.layout.yaxis.type == "log" and tuple(over.layout.yaxis.range) == (-7, 0.05)
    horiz = validated(
        charts.distribution_figure(labels, stages, mode="overlay", log=True, horizontal=True)
    )
    assert horiz.layout.xaxis.type == "log" and horiz.layout.yaxis.type == "category"


def test_step_axis_points_carry_their_step(run):
    lm, tr, wi, p = run
    df = charts.step_frame(tr)
    for fig in (charts.entropy_figure(df, p), charts.thermo_figure(df), charts.entropy_scatter(df)):
        for t in validated(fig).data:
            if t.customdata is not None and t.x is not None and len(t.x) == len(df):
                assert [row[0] for row in t.customdata] == list(range(len(df)))
    cb = validated(charts.cache_bytes_figure(tr.steps)).data[0]
    assert [row[0] for row in cb.customdata] == [s.index for s in tr.steps]


def test_step_from_selection_reads_the_clicked_step():
    from ui.views import step_from_selection

    ev = {"selection": {"points": [{"x": 7.0, "y": 2.1, "customdata": [3, "·the"]}]}}
    assert step_from_selection(ev) == 3  # customdata[0] wins (the scatter's x is entropy)
    assert step_from_selection({"selection": {"points": [{"x": 4}]}}) == 4
    assert step_from_selection({"selection": {"points": []}}) is None
    assert step_from_selection(None) is None


def test_chain_captions_are_wrapped():
    p = PruneParams(top_k=40, top_p=0.9, min_p=0.05, gravity_lambda=0.5, fallback=True)
    fig = validated(charts.chain_figure(p))
    captions = [a.text for a in fig.layout.annotations if a.text and not a.showarrow]
    assert len(captions) == len(charts.chain_stages(p))
    assert all(len(line) <= 22 for c in captions for line in c.split("<br>"))


def test_no_colour_literal_outside_the_palette():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*sorted((root / "semviz").rglob("*.py")), *sorted((root / "app_pages").glob("*.py"))]
    hexa = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b|\brgba?\(\d|\bhsla?\(\d")
    found = [
        f"{f.relative_to(root)}:{n}"
        for f in files
        if f.name != "style.py"
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if hexa.search(line)
    ]
    assert not found, found


def test_streamlit_config_follows_the_viewer_and_the_palette():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    cfg = tomllib.loads(
        (Path(__file__).resolve().parents[2] / ".streamlit/config.toml").read_text()
    )
    assert "base" not in cfg.get("theme", {})  # the viewer's light or dark choice
    assert cfg["client"]["toolbarMode"] == "viewer"  # no Deploy button for visitors
    for mode in ("light", "dark"):
        assert cfg["theme"][mode]["primaryColor"] == style.CHROME[mode]


def test_style_docstring_examples_run():
    import doctest

    assert doctest.testmod(style).failed == 0


def test_report_shows_the_whatif_and_says_so(run, tmp_path):
    from semviz.output import report

    lm, tr, wi, p = run
    thermo = {
        state: next(
            v for v in report.views(tr, tokenizer=lm.tokenizer, whatif=w) if v.name == "thermo"
        )
        for state, w in (("recorded", None), ("what-if", wi))
    }
    assert list(thermo["recorded"].figure.data[0].y) == [s.temperature for s in tr.steps]
    assert list(thermo["what-if"].figure.data[0].y) == [r.temperature for r in wi.results]
    assert wi.results[0].temperature == 0.4 != tr.steps[0].temperature
    assert report.shown_state(None)[0] == "recorded"
    kind, sentence = report.shown_state(wi)
    assert kind == "what-if" and "no model run" in sentence
    rep = report.build(tr, tmp_path, tokenizer=lm.tokenizer, png=False, whatif=wi)
    assert rep.manifest["shows"] == {
        "state": "what-if",
        "params": wi.params.to_dict(),
        "first_diff": wi.first_diff,
    }
    assert "class='state state-whatif'" in rep.html.read_text()


def test_kv_timeline_draws_one_layer_at_its_budget(tiny_lm):
    """H2O keeps its own positions per layer: each layer's row holds exactly the budget, the
    positions a step has not written are blank (not evicted), and the selected step is
    marked."""
    from semviz import eviction as ev

    budget = 8
    dec = Decoder(
        tiny_lm,
        "Once upon a time in a land far away",
        PruneParams(temperature=0),
        DecodeSettings(seed=0, chat=False),
        eviction=ev.make_policy("h2o", budget=budget),
    )
    dec.run(12)
    steps = dec.trace.steps
    n = len(dec.trace.prompt_ids) + len(steps)
    n_layers = len(charts.kv_budgets(steps[-1]))
    assert charts.kv_budgets(steps[-1]) == [budget] * n_layers
    unions = set()
    for layer in range(n_layers):
        z, _ = charts.kv_timeline_matrix(steps, n_positions=n, layer=layer)
        for r, rec in enumerate(steps):
            seen = rec.eviction["n_seen"]
            # kept per layer: min(seen, budget) positions, each one the record holds
            assert int(np.nansum(z[r])) == min(seen, budget)
            held = charts.kv_layer_positions(rec, layer)
            assert sorted(np.flatnonzero(z[r] == 1).tolist()) == sorted(held.tolist())
            assert (z[r, :seen] == 0).sum() == seen - min(seen, budget)
            assert np.isnan(z[r, seen:]).all() and z[r, seen:].size == n - seen
        unions.add(tuple(np.flatnonzero(z[-1] == 1).tolist()))
    # the layers keep different positions, so the union over layers, which the query of the
    # step read (cache_positions), holds more than any one layer's cache
    union = set().union(*map(set, unions))
    assert len(union) > budget
    assert union <= set(steps[-1].cache_positions.tolist())

    fig = charts.kv_timeline_figure(steps, n_positions=n, layer=1, selected=5)
    validated(fig)
    assert [s.y0 for s in fig.layout.shapes] == [5] and fig.layout.shapes[0].y1 == 5
    assert fig.data[0].colorbar.title.text == "layer 1"
    z1, _ = charts.kv_timeline_matrix(steps, n_positions=n, layer=1)
    np.testing.assert_array_equal(np.array(fig.data[0].z, dtype=float), z1)
    assert not validated(charts.kv_timeline_figure(steps, n_positions=n)).layout.shapes
    with pytest.raises(ValueError, match="layer 99 is out of range"):
        charts.kv_timeline_figure(steps, n_positions=n, layer=99)


def test_binned_kv_timeline_leaves_unwritten_positions_blank(tiny_lm):
    from semviz import eviction as ev

    dec = Decoder(
        tiny_lm,
        "Once upon a time",
        PruneParams(temperature=0),
        DecodeSettings(seed=0, chat=False),
        eviction=ev.make_policy("h2o", budget=4),
    )
    dec.run(6)
    steps = dec.trace.steps
    n = 3000  # far more positions than written: the binned view
    fig = charts.kv_timeline_figure(steps, n_positions=n, layer=0, max_cols=100)
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (6, 100)
    # bin 0 holds every written position (fewer than 30); the other bins are unwritten
    assert np.isnan(z[:, 1:]).all()
    for r, rec in enumerate(steps):
        seen = rec.eviction["n_seen"]
        assert z[r, 0] == pytest.approx(min(seen, 4) / seen)
