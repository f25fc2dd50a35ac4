"""Vectors and their projection: the candidate matrices, ``G = Ĉ·p`` and the z-score.

``sim`` is linear in the context vector, so a pull's potential ``G = Ĉ @ (Σ_i m_i t̂_i)`` is one
``(V, d) @ (d,)`` product whatever the context length (:func:`project`); the decoder computes
it as one more row of the LM head's own matmul when the candidate matrix is that weight
(:func:`logits_and_gravity`). The candidate matrices, their row norms and other per-model
tables are cached per model object and weight version (:func:`cached`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

Sim = Literal["cosine", "dot"]
Space = Literal["embedding", "hidden", "contextual"]

__all__ = [
    "BareEmbedding",
    "cached",
    "candidate_matrix",
    "fuses_with_lm_head",
    "gravity_potential",
    "logits_and_gravity",
    "normalize_gravity",
    "project",
    "pull_vector",
    "row_norms",
    "unit_rows",
    "weight",
]

_EPS = 1e-8


def unit_rows(x: Tensor) -> Tensor:
    """``x`` with every row scaled to unit length (a zero row stays zero). (..., d)"""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(_EPS)


def pull_vector(
    context: Tensor, mass: Tensor, sim: Sim = "cosine", *, normalized: bool = False
) -> Tensor:
    """``Σ_i m_i t_i`` (dot) or ``Σ_i m_i t̂_i`` (cosine): context (..., N, d), mass (..., N) -> (..., d).

    ``normalized=True`` says the context rows are already unit vectors.
    """
    ctx = context.float()
    if sim == "cosine" and not normalized:
        ctx = unit_rows(ctx)
    return (mass.float().unsqueeze(-2) @ ctx).squeeze(-2)  # (..., d)


def gravity_potential(
    cand: Tensor,
    context: Tensor,
    mass: Tensor,
    sim: Sim = "cosine",
    *,
    normalized: bool = False,
    context_normalized: bool = False,
) -> Tensor:
    """Raw gravity ``G(w) = Σ_i m_i·sim(w, t_i)`` for every candidate row.

    Parameters
    ----------
    cand : (V, d) candidate vectors (pass unit rows with ``normalized=True`` to skip the
        per-call normalisation for cosine, e.g. from :func:`candidate_matrix`).
    context : (N, d) context vectors in the same space.
    mass : (N,) weights ``m_i`` (used as given).
    sim : ``"cosine"`` or ``"dot"``.

    Returns
    -------
    (V,) float32, computed as one matrix-vector product.

    Examples
    --------
    >>> import torch
    >>> cand, ctx = torch.randn(10, 4), torch.randn(3, 4)
    >>> gravity_potential(cand, ctx, torch.full((3,), 1 / 3)).shape
    torch.Size([10])
    """
    if sim not in ("cosine", "dot"):
        raise ValueError(f"sim must be 'cosine' or 'dot', got {sim!r}")
    if context.shape[0] != mass.shape[0]:
        raise ValueError(f"context has {context.shape[0]} rows but mass has {mass.shape[0]}")
    c = cand.float()
    if sim == "cosine" and not normalized:
        c = unit_rows(c)
    v = pull_vector(context, mass, sim, normalized=context_normalized)  # (d,)
    return c @ v  # (V,)


def normalize_gravity(g: Tensor, dim: int = -1) -> Tensor:
    """Z-score ``g`` along ``dim`` over its finite entries; zero spread gives zeros."""
    x = g.float()
    if x.dim() == 1 and bool(torch.isfinite(x.sum())):
        # every entry finite (the usual case): two reductions and one pass, no masks
        mean = x.mean()
        d = x - mean  # (V,)
        std = (torch.dot(d, d) / max(x.numel(), 1)).sqrt()
        if not bool(std > 1e-6 * (mean.abs() + 1.0)):
            return torch.zeros_like(x)
        return d / std.clamp_min(_EPS)
    finite = torch.isfinite(x)
    x0 = torch.where(finite, x, torch.zeros_like(x))
    n = finite.sum(dim, keepdim=True).clamp_min(1)
    mean = x0.sum(dim, keepdim=True) / n
    var = (torch.where(finite, x - mean, torch.zeros_like(x)) ** 2).sum(dim, keepdim=True) / n
    std = var.sqrt()
    out = (x0 - mean) / std.clamp_min(_EPS)
    out = torch.where((std > 1e-6 * (mean.abs() + 1.0)) & finite, out, torch.zeros_like(out))
    return out


# -- per-model candidate matrices -------------------------------------------------------------

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weight(model: torch.nn.Module, space: Space) -> Tensor:
    """The ``(V, d)`` candidate weight of ``space``: the input embeddings, or the LM head's."""
    if space == "embedding":
        return model.get_input_embeddings().weight
    if space in ("hidden", "contextual"):
        out = model.get_output_embeddings()
        if out is None:
            raise ValueError(f"space={space!r} needs a model with an output embedding (lm_head)")
        return out.weight
    raise ValueError(f"space must be 'embedding', 'hidden' or 'contextual', got {space!r}")


def candidate_matrix(
    model: torch.nn.Module, space: Space = "embedding", sim: Sim = "cosine"
) -> Tensor:
    """The ``(V, d)`` float32 candidate matrix of ``model`` in ``space`` (unit rows for cosine).

    Cached per model object (weakly, so it dies with the model) and per weight tensor and
    version, so two models, or a model whose weights changed, never share an entry.
    """
    w = weight(model, space)

    def build() -> Tensor:
        m = w.detach().float()
        return unit_rows(m) if sim == "cosine" else m.clone()

    return cached(model, (_weight_space(space), sim), w, build)


def _weight_space(space: Space) -> str:
    # hidden and contextual share the output embedding, so they share its cache entries
    return "embedding" if space == "embedding" else "hidden"


def cached(model: torch.nn.Module, tag: tuple, w: Tensor, build: Callable[[], object]):
    """``build()`` cached per model and ``tag``, rebuilt when the weight ``w`` changes.

    Weakly keyed by the model object, so an entry dies with its model, and keyed by the
    weight tensor and its version, so two models, or a model whose weights changed, never
    share an entry.
    """
    key = (*tag, id(w), w._version, w.dtype, w.device)
    per_model = _CACHE.setdefault(model, {})
    hit = per_model.get(key)
    if hit is None:
        with torch.no_grad():
            hit = build()
        for k in [k for k in per_model if k[: len(tag)] == tag]:
            del per_model[k]
        per_model[key] = hit
    return hit


def fuses_with_lm_head(model: torch.nn.Module, space: Space) -> bool:
    """True when the candidate matrix *is* the LM head's weight, so ``G`` can ride along.

    The hidden and contextual spaces' candidates are the unembedding rows by definition; the
    embedding space's are too when the embeddings are tied (as in SmolLM2). A bias breaks it.
    """
    out = model.get_output_embeddings()
    if out is None or getattr(out, "bias", None) is not None:
        return False
    if space in ("hidden", "contextual"):
        return True
    return weight(model, "embedding").data_ptr() == out.weight.data_ptr()


def row_norms(model: torch.nn.Module, space: Space) -> Tensor:
    """``‖c_w‖`` of every candidate row in ``space``, float32, cached like the matrix. ``(V,)``"""
    w = weight(model, space)
    return cached(
        model,
        ("norms", _weight_space(space)),
        w,
        lambda: w.detach().float().norm(dim=-1).clamp_min(_EPS),
    )


def project(model: torch.nn.Module, pulls: Tensor, space: Space, sim: Sim) -> Tensor:
    """Raw gravity of every candidate for each pull vector: ``(R, d) -> (R, V)`` float32.

    Computed the way :func:`logits_and_gravity` computes it inside the LM head (the weight in
    its own dtype, float32 accumulation, then ``/ ‖c_w‖`` for cosine), two rows per product
    as there, so that the decoder, the ``generate`` processor and replay agree.
    """
    w = weight(model, space).detach()  # (V, d)
    p = pulls.detach().to(w.dtype)
    if p.shape[0] % 2:
        p = torch.cat([p.new_zeros(1, p.shape[1]), p])  # (R+1, d) pairs, the pad first
    with torch.no_grad():
        rows = [torch.nn.functional.linear(p[i : i + 2], w) for i in range(0, p.shape[0], 2)]
        out = torch.cat(rows).float()[p.shape[0] - pulls.shape[0] :]  # (R, V)
        if sim == "cosine":
            out = out / row_norms(model, space)
    return out


def logits_and_gravity(
    model: torch.nn.Module, h_last: Tensor, pull: Tensor, space: Space, sim: Sim
) -> tuple[Tensor, Tensor]:
    """Next-token logits and raw gravity from ONE pass over the LM head's weight.

    ``[h; p] @ Wᵀ`` gives the logits (row 0) and ``W·p`` (row 1). For cosine,
    ``G(w) = ŵ·p = (W_w·p)/‖W_w‖``; for dot, ``G = W·p``. The product runs in the model's
    dtype with float32 accumulation, like the logits themselves; both come back float32.
    Requires :func:`fuses_with_lm_head`.

    Parameters
    ----------
    h_last : (d,) final normed hidden state of the last position
    pull : (d,) from :func:`context_pull`

    Returns
    -------
    logits : (V,) float32
    gravity : (V,) float32, not normalised
    """
    w = model.get_output_embeddings().weight  # (V, d)
    both = torch.nn.functional.linear(torch.stack([h_last.to(w.dtype), pull.to(w.dtype)]), w)
    logits, proj = both[0].float(), both[1].float()  # (V,), (V,)
    if sim == "cosine":
        proj = proj / row_norms(model, space)
    return logits, proj


class BareEmbedding(torch.nn.Module):
    """A bare ``(V, d)`` embedding matrix dressed as a model, for a pull without an LM."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding.from_pretrained(weight.detach(), freeze=True)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed

    def get_output_embeddings(self) -> None:
        return None
