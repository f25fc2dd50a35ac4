"""Page pieces that need streamlit: the token strip, charts that select steps, shared warnings."""

from __future__ import annotations

import html
import math
from typing import Any

import streamlit as st

from semviz import style
from semviz.sampling import active_filters
from ui.page import PageContext
from ui.state import session

# the modebar keeps zoom, pan, reset and a PNG download at twice the pixels
CHART_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}

MAX_TOKENS_SHOWN = 1500


def _color(value: float) -> str:
    """White → blue for value in [0, 1]."""
    v = min(max(value, 0.0), 1.0)
    r = int(255 - 190 * v)
    g = int(255 - 120 * v)
    return f"rgb({r},{g},255)"


def _tip(ctx: PageContext, i: int) -> str:
    rec = ctx.steps[i]
    res = ctx.result(i)
    probs = res.index_probs["final"] if res is not None else rec.stage_probs.get("final")
    raw = rec.top_probs[:5].tolist()
    labels = ctx.labels(rec.cand_ids[:5].tolist())
    lines = [
        f"step {i} · p={rec.chosen_prob:.3f} · H={rec.entropy:.2f} nats · kept {rec.n_kept}",
        "alternatives (raw p → final p):",
    ]
    for r, (lab, p) in enumerate(zip(labels, raw, strict=False)):
        q = float(probs[r]) if probs is not None else float("nan")
        mark = " ◀" if r == rec.chosen_rank else ""
        lines.append(f"  {lab!r}: {p:.3f} → {q:.3f}{mark}")
    return "\n".join(lines)


def token_strip(ctx: PageContext, color_by: str = "probability") -> None:
    """The generated text as tokens coloured by probability (or entropy); hover for details."""
    tr = ctx.trace
    steps = tr.steps
    sel = ctx.selected
    first = ctx.first_diff
    hmax = max((s.entropy for s in steps), default=1.0) or 1.0
    start = max(0, len(steps) - MAX_TOKENS_SHOWN)
    parts = [
        '<div class="semviz-strip" style="font-family:ui-monospace,monospace;font-size:14px;'
        "line-height:1.9;white-space:pre-wrap;word-break:break-word;max-height:320px;"
        'overflow-y:auto;border:1px solid #e6e6e6;border-radius:6px;padding:8px">'
    ]
    prompt = "".join(tr.prompt_tokens)
    if len(prompt) > 600:
        prompt = "…" + prompt[-600:]
    parts.append(f'<span style="color:#888">{html.escape(prompt)}</span>')
    if start:
        parts.append(f'<span style="color:#888"> … {start} earlier tokens … </span>')
    for i in range(start, len(steps)):
        s = steps[i]
        if color_by == "entropy":
            v = s.entropy / hmax
        else:
            p = s.chosen_prob
            v = 1.0 - (p if math.isfinite(p) else 0.0)  # darker = less likely
        style = f"background:{_color(v)};border-radius:3px;padding:0 1px"
        if i == sel:
            style += ";outline:2px solid #000"
        if first is not None and i == first:
            style += ";border-bottom:3px solid #ff7f0e"
        text = html.escape(s.token_text.replace("\n", "↵\n")) or "∅"
        parts.append(
            f'<span class="tok" data-step="{i}" title="{html.escape(_tip(ctx, i))}" '
            f'style="{style}">{text}</span>'
        )
    parts.append("</div>")
    legend = (
        "darker = less likely token" if color_by == "probability" else "darker = higher entropy"
    )
    st.html("".join(parts))
    st.caption(f"{legend} · black outline: selected step · orange underline: first what-if change")


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
    step-axis chart in ``semviz.charts`` carries it), else its x. None when nothing is
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
