"""Page pieces that need streamlit: the token strip and shared warnings."""

from __future__ import annotations

import streamlit as st

from semviz import pruning
from ui.page import PageContext


def token_strip(
    ctx: PageContext,
    color_by: str = "probability",
    *,
    ghost: dict | None = None,
    on_select=None,
    on_branch=None,
    key: str = "semviz_strip",
) -> None:
    """The generated text as ``.semviz-strip .tok`` elements on a colour scale; hover for the
    alternatives at every stage, click to select a step, click an alternative to branch.

    Without ``on_select`` a click selects the step for every page (``sess.selected``).
    """
    from ui import strip

    def _select(i: int) -> None:
        n = len(ctx.steps)
        ctx.sess.selected = None if i >= n - 1 and not ctx.sess.playing else int(i)

    strip.draw(
        ctx, color_by, ghost=ghost, on_select=on_select or _select, on_branch=on_branch, key=key
    )


def filters_disjoint(res) -> bool:
    """True when the active filters, each on its own, keep sets with nothing in common.

    The core then tops the kept set up with the most probable token; this asks the same
    core mask functions what each filter alone would keep.
    """
    p = res.params
    if res.greedy or p.combine != "intersection":
        return False
    x = res.scores / res.temperature if p.order == "hf" else res.scores
    x = x.unsqueeze(0)  # (1, K)
    masks = []
    if p.top_k > 0:
        masks.append(pruning.top_k_mask(x, p.top_k, 1, p.tie_rule))
    if p.top_p < 1.0:
        masks.append(pruning.top_p_mask(x, p.top_p, 1, p.tie_rule))
    if p.min_p > 0.0:
        masks.append(pruning.min_p_mask(x, p.min_p, 1, p.tie_rule))
    if p.typical_p < 1.0:
        masks.append(pruning.typical_mask(x, p.typical_p, 1, p.tie_rule))
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
