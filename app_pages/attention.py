"""Attention & gravity: where the last query looked, how that moved, and what pulled the token."""

import streamlit as st

from semviz.output import charts
from ui import page, strip, views

WINDOW = 256  # context positions shown unbinned when windowing a long context

ctx = page.context("Attention & gravity")
views.page_css()
if page.need_trace(ctx):
    i = page.step_selector(ctx)
    rec = ctx.steps[i]
    tr = ctx.trace
    summary = tr.model
    L, H = int(summary.get("num_layers", 1)), int(summary.get("num_heads", 1))
    c1, c2, c3 = st.columns([2, 2, 3])
    layers = c1.multiselect("Layers (empty: all)", list(range(L)), key="att_layers")
    heads = c2.multiselect("Heads (empty: mean of all)", list(range(H)), key="att_heads")
    S = rec.cache_len
    window = None
    if S > WINDOW:
        view = c3.segmented_control(
            "Long context",
            ["binned", "window"],
            default="binned",
            key="att_view",
            help=f"{S} cached positions: bin them, or show {WINDOW} at full resolution.",
        )
        if view == "window":
            start = c3.slider("Window start", 0, S - WINDOW, S - WINDOW, key="att_win")
            window = (start, start + WINDOW)
    if rec.attention is None:
        st.info("This run did not capture attention.")
    else:
        st.caption(
            "Hover a token: the context tokens it read light up by its attention, "
            f"{strip.read_label(layers, heads)} (the choice above). Click one to select its step."
        )
        views.token_strip(ctx, key="att_strip", layers=layers, heads=heads)
        st.subheader(f"Step {i}: attention of the last query, layers × context")
        st.caption(
            f"The query is the one that chose step {i}'s token: the last position of the "
            "context at that step (the prompt's last token at step 0, else the token before)."
        )
        labels = ctx.context_labels(rec.cache_positions.tolist())
        rows = st.segmented_control(
            "Rows",
            ["layers", "heads"],
            default="layers",
            key="att_rows",
            format_func=lambda r: (
                "a layer each (mean over the heads)"
                if r == "layers"
                else "every head of every layer (model view)"
            ),
        )
        fig = charts.attention_heatmap(
            rec.attention.float().numpy(),
            labels,
            layers=layers,
            heads=heads,
            window=window,
            per_head=rows == "heads",
        )
        views.chart(fig, key="att_heatmap")
        att = rec.attention.float()  # (L, H, S)
        sink = float(att[..., 0].mean()) if int(rec.cache_positions[0]) == 0 else None
        st.caption(
            "Colour is log10 of the attention mass (hover for the mass itself), on the same "
            "scale in both charts: "
            + (
                f"position 0, the attention sink, takes {sink:.0%} of the mass on average here "
                "(up to 0.9 of a row), and on a linear scale every other cell would be the "
                "darkest colour."
                if sink is not None
                else "a few positions take most of the mass."
            )
        )
        st.subheader("Where the mass moved, step by step")
        n_pos = len(tr.prompt_ids) + len(tr.steps)
        fig = charts.attention_flow(tr.steps, n_positions=n_pos, layers=layers, heads=heads)
        views.chart(fig, key="att_flow")
        st.caption("Blank: positions not written yet (or evicted) at that step.")
    views.gravity_terms(ctx, i, key="att_terms")
