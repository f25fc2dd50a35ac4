"""Thermodynamics: entropy, varentropy, temperature, free energy and kept-set size per step."""

import streamlit as st

from semviz import charts
from ui import page

ctx = page.context("Thermodynamics")
if page.need_trace(ctx):
    wi = ctx.wi
    df = charts.step_frame(ctx.trace, wi.results if wi else None, wi.chosen if wi else None)
    sel = ctx.selected
    first = ctx.first_diff
    params = ctx.params or ctx.decoder.params
    m = st.columns(4)
    m[0].metric("mean entropy", f"{df['entropy'].mean():.2f} nats")
    m[1].metric("mean kept", f"{df['n_kept'].mean():.1f}")
    m[2].metric("mean T", f"{df['temperature'].mean():.2f}")
    m[3].metric("fallback fired", f"{int((df['fallback'] != '').sum())} steps")
    st.subheader("Entropy and varentropy, with the thresholds the settings act on")
    st.plotly_chart(
        charts.entropy_figure(df, params, selected=sel, first_diff=first), key="thermo_entropy"
    )
    c1, c2 = st.columns([3, 2])
    with c1:
        st.subheader("Effective temperature, free energy, kept set")
        st.plotly_chart(
            charts.thermo_figure(df, selected=sel, first_diff=first), key="thermo_series"
        )
    with c2:
        st.subheader("Entropy × varentropy")
        st.plotly_chart(charts.entropy_scatter(df, selected=sel), key="thermo_scatter")
        st.caption(
            "Each point is a step, coloured by what the sampler did. The grey dotted line on the "
            "left charts is the selected step, the orange one the first step a what-if changes."
        )
