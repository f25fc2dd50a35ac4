"""Per-call capture of the last query's attention, at sdpa speed.

transformers looks attention functions up by name in ``AttentionInterface``. semviz registers
one, ``"semviz_sdpa"``, that runs the stock sdpa kernel and, only when the caller passes a
``semviz_sink`` keyword to ``model(...)``, also computes the last query row's softmax(q·Kᵀ·scale)
for each layer and stores it in that sink. A ``semviz_masks`` keyword (one boolean mask per
layer, or None) replaces the model's mask where rows of a batch hold padded caches
(``semviz.model.forward.KVRows``). Nothing else changes: without either keyword it is exactly sdpa.
The sink is per call, so two sessions sharing one model never see each other's capture, and
no hook is ever left registered on the model.

The full N×N attention is never formed: at prefill only the last row is computed, which is
O(H·N·D) per layer instead of O(H·N²).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

IMPL_NAME = "semviz_sdpa"


@dataclass
class AttentionSink:
    """Receives each layer's last-query attention during one forward call.

    Attributes
    ----------
    rows : dict[int, torch.Tensor]
        layer index → (B, H, S) float32 attention of the last query over the S cached keys.
    """

    rows: dict[int, torch.Tensor] = field(default_factory=dict)

    def stacked(self, *, align: str = "right") -> torch.Tensor:
        """All layers as one (L, B, H, S) float32 tensor, layer order.

        Layers may hold different numbers of cached keys, S is the longest, and a shorter
        layer's row is zero-padded:

        - ``align="right"``: a sliding-window layer under transformers' own cache (in
          ``generate``) holds only the window's most recent keys, so its row is right-aligned,
          zeros standing for the positions before its window;
        - ``align="left"``: under eviction each layer keeps its own entries packed from slot 0
          (``semviz.model.forward.KVRows``), so its row is zero beyond its own length.
        """
        if align not in ("left", "right"):
            raise ValueError(f"align must be 'left' or 'right', got {align!r}")
        rows = [self.rows[i] for i in sorted(self.rows)]  # each (B, H, S_l)
        s = max(r.shape[-1] for r in rows)
        pad = (lambda n: (0, n)) if align == "left" else (lambda n: (n, 0))
        return torch.stack([torch.nn.functional.pad(r, pad(s - r.shape[-1])) for r in rows])


def last_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    attention_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Softmax attention of the last query row over every key.

    Parameters
    ----------
    query : (B, H, Q, D)
    key : (B, H_kv, S, D), already RoPE'd, as stored in the cache
    scaling : the module's softmax scale
    attention_mask : additive or boolean mask (B, 1, Q, S) or None

    Returns
    -------
    (B, H, S) float32 weights that sum to 1 over S.
    """
    B, H, _, D = query.shape
    H_kv, S = key.shape[1], key.shape[2]
    # Grouped heads share a KV head: view the queries as (B, H_kv, n_rep, D) instead of
    # copying the keys n_rep times. Head h uses KV head h // n_rep, as repeat_kv does.
    q = query[:, :, -1, :].float().view(B, H_kv, H // H_kv, D)  # (B, H_kv, n_rep, D)
    k = key.float()  # (B, H_kv, S, D)
    scores = (q @ k.transpose(-1, -2)).view(B, H, 1, S) * scaling  # (B, H, 1, S)
    if attention_mask is not None:
        m = attention_mask[:, :, -1:, -key.shape[-2] :]  # (B, 1, 1, S)
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m, float("-inf"))
        else:
            scores = scores + m.float()
    return torch.softmax(scores, dim=-1)[:, :, 0, :]  # (B, H, S)


def _capturing_sdpa(module, query, key, value, attention_mask, **kwargs):
    sink: AttentionSink | None = kwargs.pop("semviz_sink", None)
    masks = kwargs.pop("semviz_masks", None)
    if masks is not None and masks[module.layer_idx] is not None:
        # rows of a batch hold different cache entries: this layer's own (B, 1, T, S) mask
        # (semviz.model.forward.KVRows.masks) says which keys each query sees, padding hidden
        attention_mask = masks[module.layer_idx].to(query.device)
    out = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if sink is not None:
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        with torch.no_grad():
            sink.rows[module.layer_idx] = last_query_attention(query, key, scaling, attention_mask)
    return out


AttentionInterface.register(IMPL_NAME, _capturing_sdpa)
# masks are looked up by the same name: build them exactly as for "sdpa" (a chunk of several
# tokens fed onto a non-empty cache then gets the right causal alignment)
AttentionMaskInterface.register(IMPL_NAME, sdpa_mask)


def enable_capture(model: torch.nn.Module) -> None:
    """Switch ``model`` to the capturing sdpa implementation.

    Without a sink the implementation is plain sdpa, so this changes no numbers for anyone
    else using the model; it is idempotent and safe to call from several sessions.
    """
    if getattr(model.config, "_attn_implementation", None) != IMPL_NAME:
        model.set_attn_implementation(IMPL_NAME)


@contextlib.contextmanager
def capturing(model: torch.nn.Module) -> Iterator[AttentionSink]:
    """Yield a fresh sink; pass it as ``semviz_sink=sink`` to ``model(...)``.

    Examples
    --------
    >>> with capturing(model) as sink:  # doctest: +SKIP
    ...     model(ids, semviz_sink=sink)
    ...     attn = sink.stacked()  # (L, B, H, S)
    """
    enable_capture(model)
    yield AttentionSink()
