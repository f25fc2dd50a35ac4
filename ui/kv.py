"""The sidebar's KV-cache policy: ``"none"`` or a policy of ``semviz.eviction``."""

from __future__ import annotations

from semviz.eviction import POLICIES, EvictionPolicy
from semviz.eviction import make_policy as _make_policy


def policy_names() -> list[str]:
    """``"none"`` (no eviction) and every registered policy."""
    return ["none", *POLICIES]


def make_policy(name: str, budget: int) -> EvictionPolicy | None:
    """A fresh policy for one decoder at ``budget`` tokens, or None for ``"none"``."""
    return None if name == "none" else _make_policy(name, budget=int(budget))
