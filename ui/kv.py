"""KV-cache policies for the sidebar, through ``semviz.eviction`` when it is installed."""

from __future__ import annotations

import importlib
import inspect
from typing import Any


def _module():
    try:
        return importlib.import_module("semviz.eviction")
    except ImportError:
        return None


def policy_names() -> list[str]:
    """``"none"`` plus every policy ``semviz.eviction`` registers."""
    mod = _module()
    names: list[str] = []
    if mod is not None:
        reg = getattr(mod, "POLICIES", None) or getattr(mod, "REGISTRY", None) or {}
        names = [n for n in reg if n != "none"]
    return ["none", *names]


def make_policy(name: str, budget: int) -> Any:
    """A fresh policy object for one decoder, or None for ``"none"``."""
    if name == "none":
        return None
    mod = _module()
    if mod is None:
        raise ValueError("KV-cache policies are not available in this build (no semviz.eviction).")
    factory = getattr(mod, "make_policy", None)
    if factory is not None:
        return factory(name, budget=int(budget))
    reg = getattr(mod, "POLICIES", None) or getattr(mod, "REGISTRY", None) or {}
    if name not in reg:
        raise ValueError(f"Unknown KV policy {name!r}; choose one of {', '.join(policy_names())}.")
    cls = reg[name]
    params = inspect.signature(cls).parameters
    return cls(budget=int(budget)) if "budget" in params else cls()


def kv_eval_function():
    """``semviz.eviction.kv_eval`` (or wherever it lives), or None."""
    for modname in ("semviz.eviction", "semviz.kv_eval"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        fn = getattr(mod, "kv_eval", None)
        if fn is not None:
            return fn
    return None
