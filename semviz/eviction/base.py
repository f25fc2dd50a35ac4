"""What every eviction policy shares: the view it scores, the plan it returns, the base class.

A policy sees one row's cache at one forward as a :class:`CacheView`: every layer at once,
``(L, W)`` slots with the original position of each entry (-1 for padding) and the last
query's attention over them. ``score()`` returns an ``(L, W)`` keep-score (higher is kept) and
may update per-entry state; :class:`EvictionPolicy` resolves budgets and thresholds per layer,
protects sinks, the recent window and what ``protect()`` names, selects the entries to evict,
packs its state, and writes the timeline record. It never touches the cache itself: it returns
a :class:`Plan` whose ``keep`` mask the caller applies (:func:`apply_plans`), so one policy
code path serves a decoder's own cache (``after_forward``) and a row of a batch
(``semviz.eviction.harness``).

The timeline record (``StepRecord.eviction``)
---------------------------------------------
One dict per forward; ``L`` layers, ``S`` the longest layer after eviction, ``E`` the most
entries one layer evicted at this forward. Padding is ``-1`` (ints), ``-inf`` (floats),
``255`` (rule codes), ``False`` (bools); no NaN anywhere, so records compare equal after a
JSON round trip.

=================  ==================  ========================================================
key                type / shape        meaning
=================  ==================  ========================================================
``policy``         str                 policy name
``query_position`` int                 true position of the query that made this record
``n_seen``         int                 tokens read so far (``query_position + 1``)
``budget``         (L,) int32          resolved token budget per layer (-1: none)
``threshold``      (L,) float32        threshold per layer (-inf: none)
``lengths``        (L,) int32          cache entries per layer after eviction
``positions``      (L, S) int32        original positions held per layer after eviction, sorted
``scores``         (L, S) float16      the policy's score of each held entry (None for ``full``)
``protected``      (L, S) bool         held entries the rules protect (sinks, recent, theme)
``evicted``        (L, E) int32        original positions evicted at this forward
``evicted_scores`` (L, E) float16      their scores
``rule``           (L, E) uint8        why: an index into ``rules``
``rules``          list[str]           ``["budget", "threshold", "window"]``
``evicted_mass``   (L,) float32        exact: share of this query's attention (head mean) that
                                       fell on the entries evicted after it
``regret``         (L,) float32        estimate (see ``regret_method``): share of attention this
                                       query would have put on entries evicted earlier
``regret_is_estimate`` bool            always True
``regret_method``  str                 how ``regret`` was estimated
``bytes``          (L,) int64          key+value bytes per layer after eviction
``cache_bytes``    int                 their sum
``seconds``        float               time spent in the policy for this forward
=================  ==================  ========================================================

The regret of earlier evictions cannot be exact: their keys are gone. It is estimated by
assuming each evicted entry keeps the share of attention it had when it was evicted, fading by
``regret_decay`` per step (the seed's EMA with no new attention): with ``R = Σ share·decay^age``
the kept entries sum to 1 and the evicted ones add ``R``, so ``regret = R / (1 + R)``.

Examples
--------
>>> parse_budgets("64, 0.25")
[64, 0.25]
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, ClassVar

import torch
from torch import Tensor

from semviz.model.forward import KVRows, kv_bytes_per_token
from semviz.model.load import require_full_attention

__all__ = [
    "MAX_BUDGET",
    "RULES",
    "CacheView",
    "EvictionPolicy",
    "Plan",
    "Value",
    "apply_plans",
    "evict_session",
    "parse_budget",
    "parse_budgets",
    "view_of",
]

RULES = ("budget", "threshold", "window")
MAX_BUDGET = 2**31 - 1  # budgets are recorded as int32
MIN_FRACTION = 1e-4  # a smaller fraction keeps one token of any text semviz reads
_RULE = {r: i for i, r in enumerate(RULES)}
REGRET_METHOD = "frozen share at eviction, decayed by regret_decay per step; R/(1+R)"

Value = float | int | Sequence[float | int] | None


# --------------------------------------------------------------------------------------------
# What a policy reads and returns
# --------------------------------------------------------------------------------------------


@dataclass
class CacheView:
    """One row's cache at one forward, as a policy sees it: every layer at once.

    Attributes
    ----------
    attention : (L, H, W) float32 the last query's attention over each slot (0 at padding)
    positions : (L, W) long original position of each slot, -1 for padding; ascending over
        each layer's held slots
    n_seen : tokens read so far; the query's true position is ``n_seen - 1``
    lm : the ``LoadedModel``
    ids : every token id read so far
    hidden : (n_seen, d) this row's final normed hidden states, or None
    entry_bytes : key + value bytes of one entry of one layer
    read_keys : ``(layer, slots) -> (m, H_kv, D)`` float32 cached keys at ``slots``
    n_before : tokens read before this forward: slots holding a position >= it are new
    budget : (L,) long token budget per layer at this forward, -1 for none (set by the policy)
    state : the policy's per-slot tensors, each (L, W, ...) (set by the policy)
    """

    attention: Tensor
    positions: Tensor
    n_seen: int
    lm: Any
    ids: Sequence[int]
    hidden: Tensor | None = None
    entry_bytes: int = 0
    read_keys: Callable[[int, Tensor], Tensor] | None = None
    n_before: int = 0
    budget: Tensor | None = None
    state: dict[str, Tensor] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return self.positions.shape[1]

    # the view is made once per forward and never changed, so its derived tensors are cached
    @cached_property
    def valid(self) -> Tensor:
        """(L, W) bool slots that hold an entry."""
        return self.positions >= 0

    @property
    def new(self) -> Tensor:
        """(L, W) bool entries that arrived with this forward."""
        return self.positions >= self.n_before

    @cached_property
    def count(self) -> Tensor:
        """(L,) long entries held per layer."""
        return self.valid.sum(1)

    @cached_property
    def mean_attention(self) -> Tensor:
        """(L, W) attention averaged over query heads."""
        return self.attention.mean(1)


@dataclass
class Plan:
    """A policy's decision for one row at one forward.

    Attributes
    ----------
    keep : (L, W) bool slots to keep (the caller packs them, :meth:`KVRows.keep`)
    record : the timeline record (see the module docstring)
    rotate : ``(layer, slots, keys)`` to write after packing: slots (m,) of the packed layer
        and their new keys (m, H_kv, D) (key re-rotation)
    """

    keep: Tensor
    record: dict
    rotate: list[tuple[int, Tensor, Tensor]] = field(default_factory=list)


def view_of(
    rows: KVRows, row: int, attention: Tensor, *, lm: Any, entry_bytes: int | None = None, **kw
) -> CacheView:
    """Row ``row`` of ``rows`` after a forward whose capture is ``attention`` (L, B, H, W).

    ``kw`` are the other :class:`CacheView` fields (``n_seen``, ``ids``, ``hidden``).
    """

    def read(layer: int, slots: Tensor) -> Tensor:
        return rows.read_keys(row, layer, slots)

    if entry_bytes is None:
        entry_bytes = kv_bytes_per_token(lm.summary()) // rows.pos.shape[1]
    return CacheView(
        attention=attention[:, row].detach().float().cpu(),
        positions=rows.pos[row],
        lm=lm,
        entry_bytes=entry_bytes,
        read_keys=read,
        **kw,
    )


def apply_plans(rows: KVRows, plans: Sequence[Plan]) -> None:
    """Apply one plan per row: drop evicted entries, pack rows, write re-rotated keys."""
    rows.keep(torch.stack([p.keep for p in plans]))
    for r, p in enumerate(plans):
        for layer, slots, keys in p.rotate:
            rows.write_keys(r, layer, slots, keys)


def evict_session(policy: Any, session: Any, attention: Tensor) -> dict:
    """Score, evict from ``session.cache`` (one row) and return the timeline record.

    ``session`` is a ``Decoder`` (``lm``, ``cache``, ``positions`` per layer, ``ids``,
    ``hidden``); its cache and ``positions`` are edited in place. ``attention`` is (L, H, S).
    """
    rows = KVRows.of(session.cache, session.positions)
    hidden = getattr(session, "hidden", None)
    view = view_of(
        rows,
        0,
        attention[:, None],
        lm=session.lm,
        n_seen=len(session.ids),
        ids=session.ids,
        hidden=hidden if policy.needs_hidden else None,
    )
    plan = policy.plan(view)
    apply_plans(rows, [plan])
    session.positions = rows.row_positions(0)
    return plan.record


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_budget_value(v: Any, name: str) -> float | int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a token count >= 1 or a fraction in (0, 1), got {v!r}")
    if v >= 1:
        if float(v) != int(v):
            raise ValueError(f"{name} must be a whole number of tokens when >= 1, got {v!r}")
        if v > MAX_BUDGET:
            raise ValueError(f"{name} must be at most {MAX_BUDGET:,} tokens, got {v!r}")
        return int(v)
    if v < MIN_FRACTION:
        raise ValueError(
            f"{name} must be a token count >= 1 or a fraction in [{MIN_FRACTION:g}, 1), got {v!r}"
        )
    return float(v)


def _check_per_layer(v: Value, name: str, check: Callable[[Any, str], Any]) -> Any:
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError(f"{name} must not be an empty sequence")
        return tuple(check(x, f"{name}[{i}]") for i, x in enumerate(v))
    return check(v, name)


def _check_threshold_value(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise ValueError(f"{name} must be a number, got {v!r}")
    return float(v)


def parse_budget(text: str) -> int | float:
    """``"128"`` → 128 tokens, ``"0.25"`` → a quarter of the tokens read.

    >>> parse_budget("128"), parse_budget("0.25")
    (128, 0.25)
    """
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"budget must be a number, got {text!r}") from None
    return _check_budget_value(v, "budget")


def parse_budgets(text: str) -> list[int | float]:
    """Comma- or space-separated budgets (``"64, 128, 0.25"``); at least one."""
    parts = [s for s in text.replace(",", " ").split() if s]
    if not parts:
        raise ValueError("give at least one budget: a token count (128) or a fraction (0.25)")
    return [parse_budget(s) for s in parts]


# --------------------------------------------------------------------------------------------
# The base policy
# --------------------------------------------------------------------------------------------


@dataclass
class EvictionPolicy:
    """Base of every policy: per-layer budget/threshold, protection, selection, record.

    Parameters
    ----------
    budget : tokens to keep per layer (``int >= 1``), a fraction ``< 1`` of the tokens read,
        or one such value per layer. None: no budget.
    threshold : evict entries whose ``score()`` is below this (scalar or one per layer);
        sinks and the recent window are exempt. None: no threshold.
    sinks : the first ``sinks`` positions are never evicted (StreamingLLM's attention sinks).
    recent : the most recent ``recent`` tokens (or this fraction of the budget) are never
        evicted. The newest token is always kept.
    regret_decay : per-step fade used by the ``regret`` estimate.
    """

    budget: Value = None
    threshold: Value = None
    sinks: int = 0
    recent: int | float = 0
    regret_decay: float = 0.9

    name: ClassVar[str] = "policy"
    budget_rule: ClassVar[str] = "budget"  # rule named when the budget evicts
    needs_hidden: ClassVar[bool] = False  # score() reads the row's hidden states

    def __post_init__(self) -> None:
        self.budget = _check_per_layer(self.budget, "budget", _check_budget_value)
        self.threshold = _check_per_layer(self.threshold, "threshold", _check_threshold_value)
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"sinks must be an integer >= 0, got {self.sinks!r}")
        r = self.recent
        if isinstance(r, bool) or not isinstance(r, (int, float)) or r < 0:
            raise ValueError(f"recent must be a count >= 0 or a fraction in [0, 1), got {r!r}")
        if isinstance(r, float) and r >= 1:
            if r != int(r):
                raise ValueError(f"recent must be a whole number of tokens when >= 1, got {r!r}")
            self.recent = int(r)
        if not 0.0 <= self.regret_decay <= 1.0:
            raise ValueError(f"regret_decay must be in [0, 1], got {self.regret_decay!r}")
        for b in self.budget if isinstance(self.budget, tuple) else (self.budget,):
            if isinstance(b, int) and b <= self.sinks:
                raise ValueError(f"budget ({b}) must be larger than sinks ({self.sinks})")
        self._state: dict[str, Tensor] = {}
        self._regret_r: Tensor | None = None
        self._seen = 0
        self._fixed_budgets: Tensor | None = None

    # -- what subclasses provide ---------------------------------------------------------
    def score(self, v: CacheView) -> Tensor | None:
        """(L, W) float32 keep-score per slot: higher is kept. Update ``v.state`` here."""
        raise NotImplementedError

    def protect(self, v: CacheView, scores: Tensor | None) -> Tensor | None:
        """(L, W) bool entries this policy protects beyond sinks and recent (None: none)."""
        return None

    def begin_step(self, v: CacheView) -> None:
        """Hook before scoring (per-forward work shared by all layers)."""

    # -- settings ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Settings, JSON-ready (goes into ``Trace.settings["eviction"]``)."""
        d: dict[str, Any] = {"policy": self.name}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        return d

    def _per_layer(self, v: Any, layer: int) -> Any:
        return v[layer] if isinstance(v, tuple) else v

    def layer_budget(self, layer: int, n_seen: int) -> int | None:
        """Token budget of ``layer`` when ``n_seen`` tokens have been read (None: none)."""
        b = self._per_layer(self.budget, layer)
        if b is None:
            return None
        if isinstance(b, float):
            return max(self.sinks + 1, math.ceil(b * n_seen))
        return int(b)

    def layer_threshold(self, layer: int) -> float | None:
        return self._per_layer(self.threshold, layer)

    def _budgets(self, n_layers: int, n_seen: int) -> Tensor:
        """(L,) long budgets now, -1 for none (made once unless a budget is a fraction)."""
        per = self.budget if isinstance(self.budget, tuple) else (self.budget,)
        fixed = not any(isinstance(b, float) for b in per)
        if fixed and self._fixed_budgets is not None:
            return self._fixed_budgets
        b = [self.layer_budget(i, n_seen) for i in range(n_layers)]
        out = torch.tensor([-1 if x is None else x for x in b], dtype=torch.long)
        if fixed:
            self._fixed_budgets = out
        return out

    def _thresholds(self, n_layers: int) -> Tensor:
        """(L,) float32 thresholds, -inf for none."""
        t = [self.layer_threshold(i) for i in range(n_layers)]
        return torch.tensor([float("-inf") if x is None else x for x in t], dtype=torch.float32)

    def _recent_counts(self, budget: Tensor) -> Tensor:
        """(L,) long size of the protected recent window per layer."""
        r = self.recent
        if isinstance(r, float):
            return torch.where(budget >= 0, (r * budget.double()).floor().long(), 0)
        return torch.full_like(budget, int(r))

    # -- lifecycle ---------------------------------------------------------------------------
    def check_model(self, lm: Any) -> None:
        """Raise ``ValueError`` (one sentence naming the model) if this policy cannot run on
        ``lm``: a policy that evicts needs every layer to see the whole cache."""
        if self.budget is not None or self.threshold is not None:
            require_full_attention(lm)

    def reset(self, owner: Any) -> None:
        """Forget all state; called when a run (re)starts. ``owner``: a session or an lm."""
        lm = getattr(owner, "lm", owner)
        self.check_model(lm)
        n_layers = int(lm.model.config.num_hidden_layers)
        for name in ("budget", "threshold"):
            v = getattr(self, name)
            if isinstance(v, tuple) and len(v) != n_layers:
                raise ValueError(f"{name} has {len(v)} values but the model has {n_layers} layers")
        self._state = {}
        self._regret_r = torch.zeros(n_layers, dtype=torch.float64)
        self._seen = 0
        self._fixed_budgets: Tensor | None = None

    def after_forward(self, session: Any, attention: Tensor) -> dict:
        """Evict from a decoder's own cache after a forward; return the timeline record.

        ``attention`` is (L, H, S): the last query's attention over each layer's cached keys,
        the new tokens included, zero-padded where layers hold fewer entries.
        """
        return evict_session(self, session, attention)

    def plan(self, v: CacheView) -> Plan:
        """Score every slot, select what to evict, pack the state, record the step."""
        t0 = time.perf_counter()
        n_layers = v.positions.shape[0]
        if self._regret_r is None:
            self.reset(v.lm)
        v.n_before, self._seen = self._seen, v.n_seen
        self._regret_r *= self.regret_decay
        regret = (self._regret_r / (1.0 + self._regret_r)).float()  # (L,)
        v.budget = self._budgets(n_layers, v.n_seen)
        v.state = self._fit_state(v.width)
        self.begin_step(v)
        scores = self.score(v)  # (L, W) or None
        tier = self._tiers(v, scores)  # (L, W) 0 free, 1 protected, 2 always kept
        thr = self._thresholds(n_layers)
        evict, rule = self._select(v, scores, tier, thr)
        keep = v.valid & ~evict
        ev_mass = (v.mean_attention * evict).sum(1)  # (L,)
        self._regret_r += ev_mass.double()
        pack = _Packer(keep)
        self._state = {k: pack(t, 0) for k, t in v.state.items()}
        record = _record(self, v, scores, tier, evict, rule)
        record.update(
            threshold=thr, evicted_mass=ev_mass, regret=regret, seconds=time.perf_counter() - t0
        )
        return Plan(keep=keep, record=record)

    # -- internals ---------------------------------------------------------------------------
    def _fit_state(self, width: int) -> dict[str, Tensor]:
        """The per-slot state, zero-padded to ``width`` slots (new entries start at 0)."""
        out = {}
        for k, t in self._state.items():
            if t.shape[1] < width:
                pad = t.new_zeros((t.shape[0], width - t.shape[1], *t.shape[2:]))
                t = torch.cat([t, pad], dim=1)
            out[k] = t
        self._state = out
        return out

    def _tiers(self, v: CacheView, scores: Tensor | None) -> Tensor:
        pos = v.positions
        tier = torch.zeros(pos.shape, dtype=torch.int8)
        recent = self._recent_counts(v.budget)  # (L,)
        tier[pos >= v.n_seen - recent[:, None]] = 1
        extra = self.protect(v, scores)
        if extra is not None:
            tier[extra] = 1
        tier[(pos >= 0) & (pos < self.sinks)] = 2
        tier[pos == v.n_seen - 1] = 2
        return tier

    def _select(
        self, v: CacheView, scores: Tensor | None, tier: Tensor, thr: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(L, W) bool evicted and (L, W) uint8 rule codes."""
        evict = torch.zeros(v.positions.shape, dtype=torch.bool)
        rule = torch.full(v.positions.shape, 255, dtype=torch.uint8)
        if scores is None:
            return evict, rule
        valid = v.valid
        low = valid & (tier == 0) & (scores < thr[:, None])
        evict |= low
        rule[low] = _RULE["threshold"]
        alive = valid & ~evict
        over = torch.where(v.budget >= 0, alive.sum(1) - v.budget, 0).clamp_min(0)  # (L,)
        if int(over.max()) > 0:
            # ascending by (tier, score, slot): stable sorts, least significant first; slots
            # ascend with positions, and held entries sort before padding
            key = torch.where(alive, scores, torch.zeros_like(scores))
            order = torch.sort(key, dim=1, stable=True).indices  # (L, W)
            t = torch.where(alive, tier.long(), 3).gather(1, order)
            order = order.gather(1, torch.sort(t, dim=1, stable=True).indices)
            first = torch.arange(order.shape[1]) < over[:, None]  # (L, W)
            out = torch.zeros_like(evict).scatter_(1, order, first)
            evict |= out
            rule[out] = _RULE[self.budget_rule]
        return evict, rule


class _Packer:
    """Packs the entries ``mask`` (L, W) selects to the front of each row, in order.

    ``pack(values)`` gives (L, K, ...) with K the largest row count and ``fill`` beyond each
    row's count; the order is computed once for all the tensors packed with one mask.
    """

    def __init__(self, mask: Tensor) -> None:
        self.counts = mask.sum(1)  # (L,)
        k = int(self.counts.max()) if self.counts.numel() else 0
        if k == mask.shape[1] and bool(mask.all()):
            self.order = None  # everything selected: packing is the identity
        else:
            self.order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :k]
            self.pad = torch.arange(k) >= self.counts[:, None]  # (L, K)
        self.k = k

    def __call__(self, values: Tensor, fill: Any, dtype: torch.dtype | None = None) -> Tensor:
        out = values
        if self.order is not None:
            extra = values.dim() - 2
            idx = self.order.view(*self.order.shape, *([1] * extra))
            out = values.gather(1, idx.expand(-1, -1, *values.shape[2:]))
            out = out.masked_fill(self.pad.view(*self.pad.shape, *([1] * extra)), fill)
        return out if dtype is None else out.to(dtype)


def _record(
    policy: EvictionPolicy,
    v: CacheView,
    scores: Tensor | None,
    tier: Tensor,
    evict: Tensor,
    rule: Tensor,
) -> dict:
    """The timeline record's entries that describe what is held and what went."""
    held, gone = _Packer(v.valid & ~evict), _Packer(evict)
    nbytes = held.counts * v.entry_bytes  # (L,)
    has = scores is not None
    return {
        "policy": policy.name,
        "query_position": v.n_seen - 1,
        "n_seen": v.n_seen,
        "budget": v.budget.to(torch.int32),
        "lengths": held.counts.to(torch.int32),
        "positions": held(v.positions, -1, torch.int32),
        "scores": held(scores, float("-inf"), torch.float16) if has else None,
        "protected": held(tier > 0, False),
        "evicted": gone(v.positions, -1, torch.int32),
        "evicted_scores": gone(scores, float("-inf"), torch.float16) if has else None,
        "rule": gone(rule, 255),
        "rules": list(RULES),
        "regret_is_estimate": True,
        "regret_method": REGRET_METHOD,
        "bytes": nbytes,
        "cache_bytes": int(nbytes.sum()),
    }
