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

A sink made with ``lens=True`` also receives, at the last position, what the logit lens and
direct logit attribution read (``semviz.analysis.lens``): the residual stream entering each
block and leaving the last one, and each head's output before the output projection, plus
the mean magnitude of each head's pre-softmax scores (entropix's interaction strength). The
residual comes from forward hooks on the decoder blocks that exist only inside
:func:`lens_hooks` (removed in ``finally``) and that read the sink from the call's own
keyword arguments, so a forward of another session that runs meanwhile records nothing.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
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
    lens: bool = False
    # with ``lens``, all at the last position of the call:
    # 0 → (B, d) the embedding output; l + 1 → (B, d) the output of block l
    residual: dict[int, torch.Tensor] = field(default_factory=dict)
    heads: dict[int, torch.Tensor] = field(default_factory=dict)  # l → (B, H, D) before o_proj
    score_abs: dict[int, torch.Tensor] = field(default_factory=dict)  # l → (B, H) mean |score|
    n_keys: dict[int, torch.Tensor] = field(default_factory=dict)  # l → (B,) keys read
    # l → (scores (B, H, S), valid (B, 1, S) or None) the forward left, not yet in ``rows``
    pending: dict[int, tuple] = field(default_factory=dict, repr=False)

    def finish(self) -> None:
        """Turn the scores the last forward left into ``rows`` (and, with ``lens``,
        ``score_abs`` and ``n_keys``). Layers that read the same number of keys are done
        together: one softmax for all of them instead of one per layer."""
        if not self.pending:
            return
        layers = sorted(self.pending)
        scores = [self.pending[i][0] for i in layers]
        valid = [self.pending[i][1] for i in layers]
        self.pending = {}
        one = all(s.shape == scores[0].shape for s in scores) and (
            all(v is None for v in valid)
            or all(v is not None and v.shape == valid[0].shape for v in valid)
        )
        if one:
            groups = [
                (layers, torch.stack(scores), None if valid[0] is None else torch.stack(valid))
            ]
        else:
            groups = [
                ([i], s[None], None if v is None else v[None])
                for i, s, v in zip(layers, scores, valid, strict=True)
            ]
        for idx, s, v in groups:  # s (n, B, H, S), v (n, B, 1, S) or None
            p = _softmax(s, v)
            for j, i in enumerate(idx):
                self.rows[i] = p[j]
            if not self.lens:
                continue
            if v is None:
                score_abs = s.abs().mean(-1)  # (n, B, H)
                n_keys = torch.full(s.shape[:2], s.shape[-1], dtype=torch.long)  # (n, B)
            else:
                n = v.sum(-1)  # (n, B, 1)
                score_abs = s.abs().masked_fill(~v, 0.0).sum(-1) / n.clamp_min(1)
                n_keys = n[..., 0].cpu()
            for j, i in enumerate(idx):
                self.score_abs[i], self.n_keys[i] = score_abs[j], n_keys[j]

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
        self.finish()
        rows = [self.rows[i] for i in sorted(self.rows)]  # each (B, H, S_l)
        s = max(r.shape[-1] for r in rows)
        if all(r.shape[-1] == s for r in rows):
            return torch.stack(rows)
        pad = (lambda n: (0, n)) if align == "left" else (lambda n: (n, 0))
        return torch.stack([torch.nn.functional.pad(r, pad(s - r.shape[-1])) for r in rows])


def last_query_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    attention_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The last query row's pre-softmax scores ``q·kᵀ·scale`` and which keys it may read.

    Parameters
    ----------
    query : (B, H, Q, D)
    key : (B, H_kv, S, D), already RoPE'd, as stored in the cache
    scaling : the module's softmax scale
    attention_mask : additive or boolean mask (B, 1, Q, S) or None

    Returns
    -------
    scores : (B, H, S) float32, the mask not applied
    valid : (B, 1, S) bool, or None when every key may be read
    """
    B, H, _, D = query.shape
    H_kv, S = key.shape[1], key.shape[2]
    # Grouped heads share a KV head: view the queries as (B, H_kv, n_rep, D) instead of
    # copying the keys n_rep times. Head h uses KV head h // n_rep, as repeat_kv does.
    q = query[:, :, -1, :].float().view(B, H_kv, H // H_kv, D)  # (B, H_kv, n_rep, D)
    k = key.float()  # (B, H_kv, S, D)
    scores = (q @ k.transpose(-1, -2)).view(B, H, S) * scaling  # (B, H, S)
    if attention_mask is None:
        return scores, None
    m = attention_mask[:, :, -1, -S:]  # (B, 1, S)
    if m.dtype != torch.bool:  # additive: 0 where readable, -inf or the dtype's minimum where not
        m = m > torch.finfo(m.dtype).min / 2
    return scores, m


def last_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    attention_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Softmax attention of the last query row over every key.

    Parameters are those of :func:`last_query_scores`.

    Returns
    -------
    (B, H, S) float32 weights that sum to 1 over S.
    """
    scores, valid = last_query_scores(query, key, scaling, attention_mask)
    return _softmax(scores, valid)


def _softmax(scores: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    return torch.softmax(scores, dim=-1)  # (B, H, S)


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
        layer = module.layer_idx
        with torch.no_grad():
            # the softmax and the lens's score metrics wait for the forward's end, where
            # AttentionSink.finish does every layer at once
            sink.pending[layer] = last_query_scores(query, key, scaling, attention_mask)
            if sink.lens:
                # (B, T, H, D) from sdpa: each head's output at the last position
                sink.heads[layer] = _last(out[0])  # (B, H, D)
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


# -- the residual stream, for the logit lens ----------------------------------------------------


_blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → its decoder blocks


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder blocks in order: the modules of the class transformers records
    ``hidden_states`` from (``LlamaDecoderLayer``, ``GPT2Block``, …). Found once per model:
    a walk over every module costs a millisecond, and the lens asks on every forward."""
    found = _blocks.get(model)
    if found is None:
        found = _blocks[model] = _find_blocks(model)
    return list(found)


def _find_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    decoder = model.get_decoder()
    cls = getattr(decoder, "_can_record_outputs", None) or {}
    target = cls.get("hidden_states")
    target = getattr(target, "target_class", target)
    if isinstance(target, type):
        found = [m for m in decoder.modules() if isinstance(m, target)]
        if found:
            return found
    for name in ("layers", "h", "blocks"):
        blocks = getattr(decoder, name, None)
        if isinstance(blocks, torch.nn.ModuleList):
            return list(blocks)
    raise ValueError(f"{type(model).__name__}: semviz cannot find its decoder blocks")


def _last(x: torch.Tensor) -> torch.Tensor:
    """``x[:, -1]`` as a float32 copy on the CPU. Always a copy: a view of a float32 CPU
    tensor would keep the whole (B, T, ...) activation alive until the forward ends; the 61
    rows of a 2,048-token prefill of the default model would hold 288 MB."""
    return x[:, -1].to("cpu", torch.float32, copy=True)


def _residual_hook(index: int):
    """A forward hook for block ``index``: its input (block 0 only: the embedding output) and
    output at the last position, into the sink the call carries; nothing without one."""

    def hook(module, args, kwargs, output):
        sink = kwargs.get("semviz_sink")
        if sink is None or not sink.lens:
            return None
        with torch.no_grad():
            if index == 0:
                x = args[0] if args else kwargs["hidden_states"]
                sink.residual[0] = _last(x)  # (B, d)
            h = output[0] if isinstance(output, tuple) else output
            sink.residual[index + 1] = _last(h)  # (B, d)
        return None

    return hook


_hooks_lock = threading.Lock()
_hooks: dict[int, list] = {}  # id(model) → [users, handles]


@contextlib.contextmanager
def lens_hooks(model: torch.nn.Module) -> Iterator[None]:
    """Forward hooks on the decoder blocks for as long as the block runs.

    They record only into a sink with ``lens=True`` passed to the forward as ``semviz_sink``.
    Sessions that record at once share one set of hooks (counted), and the last one out
    removes them, in ``finally``.
    """
    key = id(model)
    with _hooks_lock:
        entry = _hooks.get(key)
        if entry is None:
            handles = [
                block.register_forward_hook(_residual_hook(i), with_kwargs=True)
                for i, block in enumerate(decoder_layers(model))
            ]
            entry = _hooks[key] = [0, handles]
        entry[0] += 1
    try:
        yield
    finally:
        with _hooks_lock:
            entry[0] -= 1
            if entry[0] == 0:
                for h in entry[1]:
                    h.remove()
                del _hooks[key]


@dataclass
class LensCapture:
    """What one forward recorded for the lens, every row of the batch.

    Attributes
    ----------
    residual : (L+1, B, d) float32 residual stream at the last position: the embedding
        output, then the output of each block
    heads : (L, B, H, D) float32 each head's attention output before the output projection
    metrics : (4, L, B, H) float32 ``semviz.output.trace.ATTENTION_METRICS`` of the last query's attention
    """

    residual: torch.Tensor
    heads: torch.Tensor
    metrics: torch.Tensor

    @classmethod
    def of(cls, sink: AttentionSink, attention: torch.Tensor) -> LensCapture:
        """From a ``lens=True`` sink after its forward, and its ``stacked(align="left")``."""
        n = len(sink.heads)
        residual = torch.stack([sink.residual[i] for i in range(n + 1)])  # (L+1, B, d)
        heads = torch.stack([sink.heads[i] for i in range(n)])  # (L, B, H, D)
        score_abs = torch.stack([sink.score_abs[i] for i in range(n)]).cpu()  # (L, B, H)
        n_keys = torch.stack([sink.n_keys[i] for i in range(n)])  # (L, B)
        metrics = attention_metrics(attention.cpu(), score_abs, n_keys)
        return cls(residual, heads, metrics)

    def row(self, r: int) -> LensCapture:
        """Row ``r`` of the batch, kept as a batch of one."""
        return LensCapture(
            self.residual[:, r : r + 1], self.heads[:, r : r + 1], self.metrics[:, :, r : r + 1]
        )


def attention_metrics(
    attention: torch.Tensor, score_abs: torch.Tensor, n_keys: torch.Tensor
) -> torch.Tensor:
    """entropix's attention metrics of the last query, per layer, row and head.

    Parameters
    ----------
    attention : (L, B, H, S) weights, each row summing to 1 over the keys it read, zero
        elsewhere (padding, a shorter layer)
    score_abs : (L, B, H) mean absolute pre-softmax score over the keys read
    n_keys : (L, B) the number of keys read

    Returns
    -------
    (4, L, B, H) float32, ``semviz.output.trace.ATTENTION_METRICS`` in order: entropy ``-Σ p ln p``,
    varentropy ``Σ p (ln p + H)²``, agreement ``Σ |p - p̄| / n`` (``p̄`` the mean row of the
    layer's heads, ``n`` the keys read) and interaction strength ``score_abs``.

    Examples
    --------
    >>> a = torch.tensor([0.5, 0.25, 0.25]).view(1, 1, 1, 3)
    >>> m = attention_metrics(a, torch.ones(1, 1, 1), torch.tensor([[3]]))
    >>> round(float(m[0].squeeze()), 4)  # 1.5 ln 2
    1.0397
    """
    p = attention.float()
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))  # 0 · ln 0 counts as 0
    h = -(p * logp).sum(-1)  # (L, B, H)
    var = (p * (logp + h[..., None]).square()).sum(-1)  # centred: no cancellation
    mean = p.mean(2, keepdim=True)  # (L, B, 1, S) the mean row over heads
    agree = (p - mean).abs().sum(-1) / n_keys.clamp_min(1)[..., None].to(p.dtype)  # (L, B, H)
    return torch.stack([h.clamp_min(0.0), var, agree, score_abs.float()])
