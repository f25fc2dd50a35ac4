"""Mass sources: how much each context position pulls, one small class each.

A pull's potential is ``G(w) = Σ_i m_i·sim(w, t_i)``; a :class:`MassSource` gives the
``m_i``. The pull (:func:`semviz.gravity.pull.context_pull`) decides which positions may carry
mass at all (anchor, sinks, template), asks the source to weigh them, and normalises the
result to sum 1. ``MASSES`` lists the sources in order; ``PruneParams.gravity_mass`` takes its
choices from it, so a source registered here (or anywhere, with :func:`register_mass`) is a
setting in the decoder, the ``generate`` processor, replay, the CLI and the app.

Adding one: subclass :class:`MassSource` with a ``name`` and :meth:`~MassSource.weigh`, say in
``reads`` what it needs beyond the token ids (``"attention"``: the step's last-query attention;
``"model"``: the language model itself, not a bare embedding matrix), and register it.

Examples
--------
>>> import torch
>>> m = context_mass("idf", context_ids=torch.tensor([7, 7, 7, 9]))  # rare tokens weigh more
>>> [round(x, 3) for x in m.tolist()]
[0.219, 0.219, 0.219, 0.343]
>>> get_mass("attention").reads
frozenset({'attention'})
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import Tensor

from semviz.gravity.context import GravityContext, model_special_ids, positions_of
from semviz.gravity.projection import BareEmbedding, cached, weight
from semviz.gravity.registry import Registry
from semviz.gravity.side import log_probs, side_forward

__all__ = [
    "INFO_QUANTILE",
    "MASSES",
    "Attention",
    "Ema",
    "Idf",
    "Info",
    "MassSource",
    "Norm",
    "Uniform",
    "context_mass",
    "ema_mass",
    "get_mass",
    "information_mass",
    "mean_attention",
    "register_mass",
    "unregister_mass",
]


class MassSource:
    """One source of the masses ``m_i``. Subclasses set ``name`` and implement :meth:`weigh`.

    ``reads`` names what the source needs beyond the token ids: ``"attention"`` (the step's
    last-query attention, ``ctx.attention``) or ``"model"`` (the language model itself).
    """

    name: ClassVar[str]
    label: ClassVar[str] = ""
    reads: ClassVar[frozenset[str]] = frozenset()

    def weigh(
        self, model: torch.nn.Module | None, params: Any, ctx: GravityContext, ok: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """The raw masses of ``ctx``'s positions and what the source carries to the next step.

        Parameters
        ----------
        model : the LM (or a bare embedding dressed as one).
        params : the gravity settings (``PruneParams.gravity_params``).
        ctx : the step's context; ``positions_of(ctx)`` are the positions to weigh (S,).
        ok : (S,) bool, the positions that may carry mass; the others' values are ignored.

        Returns
        -------
        mass : (S,) float32, any positive scale: the pull keeps ``ok``'s entries and
            normalises them to sum 1.
        carry : handed back as ``ctx.ema`` at the next step (None: nothing to carry).
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<mass {self.name}>"


MASSES: Registry[MassSource] = Registry("mass source", MassSource)
get_mass = MASSES.get
register_mass = MASSES.register
unregister_mass = MASSES.unregister


def _normalised(m: Tensor) -> Tensor:
    """``m / Σ m``; uniform where ``m`` sums to zero. ``(N,)``"""
    s = m.sum()
    return m / s if s > 0 else torch.full_like(m, 1.0 / max(m.numel(), 1))


def _on(ok: Tensor, values: Tensor) -> Tensor:
    """``values`` (of ``ok``'s positions) normalised and laid out on all positions. ``(S,)``"""
    out = torch.zeros(ok.numel())
    if bool(ok.any()):
        out[ok] = _normalised(values.float())
    return out


def mean_attention(
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


def _attention(ctx: GravityContext) -> Tensor:
    if ctx.attention is None:
        raise ValueError("this gravity mass needs the step's attention (L, H, S)")
    return ctx.attention


@register_mass
class Attention(MassSource):
    """The step's last-query attention, averaged over ``gravity_layers`` × ``gravity_heads``
    (already a distribution: not softmaxed again)."""

    name, label, reads = "attention", "attention", frozenset({"attention"})

    def weigh(self, model, params, ctx, ok):
        return mean_attention(_attention(ctx), params.gravity_layers, params.gravity_heads), None


@register_mass
class Ema(MassSource):
    """That average folded into the previous steps' with ``ema_decay`` (:func:`ema_mass`),
    by absolute position, so eviction cannot misalign it; it carries the EMA."""

    name, label, reads = "ema", "attention EMA", frozenset({"attention"})

    def weigh(self, model, params, ctx, ok):
        pos = positions_of(ctx)
        raw = mean_attention(_attention(ctx), params.gravity_layers, params.gravity_heads)
        now = torch.zeros(int(ctx.ids.numel()))  # (T,) by absolute position
        now[pos] = raw
        ema = ema_mass(ctx.ema, now, params.ema_decay)  # (T,)
        return ema[pos], ema


@register_mass
class Uniform(MassSource):
    """Every position that may pull, alike."""

    name, label = "uniform", "uniform"

    def weigh(self, model, params, ctx, ok):
        return _on(ok, torch.ones(int(ok.sum()))), None


@register_mass
class Idf(MassSource):
    """``log((1 + N) / (1 + c_i)) + 1`` with ``c_i`` the count of token ``t_i`` among the
    ``N`` positions that may pull, so repeated filler weighs less."""

    name, label = "idf", "IDF"

    def weigh(self, model, params, ctx, ok):
        ids = ctx.ids.long().flatten()[positions_of(ctx)][ok]
        _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        c = counts[inverse].float()  # (N,)
        return _on(ok, torch.log((1.0 + ids.numel()) / (1.0 + c)) + 1.0), None


@register_mass
class Norm(MassSource):
    """The input embedding's norm ``‖E[t_i]‖``."""

    name, label = "norm", "embedding norm"

    def weigh(self, model, params, ctx, ok):
        if model is None:
            raise ValueError("gravity mass 'norm' needs the model's (or an) embedding matrix")
        ids = ctx.ids.long().flatten()[positions_of(ctx)][ok]
        return _on(ok, weight(model, "embedding")[ids].detach().float().norm(dim=-1)), None


INFO_QUANTILE = 0.05  # mass "info": the vocabulary's most expected 5% carry none


@register_mass
class Info(MassSource):
    """A token's surprise opening a text under the model itself, above the stopword level
    (:func:`information_mass`): stopwords and punctuation carry none."""

    name, label, reads = "info", "information", frozenset({"model"})

    def weigh(self, model, params, ctx, ok):
        ids = ctx.ids.long().flatten()[positions_of(ctx)]
        return information_mass(model)[ids], None


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
            start = next(iter(model_special_ids(model)), 0)
        dev = w.device
        with side_forward(), torch.inference_mode():
            x = model.get_decoder()(input_ids=torch.tensor([[start]], device=dev)).last_hidden_state
            info = -log_probs(model.get_output_embeddings()(x[0, -1]).float()).cpu()  # (V,)
        floor = torch.quantile(info, INFO_QUANTILE)
        return (info - floor).clamp_min(0.0)

    return cached(model, ("info",), w, build)


def context_mass(
    source: str,
    *,
    attention: Tensor | None = None,
    layers: tuple[int, ...] | None = None,
    heads: tuple[int, ...] | None = None,
    ema: Tensor | None = None,
    ema_decay: float = 0.9,
    context_ids: Tensor | None = None,
    embed: Tensor | None = None,
    n: int | None = None,
) -> Tensor:
    """Mass ``m_i`` of every context position from one source alone, summing to 1. ``(N,)``

    Every position may carry mass (no anchor, sinks or template rule; the pull applies
    those, see :func:`semviz.gravity.pull.context_pull`), and attention is read at the
    precision given.

    Parameters
    ----------
    source : a name in ``MASSES``.
    attention : (L, H, N) last-query attention rows, already softmaxed (not re-softmaxed),
        averaged over ``layers`` × ``heads``; ``ema`` the previous EMA by position, folded in
        with ``ema_decay`` for ``"ema"``.
    context_ids : (N,) token ids, for ``idf``, ``norm`` and ``info``.
    embed : (V, d) input embedding matrix, for ``norm``.
    n : context length, for ``uniform`` when nothing else gives it.
    """
    src = get_mass(source)
    size = n
    if size is None and context_ids is not None:
        size = int(context_ids.numel())
    if size is None and attention is not None:
        size = int(attention.shape[-1])
    if size is None:
        raise ValueError(f"context_mass({source!r}) needs n, context_ids or attention")
    ids = torch.zeros(size, dtype=torch.long) if context_ids is None else context_ids
    params = SimpleNamespace(gravity_layers=layers, gravity_heads=heads, ema_decay=ema_decay)
    ctx = GravityContext(ids=ids.long().flatten(), attention=attention, ema=ema)
    model = None if embed is None else BareEmbedding(embed)
    raw, _ = src.weigh(model, params, ctx, torch.ones(size, dtype=torch.bool))
    return _normalised(raw.float())
