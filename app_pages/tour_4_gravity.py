"""Tour 4: narrative gravity as a light rerank layer over the model's own candidates."""

import streamlit as st

from semviz import gravity
from semviz.output import charts
from semviz.sampling import GRAVITY_FIELDS
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

1. take the model's top candidates by raw logit (here the top 64);
2. compute each candidate's gravity $G(w)=\sum_i m_i\,\mathrm{sim}(w, t_i)$ towards the
   prompt's tokens $t_i$, each weighted by the attention the last query gives it ($m_i$),
   with $\mathrm{sim}$ the cosine of the input embeddings;
3. rerank inside that set by $\log P(w) + \lambda\,G(w)$ ($G$ z-scored, pulling only);
4. sample from the reranked set as before.

Turning λ back to 0 restores the baseline exactly, so it can be rolled back at any time.
The button below changes **only** the gravity settings (λ 0.5, kind *pull*, mass *attention*,
mode *rerank*) and keeps every other slider as it is. The recorded run is then replayed with
that gravity: gravity is computed with the model for each recorded step (a progress bar
shows how far), and the steps whose choice would change are marked.
"""
)
c1, c2 = st.columns(2)
with c1:
    tour.apply(
        tour.GRAVITY_ON,
        label="Turn on gravity as a rerank (λ = 0.5)",
        key="tour4_apply",
        help="Sets only the gravity sliders; every other slider keeps its value.",
    )
with c2:
    tour.apply(
        tour.GRAVITY_OFF,
        label="Turn gravity off (λ = 0)",
        key="tour4_back",
        help="Sets λ to 0; every other slider keeps its value.",
    )
if page.need_trace(ctx):
    p = ctx.params
    if p is None or p.gravity_lambda == 0:
        st.info("Gravity is off (λ = 0). Press **Turn on gravity as a rerank** above.")
    else:
        where = (
            f"a rerank of the top {p.rerank_k} raw candidates"
            if p.gravity_mode == "rerank"
            else "every token (mode full)"
        )
        st.markdown(
            f"**Gravity on now:** kind *{p.gravity_kind}* ({gravity.describe(p)}), "
            f"λ = {p.gravity_lambda:g}, over {where}."
        )
        dec = ctx.decoder
        other = sorted(
            f.name
            for f in p.__dataclass_fields__.values()
            if f.name not in GRAVITY_FIELDS
            and f.name not in ("gravity_lambda", "gravity_mode", "rerank_k")
            and dec is not None
            and getattr(p, f.name) != getattr(dec.params, f.name)
        )
        if ctx.wi is not None and ctx.wi.note:
            st.info(ctx.wi.note, icon=":material/info:")
        i = page.step_selector(ctx, key="tour4_step")
        rec, res = ctx.steps[i], ctx.result(i)
        stages = charts.step_stages(rec, res)
        if "gravity" in stages:
            labels = ctx.labels(rec.cand_ids[:200].tolist())
            st.subheader(f"Step {i}: ranks before and after gravity")
            views.chart(
                charts.rank_shift_figure(
                    labels, stages["raw"][:200], stages["gravity"][:200], top=15
                ),
                key="tour4_rankshift",
            )
        views.gravity_terms(ctx, i, key="tour4_terms")
        wi = ctx.wi
        if wi is not None:
            df = charts.step_frame(ctx.trace, wi.results, wi.chosen)
            views.step_chart(
                ctx,
                charts.entropy_figure(df, p, selected=i, first_diff=wi.first_diff),
                key="tour4_entropy",
            )
            if wi.first_diff is None:
                st.caption("No choice changes with these settings.")
            elif other:
                st.caption(
                    f"The pink line marks step {wi.first_diff}, the first choice that changes. "
                    f"Other sliders differ from the run's too ({', '.join(other)}), so it is "
                    "their change and gravity's together; **Turn gravity off** shows theirs alone."
                )
            else:
                st.caption(
                    f"The pink line marks step {wi.first_diff}, the first choice gravity changes: "
                    "every other slider is the run's own."
                )
tour.footer(4)
