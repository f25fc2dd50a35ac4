"""Page pieces that need streamlit: the token strip, charts that select steps, shared warnings."""

from __future__ import annotations

import html
from typing import Any

import streamlit as st

from semviz import gravity
from semviz.output import charts, style
from semviz.sampling import active_filters
from ui.errors import guard
from ui.page import PageContext
from ui.state import session

# the modebar keeps zoom, pan, reset and a PNG download at twice the pixels
CHART_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def token_strip(
    ctx: PageContext,
    color_by: str = "probability",
    *,
    ghost: dict | None = None,
    on_select=None,
    on_branch=None,
    key: str = "semviz_strip",
    layers=(),
    heads=(),
) -> None:
    """The generated text as ``.semviz-strip .tok`` elements on a colour scale; hover for the
    alternatives at every stage and the tokens it read (attention averaged over ``layers``
    and ``heads``, empty: all), click to select a step, click an alternative to branch.

    Without ``on_select`` a click selects the step for every page (``sess.selected``).
    """
    from ui import strip

    def _select(i: int) -> None:
        n = len(ctx.steps)
        ctx.sess.selected = None if i >= n - 1 and ctx.sess.job is None else int(i)

    strip.draw(
        ctx,
        color_by,
        ghost=ghost,
        on_select=on_select or _select,
        on_branch=on_branch,
        key=key,
        layers=layers,
        heads=heads,
    )


def filters_disjoint(res) -> bool:
    """True when the active filters, each on its own, keep sets with nothing in common.

    The core then tops the kept set up with the most probable token; this asks each
    registered filter (``FILTERS``) what it alone would keep.
    """
    p = res.params
    if res.greedy or p.combine != "intersection":
        return False
    x = res.scores / res.temperature if p.order == "hf" else res.scores
    one = p.replace(min_tokens_to_keep=1)
    masks = [
        f.mask(x, one, scores=res.scores, temperature=res.temperature)[0] for f in active_filters(p)
    ]
    if len(masks) < 2:
        return False
    inter = masks[0]
    for m in masks[1:]:
        inter = inter & m
    return not bool(inter.any())


def all_removed_warning(ctx: PageContext, i: int) -> None:
    """Say so when the filters together would remove every token at step ``i``."""
    res = ctx.result(i)
    if res is None:
        return
    if filters_disjoint(res):
        st.warning(
            "These sliders would remove every candidate at this step: the filters keep "
            "disjoint sets. The core keeps the most probable token so sampling can go on; "
            "loosen top-k / top-p / min-p / typical to give it a choice.",
            icon="🚫",
        )


# -- chart helpers --------------------------------------------------------------------------------


def page_css() -> None:
    """The app's own classes (``style.app_css``); drawing it costs no space on the page."""
    st.html(f"<style>{style.app_css()}</style>")


def chart(fig, *, key: str) -> None:
    """A Plotly chart with the app's modebar."""
    st.plotly_chart(fig, key=key, config=CHART_CONFIG)


def shown_whatif(ctx: PageContext):
    """The what-if when the sliders differ from the run's, else None (the recorded run)."""
    from ui import page

    return ctx.wi if ctx.wi is not None and page.params_changed(ctx) else None


def shown_result(ctx: PageContext, i: int):
    """Step ``i``'s what-if ``PruneResult`` when the sliders differ from the run's, else None."""
    wi = shown_whatif(ctx)
    return wi.results[i] if wi is not None and i < len(wi.results) else None


def step_from_selection(event: Any) -> int | None:
    """The step a chart selection points at: the clicked point's ``customdata[0]`` (every
    step-axis chart in ``semviz.output.charts`` carries it), else its x. None when nothing is
    selected."""
    if not event:
        return None
    sel = event.get("selection") if isinstance(event, dict) else getattr(event, "selection", None)
    points = (sel.get("points") if isinstance(sel, dict) else getattr(sel, "points", None)) or []
    for pt in points:
        cd = pt.get("customdata")
        value = cd[0] if isinstance(cd, list | tuple) and cd else pt.get("x")
        try:
            return int(round(float(value)))
        except (TypeError, ValueError):
            continue
    return None


def step_chart(ctx: PageContext, fig, *, key: str) -> None:
    """A chart on the step axis: clicking a point selects that step on every page.

    The selection goes to ``sess.selected`` (so the step slider, the other charts and the
    URL's ``step`` follow); the last step means "follow new tokens", as on the slider.
    """

    def _picked() -> None:
        step = step_from_selection(st.session_state.get(key))
        sess = session(st.session_state)
        n = len(sess.trace.steps) if sess.trace is not None else 0
        if step is None or n == 0:
            return
        step = max(0, min(step, n - 1))
        sess.selected = None if step == n - 1 else step

    st.plotly_chart(fig, key=key, on_select=_picked, selection_mode="points", config=CHART_CONFIG)


def state_badge(kind: str, sentence: str) -> None:
    """Say which state a page shows: the recorded run or a what-if replay."""
    cls = "semviz-state-whatif" if kind == "what-if" else "semviz-state-recorded"
    st.html(
        f'<p><span class="semviz-state {cls}">{html.escape(kind)}</span> '
        f"{html.escape(sentence)}</p>"
    )


def gravity_terms(ctx: PageContext, i: int, *, key: str) -> None:
    """What pulled the token step ``i`` takes under the current sliders: the per-context-token
    terms of ``G`` (a pull's ``m_j·sim(w, t_j)``), or why the gravity set has none."""
    token = ctx.taken(i)
    shown = style.token_md(charts.display_token(ctx.labels([token])[0]))
    st.subheader(f"What pulled {shown}: the terms of G")
    params, dec = ctx.params, ctx.decoder
    lm = getattr(dec, "lm", None) or ctx.lm
    if params is None or dec is None or lm is None:
        st.info("Fix the sampling settings to see the gravity terms.")
        return
    kind = gravity.get_kind(params.gravity_kind)
    if not kind.has_terms:
        st.info(
            f"{(kind.label or kind.name).capitalize()} gravity is not a sum over the context, "
            "so it has no per-token terms."
        )
        return
    with guard("computing gravity terms"):
        pos, terms = gravity.gravity_terms(lm.model, ctx.trace, i, token, params, hidden=dec.hidden)
        labels = ctx.context_labels(pos.tolist())
        chart(charts.gravity_terms_figure(labels, terms, positions=pos.tolist()), key=key)
        st.caption(
            f"G(w) = Σ m_i·sim(w, t_i) = {terms.sum():.4f} with mass **{params.gravity_mass}**, "
            f"similarity **{params.gravity_sim}**; λ = {params.gravity_lambda:g} scales its "
            "z-scored value into the score. Green pulled the token, red pushed it away."
        )
