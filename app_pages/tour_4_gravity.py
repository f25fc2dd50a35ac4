"""Tour 4: narrative gravity as a light rerank layer over the model's own candidates."""

import streamlit as st

from semviz.output import charts
from ui import page, tour, views

ctx = page.context("Tour 4 · Gravity as a rerank")
views.page_css()
tour.header(
    4,
    "add narrative gravity as a switchable rerank: the model's logits stay untouched, only the "
    "order inside its top candidates changes.",
)
st.markdown(
    r"""
The safest way to add gravity is a rerank layer:

1. take the model's top candidates by probability (here the top 64);
2. compute each candidate's gravity $G(w)=\sum_i m_i\,\mathrm{sim}(w, t_i)$ towards the
   context tokens $t_i$, weighted by where attention sits ($m_i$);
3. rerank inside that set by $\log P(w) + \lambda\,G(w)$;
4. sample from the reranked set as before.

Turning λ back to 0 restores the baseline exactly, so it can be rolled back at any time.
Press the button: the sliders change and the recorded run is **replayed** with gravity (no
new model run); the steps whose choice would change are marked.
"""
)
tour.apply(tour.GRAVITY, label="Try gravity as a rerank (λ = 0.5)", key="tour4_apply")
tour.apply(tour.BASELINE, label="Back to the baseline", key="tour4_back")
if page.need_trace(ctx):
    p = ctx.params
    if p is None or p.gravity_lambda == 0:
        st.info("Gravity is off (λ = 0). Press **Try gravity as a rerank** above.")
    else:
        i = page.step_selector(ctx, key="tour4_step")
        rec, res = ctx.steps[i], ctx.result(i)
        stages = charts.step_stages(rec, res)
        if "gravity" in stages:
            labels = ctx.labels(rec.cand_ids[:200].tolist())
            st.subheader(f"Step {i}: ranks before and after gravity")
            views.chart(
                charts.rank_shift_figure(labels, stages["raw"][:200], stages["gravity"][:200],
                                         top=15),
                key="tour4_rankshift",
            )  # fmt: skip
        wi = ctx.wi
        if wi is not None:
            df = charts.step_frame(ctx.trace, wi.results, wi.chosen)
            views.step_chart(
                ctx,
                charts.entropy_figure(df, p, selected=i, first_diff=wi.first_diff),
                key="tour4_entropy",
            )
            st.caption(
                "No choice changes with these settings."
                if wi.first_diff is None
                else f"The pink line marks step {wi.first_diff}, the first choice gravity changes."
            )
tour.footer(4)
