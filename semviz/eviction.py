"""KV-cache eviction on the real ``DynamicCache``: gravity-field, H2O, StreamingLLM, TOVA and more.

Every policy is a small ``@dataclass`` with a ``score()`` method; :class:`EvictionPolicy` does
the rest (per-layer budgets and thresholds, protection, selection, gather, timeline record).
After each forward pass the decoder calls ``policy.after_forward(session, attention)``, where
``attention`` is ``(L, H, S)`` — the last query's attention over each layer's cached keys,
the new tokens included. The policy scores every cached entry of every layer, removes the
losers from the cache's key and value tensors (so memory and per-step time really drop), and
returns one timeline record. Eviction therefore always happens *after* the step's attention has
been computed, and the next forward passes the true ``position_ids`` so RoPE stays right.

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
layer. Eviction is per layer and per position (all KV heads of a layer keep the same positions,
as ``DynamicCache`` needs one length per layer). Scores are head means. ``rerotate=True`` gives
cache-relative positions (StreamingLLM §3.2): kept keys are re-rotated so that each key's RoPE
distance to the next query is its rank from the newest entry, not its true distance.

The timeline record (``StepRecord.eviction``)
---------------------------------------------
One dict per forward pass; ``L`` layers, ``S`` the longest layer after eviction, ``E`` the most
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
>>> from semviz.eviction import make_policy
>>> make_policy("streaming", budget=128)
StreamingPolicy(budget=128, threshold=None, sinks=4, recent=0, rerotate=False, regret_decay=0.9)
>>> make_policy("h2o", budget=0.25).name
'h2o'
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from semviz.gravity import (
    candidate_matrix,
    context_mass,
    gravity_potential,
    normalize_gravity,
)
from semviz.model import require_full_attention, require_rope

__all__ = [
    "POLICIES",
    "RULES",
    "CacheSession",
    "EMAPolicy",
    "EvictionPolicy",
    "FullPolicy",
    "GravityPolicy",
    "H2OPolicy",
    "LayerView",
    "StreamingPolicy",
    "TOVAPolicy",
    "WindowPolicy",
    "kv_eval",
    "make_policy",
    "parse_budget",
    "teacher_force",
]

RULES = ("budget", "threshold", "window")
_RULE = {r: i for i, r in enumerate(RULES)}
REGRET_METHOD = "frozen share at eviction, decayed by regret_decay per step; R/(1+R)"

Value = float | int | Sequence[float | int] | None


# --------------------------------------------------------------------------------------------
# What a policy reads
# --------------------------------------------------------------------------------------------


@dataclass
class CacheSession:
    """The state a policy reads and edits: the ``Decoder`` has the same attributes.

    Attributes
    ----------
    lm : a ``LoadedModel``
    cache : the session's ``DynamicCache``
    positions : per layer, the original positions held in the cache, ``(S_l,)`` long, sorted
    ids : every token id read so far (the last one is the query just fed)
    hidden : ``(T, d)`` final normed hidden states of every position read, or None
    """

    lm: Any
    cache: Any
    positions: list[Tensor]
    ids: list[int]
    hidden: Tensor | None = None


@dataclass
class LayerView:
    """One layer as ``score()`` sees it.

    Attributes
    ----------
    layer : layer index
    attention : (H, S) float32 the last query's attention over this layer's cached entries
    positions : (S,) long original positions of the entries
    n_new : how many entries (at the end) arrived with this forward
    n_seen : tokens read so far; the query's true position is ``n_seen - 1``
    budget : this layer's token budget now, or None
    state : the policy's per-entry tensors for this layer, aligned with ``positions``
    session : the ``CacheSession`` / ``Decoder``
    """

    layer: int
    attention: Tensor
    positions: Tensor
    n_new: int
    n_seen: int
    budget: int | None
    state: dict[str, Tensor]
    session: Any

    @property
    def mean_attention(self) -> Tensor:
        """(S,) attention averaged over query heads."""
        return self.attention.mean(0)

    @property
    def new(self) -> Tensor:
        """(S,) bool, True for entries that arrived with this forward."""
        m = torch.zeros(self.positions.numel(), dtype=torch.bool)
        if self.n_new:
            m[-self.n_new :] = True
        return m


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_budget_value(v: Any, name: str) -> float | int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a token count >= 1 or a fraction in (0, 1), got {v!r}")
    if v >= 1:
        if float(v) != int(v):
            raise ValueError(f"{name} must be a whole number of tokens when >= 1, got {v!r}")
        return int(v)
    if v <= 0:
        raise ValueError(f"{name} must be a token count >= 1 or a fraction in (0, 1), got {v!r}")
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


# --------------------------------------------------------------------------------------------
# The base policy
# --------------------------------------------------------------------------------------------


@dataclass
class EvictionPolicy:
    """Base of every policy: per-layer budget/threshold, protection, selection and gather.

    Parameters
    ----------
    budget : tokens to keep per layer (``int >= 1``), a fraction ``< 1`` of the tokens read,
        or one such value per layer. None: no budget.
    threshold : evict entries whose ``score()`` is below this (scalar or one per layer);
        sinks and the recent window are exempt. None: no threshold.
    sinks : the first ``sinks`` positions are never evicted (StreamingLLM's attention sinks).
    recent : the most recent ``recent`` tokens (or this fraction of the budget) are never
        evicted. The newest token is always kept.
    rerotate : re-rotate kept keys to cache-relative positions (see the module docstring).
    regret_decay : per-step fade used by the ``regret`` estimate.
    """

    budget: Value = None
    threshold: Value = None
    sinks: int = 0
    recent: int | float = 0
    rerotate: bool = False
    regret_decay: float = 0.9

    name: ClassVar[str] = "policy"
    budget_rule: ClassVar[str] = "budget"  # rule named when the budget evicts

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
        self._state: list[dict[str, Tensor]] = []
        self._regret_r: Tensor | None = None
        self._orig: list[tuple[Tensor, Tensor]] = []  # rerotate: (positions, f32 keys)
        self._assigned: list[Tensor] = []
        self._prev_len: list[int] = []

    # -- what subclasses provide ---------------------------------------------------------
    def score(self, v: LayerView) -> Tensor | None:
        """(S,) float32 keep-score per cached entry: higher is kept. Update ``v.state`` here."""
        raise NotImplementedError

    def protect(self, v: LayerView, scores: Tensor | None) -> Tensor | None:
        """(S,) bool entries this policy protects beyond sinks and recent (None: none)."""
        return None

    def begin_step(self, session: Any, attention: Tensor) -> None:
        """Hook before the layers are scored (per-step work shared by all layers)."""

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

    def _recent_count(self, budget: int | None) -> int:
        r = self.recent
        if isinstance(r, float):
            return int(r * budget) if budget is not None else 0
        return int(r)

    # -- lifecycle ---------------------------------------------------------------------------
    def check_model(self, lm: Any) -> None:
        """Raise ``ValueError`` (one sentence naming the model) if this policy cannot run on
        ``lm``: eviction needs every layer to see the whole cache, re-rotation needs RoPE."""
        if self.budget is not None or self.threshold is not None:
            require_full_attention(lm)
        if self.rerotate:
            require_rope(lm)

    def reset(self, session: Any) -> None:
        """Forget all state; called when a session (re)starts its prefill."""
        n_layers = int(session.lm.model.config.num_hidden_layers)
        self.check_model(session.lm)
        for name in ("budget", "threshold"):
            v = getattr(self, name)
            if isinstance(v, tuple) and len(v) != n_layers:
                raise ValueError(f"{name} has {len(v)} values but the model has {n_layers} layers")
        self._state = [{} for _ in range(n_layers)]
        self._regret_r = torch.zeros(n_layers, dtype=torch.float64)
        self._orig = [(torch.zeros(0, dtype=torch.long), torch.zeros(0)) for _ in range(n_layers)]
        self._assigned = [torch.zeros(0, dtype=torch.long) for _ in range(n_layers)]
        self._prev_len = [0] * n_layers

    def after_forward(self, session: Any, attention: Tensor) -> dict:
        """Score, evict from ``session.cache`` and return this forward's timeline record.

        Parameters
        ----------
        session : a ``Decoder`` or :class:`CacheSession` (``lm``, ``cache``, ``positions``,
            ``ids``, ``hidden``); its cache and ``positions`` are edited in place.
        attention : (L, H, S) float32 last-query attention over each layer's cached keys,
            zero-padded where layers hold fewer entries.
        """
        t0 = time.perf_counter()
        if not self._state:
            self.reset(session)
        cache = session.cache
        n_layers = len(self._state)
        n_seen = len(session.ids)
        self._sync_positions(session, n_seen)
        self._regret_r *= self.regret_decay
        regret = (self._regret_r / (1.0 + self._regret_r)).float()  # (L,)
        self.begin_step(session, attention)

        kept_pos, kept_scores, kept_prot = [], [], []
        ev_pos, ev_scores, ev_rule = [], [], []
        ev_mass = torch.zeros(n_layers)
        budgets = torch.full((n_layers,), -1, dtype=torch.int32)
        thresholds = torch.full((n_layers,), float("-inf"))
        has_scores = True
        for layer in range(n_layers):
            pos = session.positions[layer]  # (S,)
            s_len = pos.numel()
            att = attention[layer, :, :s_len].detach().float().cpu()  # (H, S)
            state = self._state[layer]
            n_new = s_len - self._prev_len[layer]
            self._extend_state(state, s_len)
            budget = self.layer_budget(layer, n_seen)
            thr = self.layer_threshold(layer)
            if budget is not None:
                budgets[layer] = budget
            if thr is not None:
                thresholds[layer] = thr
            view = LayerView(layer, att, pos, n_new, n_seen, budget, state, session)
            scores = self.score(view)
            has_scores = has_scores and scores is not None
            tier = self._tiers(view, scores)  # (S,) 0 free, 1 protected, 2 always kept
            evict, rule = self._select(scores, tier, budget, thr)
            keep = ~evict
            mean_att = att.mean(0)  # (S,)
            ev_mass[layer] = float(mean_att[evict].sum())
            self._regret_r[layer] += float(mean_att[evict].sum())
            ev_pos.append(pos[evict])
            ev_rule.append(rule[evict])
            ev_scores.append(scores[evict] if scores is not None else None)
            if bool(evict.any()):
                keep_idx = keep.nonzero().flatten()  # (S_kept,)
                with torch.inference_mode():
                    self._gather(cache, layer, keep_idx)
                session.positions[layer] = pos[keep_idx]
                for k in state:
                    state[k] = state[k][keep_idx]
            if self.rerotate:
                with torch.inference_mode():
                    self._rerotate(session, layer, n_seen, keep)
            self._prev_len[layer] = session.positions[layer].numel()
            kept_pos.append(session.positions[layer])
            kept_scores.append(scores[keep] if scores is not None else None)
            kept_prot.append(tier[keep] > 0)

        nbytes = torch.tensor([_layer_nbytes(cache, i) for i in range(n_layers)], dtype=torch.int64)
        return {
            "policy": self.name,
            "query_position": n_seen - 1,
            "n_seen": n_seen,
            "budget": budgets,
            "threshold": thresholds,
            "lengths": torch.tensor([p.numel() for p in kept_pos], dtype=torch.int32),
            "positions": _pad(kept_pos, -1, torch.int32),
            "scores": _pad(kept_scores, float("-inf"), torch.float16) if has_scores else None,
            "protected": _pad(kept_prot, False, torch.bool),
            "evicted": _pad(ev_pos, -1, torch.int32),
            "evicted_scores": (
                _pad(ev_scores, float("-inf"), torch.float16) if has_scores else None
            ),
            "rule": _pad(ev_rule, 255, torch.uint8),
            "rules": list(RULES),
            "evicted_mass": ev_mass,
            "regret": regret,
            "regret_is_estimate": True,
            "regret_method": REGRET_METHOD,
            "bytes": nbytes,
            "cache_bytes": int(nbytes.sum()),
            "seconds": time.perf_counter() - t0,
        }

    # -- internals ---------------------------------------------------------------------------
    def _sync_positions(self, session: Any, n_seen: int) -> None:
        """Append the positions of entries the last forward added, if the caller has not."""
        for layer, lay in enumerate(session.cache.layers):
            keys = getattr(lay, "keys", None)
            n_cache = int(keys.shape[-2]) if isinstance(keys, Tensor) and keys.dim() == 4 else 0
            have = session.positions[layer].numel()
            if have < n_cache:
                extra = torch.arange(n_seen - (n_cache - have), n_seen, dtype=torch.long)
                session.positions[layer] = torch.cat([session.positions[layer], extra])
            elif have > n_cache:
                raise RuntimeError(
                    f"layer {layer} tracks {have} positions but its cache holds {n_cache}"
                )

    @staticmethod
    def _extend_state(state: dict[str, Tensor], s_len: int) -> None:
        """Pad every per-entry state tensor with zeros for the entries that are new."""
        for k, t in state.items():
            state[k] = torch.cat([t, t.new_zeros((s_len - t.shape[0], *t.shape[1:]))])

    def _tiers(self, v: LayerView, scores: Tensor | None) -> Tensor:
        pos = v.positions
        tier = torch.zeros(pos.numel(), dtype=torch.int8)
        recent = self._recent_count(v.budget)
        if recent:
            tier[pos >= v.n_seen - recent] = 1
        extra = self.protect(v, scores)
        if extra is not None:
            tier[extra] = 1
        tier[pos < self.sinks] = 2
        tier[pos == v.n_seen - 1] = 2
        return tier

    def _select(
        self, scores: Tensor | None, tier: Tensor, budget: int | None, thr: float | None
    ) -> tuple[Tensor, Tensor]:
        """(S,) bool evicted and (S,) uint8 rule codes."""
        n = tier.numel()
        evict = torch.zeros(n, dtype=torch.bool)
        rule = torch.full((n,), 255, dtype=torch.uint8)
        if scores is None:
            return evict, rule
        if thr is not None:
            low = (scores < thr) & (tier == 0)
            evict |= low
            rule[low] = _RULE["threshold"]
        if budget is not None:
            alive = (~evict).nonzero().flatten()
            over = alive.numel() - budget
            if over > 0:
                # ascending by (tier, score, position): stable sorts, least significant first
                order = alive  # positions ascend with the cache index
                order = order[torch.sort(scores[order], stable=True).indices]
                order = order[torch.sort(tier[order].int(), stable=True).indices]
                out = order[:over]
                evict[out] = True
                rule[out] = _RULE[self.budget_rule]
        return evict, rule

    @staticmethod
    def _gather(cache: Any, layer: int, keep_idx: Tensor) -> None:
        lay = cache.layers[layer]
        idx = keep_idx.to(lay.keys.device)
        lay.keys = lay.keys.index_select(-2, idx)  # (B, H_kv, S_kept, D), a new tensor
        lay.values = lay.values.index_select(-2, idx)

    def _rerotate(self, session: Any, layer: int, n_seen: int, keep: Tensor) -> None:
        """Give kept keys cache-relative RoPE distances to the next query (at ``n_seen``)."""
        lay = session.cache.layers[layer]
        pos = session.positions[layer]  # (S,)
        s_len = pos.numel()
        assigned = self._assigned[layer]
        assigned = assigned[keep[: assigned.numel()]] if assigned.numel() else assigned
        assigned = torch.cat([assigned, pos[assigned.numel() :]])  # new entries: true position
        target = n_seen - s_len + torch.arange(s_len)  # newest entry sits at n_seen - 1
        self._assigned[layer] = target
        move = (target != assigned).nonzero().flatten()
        o_pos, o_keys = self._orig[layer]
        held = torch.isin(o_pos, pos)
        o_pos, o_keys = o_pos[held], o_keys[held]
        if move.numel():
            inv_freq = _inv_freq(session.lm.model)
            have = torch.isin(pos[move], o_pos)
            fresh = move[~have]
            if fresh.numel():  # entries still at their true position: keep their exact key
                k = lay.keys[0].index_select(1, fresh.to(lay.keys.device))  # (H_kv, f, D)
                k = k.transpose(0, 1).float().cpu()  # (f, H_kv, D)
                o_pos = torch.cat([o_pos, pos[fresh]])
                o_keys = torch.cat([o_keys.reshape(-1, *k.shape[1:]), k])  # (M, H_kv, D)
            where = (o_pos.unsqueeze(1) == pos[move].unsqueeze(0)).int().argmax(0)  # (m,)
            base = o_keys[where]  # (m, H_kv, D) f32, rotated at the true position
            delta = (target[move] - pos[move]).float()  # (m,)
            rot = _rope_shift(base, delta, inv_freq)  # (m, H_kv, D)
            dev = lay.keys.device
            lay.keys[0][:, move.to(dev)] = rot.transpose(0, 1).to(dev, lay.keys.dtype)
        self._orig[layer] = (o_pos, o_keys)


def _inv_freq(model: torch.nn.Module) -> Tensor:
    rope = getattr(model.get_decoder(), "rotary_emb", None)
    if rope is None or not hasattr(rope, "inv_freq"):
        raise ValueError("rerotate needs a RoPE model with a rotary_emb.inv_freq buffer")
    return rope.inv_freq.detach().float().cpu()


def _rope_shift(k: Tensor, delta: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate RoPE'd keys ``k`` (m, H, D) by ``delta`` (m,) more positions."""
    freqs = delta[:, None] * inv_freq[None, :]  # (m, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]  # (m, 1, D)
    half = k.shape[-1] // 2
    rot_half = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    return k * emb.cos() + rot_half * emb.sin()


def _layer_nbytes(cache: Any, layer: int) -> int:
    lay = cache.layers[layer]
    n = 0
    for t in (getattr(lay, "keys", None), getattr(lay, "values", None)):
        if isinstance(t, Tensor):
            n += t.numel() * t.element_size()
    return n


def _pad(rows: list[Tensor | None], fill: Any, dtype: torch.dtype) -> Tensor:
    """Stack ragged 1-D rows into (L, max) with ``fill`` padding."""
    width = max((r.numel() for r in rows if r is not None), default=0)
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        if r is not None and r.numel():
            out[i, : r.numel()] = r.to(dtype)
    return out


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

    def score(self, v: LayerView) -> Tensor | None:
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

    def score(self, v: LayerView) -> Tensor:
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

    def score(self, v: LayerView) -> Tensor:
        st = v.state.setdefault("acc", torch.zeros(v.positions.numel()))
        st += v.mean_attention
        return st.clone()


@dataclass
class TOVAPolicy(EvictionPolicy):
    """TOVA: the last query's attention averaged over heads; nothing else remembered."""

    name: ClassVar[str] = "tova"

    def score(self, v: LayerView) -> Tensor:
        return v.mean_attention * v.positions.numel()  # relative to a uniform share


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

    def importance(self, v: LayerView) -> Tensor:
        """(S,) the EMA importance, updated with this step's attention."""
        a = v.mean_attention
        imp = v.state.setdefault("importance", torch.zeros_like(a))
        upd = torch.where(v.new, a, self.decay * imp + (1.0 - self.decay) * a)
        v.state["importance"] = upd
        return upd

    def score(self, v: LayerView) -> Tensor:
        return self.importance(v) * v.positions.numel()


@dataclass
class GravityPolicy(EMAPolicy):
    """Seed §5.3/§6 gravity-field eviction: low attention AND far from the context goes first.

    ``score = importance_rel · exp(beta · Ĝ)`` where ``importance_rel`` is the EMA importance
    relative to a uniform share and ``Ĝ`` the z-scored gravity potential of the entry's token
    towards the current context, ``G(t_j) = Σ_i m_i·sim(t_j, t_i)`` (``semviz.gravity``): its
    projection on the context's "sentence vector". An entry is evicted only if it is cold and
    semantically far; a far entry needs more attention to stay, a near one less. Entries with
    ``Ĝ >= protect_z`` carry the theme and are kept even when cold (at most
    ``protect_frac`` of the budget, nearest first).

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

    # defaults tuned on the shipped text (512 tokens, budget 64; see the issue notes)
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
        self._z: dict[int, Tensor] = {}

    def reset(self, session: Any) -> None:
        super().reset(session)
        self._vecs = None
        self._rel = None

    def _vectors(self, session: Any) -> Tensor:
        """(N, d) float32 vectors of every position read (unit rows for cosine)."""
        n = len(session.ids)
        have = 0 if self._vecs is None else self._vecs.shape[0]
        if self.space == "embedding":
            if have < n:
                cand = candidate_matrix(session.lm.model, "embedding", self.sim)  # (V, d)
                new = cand[torch.tensor(session.ids[have:], device=cand.device)].cpu()
                self._vecs = new if self._vecs is None else torch.cat([self._vecs, new])
            return self._vecs
        hidden = getattr(session, "hidden", None)
        if hidden is None or hidden.shape[0] < n:
            raise ValueError("space='hidden' needs the session's hidden states of every position")
        h = hidden[:n].detach().float().cpu()
        if self.sim == "cosine":
            h = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        return h

    def begin_step(self, session: Any, attention: Tensor) -> None:
        vecs = self._vectors(session)  # (N, d)
        self._rel = None
        if self.mass == "attention":
            return
        n = vecs.shape[0]
        w = n if self.context_window is None else min(n, self.context_window)
        ctx_ids = torch.tensor(session.ids[n - w :])
        m = context_mass(self.mass, context_ids=ctx_ids, n=w)  # (W,)
        self._rel = gravity_potential(vecs, vecs[n - w :], m, self.sim, normalized=True)  # (N,)

    def relevance(self, v: LayerView) -> Tensor:
        """(S,) z-scored gravity potential of each cached entry towards the context."""
        vecs = self._vectors(v.session)
        if self._rel is not None:
            g = self._rel[v.positions]  # (S,)
        else:
            m = context_mass("attention", attention=v.attention.unsqueeze(0))  # (S,)
            c = vecs[v.positions]
            g = gravity_potential(c, c, m, self.sim, normalized=True)  # (S,)
        return normalize_gravity(g)

    def score(self, v: LayerView) -> Tensor:
        imp = self.importance(v) * v.positions.numel()
        z = self.relevance(v)
        self._z[v.layer] = z
        return imp * torch.exp(self.beta * z)

    def protect(self, v: LayerView, scores: Tensor | None) -> Tensor | None:
        z = self._z.pop(v.layer, None)
        if z is None or not math.isfinite(self.protect_z) or self.protect_frac == 0:
            return None
        theme = z >= self.protect_z
        cap = v.positions.numel() if v.budget is None else int(self.protect_frac * v.budget)
        if int(theme.sum()) > cap:
            idx = theme.nonzero().flatten()
            top = idx[torch.sort(z[idx], descending=True, stable=True).indices[:cap]]
            theme = torch.zeros_like(theme)
            theme[top] = True
        return theme


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


def make_policy(name: str, budget: Value = None, threshold: Value = None, **kw: Any):
    """A policy by name: ``full``, ``window``, ``streaming``, ``h2o``, ``tova``, ``ema``, ``gravity``.

    >>> make_policy("gravity", budget=128, beta=1.0).beta
    1.0
    """
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {name!r}")
    return cls(budget=budget, threshold=threshold, **kw)


# --------------------------------------------------------------------------------------------
# Teacher-forced evaluation
# --------------------------------------------------------------------------------------------


def teacher_force(lm, ids: Sequence[int], policy: EvictionPolicy | None, *, prefill: int = 1):
    """Feed ``ids`` (prefill chunk, then one token per forward) with eviction live.

    Yields ``(positions, logits, event, seconds)`` per forward: ``positions`` the true
    positions fed, ``logits`` ``(T, V)`` float32 next-token logits for them, ``event`` the
    policy's timeline record (None without a policy) and ``seconds`` the forward plus eviction
    time. The cache's bytes at their peak (before eviction) are in ``event["peak_bytes"]``.
    """
    from semviz.capture import AttentionSink, enable_capture
    from semviz.decoding import cache_nbytes

    model = lm.model
    enable_capture(model)
    ids = list(ids)
    if not ids:
        raise ValueError("ids must not be empty")
    prefill = max(1, min(int(prefill), len(ids)))
    session = CacheSession(
        lm=lm,
        cache=lm.new_cache(),
        positions=[torch.zeros(0, dtype=torch.long) for _ in range(model.config.num_hidden_layers)],
        ids=[],
    )
    if policy is not None:
        policy.reset(session)
    dev = lm.device
    start = 0
    while start < len(ids):
        stop = prefill if start == 0 else start + 1
        chunk = ids[start:stop]
        pos = list(range(start, stop))
        sink = AttentionSink() if policy is not None else None
        kw = {"semviz_sink": sink} if sink is not None else {}
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.get_decoder()(
                input_ids=torch.tensor([chunk], device=dev),
                position_ids=torch.tensor([pos], device=dev),
                cache=session.cache,
                use_cache=True,
                **kw,
            )
            h = out.last_hidden_state[0]  # (T, d)
            logits = model.get_output_embeddings()(h).float()  # (T, V)
        session.ids.extend(chunk)
        if policy is not None and policy_needs_hidden(policy):
            hf = h.float().cpu()
            session.hidden = hf if session.hidden is None else torch.cat([session.hidden, hf])
        peak = cache_nbytes(session.cache)
        event = None
        if policy is not None:
            event = policy.after_forward(session, _attention_rows(sink))
            event["peak_bytes"] = peak
        seconds = time.perf_counter() - t0
        yield pos, logits, event, seconds
        start = stop


def _attention_rows(sink) -> Tensor:
    """(L, H, S) from a sink's per-layer (1, H, S_l) rows, zero-padded to the longest."""
    rows = [sink.rows[i][0] for i in sorted(sink.rows)]  # each (H, S_l)
    return _pad_rows(rows)


def _pad_rows(rows: list[Tensor]) -> Tensor:
    s = max(r.shape[-1] for r in rows)
    out = rows[0].new_zeros(len(rows), rows[0].shape[0], s)
    for i, r in enumerate(rows):
        out[i, :, : r.shape[-1]] = r
    return out


def policy_needs_hidden(policy: EvictionPolicy) -> bool:
    return isinstance(policy, GravityPolicy) and policy.space == "hidden"


def _as_policy(p: str | EvictionPolicy, budget: Value, kw: dict) -> EvictionPolicy:
    if isinstance(p, EvictionPolicy):
        return p
    return make_policy(p, None if p == "full" else budget, **kw.get(p, {}))


def kv_eval(
    lm,
    ids: Sequence[int],
    policies: Sequence[str | EvictionPolicy] = tuple(POLICIES),
    budgets: Sequence[int | float] = (128,),
    *,
    prefill: int = 1,
    policy_kwargs: dict[str, dict] | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[dict]:
    """Teacher-forced quality of each policy against the full cache, eviction live.

    Parameters
    ----------
    lm : a ``LoadedModel``
    ids : the text's token ids; position ``t``'s logits are scored against ``ids[t+1]``
    policies : names (built for every budget) or ready policies (run once, as given)
    budgets : token counts or fractions, swept for every named policy except ``full``
    prefill : tokens in the first forward; every later forward feeds one token
    policy_kwargs : extra constructor arguments per policy name
    on_progress : ``(done, total, label)`` after every forward
    should_stop : polled after every forward; when True, the rows finished so far are returned

    Returns
    -------
    One dict per (policy, budget): ``policy``, ``budget``, ``tokens`` (predictions scored),
    ``ppl``, ``nll``, ``top1_agree`` and ``kl`` (mean KL(full ‖ policy), nats) against the
    full cache, ``peak_cache_bytes``, ``mean_cache_len``, ``evicted_mass`` (mean exact share of
    attention on entries evicted after each step), ``regret_est`` (mean estimated regret),
    ``tokens_per_s`` and ``seconds``. ``pandas.DataFrame(rows)`` makes the table.
    """
    ids = list(ids)
    if len(ids) < 2:
        raise ValueError("ids must hold at least 2 tokens")
    kw = policy_kwargs or {}
    runs: list[tuple[str, Any, EvictionPolicy]] = []
    for b in budgets:
        for p in policies:
            if isinstance(p, EvictionPolicy) or p == "full":
                continue
            runs.append((p, b, _as_policy(p, b, kw)))
    fixed = [p for p in policies if isinstance(p, EvictionPolicy)]
    runs += [(p.name, p.budget, p) for p in fixed]
    for _, _, policy in runs:  # refuse before the reference pass, not after it
        policy.check_model(lm)
    want_full = any(not isinstance(p, EvictionPolicy) and p == "full" for p in policies)
    n_fwd = len(ids) - max(1, min(prefill, len(ids))) + 1
    total = n_fwd * (1 + len(runs))
    done = 0
    targets = torch.tensor(ids[1:])  # (N-1,)

    def tick(label: str) -> bool:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total, label)
        return should_stop is not None and bool(should_stop())

    # the reference: full cache, same code path
    ref_logp = torch.empty(len(ids) - 1, lm.model.config.vocab_size)
    full = FullPolicy()
    stats = _Stats()
    for pos, logits, event, sec in teacher_force(lm, ids, full, prefill=prefill):
        lp = torch.log_softmax(logits, -1)  # (T, V)
        keep = [i for i, p in enumerate(pos) if p < len(ids) - 1]
        ref_logp[[pos[i] for i in keep]] = lp[keep]
        stats.add(pos, lp, targets, None, event, sec)
        if tick("full"):
            return []
    rows: list[dict] = []
    if want_full:
        rows.append(stats.row("full", None))
    ref_top = ref_logp.argmax(-1)  # (N-1,)
    ref_p = ref_logp.exp()
    for name, budget, policy in runs:
        st = _Stats()
        for pos, logits, event, sec in teacher_force(lm, ids, policy, prefill=prefill):
            lp = torch.log_softmax(logits, -1)
            st.add(pos, lp, targets, (ref_logp, ref_p, ref_top), event, sec)
            if tick(f"{name} @ {budget}"):
                return rows
        rows.append(st.row(name, budget))
    return rows


class _Stats:
    """Running sums for one policy's row."""

    def __init__(self) -> None:
        self.nll = self.kl = self.agree = 0.0
        self.n = 0
        self.peak = 0
        self.len_sum = 0.0
        self.n_fwd = 0
        self.mass = self.regret = 0.0
        self.seconds = 0.0

    def add(self, pos, lp: Tensor, targets: Tensor, ref, event, sec: float) -> None:
        self.seconds += sec
        self.n_fwd += 1
        if event is not None:
            self.peak = max(self.peak, int(event.get("peak_bytes", event["cache_bytes"])))
            self.len_sum += float(event["lengths"].float().mean())
            self.mass += float(event["evicted_mass"].mean())
            self.regret += float(event["regret"].mean())
        idx = [i for i, p in enumerate(pos) if p < targets.numel()]
        if not idx:
            return
        p_idx = torch.tensor([pos[i] for i in idx])
        rows = lp[idx]  # (T', V)
        self.nll -= float(rows.gather(1, targets[p_idx].unsqueeze(1)).sum())
        self.n += len(idx)
        if ref is None:
            self.agree += len(idx)
            return
        ref_logp, ref_p, ref_top = ref
        self.agree += float((rows.argmax(-1) == ref_top[p_idx]).sum())
        self.kl += float((ref_p[p_idx] * (ref_logp[p_idx] - rows)).sum())

    def row(self, name: str, budget: Any) -> dict:
        n = max(self.n, 1)
        f = max(self.n_fwd, 1)
        return {
            "policy": name,
            "budget": budget,
            "tokens": self.n,
            "ppl": math.exp(self.nll / n),
            "nll": self.nll / n,
            "top1_agree": self.agree / n,
            "kl": max(self.kl / n, 0.0),
            "peak_cache_bytes": self.peak,
            "mean_cache_len": self.len_sum / f,
            "evicted_mass": self.mass / f,
            "regret_est": self.regret / f,
            "tokens_per_s": self.n_fwd / self.seconds if self.seconds else float("nan"),
            "seconds": self.seconds,
        }
