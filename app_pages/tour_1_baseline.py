"""Tour 1: the baseline chain. Where logits, temperature, top-k and top-p sit in decoding."""

import streamlit as st

from semviz.output import charts, style
from ui import page, tour, views

ctx = page.context("Tour 1 · The baseline chain")
views.page_css()
tour.header(
    1,
    "know the standard decoding code: where the logits come from and where temperature, "
    "top-k and top-p act on them, before changing anything.",
)
st.markdown(
    """
Every new token goes through the same short chain:

1. **Prefill** reads the whole prompt in one forward pass and fills the **KV cache**.
2. The model turns the last position into **logits**, one score per vocabulary token.
3. **Temperature** divides the logits: below 1 sharpens, above 1 flattens.
4. **top-k** keeps the k best tokens; **top-p** keeps the smallest set holding mass p.
5. The survivors are **renormalised** and one token is **sampled**.
6. The token is fed back (one forward with the cache) and the loop repeats.

The baseline below is ordinary sampling (T = 0.8, top-k 50, top-p 0.95), the chain most
libraries run by default. Load it, then press **Run** on the Generate page.
"""
)
tour.apply(tour.BASELINE, label="Use the baseline settings", key="tour1_apply")
st.subheader("The chain as the sidebar sets it now")
views.chart(charts.chain_figure(ctx.params or tour.BASELINE), key="tour1_chain")
if page.need_trace(ctx):
    i = page.step_selector(ctx, key="tour1_step")
    rec, res = ctx.steps[i], views.shown_result(ctx, i)
    stages = charts.step_stages(rec, res)
    keep = {k: stages[k] for k in ("raw", "temperature", "final") if k in stages}
    chosen = ctx.chosen(i) if res is not None else rec.chosen_rank
    labels = ctx.labels(rec.cand_ids[: max(20, chosen + 1)].tolist())
    if res is not None:
        kept = res.kept.numpy()
    else:  # as recorded: a candidate the filters cut has no final probability
        kept = stages["final"] > 0 if "final" in stages else None
    token = ctx.labels([ctx.taken(i) if res is not None else rec.token_id])[0]
    st.subheader(
        f"Step {i}: from logits to the token {style.token_md(charts.display_token(token))}"
    )
    views.chart(
        charts.distribution_figure(labels, keep, kept=kept, chosen=chosen, mode="side", top=20),
        key="tour1_dist",
    )
    st.caption(
        "Pale hatched bars in the last panel were cut by top-k / top-p (drawn at the "
        "probability they had after temperature); the yellow band marks the token drawn."
    )
    st.subheader("What each filter removed")
    wf = [w.to_dict() for w in res.waterfall] if res is not None else rec.waterfall
    views.chart(charts.waterfall_figure(wf), key="tour1_waterfall")
tour.footer(1)
