"""Thermodynamics: entropy, varentropy, temperature, free energy and kept-set size per step,
with entropix's attention metrics and quadrant beside the logits' entropy and varentropy."""

import streamlit as st

from semviz.analysis import lens
from semviz.output import charts
from ui import page, views
from ui.errors import guard

NO_METRICS = (
    "This run did not record the attention metrics: generate with the lens on (it is on by "
    "default) to see them beside the logits' entropy."
)

ctx = page.context("Thermodynamics")
views.page_css()
if page.need_trace(ctx):
    wi = views.shown_whatif(ctx)
    df = charts.step_frame(ctx.trace, wi.results if wi else None, wi.chosen if wi else None)
    sel = ctx.selected
    first = ctx.first_diff
    params = ctx.params or ctx.decoder.params
    vocab = int(ctx.trace.model.get("vocab_size") or 0)
    kept = int(df["n_kept"].median())
    m = st.columns(4)
    m[0].metric("mean entropy, nats", f"{df['entropy'].mean():.2f}")
    m[1].metric(
        "kept set, median",
        f"all {kept:,}" if kept == vocab else f"{kept:,}",
        help="Candidates left after the filters, the median over the steps; 'all' is the "
        "whole vocabulary (no filter cut anything).",
    )
    m[2].metric("mean temperature", f"{df['temperature'].mean():.2f}")
    m[3].metric("fallback fired, steps", f"{int((df['fallback'] != '').sum())}")
    st.subheader("Entropy and varentropy, with the thresholds the settings act on")
    views.step_chart(
        ctx, charts.entropy_figure(df, params, selected=sel, first_diff=first), key="thermo_entropy"
    )
    c1, c2 = st.columns([3, 2])
    with c1:
        st.subheader("Effective temperature, free energy, kept set")
        views.step_chart(
            ctx, charts.thermo_figure(df, selected=sel, first_diff=first), key="thermo_series"
        )
    with c2:
        st.subheader("Entropy × varentropy")
        views.step_chart(ctx, charts.entropy_scatter(df, selected=sel), key="thermo_scatter")
    st.caption(
        "Each point is a step; click one to select it on every page. The yellow band (and "
        "the yellow disc) is the selected step; the pink line is the first step a what-if "
        "changes. On the right, points are coloured by what the sampler did."
    )

    # the attention metrics and the quadrant are the record's own numbers: a what-if changes
    # the sampler, not the attention the model paid, so both read the recorded run
    rec_df = charts.step_frame(ctx.trace)
    with guard("the attention metrics"):
        st.subheader("Attention metrics (entropix) beside the logits' entropy")
        if any(r.attn_metrics is not None for r in ctx.trace.steps):
            which = st.selectbox(
                "Attention of",
                ["last layer", "mean of every layer"],
                key="thermo_att_layer",
                help="entropix reads the last layer's attention.",
            )
            series = lens.attention_series(ctx.trace, layer=-1 if which == "last layer" else None)
            views.step_chart(
                ctx,
                charts.attention_metrics_figure(rec_df, series, selected=sel),
                key="thermo_metrics",
            )
            st.caption(
                "Attention entropy and varentropy of the last query's row (nats), averaged over "
                "the heads; head agreement is how far each head's row is from the heads' mean, "
                "interaction strength the mean size of the pre-softmax scores."
            )
        else:
            st.info(NO_METRICS)
    with guard("the quadrant"):
        st.subheader("The entropix quadrant: entropy × varentropy of the logits, by token")
        views.step_chart(ctx, charts.quadrant_figure(rec_df, selected=sel), key="thermo_quadrant")
        st.caption(
            "Split at the run's medians: low entropy and varentropy, the model is sure; high "
            "entropy, low varentropy, evenly unsure; low entropy, high varentropy, a few "
            "distinct options; both high, lost."
        )
