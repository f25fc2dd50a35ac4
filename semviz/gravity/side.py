"""Forwards gravity runs for itself: the short window of coherence boosting, the info prior.

A hook that collects the text's hidden states (``semviz.processors.capture_hidden``) must not
see these, so they run inside :func:`side_forward` and the hook asks :func:`in_side_forward`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["in_side_forward", "log_probs", "short_window_logits", "side_forward"]


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
def side_forward() -> Iterator[None]:
    """Mark the forwards inside the block as gravity's own (see :func:`in_side_forward`)."""
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
    with side_forward(), torch.inference_mode():
        h = model.get_decoder()(input_ids=w, position_ids=pos, use_cache=False)
        out = model.get_output_embeddings()(h.last_hidden_state[:, -1])  # (B, V)
    return out.float().cpu()
