"""Thermodynamics: entropy, varentropy, temperature, free energy and kept-set size per step."""

import streamlit as st

from semviz.output import charts
from ui import page, views

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
