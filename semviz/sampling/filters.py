"""The truncation filters: one small class per filter, listed in chain order in ``FILTERS``.

Each filter says when it is on for a :class:`PruneParams`, what it keeps on a full-length
input (:meth:`Filter.mask`, batched ``(B, V)``, any tie rule) and, optionally, what it keeps
on a short sorted head of that input (:meth:`Filter.head_keep`, tie rule ``"stable"``), which
the chain uses on long vocabularies. The chain (:func:`semviz.sampling.prune`), the HF
processors, the chain chart and the app loop over ``FILTERS``; a new filter is one class
here (or anywhere, passed to :func:`register`) and its tests.

A filter reads scores, never token ids: the what-if replay runs the chain over a step's
recorded top-K candidates, so position ``i`` of the input is the i-th candidate there, not
token ``i``. Adding one: subclass :class:`Filter` (``name``, ``label``, ``active``,
``describe``, ``mask``; a ``head_keep`` if it keeps an upper set of its input, so long
vocabularies stay on the fast path), add its setting to ``PruneParams`` with
:func:`~semviz.sampling.params.setting`, and list it in ``FILTERS`` (or :func:`register`
it). The chain, replay, the chain chart, the app's warnings and
``semviz.processors.FilterLogitsWarper`` pick it up from there.

The module-level mask functions (``top_k_mask`` …) are the filters' full-length rules as
plain functions of a batch of logits.

Examples
--------
>>> import torch
>>> [f.name for f in active_filters(PruneParams(top_k=5, min_p=0.1))]
['top_k', 'min_p']
>>> top_k_mask(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2)
tensor([[False,  True,  True, False]])
>>> get_filter("top_p").mask(torch.log(torch.tensor([0.1, 0.6, 0.3])), PruneParams(top_p=0.5))
tensor([[False,  True, False]])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Literal

import torch
from torch import Tensor

from semviz.sampling.params import PruneParams
from semviz.sampling.thermo import LN2, entropy_stats

__all__ = [
    "FILTERS",
    "Filter",
    "HeadInput",
    "active_filters",
    "epsilon_mask",
    "eta_mask",
    "free_energy_mask",
    "get_filter",
    "min_p_mask",
    "mirostat_mask",
    "register",
    "stable_head",
    "stable_order",
    "top_k_mask",
    "top_p_mask",
    "typical_mask",
    "unregister",
]

NEG_INF = float("-inf")
TieRule = Literal["stable", "hf"]


# --------------------------------------------------------------------------------------------
# Orders
# --------------------------------------------------------------------------------------------


def stable_order(values: Tensor, descending: bool = True) -> Tensor:
    """Indices sorting ``values`` (B, V) by value, ties broken by the lower index."""
    return torch.sort(values, dim=-1, descending=descending, stable=True).indices


def stable_head(x: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest entries of 1-D ``x`` in stable order (ties: lower index).

    Every entry tied with the k-th value is included, so the result can be longer than ``k``;
    its first ``k`` entries equal ``stable_order(x)[:k]``. Costs a top-k plus a sort of the
    head instead of a sort of the whole vocabulary.

    >>> stable_head(torch.tensor([1.0, 3.0, 3.0, 0.0, 2.0, 0.5, 0.2, 0.1, 0.0]), 1)
    tensor([1, 2])
    """
    n = x.shape[-1]
    k = max(1, min(k, n))
    if k >= n // 4:
        return stable_order(x.unsqueeze(0))[0]
    top = torch.topk(x, k + 1)  # (k+1,) each, values descending
    if top.values[k] < top.values[k - 1]:
        # every entry outside the top k is at most the (k+1)-th value, below the k-th: the
        # top k are exactly the entries >= the k-th value, with no pass over x to find them
        idx = top.indices[:k].sort().values  # ascending index order
    else:
        idx = torch.nonzero(x >= top.values[k - 1]).flatten()  # ties at the k-th value too
    order = torch.sort(x[idx], descending=True, stable=True).indices
    return idx[order]


def _protect_head(x: Tensor, n: int) -> Tensor:
    """Mask (B, V) that is True on the first ``n`` entries of each row's stable order."""
    prot = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    if n == 1:
        # max(dim) returns the first maximal index: the stable order's head, no top-k
        prot.scatter_(-1, x.max(-1, keepdim=True).indices, True)
        return prot
    for b in range(x.shape[0]):
        prot[b, stable_head(x[b], n)[:n]] = True
    return prot


def _protect_by(values_h: Tensor, head: Tensor, n: int) -> Tensor:
    """First ``n`` head entries in stable order of ``values_h`` (H,) (ties: lower index)."""
    if n == 1:
        # lowest index among the maxima
        top = values_h == values_h.max()
        i = int(torch.argmin(torch.where(top, head, head.max() + 1)))
        out = torch.zeros_like(top)
        out[i] = True
        return out
    by_index = torch.argsort(head)  # (H,) ascending token index
    order = by_index[torch.sort(values_h[by_index], descending=True, stable=True).indices]
    out = torch.zeros(values_h.shape, dtype=torch.bool)
    out[order[:n]] = True
    return out


def _2d(x: Tensor) -> Tensor:
    return x.unsqueeze(0) if x.dim() == 1 else x


# --------------------------------------------------------------------------------------------
# Full-length rules: each returns a keep mask (B, V) for logits (B, V)
# --------------------------------------------------------------------------------------------


def top_k_mask(x: Tensor, k: int, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Keep the ``k`` highest logits of ``x`` (B, V).

    ``hf`` keeps every token tied with the k-th value; ``stable`` keeps exactly ``k``.
    """
    x = _2d(x)
    k = min(max(k, min_tokens_to_keep), x.shape[-1])
    if tie_rule == "hf":
        kth = torch.topk(x, k)[0][..., -1, None]  # (B, 1)
        return ~(x < kth)
    return _protect_head(x, k)


def top_p_mask(x: Tensor, p: float, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Keep the smallest most-probable prefix whose mass is ``>= p`` (B, V)."""
    x = _2d(x)
    if tie_rule == "hf":
        sorted_logits, sorted_indices = torch.sort(x, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative_probs <= (1 - p)
        remove[..., -min_tokens_to_keep:] = 0
        remove = remove.scatter(1, sorted_indices, remove)
        return ~remove
    probs = torch.softmax(x, -1)  # (B, V)
    keep = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    for b in range(x.shape[0]):
        # grow a stably sorted head until it holds mass p: the nucleus is usually short
        k = max(64, min_tokens_to_keep)
        while True:
            idx = stable_head(x[b], k)  # (k',)
            q = probs[b, idx]  # (k',) descending
            before = q.cumsum(0) - q  # mass strictly ahead of each token
            inside = before < p
            if not bool(inside[-1]) or idx.numel() >= x.shape[-1]:
                break
            k *= 4
        inside[:min_tokens_to_keep] = True
        keep[b, idx[inside]] = True
    return keep


def min_p_mask(x: Tensor, min_p: float, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Keep tokens with ``p >= min_p * p_max`` (B, V)."""
    x = _2d(x)
    probs = torch.softmax(x, dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    if tie_rule == "hf":
        k = min(min_tokens_to_keep, probs.shape[-1])
        remove.scatter_(-1, torch.topk(probs, k, dim=-1).indices, False)
        return ~remove
    return ~remove | _protect_head(x, min_tokens_to_keep)


def typical_mask(x: Tensor, mass: float, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Locally typical sampling: keep tokens whose surprise is closest to the entropy (B, V)."""
    x = _2d(x)
    normalized = torch.nn.functional.log_softmax(x, dim=-1)
    p = torch.exp(normalized)
    ent = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs((-normalized) - ent)
    if tie_rule == "hf":
        sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
    else:
        sorted_scores, sorted_indices = torch.sort(shifted, descending=False, stable=True)
    cumulative_probs = x.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
    last_ind = (cumulative_probs < mass).sum(dim=1)
    last_ind.clamp_(max=sorted_scores.shape[-1] - 1)
    remove = sorted_scores > sorted_scores.gather(1, last_ind.view(-1, 1))
    remove[..., :min_tokens_to_keep] = 0
    remove = remove.scatter(1, sorted_indices, remove)
    return ~remove


def epsilon_mask(x: Tensor, epsilon: float, min_tokens_to_keep: int = 1, tie_rule="stable"):
    """Keep tokens with ``p >= epsilon`` (B, V)."""
    x = _2d(x)
    return _cutoff_mask(x, x.softmax(dim=-1) < epsilon, min_tokens_to_keep, tie_rule)


def eta_mask(x: Tensor, epsilon: float, min_tokens_to_keep: int = 1, tie_rule="stable"):
    """Keep tokens with ``p >= min(eps, sqrt(eps) * exp(-H))`` (B, V)."""
    x = _2d(x)
    probabilities = x.softmax(dim=-1)
    if tie_rule == "hf":
        eps = torch.tensor(epsilon, device=x.device)
        entropy = torch.distributions.Categorical(logits=x).entropy()
        eta = torch.min(eps, torch.sqrt(eps) * torch.exp(-entropy))[..., None]
    else:
        h, _ = entropy_stats(x)
        eta = torch.clamp(math.sqrt(epsilon) * torch.exp(-h), max=epsilon)[..., None]
    return _cutoff_mask(x, probabilities < eta, min_tokens_to_keep, tie_rule)


def _cutoff_mask(x: Tensor, remove: Tensor, min_tokens_to_keep: int, tie_rule: str) -> Tensor:
    if tie_rule == "hf":
        top_k = min(min_tokens_to_keep, x.size(-1))
        remove = remove & (x < torch.topk(x, top_k)[0][..., -1, None])
        return ~remove
    return ~remove | _protect_head(x, min_tokens_to_keep)


def free_energy_mask(
    scores: Tensor,
    temperature: float,
    kappa: float = 1.0,
    min_tokens_to_keep: int = 1,
    entropy: Tensor | float | None = None,
) -> Tensor:
    """Free-energy criterion (seed §4.4): keep ``w`` iff ``U(w) - U_min <= kappa·T·H``.

    With energies ``U(w) = -s(w)`` (``s`` the gravity-adjusted score at T = 1) the seed
    defines ``F(w) = U(w) - T·H(C)``. A candidate is kept iff its free energy is no higher
    than the ground state's energy, ``F(w) <= U_min`` (scaled by ``kappa``): the thermal
    budget ``T·H`` pays for its excess energy. Equivalently ``p(w) >= p_max·exp(-kappa·T·H)``,
    so at ``kappa = T = 1`` a token survives iff it is at least ``1/exp(H)`` as likely as the
    best one: a single survivor when ``H ≈ 0`` (decisive), a wide window when ``H`` is large
    (tolerant). The argmax always survives. ``H`` is the entropy of ``softmax(s)``.

    Parameters
    ----------
    scores : (B, V) adjusted scores; ``-inf`` marks tokens already removed.
    """
    s = _2d(scores).float()
    h = entropy_stats(s)[0] if entropy is None else torch.as_tensor(entropy).reshape(-1)  # (B,)
    window = kappa * temperature * h  # (B,)
    gap = s.amax(-1, keepdim=True) - s  # (B, V) U(w) - U_min
    keep = gap <= window[..., None]
    return keep | _protect_head(s, min_tokens_to_keep)


def mirostat_mask(x: Tensor, mu: float | Tensor, min_tokens_to_keep: int = 1) -> Tensor:
    """Mirostat v2 truncation: keep tokens whose surprise ``-log2 p`` is ``<= mu`` (B, V).

    ``mu`` is a float or one value per row ``(B,)``.
    """
    x = _2d(x)
    surprise = -torch.log_softmax(x, -1) / LN2  # (B, V) bits
    mu = torch.as_tensor(mu, dtype=surprise.dtype, device=x.device).reshape(-1, 1)  # (B|1, 1)
    return (surprise <= mu) | _protect_head(x, min_tokens_to_keep)


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------


@dataclass
class HeadInput:
    """What a filter sees on the head: the first ``H`` tokens of the stable order of the
    filters' input ``block`` (``s/T`` in "hf" order, ``s`` in "llama.cpp" order).

    Every token outside the head is strictly below every token inside it, so a rule that
    keeps an upper set of the input decides the whole vocabulary from the head.
    """

    head: Tensor  # (H,) token indices, stable order of the block
    src: Tensor  # (H,) bool: the tokens of the head this filter's input holds
    src_full: Tensor  # (K,) this filter's full-length input (removed tokens -inf)
    rank: Tensor  # (H,) position among the input's finite tokens
    protect: Tensor  # (H,) bool: the input's first min_tokens_to_keep tokens
    bounded: bool  # every token outside the head is already out
    probs_full: Tensor | None  # (K,) softmax(src_full) when already computed
    scores: Tensor  # (H,) T = 1 scores s on the head
    scores_full: Tensor  # (K,) s
    alive: Tensor  # (K,) bool: tokens in play before the filters
    n_src: int  # finite tokens of this filter's input
    sequential: bool
    temperature: float
    entropy: float | None  # entropy of softmax(s), when the chain computed it
    m: int  # min_tokens_to_keep

    @cached_property
    def probs(self) -> Tensor:
        """(H,) the input's probabilities on the head, computed on the full-length input."""
        p = self.probs_full
        if p is None:
            p = torch.softmax(self.src_full.unsqueeze(0), -1)[0]  # (K,)
        return p[self.head]

    def full(self, mask_h: Tensor, values_h: Tensor) -> Tensor:
        """(K,) ``values_h`` where ``mask_h``, ``-inf`` elsewhere (and off the head)."""
        z = torch.full(self.src_full.shape, NEG_INF)
        z[self.head[mask_h]] = values_h[mask_h]
        return z


class Filter:
    """One truncation filter. Subclasses set ``name`` (the waterfall stage), ``label`` and
    ``field`` (the ``PruneParams`` field that sets it), and implement :meth:`mask`.

    A filter with :meth:`head_keep` (``has_head_rule``) must keep an upper set of its input
    in stable order, plus the protected tokens, so the chain can decide it on a head.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    field: ClassVar[str] = ""
    has_head_rule: ClassVar[bool] = False

    def active(self, p: PruneParams) -> bool:
        """Whether ``p`` turns this filter on (its field away from the neutral value)."""
        raise NotImplementedError

    def describe(self, p: PruneParams) -> str:
        """One line for the chain chart."""
        return f"{self.field} = {getattr(p, self.field)}" if self.field else self.label

    def mask(
        self,
        x: Tensor,
        p: PruneParams,
        *,
        scores: Tensor | None = None,
        temperature: float | None = None,
        entropy: Tensor | float | None = None,
    ) -> Tensor:
        """Keep mask (B, V) for the filter's input ``x`` (B, V) (``-inf``: removed).

        ``scores`` are the T = 1 scores (default ``x``), ``temperature`` the step's
        (default ``p.temperature``), ``entropy`` that of ``softmax(scores)`` if known.
        """
        raise NotImplementedError

    def head_keep(self, h: HeadInput, p: PruneParams) -> Tensor | None:
        """Keep mask (H,) on the head, equal to :meth:`mask` there; None when the head is
        too short to decide."""
        raise NotImplementedError

    def head_size(self, p: PruneParams) -> int:
        """A head length that lets this filter alone bound the head (0: no hint)."""
        return 0

    def __repr__(self) -> str:
        return f"<filter {self.name}>"


class TopK(Filter):
    name, label, field, has_head_rule = "top_k", "top-k", "top_k", True

    def active(self, p):
        return p.top_k > 0

    def describe(self, p):
        return f"keep the {p.top_k} most probable"

    def mask(self, x, p, **_):
        return top_k_mask(x, p.top_k, p.min_tokens_to_keep, p.tie_rule)

    def head_keep(self, h, p):
        kk = min(max(p.top_k, h.m), h.src_full.shape[0])
        return h.src & (h.rank < kk)

    def head_size(self, p):
        return p.top_k + 1  # one past the k-th: top-k alone then bounds the head


class TopP(Filter):
    name, label, field, has_head_rule = "top_p", "top-p", "top_p", True

    def active(self, p):
        return p.top_p < 1.0

    def describe(self, p):
        return f"smallest set with mass ≥ {p.top_p:g}"

    def mask(self, x, p, **_):
        return top_p_mask(x, p.top_p, p.min_tokens_to_keep, p.tie_rule)

    def head_keep(self, h, p):
        q = h.probs[h.src]  # (n,) in stable order
        before = q.cumsum(0) - q  # mass strictly ahead of each token
        inside = before < p.top_p
        if not h.bounded and bool(inside.all()):
            return None  # the nucleus may reach past the head
        inside[: h.m] = True
        keep = torch.zeros(h.head.shape, dtype=torch.bool)
        keep[h.src] = inside
        return keep


class MinP(Filter):
    name, label, field, has_head_rule = "min_p", "min-p", "min_p", True

    def active(self, p):
        return p.min_p > 0.0

    def describe(self, p):
        return f"p ≥ {p.min_p:g}·p_max"

    def mask(self, x, p, **_):
        return min_p_mask(x, p.min_p, p.min_tokens_to_keep, p.tie_rule)

    def head_keep(self, h, p):
        pmax = h.probs[h.src].max()
        return ~(h.probs < p.min_p * pmax) | h.protect


class Typical(Filter):
    """Locally typical sampling keeps a set in surprise order, not an upper set of ``p``:
    no head rule, the full-length path runs it."""

    name, label, field = "typical", "typical", "typical_p"

    def active(self, p):
        return p.typical_p < 1.0

    def describe(self, p):
        return f"closest to H, mass {p.typical_p:g}"

    def mask(self, x, p, **_):
        return typical_mask(x, p.typical_p, p.min_tokens_to_keep, p.tie_rule)


class Epsilon(Filter):
    name, label, field, has_head_rule = "epsilon", "epsilon", "epsilon", True

    def active(self, p):
        return p.epsilon > 0.0

    def describe(self, p):
        return f"p ≥ {p.epsilon:g}"

    def mask(self, x, p, **_):
        return epsilon_mask(x, p.epsilon, p.min_tokens_to_keep, p.tie_rule)

    def head_keep(self, h, p):
        return ~(h.probs < p.epsilon) | h.protect


class Eta(Filter):
    name, label, field, has_head_rule = "eta", "eta", "eta", True

    def active(self, p):
        return p.eta > 0.0

    def describe(self, p):
        return f"η = {p.eta:g}"

    def mask(self, x, p, **_):
        return eta_mask(x, p.eta, p.min_tokens_to_keep, p.tie_rule)

    def head_keep(self, h, p):
        ent, _ = entropy_stats(h.src_full.unsqueeze(0))
        eta = torch.clamp(math.sqrt(p.eta) * torch.exp(-ent), max=p.eta)  # (1,)
        return ~(h.probs < eta) | h.protect


class FreeEnergy(Filter):
    """Keeps ``U(w) - U_min <= kappa·T·H`` on the T = 1 scores with the input's removals
    (see :func:`free_energy_mask`)."""

    name, label, field, has_head_rule = "free_energy", "free energy", "free_energy", True

    def active(self, p):
        return p.free_energy

    def describe(self, p):
        return f"U − U_min ≤ {p.free_energy_kappa:g}·T·H"

    def mask(self, x, p, *, scores=None, temperature=None, entropy=None):
        x = _2d(x)
        s = x if scores is None else _2d(scores).masked_fill(torch.isneginf(x), NEG_INF)
        t = p.temperature if temperature is None else temperature
        return free_energy_mask(s, t, p.free_energy_kappa, p.min_tokens_to_keep, entropy)

    def head_keep(self, h, p):
        s2 = h.scores if bool(h.src.all()) else torch.where(h.src, h.scores, NEG_INF)  # (H,)
        if h.sequential and h.n_src < h.src_full.shape[0]:
            # earlier filters removed tokens from what this one sees: its own entropy, on
            # the same full-length input as free_energy_mask computes it
            full = (
                h.full(h.src, h.scores)
                if h.bounded
                else h.scores_full.masked_fill(~h.alive, NEG_INF)
            )
            ent = entropy_stats(full.unsqueeze(0))[0]  # (1,)
        else:
            ent = torch.as_tensor(h.entropy).reshape(-1)  # (1,)
        window = p.free_energy_kappa * h.temperature * ent  # (1,) as free_energy_mask rounds it
        gap = s2.max() - s2  # (H,) U(w) - U_min
        return (gap <= window) | _protect_by(s2, h.head, h.m)


FILTERS: list[Filter] = [TopK(), TopP(), MinP(), Typical(), Epsilon(), Eta(), FreeEnergy()]


def active_filters(p: PruneParams) -> list[Filter]:
    """The filters ``p`` turns on, in chain order."""
    return [f for f in FILTERS if f.active(p)]


def get_filter(name: str) -> Filter:
    """The registered filter called ``name``; ``ValueError`` listing the names otherwise."""
    for f in FILTERS:
        if f.name == name:
            return f
    raise ValueError(f"unknown filter {name!r}; registered: {[f.name for f in FILTERS]}")


def register(f: Filter | type[Filter], *, after: str | None = None) -> Filter | type[Filter]:
    """Add a filter (an instance, or a class to instantiate) to ``FILTERS``: last, or right
    after the filter named ``after``. Returns ``f``, so it works as a class decorator."""
    inst = f() if isinstance(f, type) else f
    if any(g.name == inst.name for g in FILTERS):
        raise ValueError(f"a filter named {inst.name!r} is already registered")
    at = len(FILTERS) if after is None else FILTERS.index(get_filter(after)) + 1
    FILTERS.insert(at, inst)
    return f


def unregister(name: str) -> None:
    """Remove the filter called ``name`` from ``FILTERS``."""
    FILTERS.remove(get_filter(name))
