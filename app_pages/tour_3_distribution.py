"""Tour 3: watch the entropy distribution and find where "sure" ends and "unsure" begins."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from semviz.output import charts, escape, style
from ui import page, tour, views

ctx = page.context("Tour 3 · Watch its distribution")
views.page_css()
tour.header(
    3,
    "look at how entropy is distributed over real text and find the watershed between "
    "low-entropy steps (one obvious token) and high-entropy steps (a real choice).",
)
st.markdown(
    """
Run a few prompts of the kind you care about (code, a story, a question) and watch the
histogram. Most text has many near-certain steps (punctuation, word endings) and a minority
of open choices. The threshold you find here is what adaptive temperature and the fallback
act on later.
"""
)
if page.need_trace(ctx):
    df = charts.step_frame(ctx.trace)
    h = df["entropy"].to_numpy()
    hi = float(max(h.max(), h.min() + 0.1))
    cut = st.slider(
        "Threshold (nats)",
        0.0,
        round(hi + 0.5, 1),
        round(float(np.median(h)), 2),
        step=0.05,
        key="tour3_cut",
        help="Starts at the median entropy.",
    )
    fig = go.Figure(go.Histogram(x=h, nbinsx=30, marker_color=style.ENTROPY, name="steps"))
    fig.add_vline(x=cut, line={"color": style.REFERENCE, "width": 3, "dash": "dash"})
    fig.update_layout(
        height=300,
        xaxis_title="entropy, nats",
        yaxis_title="steps",
        margin={"l": 50, "r": 20, "t": 20, "b": 40},
    )
    views.chart(fig, key="tour3_hist")
    st.caption("The dashed line is the threshold.")
    low, high = df[df["entropy"] < cut], df[df["entropy"] >= cut]
    c1, c2 = st.columns(2)
    c1.metric("low-entropy steps", f"{len(low)} ({100 * len(low) / len(df):.0f}%)")
    c2.metric("high-entropy steps", f"{len(high)} ({100 * len(high) / len(df):.0f}%)")
    c1.caption(
        "sure: "
        + "  ".join(escape.markdown(charts.display_token(t)) for t in low["token"].head(30))
    )
    c2.caption(
        "unsure: "
        + "  ".join(escape.markdown(charts.display_token(t)) for t in high["token"].head(30))
    )
    st.subheader("Entropy × varentropy")
    views.step_chart(ctx, charts.entropy_scatter(df, selected=ctx.selected), key="tour3_scatter")
tour.footer(3)
