"""Page pieces that need streamlit: the token strip and shared warnings."""

from __future__ import annotations

import html
import math

import streamlit as st

from semviz.sampling import active_filters
from ui.page import PageContext

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
