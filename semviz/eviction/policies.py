"""Eviction policies: each a small ``@dataclass`` with a ``score()``; the base class
(:class:`~semviz.eviction.base.EvictionPolicy`) does the rest.

Policies
--------
``full``      no eviction (the reference).
``window``    the most recent ``budget`` tokens.
``streaming`` StreamingLLM: ``sinks`` first tokens (4) + the most recent ``budget - sinks``.
``h2o``       heavy hitters: attention accumulated over steps, plus a recent window (half).
``tova``      the last query's attention averaged over heads.
``ema``       seed §5.3: ``importance = 0.9·old + 0.1·attention``.
``gravity``   seed §5.3 / §6: EMA importance combined with semantic relevance to the current
              context (``semviz.gravity``); theme-carrying tokens are protected.

Each takes a ``budget`` (tokens ``>= 1`` or a fraction ``< 1`` of the tokens read so far) and/or a
``threshold`` (entries scoring below it are evicted); either may be a sequence with one value per
layer. Eviction is per layer and per position (all KV heads of a layer keep the same positions).
Scores are head means. ``make_policy(..., rerotate=True)`` wraps a policy in
:class:`~semviz.eviction.rerotate.KeyRerotation` (cache-relative positions).

Examples
--------
>>> make_policy("streaming", budget=128)
StreamingPolicy(budget=128, threshold=None, sinks=4, recent=0, regret_decay=0.9)
>>> make_policy("h2o", budget=0.25).name
'h2o'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from semviz.eviction.base import CacheView, EvictionPolicy, Value
from semviz.eviction.rerotate import KeyRerotation
from semviz.gravity import candidate_matrix, context_mass, gravity_potential, normalize_gravity

__all__ = [
    "POLICIES",
    "EMAPolicy",
    "FullPolicy",
    "GravityPolicy",
    "H2OPolicy",
    "StreamingPolicy",
    "TOVAPolicy",
    "WindowPolicy",
    "make_policy",
]

# --------------------------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------------------------


@dataclass
class FullPolicy(EvictionPolicy):
    """No eviction: the reference every other policy is measured against."""

    name: ClassVar[str] = "full"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget is not None or self.threshold is not None:
            raise ValueError("full keeps everything: it takes no budget and no threshold")

    def score(self, v: CacheView) -> Tensor | None:
        return None


@dataclass
class WindowPolicy(EvictionPolicy):
    """The most recent tokens only. Score ``-age`` (newest 0), so ``threshold=-W`` keeps age ≤ W."""

    name: ClassVar[str] = "window"
    budget_rule: ClassVar[str] = "window"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget is None and self.threshold is None:
            raise ValueError(f"{self.name} needs a budget (its window) or a threshold")

    def score(self, v: CacheView) -> Tensor:
        return (v.positions - (v.n_seen - 1)).float()


@dataclass
class StreamingPolicy(WindowPolicy):
    """StreamingLLM: ``sinks`` attention sinks plus the most recent ``budget - sinks`` tokens."""

    sinks: int = 4
    name: ClassVar[str] = "streaming"


@dataclass
class H2OPolicy(EvictionPolicy):
    """Heavy hitters (H2O): attention accumulated over every step seen, plus a recent window.

    Only the last query's row is observed at prefill (never the N×N), so a prompt's tokens
    start with one observation each.
    """

    recent: int | float = 0.5
    name: ClassVar[str] = "h2o"

    def score(self, v: CacheView) -> Tensor:
        acc = v.state.get("acc")
        acc = v.mean_attention if acc is None else acc + v.mean_attention  # (L, W)
        v.state["acc"] = acc
        return acc.clone()


@dataclass
class TOVAPolicy(EvictionPolicy):
    """TOVA: the last query's attention averaged over heads; nothing else remembered."""

    name: ClassVar[str] = "tova"

    def score(self, v: CacheView) -> Tensor:
        return v.mean_attention * v.count[:, None]  # relative to a uniform share


@dataclass
class EMAPolicy(EvictionPolicy):
    """Seed §5.3: ``importance = decay·old + (1-decay)·attention``; new entries start at their
    first attention. Score is importance relative to a uniform share (1 = average), so a
    ``threshold`` of 0.5 evicts entries that keep getting less than half an average share.
    """

    decay: float = 0.9
    name: ClassVar[str] = "ema"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay!r}")

    def importance(self, v: CacheView) -> Tensor:
        """(L, W) the EMA importance, updated with this step's attention."""
        a = v.mean_attention
        imp = v.state.get("importance")
        imp = torch.zeros_like(a) if imp is None else imp
        upd = torch.where(v.new, a, self.decay * imp + (1.0 - self.decay) * a)
        v.state["importance"] = upd
        return upd

    def score(self, v: CacheView) -> Tensor:
        return self.importance(v) * v.count[:, None]


@dataclass
class GravityPolicy(EMAPolicy):
    """Seed §5.3/§6 gravity-field eviction: low attention AND far from the context goes first.

    ``score = importance_rel · exp(beta · Ĝ)`` where ``importance_rel`` is the EMA importance
    relative to a uniform share and ``Ĝ`` the gravity potential of the entry's token towards the
    current context, ``G(t_j) = Σ_i m_i·sim(t_j, t_i)`` (``semviz.gravity``), z-scored over the
    layer's entries: its projection on the context's "sentence vector". An entry is evicted
    only if it is cold and semantically far; a far entry needs more attention to stay, a near
    one less. Entries with ``Ĝ >= protect_z`` carry the theme and are kept even when cold (at
    most ``protect_frac`` of the budget, nearest first).

    Parameters
    ----------
    beta : weight of relevance (nats of log-importance per standard deviation of ``Ĝ``).
    space : ``"embedding"`` (input embeddings) or ``"hidden"`` (final normed hidden states).
    sim : ``"cosine"`` or ``"dot"``.
    mass : context weights: ``"idf"``, ``"uniform"`` (over the last ``context_window`` tokens
        read) or ``"attention"`` (this layer's current attention over its own cache).
    context_window : the last tokens that make up the context (None, the default: all read
        so far, so with ``idf`` mass the context vector is the text's theme, not its last
        few words).
    protect_z, protect_frac : theme protection (``protect_z=inf`` turns it off).
    """

    # defaults tuned on the shipped text (512 tokens, budget 64)
    beta: float = 0.2
    space: Literal["embedding", "hidden"] = "embedding"
    sim: Literal["cosine", "dot"] = "cosine"
    mass: Literal["idf", "uniform", "attention"] = "idf"
    context_window: int | None = None
    protect_z: float = 2.0
    protect_frac: float = 0.05
    name: ClassVar[str] = "gravity"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.space not in ("embedding", "hidden"):
            raise ValueError(f"space must be 'embedding' or 'hidden', got {self.space!r}")
        if self.sim not in ("cosine", "dot"):
            raise ValueError(f"sim must be 'cosine' or 'dot', got {self.sim!r}")
        if self.mass not in ("idf", "uniform", "attention"):
            raise ValueError(f"mass must be 'idf', 'uniform' or 'attention', got {self.mass!r}")
        if self.context_window is not None and self.context_window < 1:
            raise ValueError(f"context_window must be >= 1 or None, got {self.context_window!r}")
        if not 0.0 <= self.protect_frac <= 1.0:
            raise ValueError(f"protect_frac must be in [0, 1], got {self.protect_frac!r}")
        if not math.isfinite(self.beta):
            raise ValueError(f"beta must be finite, got {self.beta!r}")
        self._vecs: Tensor | None = None
        self._rel: Tensor | None = None
        self._z: Tensor | None = None

    @property
    def needs_hidden(self) -> bool:  # type: ignore[override]
        return self.space == "hidden"

    def reset(self, owner: Any) -> None:
        super().reset(owner)
        self._vecs = None
        self._rel = None
        self._z = None

    def _vectors(self, v: CacheView) -> Tensor:
        """(N, d) float32 vectors of every position read (unit rows for cosine)."""
        n = len(v.ids)
        have = 0 if self._vecs is None else self._vecs.shape[0]
        if self.space == "embedding":
            if have < n:
                cand = candidate_matrix(v.lm.model, "embedding", self.sim)  # (V, d)
                new = cand[torch.tensor(list(v.ids[have:]), device=cand.device)].cpu()
                self._vecs = new if self._vecs is None else torch.cat([self._vecs, new])
            return self._vecs
        if v.hidden is None or v.hidden.shape[0] < n:
            raise ValueError("space='hidden' needs the hidden states of every position read")
        h = v.hidden[:n].detach().float().cpu()
        if self.sim == "cosine":
            h = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        return h

    def begin_step(self, v: CacheView) -> None:
        vecs = self._vectors(v)  # (N, d)
        self._rel = None
        if self.mass == "attention":
            return
        n = vecs.shape[0]
        w = n if self.context_window is None else min(n, self.context_window)
        ctx_ids = torch.tensor(list(v.ids[n - w :]))
        m = context_mass(self.mass, context_ids=ctx_ids, n=w)  # (W_ctx,)
        self._rel = gravity_potential(vecs, vecs[n - w :], m, self.sim, normalized=True)  # (N,)

    def relevance(self, v: CacheView) -> Tensor:
        """(L, W) gravity potential of each entry towards the context, z-scored per layer
        over the layer's entries (0 at padding)."""
        valid = v.valid
        if self._rel is not None:
            g = self._rel[v.positions.clamp_min(0)]  # (L, W)
        else:  # each layer's own attention is the context mass
            vecs = self._vectors(v)
            g = torch.zeros(v.positions.shape)
            for layer in range(g.shape[0]):
                sel = valid[layer]
                m = context_mass("attention", attention=v.attention[layer][None, :, sel])  # (S,)
                c = vecs[v.positions[layer, sel]]  # (S, d)
                g[layer, sel] = gravity_potential(c, c, m, self.sim, normalized=True)
        g = g.masked_fill(~valid, float("nan"))
        return normalize_gravity(g, dim=-1).masked_fill(~valid, 0.0)

    def score(self, v: CacheView) -> Tensor:
        imp = self.importance(v) * v.count[:, None]
        self._z = self.relevance(v)
        return imp * torch.exp(self.beta * self._z)

    def protect(self, v: CacheView, scores: Tensor | None) -> Tensor | None:
        z, self._z = self._z, None
        if z is None or not math.isfinite(self.protect_z) or self.protect_frac == 0:
            return None
        theme = v.valid & (z >= self.protect_z)  # (L, W)
        budget = v.budget
        cap = torch.where(
            budget >= 0, (self.protect_frac * budget.double()).floor().long(), v.count
        )  # (L,)
        # the ``cap`` nearest theme entries of each layer (ties: lower position first)
        zt = torch.where(theme, z, float("-inf"))
        order = torch.sort(zt, dim=1, descending=True, stable=True).indices
        first = torch.arange(order.shape[1]) < cap[:, None]
        return theme & torch.zeros_like(theme).scatter_(1, order, first)


POLICIES: dict[str, type[EvictionPolicy]] = {
    p.name: p
    for p in (
        FullPolicy,
        WindowPolicy,
        StreamingPolicy,
        H2OPolicy,
        TOVAPolicy,
        EMAPolicy,
        GravityPolicy,
    )
}


def make_policy(
    name: str, budget: Value = None, threshold: Value = None, *, rerotate: bool = False, **kw: Any
):
    """A policy by name: ``full``, ``window``, ``streaming``, ``h2o``, ``tova``, ``ema``, ``gravity``.

    ``rerotate=True`` wraps it in :class:`~semviz.eviction.rerotate.KeyRerotation`.

    >>> make_policy("gravity", budget=128, beta=1.0).beta
    1.0
    >>> make_policy("streaming", budget=64, rerotate=True).name
    'streaming'
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {name!r}")
    policy = cls(budget=budget, threshold=threshold, **kw)
    if rerotate:
        return KeyRerotation(policy)
    return policy
