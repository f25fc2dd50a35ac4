"""Key re-rotation as a policy wrapper: cache-relative positions (StreamingLLM §3.2).

Cached keys are RoPE'd at their true positions, so after eviction a kept key's rotary distance
to the next query is still its true distance. :class:`KeyRerotation` wraps any policy and,
after each eviction, re-rotates the kept keys so that each one's distance to the next query
(at ``n_seen``) is its rank from the newest entry: entry ``j`` of ``S`` kept sits at
``n_seen - S + j``. Each key is rotated from its original (true-position) key, kept in float32
from the forward that made it, so the error does not build up over steps.

Only models whose keys carry one set of RoPE frequencies over every key dimension can be
re-rotated: :func:`semviz.model.load.require_rope` refuses any other model (GPT-2's learned
positions, partial or per-layer RoPE) with one sentence, and
:func:`semviz.model.load.rope_inv_freq` gives the frequencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from semviz.eviction.base import CacheView, EvictionPolicy, Plan, _Packer, evict_session
from semviz.model.load import require_rope, rope_inv_freq

__all__ = ["KeyRerotation", "rope_shift"]


def rope_shift(k: Tensor, delta: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate RoPE'd keys ``k`` (m, H, D) by ``delta`` (m,) more positions."""
    freqs = delta[:, None] * inv_freq[None, :]  # (m, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]  # (m, 1, D)
    half = k.shape[-1] // 2
    rot_half = torch.cat([-k[..., half:], k[..., :half]], dim=-1)  # (m, H, D)
    return k * emb.cos() + rot_half * emb.sin()


@dataclass
class KeyRerotation:
    """Any policy, with kept keys re-rotated to cache-relative positions after each eviction.

    Parameters
    ----------
    policy : the policy that chooses what to keep (its name, budget and record are this
        wrapper's too)

    Examples
    --------
    >>> from semviz.eviction import make_policy
    >>> KeyRerotation(make_policy("streaming", budget=64)).to_dict()["rerotate"]
    True
    """

    policy: EvictionPolicy

    def __post_init__(self) -> None:
        if isinstance(self.policy, KeyRerotation):
            raise ValueError("policy is already re-rotated")
        if not isinstance(self.policy, EvictionPolicy):
            raise ValueError(f"policy must be an eviction policy, got {self.policy!r}")
        self._inv_freq: Tensor | None = None
        self._orig: Tensor | None = None  # (L, W, H_kv, D) f32 keys at their true position
        self._assigned: Tensor | None = None  # (L, W) long position each key is rotated to

    def __getattr__(self, name: str) -> Any:
        # name, budget, budget_rule, layer_budget, needs_hidden, … are the wrapped policy's
        if name.startswith("_") or name == "policy":
            raise AttributeError(name)
        return getattr(self.policy, name)

    def to_dict(self) -> dict:
        return {**self.policy.to_dict(), "rerotate": True}

    def check_model(self, lm: Any) -> None:
        """The wrapped policy's checks, then :func:`semviz.model.load.require_rope`."""
        self.policy.check_model(lm)
        require_rope(lm)

    def reset(self, owner: Any) -> None:
        lm = getattr(owner, "lm", owner)
        self.check_model(lm)
        self._inv_freq = rope_inv_freq(lm.model)
        self.policy.reset(owner)
        self._orig = self._assigned = None

    def after_forward(self, session: Any, attention: Tensor) -> dict:
        """As :meth:`EvictionPolicy.after_forward`, with the kept keys re-rotated."""
        return evict_session(self, session, attention)

    def plan(self, v: CacheView) -> Plan:
        if self._inv_freq is None:
            self.reset(v.lm)
        self._take_new_keys(v)
        plan = self.policy.plan(v)
        keep = plan.keep
        pack = _Packer(keep)
        orig = pack(self._orig, 0.0)  # (L, K, H_kv, D)
        assigned = pack(self._assigned, -1)  # (L, K)
        pos = pack(v.positions, -1)  # (L, K)
        count = pack.counts  # (L,)
        k = pos.shape[1]
        target = v.n_seen - count[:, None] + torch.arange(k)  # newest entry at n_seen - 1
        move = (torch.arange(k) < count[:, None]) & (target != assigned)  # (L, K)
        for layer in move.any(1).nonzero().flatten().tolist():
            slots = move[layer].nonzero().flatten()  # (m,)
            delta = (target[layer, slots] - pos[layer, slots]).float()  # (m,)
            keys = rope_shift(orig[layer, slots], delta, self._inv_freq)  # (m, H_kv, D)
            plan.rotate.append((layer, slots, keys))
        self._orig = orig
        self._assigned = torch.where(move, target, assigned)
        return plan

    def _take_new_keys(self, v: CacheView) -> None:
        """Store the new entries' keys (still at their true position) before anything moves."""
        n_layers, width = v.positions.shape
        if self._orig is None:
            cfg = v.lm.model.config
            h_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
            self._orig = torch.zeros(n_layers, 0, h_kv, 2 * self._inv_freq.numel())
            self._assigned = torch.zeros(n_layers, 0, dtype=torch.long)
        pad = width - self._orig.shape[1]
        if pad > 0:
            more = self._orig.new_zeros(n_layers, pad, *self._orig.shape[2:])
            self._orig = torch.cat([self._orig, more], dim=1)  # (L, W, H_kv, D)
            self._assigned = torch.cat(
                [self._assigned, self._assigned.new_full((n_layers, pad), -1)], dim=1
            )  # (L, W)
        new = v.valid & (self._assigned < 0)  # (L, W) entries with no key stored yet
        for layer in new.any(1).nonzero().flatten().tolist():
            slots = new[layer].nonzero().flatten()
            self._orig[layer, slots] = v.read_keys(layer, slots)
            self._assigned[layer, slots] = v.positions[layer, slots]
