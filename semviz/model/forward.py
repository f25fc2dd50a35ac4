"""One forward for everything: a batch of rows, each with its own KV entries, and their size.

:func:`forward` runs the model's decoder on a ``(B, T)`` batch of token ids at their true
``position_ids`` with a ``DynamicCache`` and, when asked, captures every layer's last-query
attention ``(L, B, H, S)``. The :class:`~semviz.decoding.decoder.Decoder` calls it with ``B = 1``; the
eviction harness (``semviz.eviction.harness``) and batched Compare A/B call it with one row per
policy or side.

Rows whose caches hold different entries live in one cache through :class:`KVRows`:

- layer ``l``'s keys and values are ``(B, H_kv, S_l, D)``; row ``r`` owns the slots where
  ``pos[r, l, slot] >= 0`` (its original positions, ascending) and the others are padding;
- a forward appends its ``T`` new entries at slots ``[S_l, S_l + T)`` of every row;
- :meth:`KVRows.keep` drops evicted entries and packs each row's kept entries to the front,
  so ``S_l`` becomes the most entries any row keeps in that layer.

Padding is hidden by one boolean mask per layer (:meth:`KVRows.masks`), passed to the capturing
attention function, which uses it instead of the model's own mask. A padded key gets exactly
zero weight, so a row's outputs equal those of the same row run alone up to float rounding
(the batched-vs-unbatched tests hold them to 1e-5 on logits). Rows that hold the same number
of entries need no mask, and the forward is then the model's plain sdpa path.

Examples
--------
>>> kv_bytes_per_token({"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "dtype": "float32"})
46080
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from semviz.model.capture import AttentionSink, LensCapture, enable_capture, lens_hooks
from semviz.model.load import new_cache

__all__ = [
    "Forward",
    "KVRows",
    "cache_nbytes",
    "forward",
    "kv_bytes_per_token",
    "lm_head",
    "prefill_scan",
]


def kv_bytes_per_token(summary: dict) -> int:
    """``2 · layers · kv_heads · head_dim · bytes``: the keys and values one token adds.

    ``summary`` is ``LoadedModel.summary()`` (or a trace's ``model``); the element size is
    that of its ``dtype``, the dtype the cache is stored in (float32 when absent). An
    unknown dtype is a ``ValueError``.
    """
    name = str(summary.get("dtype", "float32")).replace("torch.", "")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must name a torch dtype, got {name[:40]!r}")
    el = dtype.itemsize
    return 2 * summary["num_layers"] * summary["num_kv_heads"] * summary["head_dim"] * el


def cache_nbytes(cache: DynamicCache) -> int:
    """Bytes held by the cache's key and value tensors (padding included)."""
    n = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, Tensor):
                n += t.numel() * t.element_size()
    return n


@dataclass
class Forward:
    """What one :func:`forward` returns.

    Attributes
    ----------
    hidden : (B, T, d) final normed hidden states of the fed positions
    attention : (L, B, H, S) float32 last-query attention over each layer's cache, S the longest
        layer, zero where a layer holds fewer slots; None without capture
    seconds : wall time of the model call
    lens : what the logit lens reads at the last position (residual stream, head outputs,
        attention metrics); None unless asked for
    """

    hidden: Tensor
    attention: Tensor | None
    seconds: float
    lens: LensCapture | None = None


def forward(
    model: torch.nn.Module,
    ids: Tensor,
    positions: Tensor,
    cache: DynamicCache | None,
    *,
    capture: bool = False,
    masks: list[Tensor | None] | None = None,
    lens: bool = False,
) -> Forward:
    """Run the decoder on new tokens with ``cache`` (updated in place).

    Parameters
    ----------
    model : a causal LM (its ``get_decoder()`` is called)
    ids, positions : (B, T) long token ids and their true positions (RoPE, learned positions)
    cache : the rows' cache, or None for a forward without one (prefill timing)
    capture : capture every layer's last-query attention
    masks : per layer, a (B, 1, T, S_l + T) boolean mask of the keys each query may see
        (:meth:`KVRows.masks`), replacing the model's mask; None entries keep the model's
    lens : also record what the logit lens reads (:class:`LensCapture`); captures attention
    """
    enable_capture(model)
    sink = AttentionSink(lens=True) if lens else AttentionSink() if capture else None
    kw: dict = {}
    if sink is not None:
        kw["semviz_sink"] = sink
    if masks is not None:
        kw["semviz_masks"] = masks
    t0 = time.perf_counter()
    hooks = lens_hooks(model) if lens else contextlib.nullcontext()
    with torch.inference_mode(), hooks:
        out = model.get_decoder()(
            input_ids=ids,
            position_ids=positions,
            cache=cache,
            use_cache=cache is not None,
            **kw,
        )
    seconds = time.perf_counter() - t0
    if sink is not None:
        sink.finish()
    attention = sink.stacked(align="left") if sink is not None and sink.rows else None
    recorded = LensCapture.of(sink, attention) if lens and attention is not None else None
    return Forward(out.last_hidden_state, attention, seconds, recorded)


def lm_head(model: torch.nn.Module, hidden: Tensor) -> Tensor:
    """(..., V) float32 logits of final hidden states (..., d).

    A bias-free linear head is computed as ``W · hᵀ``: for the few rows of a batched decode
    step CPU BLAS runs that product faster than ``F.linear`` (SmolLM2's (49152, 576) head,
    6 rows, one thread: 126 ms against 205 ms; one row takes 70 ms either way).
    """
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear and head.bias is None:
        flat = hidden.reshape(-1, hidden.shape[-1])  # (R, d)
        with torch.inference_mode():
            out = (head.weight @ flat.T).T  # (R, V)
        return out.reshape(*hidden.shape[:-1], -1).float()
    with torch.inference_mode():
        return head(hidden).float()


class KVRows:
    """``B`` rows' KV entries in one ``DynamicCache``, each with its own original positions.

    Parameters
    ----------
    cache : the shared cache; layer ``l`` is (B, H_kv, S_l, D) once filled
    pos : (B, L, W) long original positions per slot, -1 for padding (W >= every S_l)
    """

    def __init__(self, cache: DynamicCache, pos: Tensor) -> None:
        self.cache = cache
        self.pos = pos
        self.lengths = [_layer_length(cache, i) for i in range(pos.shape[1])]  # S_l per layer

    @classmethod
    def empty(cls, model: torch.nn.Module, batch: int) -> KVRows:
        """Rows with empty caches."""
        n_layers = int(model.config.num_hidden_layers)
        pos = torch.full((batch, n_layers, 0), -1, dtype=torch.long)
        return cls(new_cache(model), pos)

    @classmethod
    def of(cls, cache: DynamicCache, positions: list[Tensor]) -> KVRows:
        """One row (a decoder's cache) from its per-layer positions, each (S_l,) ascending."""
        w = max((p.numel() for p in positions), default=0)
        pos = torch.full((1, len(positions), w), -1, dtype=torch.long)
        for i, p in enumerate(positions):
            pos[0, i, : p.numel()] = p
        return cls(cache, pos)

    @classmethod
    def stack(cls, caches: Sequence[DynamicCache], positions: Sequence[list[Tensor]]) -> KVRows:
        """Rows made of one-row caches (decoders'), with their per-layer positions; a layer's
        rows are padded to its longest. The tensors are copied into one new cache."""
        rows = [cls.of(c, p) for c, p in zip(caches, positions, strict=True)]
        n_layers = rows[0].pos.shape[1]
        width = max(r.pos.shape[-1] for r in rows)
        pos = torch.full((len(rows), n_layers, width), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            pos[i, :, : r.pos.shape[-1]] = r.pos[0]
        data = []
        for layer in range(n_layers):
            s = max(r.lengths[layer] for r in rows)
            parts = [_pad_slots(c.layers[layer], s) for c in caches]
            keys = torch.cat([k for k, _ in parts])  # (B, H_kv, S_l, D)
            data.append((keys, torch.cat([v for _, v in parts])))
        return cls(DynamicCache(ddp_cache_data=data), pos)

    @property
    def batch(self) -> int:
        return self.pos.shape[0]

    @property
    def valid(self) -> Tensor:
        """(B, L, W) bool slots that hold an entry."""
        return self.pos >= 0

    def row_positions(self, row: int) -> list[Tensor]:
        """Row ``row``'s original positions per layer, each (n_l,) ascending."""
        return [p[p >= 0] for p in self.pos[row]]

    def masks(self, n_new: int) -> list[Tensor | None] | None:
        """Per layer (B, 1, T, S_l + T) bool: what each new query may see; None where no row
        has padding in that layer, and None overall when no layer has any."""
        valid = self.valid
        out: list[Tensor | None] = []
        causal = torch.tril(torch.ones(n_new, n_new, dtype=torch.bool))  # (T, T)
        for layer, s in enumerate(self.lengths):
            held = valid[:, layer, :s]  # (B, S_l)
            if bool(held.all()):
                out.append(None)
                continue
            b = held.shape[0]
            old = held[:, None, None, :].expand(b, 1, n_new, s)  # (B, 1, T, S_l)
            new = causal[None, None].expand(b, 1, n_new, n_new)  # (B, 1, T, T)
            out.append(torch.cat([old, new], dim=-1).to(self.pos.device))
        return None if all(m is None for m in out) else out

    def append(self, positions: Tensor) -> None:
        """Record the entries a forward appended: every row, every layer, ``positions`` (T,)."""
        t = positions.numel()
        if t == 0:
            return
        b, n_layers, _ = self.pos.shape
        lengths = torch.tensor(self.lengths, dtype=torch.long)  # (L,)
        width = int((lengths + t).max())
        pos = torch.full((b, n_layers, width), -1, dtype=torch.long)
        pos[:, :, : self.pos.shape[-1]] = self.pos
        cols = (lengths[:, None] + torch.arange(t)).expand(b, n_layers, t)  # (B, L, T)
        pos.scatter_(2, cols, positions.view(1, 1, t).expand(b, n_layers, t))
        self.pos = pos
        self.lengths = [s + t for s in self.lengths]

    def keep(self, keep: Tensor) -> None:
        """Keep the slots where ``keep`` (B, L, W) is True; pack each row's entries to the front.

        A layer where every row keeps every slot and has no padding is left untouched.
        """
        keep = keep & self.valid
        counts = keep.sum(-1)  # (B, L)
        # kept slots first, in slot (= position) order
        order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices  # (B, L, W)
        new_len = [int(n) for n in counts.max(0).values]
        width = max(new_len, default=0)
        cols = torch.arange(width)
        pos = self.pos.gather(2, order[..., :width])  # (B, L, W')
        pos = pos.masked_fill(cols >= counts[..., None], -1)
        for layer, (s, n) in enumerate(zip(self.lengths, new_len, strict=True)):
            lay = self.cache.layers[layer]
            if n == s and bool(keep[:, layer, :s].all()):
                continue
            idx = order[:, layer, :n].clamp(max=max(s - 1, 0))  # (B, S') padding: any held slot
            idx = idx.to(lay.keys.device)
            lay.keys = _gather_slots(lay.keys, idx)  # (B, H_kv, S', D), a new tensor
            lay.values = _gather_slots(lay.values, idx)
        self.pos = pos
        self.lengths = new_len

    def read_keys(self, row: int, layer: int, slots: Tensor) -> Tensor:
        """(m, H_kv, D) float32 keys of ``row`` at ``slots`` of ``layer`` (as cached, RoPE'd)."""
        keys = self.cache.layers[layer].keys
        return keys[row].index_select(1, slots.to(keys.device)).transpose(0, 1).float().cpu()

    def write_keys(self, row: int, layer: int, slots: Tensor, keys: Tensor) -> None:
        """Overwrite ``row``'s keys at ``slots`` of ``layer`` with ``keys`` (m, H_kv, D)."""
        dst = self.cache.layers[layer].keys
        with torch.inference_mode():
            dst[row][:, slots.to(dst.device)] = keys.transpose(0, 1).to(dst.device, dst.dtype)


def _layer_length(cache: DynamicCache, layer: int) -> int:
    """Slots layer ``layer`` of ``cache`` holds (0 before its first forward)."""
    if layer >= len(cache.layers):
        return 0
    keys = getattr(cache.layers[layer], "keys", None)
    return int(keys.shape[-2]) if isinstance(keys, Tensor) and keys.dim() == 4 else 0


def _pad_slots(layer: Any, slots: int) -> tuple[Tensor, Tensor]:
    """A one-row cache layer's keys and values, zero-padded to ``slots`` slots."""
    k, v = layer.keys, layer.values  # (1, H_kv, S, D)
    extra = slots - k.shape[-2]
    if extra:
        k = torch.cat([k, k.new_zeros(*k.shape[:2], extra, k.shape[-1])], dim=-2)
        v = torch.cat([v, v.new_zeros(*v.shape[:2], extra, v.shape[-1])], dim=-2)
    return k, v


def _gather_slots(t: Tensor, idx: Tensor) -> Tensor:
    """``t`` (B, H, S, D) at slots ``idx`` (B, S') per row → (B, H, S', D)."""
    b, h, _, d = t.shape
    with torch.inference_mode():
        return t.gather(2, idx[:, None, :, None].expand(b, h, idx.shape[1], d))


def prefill_scan(
    lm,
    lengths: list[int],
    *,
    repeats: int = 2,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[int], list[float]]:
    """Measured prefill seconds (best of ``repeats``) for random prompts of each length."""
    vocab = lm.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    out_n, out_s = [], []
    total = len(lengths) * repeats
    done = 0
    for n in lengths:
        ids = torch.randint(100, vocab, (1, n), generator=gen).to(lm.device)  # (1, n)
        pos = torch.arange(n, device=lm.device)[None]  # (1, n)
        best = float("inf")
        for _ in range(repeats):
            best = min(best, forward(lm.model, ids, pos, None).seconds)
            done += 1
            if on_progress is not None:
                on_progress(done, total)
        out_n.append(n)
        out_s.append(best)
    return out_n, out_s
