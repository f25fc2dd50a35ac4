"""Tour 2: add an entropy log to the sampler, and change nothing else."""

import math

import streamlit as st

from semviz.output import charts
from ui import page, tour, views

ctx = page.context("Tour 2 · Log entropy only")
views.page_css()
tour.header(
    2,
    "record the entropy of every step's next-token distribution without changing what the "
    "sampler does.",
)
st.markdown(
    r"""
The entropy of the next-token distribution, $H = -\sum_w p(w)\log p(w)$ (nats), says how
unsure the model is about its next token: $e^H$ is the effective number of candidates. It is
token-level predictive entropy: two tokens that mean the same thing count as two outcomes, so
it is not the semantic entropy of Kuhn et al. (2023), which clusters whole answers by meaning.
Logging it costs one softmax the sampler computes anyway, and **changes no token**: semviz
records it on every step whatever the settings, so the run you made with the baseline is
already logged.
"""
)
if page.need_trace(ctx):
    df = ctx.trace.to_dataframe()
    c = st.columns(4)
    c[0].metric("steps logged", len(df))
    c[1].metric("mean entropy, nats", f"{df['entropy'].mean():.2f}")
    c[2].metric(
        "effective candidates",
        f"{df['entropy'].map(math.exp).mean():.1f}",
        help="The mean of e^H: how many equally likely tokens each step was worth.",
    )
    c[3].metric("max entropy, nats", f"{df['entropy'].max():.2f}")
    params = ctx.decoder.params
    views.step_chart(
        ctx,
        charts.entropy_figure(charts.step_frame(ctx.trace), params, selected=ctx.selected),
        key="tour2_entropy",
    )
    st.caption("The recorded run. Click a point to select its step on every page.")
    log = df[["step", "token", "entropy", "prob", "n_kept"]].copy()
    log["token"] = log["token"].map(charts.display_token)  # a space or ↵ is visible
    log["e^H"] = log["entropy"].map(math.exp)
    st.subheader("The log")
    st.dataframe(log, hide_index=True, width="stretch", height=260)
    st.download_button(
        "Download the log (CSV)",
        log.to_csv(index=False),
        file_name="entropy_log.csv",
        mime="text/csv",
        key="tour2_csv",
    )
tour.footer(2)
