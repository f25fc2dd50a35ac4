"""Narrative gravity (seed §4.3): ``score(w) = log P(w|C) + λ·G(w|C)``.

Two kinds of ``G``, one ``λ``:

- ``"pull"``, the seed's potential ``G(w) = Σ_i m_i · sim(w, t_i)``, z-scored over the
  vocabulary. :func:`context_pull` is the one place that turns a context into the masses
  ``m_i`` and the pull vector ``Σ_i m_i t̂_i``; the decoder, the ``generate`` processor, replay
  and the app all call it, so they compute the same ``G``.
- ``"contrast"``, coherence boosting (Malkin et al., 2022): ``G(w) = log P(w|C) -
  log P(w|last k tokens)``, what only the long context explains, in nats. It costs a second
  forward over the last ``k`` tokens per step (:func:`short_window_logits`).

What gets mass (:func:`mass_mask`). Attention parks much of its weight on the first token
and on chat-template tokens, which say nothing about the story. By default the first
``gravity_sinks`` positions, special and template tokens and the system prompt get none
(``gravity_skip_template``), and ``gravity_anchor`` picks the story: the user's prompt only
(``"prompt"``: the feedback loop in which generated words pull towards themselves cannot
start), everything (``"context"``) or the last ``gravity_window`` positions (``"window"``).
The roles of the prompt's positions come from :func:`prompt_roles`. Among the positions that
may pull, the mass source weighs them: the step's attention (or its EMA), uniform, a
count-based idf, the embedding norm, or ``"info"``, a token's surprise opening a text under
the model itself (:func:`information_mass`), which gives stopwords and punctuation none.

Topic, not copies. A token that would repeat an n-gram already in the context
(``gravity_ngram``, :func:`ngram_guard`), or whose embedding is a near copy of a context
token (``gravity_copy_cos``, :func:`near_copies`: "clocks" after "clock"), keeps no positive
gravity, as contrastive search penalises near-copies of the context. Without it a strong
pull stuffs the text with the prompt's words ("clock clocks clockclock").

Spaces. ``"embedding"``: candidates ``E[w]`` against context ``E[t_i]`` (input embeddings).
``"hidden"``: candidates are the output embeddings (``lm_head`` rows) and each context
position is the final normed hidden state ``h_i`` read there: what the context led the model
to expect next. ``"contextual"``: the same output embeddings against ``h_{i-1}``, the state
from which ``t_i`` was predicted: the model's in-context reading of the token itself. Both
sides always live in one space.

``sim`` is linear in the context vector, so ``G = Ĉ @ (Σ_i m_i t̂_i)``: one ``(V, d) @ (d,)``
product whatever the context length. A pull ``G`` is z-scored over the vocabulary
(:func:`normalize_gravity`), so ``λ = 1`` means "one standard deviation of gravity is worth
one nat"; a ``G`` with (near-)zero spread normalises to zeros.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

Sim = Literal["cosine", "dot"]
Space = Literal["embedding", "hidden", "contextual"]
MassSource = Literal["attention", "ema", "uniform", "idf", "norm", "info"]
Kind = Literal["pull", "contrast"]
Anchor = Literal["prompt", "context", "window"]

# roles of the prompt's positions (prompt_roles); positions after the prompt are generated
TEMPLATE, SYSTEM, USER, GENERATED = 0, 1, 2, 3

# the PruneParams fields that shape G itself (λ, mode and rerank_k only use it)
GRAVITY_FIELDS = (
    "gravity_kind",
    "gravity_mass",
    "gravity_sim",
    "gravity_space",
    "gravity_layers",
    "gravity_heads",
    "ema_decay",
    "gravity_anchor",
    "gravity_window",
    "gravity_sinks",
    "gravity_skip_template",
    "gravity_ngram",
    "gravity_copy_cos",
    "gravity_attract_only",
    "gravity_floor",
    "gravity_contrast_k",
)

# the first gravity semviz shipped: attention mass over every cached token, no exclusions
FIRST_GRAVITY = {
    "gravity_kind": "pull",
    "gravity_mass": "attention",
    "gravity_anchor": "context",
    "gravity_sinks": 0,
    "gravity_skip_template": False,
    "gravity_ngram": 0,
    "gravity_copy_cos": 0.0,
    "gravity_attract_only": False,
    "gravity_space": "embedding",
    "gravity_sim": "cosine",
}

__all__ = [
    "FIRST_GRAVITY",
    "GRAVITY_FIELDS",
    "INFO_QUANTILE",
    "ContextPull",
    "GravityContext",
    "candidate_matrix",
    "context_mass",
    "context_pull",
    "contrast_gravity",
    "ema_mass",
    "finish_gravity",
    "fuses_with_lm_head",
    "gravity_for_step",
    "gravity_potential",
    "gravity_terms",
    "in_side_forward",
    "information_mass",
    "log_probs",
    "logits_and_gravity",
    "mass_mask",
    "near_copies",
    "ngram_guard",
    "normalize_gravity",
    "project",
    "prompt_roles",
    "reads_attention",
    "reads_hidden",
    "pull_vector",
    "repeat_tokens",
    "row_norms",
    "short_window_logits",
    "trace_context",
    "trace_pulls",
]

_EPS = 1e-8


def _unit_rows(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(_EPS)


def reads_attention(params: Any) -> bool:
    """True when ``params``' gravity needs the step's last-query attention."""
    return (
        params.gravity_lambda != 0.0
        and params.gravity_kind == "pull"
        and params.gravity_mass in ("attention", "ema")
    )


def reads_hidden(params: Any) -> bool:
    """True when ``params``' gravity needs the final normed hidden states of the context."""
    return (
        params.gravity_lambda != 0.0
        and params.gravity_kind == "pull"
        and params.gravity_space != "embedding"
    )


# -- the potential ------------------------------------------------------------------------------


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


def ema_mass(prev: Tensor | None, current: Tensor, decay: float) -> Tensor:
    """``decay · prev + (1 - decay) · current`` by absolute position. ``(N,)``

    ``prev`` (the EMA after the previous step) may be shorter than ``current``: a position
    new since then enters at zero, so an EMA of distributions stays a distribution (it sums
    to 1 whenever every ``current`` did) and needs no renormalising. ``prev=None`` starts
    the EMA at ``current``.
    """
    cur = current.detach().float().flatten()  # (N,)
    if prev is None:
        return cur.clone()
    p = prev.detach().float().flatten().to(cur.device)[: cur.numel()]
    old = torch.zeros_like(cur)
    old[: p.numel()] = p
    return decay * old + (1.0 - decay) * cur


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
    """Mass ``m_i`` of each context token from one source, normalised to sum 1 ``(N,)``.

    The raw sources; :func:`context_pull` decides which positions may carry mass at all.

    Parameters
    ----------
    source : ``"attention"`` last-query attention averaged over ``layers``×``heads``;
        ``"ema"`` that average folded into ``ema`` (the previous EMA by position) with
        ``ema_decay`` (:func:`ema_mass`); ``"uniform"``; ``"idf"`` ``log((1+N)/(1+c_i)) + 1``
        with ``c_i`` the count of token ``t_i`` in the context, so repeated filler weighs
        less; ``"norm"`` the embedding norm ``‖E[t_i]‖`` (or of ``vectors``).
    attention : (L, H, N) last-query attention rows, already softmaxed (not re-softmaxed).
    context_ids : (N,) token ids, for ``idf`` and ``norm``.
    embed : (V, d) input embedding matrix, for ``norm``.
    vectors : (N, d) context vectors, alternative for ``norm``.
    n : context length, for ``uniform`` when nothing else gives it.
    """
    if source in ("attention", "ema"):
        if attention is None:
            raise ValueError(f"context_mass({source!r}) needs attention (L, H, N)")
        m = _mean_attention(attention, layers, heads)  # (N,)
        if source == "ema":
            m = ema_mass(ema, m, ema_decay)
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


def _mean_attention(
    attention: Tensor, layers: tuple[int, ...] | None, heads: tuple[int, ...] | None
) -> Tensor:
    """Mean over the selected layers and heads. (L, H, N) -> (N,)"""
    a = attention.detach().float()
    if a.dim() == 2:
        a = a.unsqueeze(1)
    if layers is not None:
        a = a[list(layers)]
    if heads is not None:
        a = a[:, list(heads)]
    return a.mean(dim=(0, 1))  # (N,)


# -- per-model candidate matrices -------------------------------------------------------------

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _weight(model: torch.nn.Module, space: Space) -> Tensor:
    """The ``(V, d)`` candidate weight of ``space``."""
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
    w = _weight(model, space)

    def build() -> Tensor:
        m = w.detach().float()
        return _unit_rows(m) if sim == "cosine" else m.clone()

    return _cached(model, (_weight_space(space), sim), w, build)


def _weight_space(space: Space) -> str:
    # hidden and contextual share the output embedding, so they share its cache entries
    return "embedding" if space == "embedding" else "hidden"


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


INFO_QUANTILE = 0.05  # mass "info": the vocabulary's most expected 5% carry none


def information_mass(model: torch.nn.Module) -> Tensor:
    """Mass ``info`` of every token: its information above the stopword level. ``(V,)``

    ``I(w) = -log P(w | bos)``, the model's own surprise at ``w`` opening a text: a few nats
    for "the", "," or "and", 12 to 20 for "beekeeper" or "lighthouse". The mass is
    ``max(0, I(w) - I_5%)``, where ``I_5%`` is the 5% quantile of ``I`` over the vocabulary,
    so the ~5% most expected tokens (function words, punctuation) carry none: an idf from
    the model itself, no corpus needed. One forward per model, cached.
    """
    w = model.get_output_embeddings().weight

    def build() -> Tensor:
        cfgs = (getattr(model, "generation_config", None), model.config)
        start = next(
            (v for c in cfgs for v in (getattr(c, "bos_token_id", None),) if isinstance(v, int)),
            None,
        )
        if start is None:
            start = next(iter(_model_special_ids(model)), 0)
        dev = w.device
        with _side_forward(), torch.inference_mode():
            x = model.get_decoder()(input_ids=torch.tensor([[start]], device=dev)).last_hidden_state
            info = -log_probs(model.get_output_embeddings()(x[0, -1]).float()).cpu()  # (V,)
        floor = torch.quantile(info, INFO_QUANTILE)
        return (info - floor).clamp_min(0.0)

    return _cached(model, ("info",), w, build)


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
    return _weight(model, "embedding").data_ptr() == out.weight.data_ptr()


def row_norms(model: torch.nn.Module, space: Space) -> Tensor:
    """``‖c_w‖`` of every candidate row in ``space``, float32, cached like the matrix. ``(V,)``"""
    w = _weight(model, space)
    return _cached(
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
    w = _weight(model, space).detach()  # (V, d)
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


# -- what the story is: roles and the mass mask -------------------------------------------------

_MARKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PH = "\x00semviz\x00"


def _chat_markers(tokenizer: Any) -> tuple[list[int], list[int]] | None:
    """Token ids of the chat template's user header and of what follows the user's text.

    Found by rendering the template around a placeholder with two different system
    prompts: the longest common tail before the placeholder is the user header (the
    system's text differs, the markup after it does not). None without a usable template.
    """
    try:
        hit = _MARKERS.get(tokenizer)
    except TypeError:
        hit = None
    if hit is not None:
        return hit or None
    found: tuple = ()
    try:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "system", "content": s}, {"role": "user", "content": _PH}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for s in ("A", "B")
        ]
        (pre_a, post), (pre_b, _) = (t.split(_PH, 1) for t in texts)
        n = 0
        while n < min(len(pre_a), len(pre_b)) and pre_a[-1 - n] == pre_b[-1 - n]:
            n += 1
        header = pre_a[len(pre_a) - n :]
        enc = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in (header, post)]
        if enc[0] and enc[1]:
            found = (list(enc[0]), list(enc[1]))
    except Exception:  # no template, or one that refuses a system turn: plain prompts only
        found = ()
    try:
        _MARKERS[tokenizer] = found
    except TypeError:
        pass
    return found or None


def _find(seq: list[int], sub: list[int], start: int = 0, last: bool = False) -> int:
    hits = [i for i in range(start, len(seq) - len(sub) + 1) if seq[i : i + len(sub)] == sub]
    return (hits[-1] if last else hits[0]) if hits else -1


def prompt_roles(
    tokenizer: Any | None, ids: Sequence[int] | Tensor, special_ids: Sequence[int] = ()
) -> Tensor:
    """The role of each prompt position: ``TEMPLATE``, ``SYSTEM`` or ``USER``. ``(N,)`` int8

    Special tokens are ``TEMPLATE``. When ``ids`` hold a chat-template rendering, the user's
    last turn (between the template's user header and what follows the user's text) is
    ``USER``, the rest of the markup ``TEMPLATE``, and any other text before it (the system
    prompt) ``SYSTEM``. Otherwise every non-special token is ``USER``. Without a tokenizer
    only ``special_ids`` are recognised.

    Examples
    --------
    >>> prompt_roles(None, [1, 5, 6, 2], special_ids=[1, 2]).tolist()
    [0, 2, 2, 0]
    """
    seq = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    special = set(special_ids)
    if tokenizer is not None:
        special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    roles = [TEMPLATE if i in special else USER for i in seq]
    markers = _chat_markers(tokenizer) if tokenizer is not None else None
    if markers is not None:
        head, foot = markers
        h = _find(seq, head, last=True)
        if h >= 0:
            start = h + len(head)
            f = _find(seq, foot, start)
            end = f if f >= 0 else len(seq)
            for j in range(len(seq)):
                if not start <= j < end:
                    roles[j] = SYSTEM if j < h and roles[j] != TEMPLATE else TEMPLATE
    return torch.tensor(roles, dtype=torch.int8)


def _model_special_ids(model: Any) -> list[int]:
    """bos/eos/pad ids from a model's configs (what is known without a tokenizer)."""
    out: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = getattr(cfg, name, None) if cfg is not None else None
            for i in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(i, int):
                    out.add(i)
    return sorted(out)


@dataclass
class GravityContext:
    """What one step's gravity reads. Positions are absolute: 0 is the first prompt token.

    Attributes
    ----------
    ids : (T,) every token so far, prompt then generated; the last one was just fed.
    positions : (S,) sorted positions the step's query read (the KV cache after eviction);
        None means all ``T``.
    roles : (P,) :func:`prompt_roles` of the prompt; positions ``>= P`` are generated.
        None: the first ``n_prompt`` positions are all ``USER``.
    n_prompt : the prompt length when ``roles`` is None (None: every position is prompt).
    attention : (L, H, S) last-query attention on ``positions``, for mass attention / ema.
    hidden : (T, d) final normed hidden states by position, for the hidden spaces.
    ema : (T',) the attention EMA after the previous step, by position (mass ``ema``).
    """

    ids: Tensor
    positions: Tensor | None = None
    roles: Tensor | None = None
    n_prompt: int | None = None
    attention: Tensor | None = None
    hidden: Tensor | None = None
    ema: Tensor | None = None


@dataclass
class ContextPull:
    """:func:`context_pull`'s answer.

    Attributes
    ----------
    positions : (S,) the positions the masses sit on.
    mass : (S,) ``m_i``, summing to 1 (all zero when no position may pull).
    pull : (d,) ``Σ_i m_i t̂_i`` (cosine) or ``Σ_i m_i t_i`` (dot).
    ema : (T,) the attention EMA after this step (mass ``ema``), by position, else None.
    """

    positions: Tensor
    mass: Tensor
    pull: Tensor
    ema: Tensor | None = None


def mass_mask(params: Any, ctx: GravityContext) -> Tensor:
    """Which of ``ctx``'s positions may carry mass under ``params``. ``(S,)`` bool"""
    T = int(ctx.ids.numel())
    pos = _positions(ctx)
    if ctx.roles is not None:
        roles = ctx.roles.to(torch.int8)
    else:
        n = T if ctx.n_prompt is None else int(ctx.n_prompt)
        roles = torch.full((n,), USER, dtype=torch.int8)
    P = roles.numel()
    role = torch.full((pos.numel(),), GENERATED, dtype=torch.int8)
    inside = pos < P
    role[inside] = roles[pos[inside]]
    ok = pos >= params.gravity_sinks
    if params.gravity_skip_template:
        ok &= (role == USER) | (role == GENERATED)
    if params.gravity_anchor == "prompt":
        ok &= inside
    elif params.gravity_anchor == "window":
        ok &= pos >= T - params.gravity_window
    if params.gravity_space == "contextual":
        ok &= pos >= 1  # h_{i-1} does not exist for the first position
    return ok


def _positions(ctx: GravityContext) -> Tensor:
    if ctx.positions is None:
        return torch.arange(int(ctx.ids.numel()))
    return ctx.positions.long().flatten()


def context_pull(model: torch.nn.Module, params: Any, ctx: GravityContext) -> ContextPull:
    """The masses of ``ctx``'s positions and the pull vector they make: THE gravity context.

    Parameters
    ----------
    model : the LM (for the embedding space, any module with ``get_input_embeddings()``).
    params : a :class:`~semviz.sampling.PruneParams` (its gravity fields are read).
    ctx : the step's :class:`GravityContext`.

    Attention is rounded to float16 before it becomes mass, the precision a trace records
    it in, so a replay of the trace computes the same masses as the live run.
    """
    pos = _positions(ctx)  # (S,)
    ids = ctx.ids.long().flatten()[pos]  # (S,)
    ok = mass_mask(params, ctx)  # (S,)
    src, ema = params.gravity_mass, None
    if src in ("attention", "ema"):
        if ctx.attention is None:
            raise ValueError(f"gravity_mass={src!r} needs the step's attention (L, H, S)")
        att = ctx.attention.detach().to(torch.float16).float()  # (L, H, S)
        if att.shape[-1] != pos.numel():
            raise ValueError(
                f"attention covers {att.shape[-1]} positions, the context {pos.numel()}"
            )
        raw = _mean_attention(att, params.gravity_layers, params.gravity_heads)  # (S,)
        if src == "ema":
            now = torch.zeros(int(ctx.ids.numel()))  # (T,) by absolute position
            now[pos] = raw
            ema = ema_mass(ctx.ema, now, params.ema_decay)  # (T,)
            raw = ema[pos]
    elif src == "info":
        raw = information_mass(model)[ids]  # (S,)
    else:
        raw = torch.zeros(pos.numel())
        if bool(ok.any()):
            embed = _weight(model, "embedding") if src == "norm" else None
            raw[ok] = context_mass(src, context_ids=ids[ok], embed=embed, n=int(ok.sum()))
    m = torch.where(ok, raw, torch.zeros_like(raw))  # (S,)
    total = m.sum()
    if bool(total > 0):
        m = m / total
    elif bool(ok.any()):
        m = ok.float() / ok.sum()
    vecs = _context_rows(model, params, ctx, pos[ok], ids[ok])  # (S', d)
    pull = (m[ok].unsqueeze(0) @ vecs)[0] if vecs.shape[0] else vecs.new_zeros(vecs.shape[1])
    return ContextPull(positions=pos, mass=m, pull=pull, ema=ema)


def _context_rows(
    model: torch.nn.Module, params: Any, ctx: GravityContext, pos: Tensor, ids: Tensor
) -> Tensor:
    """The context vectors of ``pos`` in the gravity space, unit rows for cosine. ``(S', d)``"""
    space, sim = params.gravity_space, params.gravity_sim
    if space == "embedding":
        return candidate_matrix(model, "embedding", sim)[ids]  # (S', d) cached rows
    if ctx.hidden is None:
        raise ValueError(f"gravity_space={space!r} needs the final normed hidden states (T, d)")
    rows = pos - 1 if space == "contextual" else pos
    h = ctx.hidden.detach().float()[rows]  # (S', d)
    return _unit_rows(h) if sim == "cosine" else h


# -- topic, not copies ----------------------------------------------------------------------------


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
    w = _weight(model, "embedding")
    memo = _cached(model, ("copies", float(cos)), w, dict)
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


def finish_gravity(
    model: torch.nn.Module,
    raw: Tensor,
    params: Any,
    ids: Tensor,
    index: Tensor | None = None,
    *,
    normalize: bool = True,
) -> Tensor:
    """The step's ``G`` from its raw values: z-scored (kind ``pull``), then the copy guards.

    With ``gravity_attract_only`` a pull is ``max(z - gravity_floor, 0)``: only the tokens
    well above the vocabulary's mean are pulled, and nothing is pushed (the signed z-score
    pushes function words away from a content-word topic, and the text loses its grammar).

    A token that would repeat an n-gram of the context (``gravity_ngram``) keeps no positive
    gravity; for a pull, neither does a near copy of a context token (``gravity_copy_cos``,
    :func:`near_copies`). ``index`` (K,): the token ids ``raw`` is over (default the
    vocabulary).
    """
    g = normalize_gravity(raw) if normalize and params.gravity_kind == "pull" else raw.float()
    if params.gravity_kind == "pull" and params.gravity_attract_only:
        g = (g - params.gravity_floor).clamp_min(0.0)  # pull the topic, push nothing away
    g = ngram_guard(g, ids, params.gravity_ngram, index)
    if params.gravity_kind == "pull" and params.gravity_copy_cos > 0:
        banned = near_copies(model, ids, params.gravity_copy_cos)
        hit = torch.isin(torch.arange(g.shape[-1]) if index is None else index.long(), banned)
        g = torch.where(hit.to(g.device) & (g > 0), torch.zeros_like(g), g)
    return g


# -- gravity by contrast (coherence boosting) -------------------------------------------------


def log_probs(logits: Tensor) -> Tensor:
    """``x - logsumexp(x)`` along the last axis, float32 (the trace's ``lse`` is the same)."""
    x = logits.float()
    return x - torch.logsumexp(x, -1, keepdim=True)


_SIDE = threading.local()


def in_side_forward() -> bool:
    """True while gravity runs the model for itself (the short window, the info prior), so
    hooks that collect the sequence's hidden states skip that forward."""
    return bool(getattr(_SIDE, "active", False))


@contextlib.contextmanager
def _side_forward() -> Iterator[None]:
    _SIDE.active = True
    try:
        yield
    finally:
        _SIDE.active = False


def short_window_logits(model: torch.nn.Module, windows: Tensor) -> Tensor:
    """Next-token logits after only each row's tokens, read as a fresh text. ``(B, k) -> (B, V)``

    The short context of coherence boosting: no cache, positions ``0..k-1``, no capture.
    """
    w = windows.long()
    if w.dim() == 1:
        w = w.unsqueeze(0)
    dev = next(model.parameters()).device
    w = w.to(dev)
    pos = torch.arange(w.shape[1], device=dev).expand_as(w)  # (B, k)
    with _side_forward(), torch.inference_mode():
        h = model.get_decoder()(input_ids=w, position_ids=pos, use_cache=False)
        out = model.get_output_embeddings()(h.last_hidden_state[:, -1])  # (B, V)
    return out.float().cpu()


def contrast_gravity(logits: Tensor, short_logits: Tensor) -> Tensor:
    """``log P(w | C) - log P(w | last k tokens)``: what only the long context explains. ``(..., V)``"""
    return log_probs(logits) - log_probs(short_logits)


# -- one step -------------------------------------------------------------------------------------


def gravity_for_step(
    model: torch.nn.Module,
    params: Any,
    ctx: GravityContext | None = None,
    *,
    context_ids: Tensor | None = None,
    attention: Tensor | None = None,
    hidden: Tensor | None = None,
    logits: Tensor | None = None,
    normalize: bool = True,
) -> Tensor:
    """The step's gravity ``G`` over the vocabulary, ``(V,)``, from a :class:`GravityContext`.

    ``context_ids`` / ``attention`` / ``hidden`` build a context with every position in the
    cache and the whole context as prompt, when ``ctx`` is not given. Kind ``contrast``
    needs the step's full ``logits`` (V,) and runs the short forward itself.
    ``normalize=False`` returns a pull's raw potential ``Σ m_i sim(w, t_i)``: no z-score,
    no floor, no copy guard.
    """
    if ctx is None:
        if context_ids is None:
            raise ValueError("gravity_for_step needs ctx or context_ids")
        ctx = GravityContext(ids=context_ids.long().flatten(), attention=attention, hidden=hidden)
    if params.gravity_kind == "contrast":
        if logits is None:
            raise ValueError("gravity_kind='contrast' needs the step's logits (V,)")
        short = short_window_logits(model, ctx.ids[-params.gravity_contrast_k :])[0]  # (V,)
        return finish_gravity(model, contrast_gravity(logits, short), params, ctx.ids)
    pull = context_pull(model, params, ctx).pull  # (d,)
    raw = project(model, pull[None], params.gravity_space, params.gravity_sim)[0]  # (V,)
    return finish_gravity(model, raw, params, ctx.ids) if normalize else raw


# -- reading a recorded trace ---------------------------------------------------------------------


def trace_context(
    trace: Any, i: int, *, hidden: Tensor | None = None, ema: Tensor | None = None
) -> GravityContext:
    """The :class:`GravityContext` of step ``i`` of a recorded trace (``semviz.output.trace.Trace``)."""
    rec = trace.steps[i]
    ids = torch.tensor(trace.prompt_ids + [s.token_id for s in trace.steps[:i]], dtype=torch.long)
    roles = (getattr(trace, "extra", None) or {}).get("prompt_roles")
    att = rec.attention.float() if rec.attention is not None else None
    pos = rec.cache_positions.long() if rec.cache_positions is not None else None
    return GravityContext(
        ids=ids,
        positions=pos,
        roles=None if roles is None else torch.as_tensor(roles, dtype=torch.int8),
        n_prompt=len(trace.prompt_ids),
        attention=att,
        hidden=None if hidden is None else hidden[: ids.numel()],
        ema=ema,
    )


def trace_pulls(
    model: torch.nn.Module,
    params: Any,
    trace: Any,
    *,
    hidden: Tensor | None = None,
    upto: int | None = None,
) -> list[ContextPull]:
    """:func:`context_pull` of every recorded step (the EMA carried from step to step)."""
    out: list[ContextPull] = []
    ema = None
    for i in range(len(trace.steps) if upto is None else min(upto, len(trace.steps))):
        ctx = trace_context(trace, i, hidden=hidden, ema=ema)
        p = params
        if p.gravity_mass in ("attention", "ema") and ctx.attention is None:
            p = p.replace(gravity_mass="uniform")  # the run did not record attention
        cp = context_pull(model, p, ctx)
        ema = cp.ema
        out.append(cp)
    return out


def gravity_terms(
    model: torch.nn.Module,
    trace: Any,
    i: int,
    token_id: int,
    params: Any,
    hidden: Tensor | None = None,
) -> tuple[Any, Any]:
    """The terms ``m_j · sim(w, t_j)`` of the raw ``G(w)`` of token ``w`` at step ``i``.

    Returns the positions (S,) and the terms (S,) as numpy arrays; their sum is the raw
    ``G(w)`` before the vocabulary-wide z-score. Without ``hidden`` the embedding space is
    used. Contrast gravity has no per-token terms: ``ValueError``.
    """
    if params.gravity_kind == "contrast":
        raise ValueError(
            "Contrast gravity (coherence boosting) compares two forwards; it has no per-token terms."
        )
    if hidden is None and params.gravity_space != "embedding":
        params = params.replace(gravity_space="embedding")
    cp = trace_pulls(model, params, trace, hidden=hidden, upto=i + 1)[i]
    ctx = trace_context(trace, i, hidden=hidden)
    rows = torch.zeros(cp.positions.numel(), cp.pull.numel())  # (S, d)
    ok = cp.mass > 0
    if bool(ok.any()):
        ids = ctx.ids[cp.positions[ok]]
        rows[ok] = _context_rows(model, params, ctx, cp.positions[ok], ids)
    w = candidate_matrix(model, params.gravity_space, params.gravity_sim)[token_id]  # (d,)
    terms = cp.mass * (rows @ w)  # (S,)
    return cp.positions.numpy(), terms.detach().float().numpy()
