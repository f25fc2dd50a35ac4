"""Narrative gravity (seed §4.3): ``G(w|C) = Σ_i m_i · sim(w, t_i)``.

Both sides live in one space:

- ``"embedding"``: candidates are rows of the input embedding ``E[w]``, context is ``E[t_i]``;
- ``"hidden"``: candidates are rows of the unembedding (``lm_head``), which live in the final
  hidden space, and context is the final normed hidden states ``h_i``.

``sim(w, t)`` is linear in ``t`` (cosine: ``ŵ·t̂``; dot: ``w·t``), so
``G = Ĉ @ (Σ_i m_i t̂_i)``: one ``(V, d) @ (d,)`` product whatever the context length, never
``V×N×d``.

Normalisation. Raw ``G`` depends on the model's embedding geometry (cosine ranges differ a
lot between spaces, dot products scale with norms), so :func:`normalize_gravity` z-scores
it over the vocabulary: ``Ĝ = (G - mean G) / std G``. The adjusted score is
``log P + λ·Ĝ``, so ``λ = 1`` means "one standard deviation of gravity is worth one nat of
log-probability" on any model. Normalise over the full vocabulary first, then index a
candidate subset. A ``G`` with (near-)zero spread normalises to zeros.
"""

from __future__ import annotations

import weakref
from typing import Literal

import torch
from torch import Tensor

Sim = Literal["cosine", "dot"]
Space = Literal["embedding", "hidden"]
MassSource = Literal["attention", "ema", "uniform", "idf", "norm"]

__all__ = [
    "candidate_matrix",
    "clear_cache",
    "context_mass",
    "context_vectors",
    "gravity_for_step",
    "fuses_with_lm_head",
    "gravity_potential",
    "logits_and_gravity",
    "normalize_gravity",
    "pull_for_step",
    "pull_vector",
    "row_norms",
]

_EPS = 1e-8


def _unit_rows(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(_EPS)


def pull_vector(
    context: Tensor, mass: Tensor, sim: Sim = "cosine", *, normalized: bool = False
) -> Tensor:
    """``Σ_i m_i t_i`` (dot) or ``Σ_i m_i t̂_i`` (cosine): context (..., N, d), mass (..., N) -> (..., d).

    ``normalized=True`` says the context rows are already unit vectors.
    """
    ctx = context.float()
    if sim == "cosine" and not normalized:
        ctx = _unit_rows(ctx)
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
        c = _unit_rows(c)
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


def context_mass(
    source: MassSource,
    *,
    attention: Tensor | None = None,
    layers: tuple[int, ...] | None = None,
    heads: tuple[int, ...] | None = None,
    ema: Tensor | None = None,
    ema_decay: float = 0.9,
    context_ids: Tensor | None = None,
    embed: Tensor | None = None,
    vectors: Tensor | None = None,
    n: int | None = None,
) -> Tensor:
    """Mass ``m_i`` of each context token, normalised to sum 1 ``(N,)``.

    Parameters
    ----------
    source : ``"attention"`` last-query attention averaged over ``layers``×``heads``;
        ``"ema"`` that average folded into ``ema`` (the previous EMA, ``(N_prev,)``) with
        ``ema_decay``; ``"uniform"``; ``"idf"`` ``log((1+N)/(1+c_i)) + 1`` with ``c_i`` the
        count of token ``t_i`` in the context, so repeated filler weighs less; ``"norm"``
        the embedding norm ``‖E[t_i]‖`` (or of ``vectors``).
    attention : (L, H, N) last-query attention rows, already softmaxed (not re-softmaxed).
    context_ids : (N,) token ids, for ``idf`` and ``norm``.
    embed : (V, d) input embedding matrix, for ``norm``.
    vectors : (N, d) context vectors, alternative for ``norm``.
    n : context length, for ``uniform`` when nothing else gives it.
    """
    if source in ("attention", "ema"):
        if attention is None:
            raise ValueError(f"context_mass({source!r}) needs attention (L, H, N)")
        a = attention.detach().float()
        if a.dim() == 2:
            a = a.unsqueeze(1)
        if layers is not None:
            a = a[list(layers)]
        if heads is not None:
            a = a[:, list(heads)]
        m = a.mean(dim=(0, 1))  # (N,)
        if source == "ema":
            from semviz.pruning import ema_mass

            return ema_mass(ema, m, ema_decay)
    elif source == "uniform":
        size = n
        for t in (context_ids, vectors, attention):
            if size is None and t is not None:
                size = t.shape[-1] if t is attention else t.shape[0]
        if size is None:
            raise ValueError("context_mass('uniform') needs n, context_ids or vectors")
        return torch.full((size,), 1.0 / max(size, 1))
    elif source == "idf":
        if context_ids is None:
            raise ValueError("context_mass('idf') needs context_ids (N,)")
        ids = context_ids.detach().long().flatten()
        _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        c = counts[inverse].float()  # (N,)
        m = torch.log((1.0 + ids.numel()) / (1.0 + c)) + 1.0
    elif source == "norm":
        if vectors is None:
            if context_ids is None or embed is None:
                raise ValueError("context_mass('norm') needs vectors or context_ids and embed")
            vectors = embed[context_ids.long().flatten()]
        m = vectors.detach().float().norm(dim=-1)
    else:
        raise ValueError(f"unknown mass source {source!r}")
    s = m.sum()
    return m / s if s > 0 else torch.full_like(m, 1.0 / max(m.numel(), 1))


# -- per-model candidate matrices -------------------------------------------------------------

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _weight(model: torch.nn.Module, space: Space) -> Tensor:
    if space == "embedding":
        return model.get_input_embeddings().weight
    if space == "hidden":
        out = model.get_output_embeddings()
        if out is None:
            raise ValueError("space='hidden' needs a model with an output embedding (lm_head)")
        return out.weight
    raise ValueError(f"space must be 'embedding' or 'hidden', got {space!r}")


def candidate_matrix(
    model: torch.nn.Module, space: Space = "embedding", sim: Sim = "cosine"
) -> Tensor:
    """The ``(V, d)`` float32 candidate matrix of ``model`` in ``space`` (unit rows for cosine).

    Cached per model object (weakly, so it dies with the model) and per weight tensor and
    version, so two models, or a model whose weights changed, never share an entry.
    """
    w = _weight(model, space)

    def build() -> Tensor:
        m = w.detach().float()
        return _unit_rows(m) if sim == "cosine" else m.clone()

    return _cached(model, (space, sim), w, build)


def _cached(model: torch.nn.Module, tag: tuple, w: Tensor, build) -> Tensor:
    """``build()`` cached per model and ``tag``, rebuilt when the weight ``w`` changes."""
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


def clear_cache() -> None:
    """Drop every cached candidate matrix."""
    _CACHE.clear()


def context_vectors(
    model: torch.nn.Module,
    space: Space,
    *,
    context_ids: Tensor | None = None,
    hidden: Tensor | None = None,
) -> Tensor:
    """Context vectors ``(N, d)``: ``E[t_i]`` for ``embedding``, the given ``hidden`` otherwise.

    ``hidden`` must be the final *normed* hidden states (the input of ``lm_head``).
    """
    if space == "embedding":
        if context_ids is None:
            raise ValueError("space='embedding' needs context_ids (N,)")
        return _weight(model, "embedding")[context_ids.long().flatten()].detach().float()
    if hidden is None:
        raise ValueError("space='hidden' needs the final normed hidden states (N, d)")
    return hidden.detach().float().reshape(-1, hidden.shape[-1])


def _step_mass(model, params, *, attention, context_ids, n, state) -> Tensor:
    """The step's mass ``(N,)`` from ``params.gravity_mass`` (see :func:`context_mass`)."""
    mass = context_mass(
        params.gravity_mass,
        attention=attention,
        layers=params.gravity_layers,
        heads=params.gravity_heads,
        ema=None if state is None else state.attention_ema,
        ema_decay=params.ema_decay,
        context_ids=context_ids,
        embed=_weight(model, "embedding") if params.gravity_mass == "norm" else None,
        vectors=None,
        n=n,
    )  # (N,)
    if params.gravity_mass == "ema" and state is not None:
        state.attention_ema = mass
    return mass


def pull_for_step(
    model: torch.nn.Module,
    params,
    *,
    context_ids: Tensor | None = None,
    attention: Tensor | None = None,
    hidden: Tensor | None = None,
    state=None,
) -> Tensor:
    """The step's pull vector ``Σ_i m_i t̂_i`` (cosine) or ``Σ_i m_i t_i`` (dot). ``(d,)``

    Costs O(N·d): only the context's own rows are read, never the (V, d) matrix.
    Arguments as in :func:`gravity_for_step`.
    """
    space, sim = params.gravity_space, params.gravity_sim
    if space == "embedding" and context_ids is not None:
        # context rows are rows of the cached float32 candidate matrix: one weighted
        # embedding_bag pass over N rows, so 4,096 context tokens cost little
        rows = context_ids.long().flatten()  # (N,)
        mass = _step_mass(
            model, params, attention=attention, context_ids=context_ids, n=rows.numel(), state=state
        )  # (N,)
        if rows.numel() != mass.numel():
            raise ValueError(f"context has {rows.numel()} rows but mass has {mass.numel()}")
        cand = candidate_matrix(model, space, sim)  # (V, d)
        return torch.nn.functional.embedding_bag(
            rows.view(1, -1), cand, per_sample_weights=mass.float().view(1, -1), mode="sum"
        )[0]  # (d,)
    ctx = context_vectors(model, space, context_ids=context_ids, hidden=hidden)  # (N, d)
    mass = _step_mass(
        model, params, attention=attention, context_ids=context_ids, n=ctx.shape[0], state=state
    )  # (N,)
    return pull_vector(ctx, mass, sim)  # (d,)


def fuses_with_lm_head(model: torch.nn.Module, space: Space) -> bool:
    """True when the candidate matrix *is* the LM head's weight, so ``G`` can ride along.

    The hidden space's candidates are the unembedding rows by definition; the embedding
    space's are too when the embeddings are tied (as in SmolLM2). A bias breaks it.
    """
    out = model.get_output_embeddings()
    if out is None or getattr(out, "bias", None) is not None:
        return False
    if space == "hidden":
        return True
    return _weight(model, "embedding").data_ptr() == out.weight.data_ptr()


def row_norms(model: torch.nn.Module, space: Space) -> Tensor:
    """``‖c_w‖`` of every candidate row in ``space``, float32, cached like the matrix. ``(V,)``"""
    w = _weight(model, space)
    return _cached(
        model, ("norms", space), w, lambda: w.detach().float().norm(dim=-1).clamp_min(_EPS)
    )


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
    pull : (d,) from :func:`pull_for_step`

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


def gravity_for_step(
    model: torch.nn.Module,
    params,
    *,
    context_ids: Tensor | None = None,
    attention: Tensor | None = None,
    hidden: Tensor | None = None,
    state=None,
    normalize: bool = True,
) -> Tensor:
    """Normalised gravity ``(V,)`` for one step, from a :class:`~semviz.pruning.PruneParams`.

    Parameters
    ----------
    context_ids : (N,) ids of the context (prompt + generated so far, as cached).
    attention : (L, H, N) last-query attention, for mass ``attention``/``ema``.
    hidden : (N, d) final normed hidden states, for space ``hidden``.
    state : :class:`~semviz.pruning.SamplerState`; with mass ``ema`` its
        ``attention_ema`` is read and replaced by the new EMA.
    """
    cand = candidate_matrix(model, params.gravity_space, params.gravity_sim)  # (V, d)
    pull = pull_for_step(
        model, params, context_ids=context_ids, attention=attention, hidden=hidden, state=state
    )  # (d,)
    g = cand @ pull  # (V,) one product, whatever the context length
    return normalize_gravity(g) if normalize else g
