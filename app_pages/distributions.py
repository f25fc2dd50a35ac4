"""Distributions: one step's raw → gravity → temperature → final, the waterfall, rank shifts."""

import streamlit as st

from semviz import charts
from ui import page, views

ctx = page.context("Distributions")
if page.need_trace(ctx):
    i = page.step_selector(ctx)
    rec = ctx.steps[i]
    res = ctx.result(i)
    c1, c2 = st.columns([1, 1])
    mode = c1.segmented_control(
        "Layout", ["side", "overlay"], default="side", key="dist_mode",
        format_func=lambda m: "side by side" if m == "side" else "overlaid",
    )  # fmt: skip
    top = c2.slider("Candidates drawn", 5, 60, 30, step=5, key="dist_top")
    labels = ctx.labels(rec.cand_ids[:top].tolist())
    stages = charts.step_stages(rec, res)
    kept = res.kept.numpy() if res is not None else None
    st.subheader(f"Step {i}: {rec.token_text!r} — the distribution at every stage")
    fig = charts.distribution_figure(
        labels, stages, kept=kept, chosen=ctx.chosen(i), mode=mode or "side", top=top
    )
    st.plotly_chart(fig, key="dist_stages", config={"displaylogo": False})
    views.all_removed_warning(ctx, i)
    c1, c2 = st.columns(2)
    with c1:
        st.subheader("Waterfall: what each stage removed")
        wf = [w.to_dict() for w in res.waterfall] if res is not None else rec.waterfall
        st.plotly_chart(charts.waterfall_figure(wf), key="dist_waterfall")
        n_kept = res.n_kept if res is not None else rec.n_kept
        st.caption(
            f"{n_kept} candidates kept at the end; the recorded set holds {rec.cand_ids.numel()}."
        )
    with c2:
        st.subheader("Rank shifts caused by gravity")
        if "gravity" in stages and ctx.params is not None and ctx.params.gravity_lambda != 0:
            rl = ctx.labels(rec.cand_ids[:200].tolist())
            fig = charts.rank_shift_figure(rl, stages["raw"][:200], stages["gravity"][:200], top=15)
            st.plotly_chart(fig, key="dist_rankshift")
        else:
            st.info("Gravity is off (λ = 0): no rank changes. Move **Gravity λ** in the sidebar.")
