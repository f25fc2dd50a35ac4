"""Distributions: one step's raw → gravity → temperature → final, the waterfall, rank shifts."""

import streamlit as st

from semviz.output import charts, style
from ui import page, views

ctx = page.context("Distributions")
views.page_css()
if page.need_trace(ctx):
    i = page.step_selector(ctx)
    rec = ctx.steps[i]
    res = views.shown_result(ctx, i)
    c1, c2, c3 = st.columns([1, 1, 1])
    mode = c1.segmented_control(
        "Layout",
        ["side", "overlay"],
        default="side",
        key="dist_mode",
        format_func=lambda m: "side by side" if m == "side" else "overlaid",
    )
    axis = c2.segmented_control(
        "Probability axis",
        ["linear", "log"],
        default="linear",
        key="dist_axis",
        help="Log: each decade of probability gets the same height, so the tail of a peaked "
        "distribution shows instead of vanishing under the top token.",
    )
    top = c3.slider("Candidates drawn", 5, 60, 30, step=5, key="dist_top")
    chosen = ctx.chosen(i) if res is not None else rec.chosen_rank
    labels = ctx.labels(rec.cand_ids[: max(top, chosen + 1)].tolist())
    params = res.params if res is not None else ctx.decoder.params  # what is shown
    stages = charts.step_stages(rec, res, params)  # λ = 0: no gravity panel (raw's bars)
    if res is not None:
        kept = res.kept.numpy()
    else:  # as recorded: a candidate the filters cut has no final probability
        kept = stages["final"] > 0 if "final" in stages else None
    taken = ctx.taken(i) if res is not None else rec.token_id
    token = style.token_md(charts.display_token(ctx.labels([taken])[0]))
    st.subheader(f"Step {i}: {token} — the distribution at every stage")
    fig = charts.distribution_figure(
        labels, stages, kept=kept, chosen=chosen, mode=mode or "side", top=top, log=axis == "log"
    )
    views.chart(fig, key="dist_stages")
    notes = ["The yellow band is the token taken"]
    if chosen < 0:
        notes[0] = (
            f"The token taken, {token}, is outside the {rec.cand_ids.numel():,} recorded candidates"
        )
    elif chosen >= top:
        notes[0] += f" (rank {chosen + 1}, drawn after the top {top})"
    notes.append(
        "pale hatched bars in the final panel were cut by the filters (drawn at the "
        "probability they had when cut)"
    )
    if "gravity" not in stages:
        notes.append("gravity is off (λ = 0), so its panel is not drawn")
    st.caption("; ".join(notes) + ".")
    views.all_removed_warning(ctx, i)
    c1, c2 = st.columns(2)
    with c1:
        st.subheader("What each filter removed")
        wf = [w.to_dict() for w in res.waterfall] if res is not None else rec.waterfall
        views.chart(charts.waterfall_figure(wf), key="dist_waterfall")
        n_kept = res.n_kept if res is not None else rec.n_kept
        st.caption(
            f"{style.count(n_kept, 'candidate')} kept at the end; the recorded set holds "
            f"{rec.cand_ids.numel():,}. Each bar is the share of the mass entering that filter "
            "that it removed."
        )
    with c2:
        st.subheader("Rank shifts caused by gravity")
        if "gravity" in stages:
            rl = ctx.labels(rec.cand_ids[:200].tolist())
            fig = charts.rank_shift_figure(rl, stages["raw"][:200], stages["gravity"][:200], top=15)
            views.chart(fig, key="dist_rankshift")
            st.caption(
                "Green: promoted by gravity; red: demoted; grey: unchanged. Tokens ranked below "
                "15 on one side sit under the dashed line, labelled with their real rank."
            )
        else:
            st.info("Gravity is off (λ = 0): no rank changes. Move **Gravity λ** in the sidebar.")
