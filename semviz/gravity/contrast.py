"""Gravity by contrast, coherence boosting (Malkin et al., 2022).

``G(w) = log P(w | C) - log P(w | last k tokens)``: what only the long context explains, in
nats. It costs a second forward over the last ``k = gravity_contrast_k`` tokens per step
(:func:`~semviz.gravity.side.short_window_logits`), read as a fresh text with no cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from semviz.gravity.guards import ngram_guard
from semviz.gravity.kinds import GravityKind, GravityOut, register_kind, with_logits
from semviz.gravity.side import log_probs, short_window_logits

__all__ = ["Contrast", "contrast_gravity"]


def contrast_gravity(logits: Tensor, short_logits: Tensor) -> Tensor:
    """``log P(w | C) - log P(w | last k tokens)``: what only the long context explains. ``(..., V)``"""
    return log_probs(logits) - log_probs(short_logits)


@register_kind
class Contrast(GravityKind):
    """Coherence boosting: the step's log-probabilities against the last k tokens' alone."""

    name, label = "contrast", "contrast"

    def reads(self, params):
        return frozenset({"model"})

    def describe(self, params):
        return f"contrast, last {params.gravity_contrast_k} tokens"

    def potential(self, model, params, step):
        window = step.ctx.ids.long()[-params.gravity_contrast_k :]
        return self._against(step, short_window_logits(model, window)[0])

    def compute(self, model, params, steps, *, batched=False, chained=False, memo=None):
        k = params.gravity_contrast_k
        windows = [s.ctx.ids.long()[-k:] for s in steps]
        if batched and len({w.numel() for w in windows}) == 1:
            shorts = list(short_window_logits(model, torch.stack(windows)))  # B × (V,)
        else:  # alone, or rows shorter than k: one forward each
            shorts = [short_window_logits(model, w)[0] for w in windows]
        out = []
        for step, short in zip(steps, shorts, strict=True):
            step, logits, seconds = with_logits(model, step)
            g = ngram_guard(
                self._against(step, short), step.ctx.ids, params.gravity_ngram, step.index
            )
            out.append(GravityOut(gravity=g, logits=logits, head_seconds=seconds))
        return out

    @staticmethod
    def _against(step, short: Tensor) -> Tensor:
        """``log P(w | C) - log P(w | short)`` over ``step``'s tokens. (V,) or (K,)"""
        lp = step.log_probs()
        if step.index is None:
            return lp - log_probs(short[: lp.shape[-1]].to(lp.device))
        return lp - log_probs(short)[step.index.long()]

    def terms(self, model, params, trace, i, token_id, hidden=None):
        raise ValueError(
            "Contrast gravity (coherence boosting) compares two forwards; it has no per-token terms."
        )
