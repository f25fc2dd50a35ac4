"""Topic, not copies: the guards that keep gravity from rewarding repetition.

A token that would repeat an n-gram already in the context (``gravity_ngram``,
:func:`ngram_guard`), or, for a pull, whose embedding is a near copy of a context token
(``gravity_copy_cos``, :func:`near_copies`: "clocks" after "clock"), keeps no positive gravity,
as contrastive search penalises near-copies of the context. Without them a strong pull stuffs
the text with the prompt's words ("clock clocks clockclock").
"""

from __future__ import annotations

import torch
from torch import Tensor

from semviz.gravity.projection import cached, candidate_matrix, weight

__all__ = ["copy_guard", "near_copies", "ngram_guard", "repeat_tokens"]


def repeat_tokens(ids: Tensor, n: int) -> Tensor:
    """Tokens that would complete an ``n``-gram already in ``ids`` after its last ``n-1``. ``(k,)``

    Examples
    --------
    >>> repeat_tokens(torch.tensor([4, 5, 6, 4, 5]), 3).tolist()
    [6]
    """
    x = ids.long().flatten()
    N = x.numel()
    if n < 1 or N < max(n - 1, 1):
        return x.new_zeros(0)
    if n == 1:
        return torch.unique(x)
    if N < n:
        return x.new_zeros(0)
    win = x.unfold(0, n - 1, 1)[: N - n + 1]  # (N-n+1, n-1) windows with a successor
    hit = (win == x[N - n + 1 :]).all(-1).nonzero()[:, 0]  # (h,)
    return torch.unique(x[hit + n - 1])


def ngram_guard(g: Tensor, ids: Tensor, n: int, index: Tensor | None = None) -> Tensor:
    """``g`` with no positive gravity left on tokens that would repeat an ``n``-gram of ``ids``.

    Parameters
    ----------
    g : (V,) gravity over the vocabulary, or over ``index`` (K,).
    ids : (N,) the context so far.
    n : the n-gram length; ``0`` leaves ``g`` as it is.
    index : (K,) the token ids ``g`` is over (default: the whole vocabulary).
    """
    banned = repeat_tokens(ids, n) if n > 0 else None
    if banned is None or banned.numel() == 0:
        return g
    if index is None:
        hit = torch.zeros(g.shape[-1], dtype=torch.bool, device=g.device)
        hit[banned[banned < g.shape[-1]].to(g.device)] = True
    else:
        hit = torch.isin(index.to(banned.device), banned).to(g.device)
    return torch.where(hit & (g > 0), torch.zeros_like(g), g)


def near_copies(model: torch.nn.Module, ids: Tensor, cos: float) -> Tensor:
    """Every token whose input embedding has cosine ``>= cos`` with one of ``ids``. ``(k,)``

    "clock" brings " Clock", " clocks" and "clock" (cosine ≈ 0.75 in SmolLM2), not " timer"
    (0.5). Each token's set is computed once per model and threshold, then cached.
    """
    unit = candidate_matrix(model, "embedding", "cosine")  # (V, d)
    w = weight(model, "embedding")
    memo = cached(model, ("copies", float(cos)), w, dict)
    uniq = torch.unique(ids.long().flatten())
    new = [int(i) for i in uniq.tolist() if int(i) not in memo and 0 <= int(i) < unit.shape[0]]
    for start in range(0, len(new), 256):  # bounded (256, V) blocks
        block = new[start : start + 256]
        with torch.no_grad():
            hit = (unit[block] @ unit.T) >= cos - 1e-6  # (b, V)
        for i, row in zip(block, hit, strict=True):
            memo[i] = row.nonzero()[:, 0]
    parts = [memo[int(i)] for i in uniq.tolist() if int(i) in memo]
    return torch.unique(torch.cat(parts)) if parts else uniq.new_zeros(0)


def copy_guard(
    model: torch.nn.Module, g: Tensor, ids: Tensor, cos: float, index: Tensor | None = None
) -> Tensor:
    """``g`` with no positive gravity left on near copies of ``ids`` (:func:`near_copies`).

    Parameters
    ----------
    g : (V,) gravity over the vocabulary, or over ``index`` (K,).
    ids : (N,) the context so far.
    cos : the cosine threshold; ``0`` leaves ``g`` as it is.
    index : (K,) the token ids ``g`` is over (default: the whole vocabulary).
    """
    if cos <= 0:
        return g
    banned = near_copies(model, ids, cos)
    hit = torch.isin(torch.arange(g.shape[-1]) if index is None else index.long(), banned)
    return torch.where(hit.to(g.device) & (g > 0), torch.zeros_like(g), g)
