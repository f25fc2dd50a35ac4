"""Inside the choice: the logit lens, direct logit attribution and entropix's attention metrics.

Everything here reads a step's record (``StepRecord.residual``, ``residual_last``,
``head_out``, ``attn_metrics``, written at decode time by the decoder) and the model's own
final norm and LM head; nothing reruns the model, so a trace loaded from disk works as well
as a live run.

- **The logit lens** (:func:`logit_lens`): the residual stream at the last position after the
  embedding and after each block, each through the final norm and the LM head. The last row
  is the model's own distribution: it is computed from the float32 ``residual_last``, the
  other rows from the float16 ``residual``.
- **Direct logit attribution** (:func:`block_attribution`, :func:`head_attribution`): the
  residual at the last layer is a sum of the embedding, each attention block's output and each
  MLP block's output. The final norm is linearised at that residual as LLM Transparency Tool
  and TransformerLens do: its scale (``1/rms``, or ``1/std`` after centring for a LayerNorm)
  is frozen at the final residual, so the terms, plus the norm's and head's biases, sum to
  the token's logit exactly. An attention block's output is its heads' outputs before the
  output projection (recorded) times that projection; the MLP's is what is left of the block.
  A norm on the attention block's output (Gemma 3) is linearised the same way at that output
  for the per-head split.
- **Caches**: a step's lens summary (:func:`lens_step`, top tokens, the chosen token's rank
  and probability, KL from the final distribution, per layer) is cached, so the layers ×
  steps grid (:func:`lens_grid`) computes each step once and afterwards only stacks them.

Examples
--------
>>> from semviz import Decoder, DecodeSettings, PruneParams
>>> dec = Decoder(lm, "The capital of France is", PruneParams(temperature=0),
...               DecodeSettings(chat=False, max_new_tokens=1))
>>> rec = dec.step()
>>> logit_lens(lm, rec).shape[0] == lm.summary()["num_layers"] + 1  # the embedding, each block
True
>>> int(lens_step(lm, rec).chosen_rank[-1])  # greedy: the last layer's top token is the pick
1
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from semviz.model.capture import decoder_layers
from semviz.output.trace import ATTENTION_METRICS, StepRecord, Trace

__all__ = [
    "ATTENTION_METRICS",
    "BlockAttribution",
    "BlockTokens",
    "HeadAttribution",
    "LensError",
    "LensGrid",
    "LensStep",
    "attention_series",
    "block_attribution",
    "block_tokens",
    "clear_cache",
    "head_attribution",
    "lens_grid",
    "lens_step",
    "logit_lens",
    "runner_up",
]

TOP = 10  # top tokens kept per layer in a step's summary
CACHE_STEPS = 4096  # step summaries kept (a few KB each)
GRID_CHUNK = 8  # steps projected per matrix product when the grid computes


class LensError(ValueError):
    """A step or model the lens cannot read; the message is one sentence for the user."""


# -- the model's anatomy ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Norm:
    """A norm frozen at one input ``x``: ``norm(x) = scale ⊙ P x + bias`` exactly, ``P``
    centring (LayerNorm) or the identity (RMSNorm). Applying ``scale ⊙ P`` to each part of
    ``x`` is the linearisation whose parts sum to ``norm(x) - bias``."""

    scale: Tensor  # (..., d)
    centre: bool
    bias: Tensor | None  # (d,)

    def apply(self, parts: Tensor) -> Tensor:
        """(..., d) parts → (..., d) their images under the frozen map (no bias)."""
        if self.centre:
            parts = parts - parts.mean(-1, keepdim=True)
        return parts * self.scale


def _unwrap(lm) -> torch.nn.Module:
    return getattr(lm, "model", lm)


def _model_name(model: torch.nn.Module) -> str:
    return type(model).__name__


def _final_norm(model: torch.nn.Module) -> torch.nn.Module:
    dec = model.get_decoder()
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        m = getattr(dec, name, None)
        if isinstance(m, torch.nn.Module):
            return m
    raise LensError(
        f"{_model_name(model)} has no final norm semviz can find, so its logit lens is not "
        "available."
    )


def _freeze(norm: torch.nn.Module, x: Tensor, what: str) -> _Norm:
    """``norm`` frozen at ``x`` (..., d), checked against the module's own output.

    A LayerNorm centres and divides by the standard deviation; an RMSNorm divides by the root
    mean square and multiplies by ``w`` (Llama, Qwen2) or ``1 + w`` (Gemma).
    """
    x = x.float()
    w = getattr(norm, "weight", None)
    with torch.inference_mode():
        want = norm(x.to(w.dtype if isinstance(w, Tensor) else x.dtype)).float()
    w = torch.ones(x.shape[-1]) if w is None else w.detach().float().cpu()
    if isinstance(norm, torch.nn.LayerNorm):
        var = x.var(-1, unbiased=False, keepdim=True)
        b = None if norm.bias is None else norm.bias.detach().float().cpu()
        candidates = [_Norm(w / (var + norm.eps).sqrt(), True, b)]
    else:
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        inv = (x.square().mean(-1, keepdim=True) + float(eps)).rsqrt()
        candidates = [_Norm(w * inv, False, None), _Norm((1.0 + w) * inv, False, None)]
    tol = 1e-4 if want.dtype == torch.float32 and _norm_dtype(norm) == torch.float32 else 2e-2
    for c in candidates:
        got = c.apply(x) + (0.0 if c.bias is None else c.bias)
        if float((got - want).abs().max()) <= tol * max(1.0, float(want.abs().max())):
            return c
    raise LensError(
        f"the {what} of this model ({type(norm).__name__}) is neither a LayerNorm nor an "
        "RMSNorm semviz knows, so direct logit attribution is not available for it."
    )


def _norm_dtype(norm: torch.nn.Module) -> torch.dtype:
    w = getattr(norm, "weight", None)
    return w.dtype if isinstance(w, Tensor) else torch.float32


@dataclass(frozen=True)
class _Attention:
    """One block's attention output path: heads (H·D) → projection → optional norm."""

    weight: Tensor  # (d, H·D) float32
    bias: Tensor | None  # (d,)
    post_norm: torch.nn.Module | None  # a norm on the block's output before the residual add


def _attention_path(model: torch.nn.Module, layer: int, blocks=None) -> _Attention:
    block = (decoder_layers(model) if blocks is None else blocks)[layer]
    attn = next((getattr(block, n) for n in ("self_attn", "attn") if hasattr(block, n)), None)
    proj = None
    for n in ("o_proj", "c_proj", "out_proj", "dense"):
        proj = getattr(attn, n, None) if attn is not None else None
        if proj is not None:
            break
    if proj is None:
        raise LensError(
            f"{_model_name(model)}'s attention has no output projection semviz knows, so its "
            "blocks cannot be split into attention and MLP."
        )
    if type(proj).__name__ == "Conv1D":  # GPT-2: y = x W + b with W (H·D, d)
        weight = proj.weight.detach().float().t()
    else:
        weight = proj.weight.detach().float()  # (d, H·D)
    bias = None if getattr(proj, "bias", None) is None else proj.bias.detach().float()
    # Gemma 2 and 3 norm the attention output before adding it (their pre-MLP norm is then
    # pre_feedforward_layernorm); in Llama post_attention_layernorm is the pre-MLP norm
    post = None
    if hasattr(block, "pre_feedforward_layernorm"):
        post = getattr(block, "post_attention_layernorm", None)
    return _Attention(weight.cpu(), None if bias is None else bias.cpu(), post)


def _lm_head(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_output_embeddings()


def _unembed(model: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    head = _lm_head(model)
    b = getattr(head, "bias", None)
    return head.weight.detach(), None if b is None else b.detach().float()


# -- reading a record ---------------------------------------------------------------------------


def _check(model: torch.nn.Module, rec: StepRecord) -> None:
    if rec.residual is None or rec.residual_last is None:
        raise LensError(
            f"step {rec.index} has no lens record: it was decoded with the lens off "
            "(DecodeSettings(lens=False), or --lens off)."
        )
    n_layers = len(decoder_layers(model))
    d = int(model.config.hidden_size) if hasattr(model.config, "hidden_size") else None
    got = tuple(rec.residual.shape)
    if got[0] != n_layers + 1 or (d is not None and got[1] != d):
        raise LensError(
            f"step {rec.index} was recorded with {got[0] - 1} layers of width {got[1]}, but "
            f"this model has {n_layers} of width {d}: use the model the trace was made with."
        )


def _rows(rec: StepRecord) -> Tensor:
    """(L+1, d) float32 residual rows, the last one exact (``residual_last``)."""
    rows = rec.residual.float().clone()
    rows[-1] = rec.residual_last.float()
    return rows


def _logits(model: torch.nn.Module, rows: Tensor) -> Tensor:
    """(R, V) float32 logits of residual rows (R, d) through the final norm and LM head, the
    same modules and dtype the model's own forward uses."""
    head = _lm_head(model)
    norm = _final_norm(model)
    dtype = head.weight.dtype
    dev = head.weight.device
    with torch.inference_mode():
        return head(norm(rows.to(dev, dtype))).float().cpu()


def logit_lens(lm, step_record: StepRecord) -> Tensor:
    """The logit lens of one step: (L+1, V) float32 log-probabilities.

    Row 0 is the embedding output and row ``l`` the output of block ``l``, each through the
    model's final norm and LM head; the last row is the model's own distribution.

    Parameters
    ----------
    lm : a ``LoadedModel`` (or its model) with the trace's architecture
    step_record : a step decoded with the lens on (``DecodeSettings.lens``), live or loaded

    Examples
    --------
    >>> lp = logit_lens(lm, dec.trace.steps[0])  # doctest: +SKIP
    >>> lp.shape, float(lp[-1].exp().sum())  # doctest: +SKIP
    (torch.Size([31, 49152]), 1.0)
    """
    model = _unwrap(lm)
    _check(model, step_record)
    return torch.log_softmax(_logits(model, _rows(step_record)), dim=-1)


# -- a step's summary and the grid ----------------------------------------------------------------


@dataclass(frozen=True)
class LensStep:
    """One step's lens, layer by layer (L+1 rows: the embedding, then each block).

    Attributes
    ----------
    top_ids, top_probs : (L+1, k) the k most likely tokens at each layer and their probability
    chosen_rank : (L+1,) 1-based rank of the token the step chose (1: the layer's top token)
    chosen_prob : (L+1,) its probability at each layer
    kl : (L+1,) KL(final ‖ layer) in nats: how far the layer's distribution is from the last
    entropy : (L+1,) entropy of each layer's distribution, nats
    """

    step: int
    token_id: int
    top_ids: np.ndarray
    top_probs: np.ndarray
    chosen_rank: np.ndarray
    chosen_prob: np.ndarray
    kl: np.ndarray
    entropy: np.ndarray

    @property
    def layers(self) -> int:
        """Rows: the embedding and every block."""
        return len(self.chosen_rank)

    @property
    def decided(self) -> int | None:
        """The first row from which the chosen token stays the top token, or None."""
        top = self.chosen_rank == 1
        if not top[-1]:
            return None
        below = np.nonzero(~top)[0]
        return 0 if below.size == 0 else int(below[-1]) + 1


def _summaries(logits: Tensor, token_ids: Sequence[int], n_rows: int, k: int) -> list[tuple]:
    """Per step (``n_rows`` consecutive rows of ``logits`` each): top-k, the chosen token's
    rank and probability, KL from the step's last row and entropy.

    Every step is read at once, and the sums over the vocabulary are batched dot products
    (KL(f ‖ l) = Σ p_f·lp_f − Σ p_f·lp_l, entropy −Σ p·lp), so no (rows, V) temporary is
    made beyond the log-probabilities and the probabilities: this is most of the grid's
    cost after the LM-head product itself.
    """
    n = len(token_ids)
    lp = torch.log_softmax(logits, dim=-1)  # (R, V)
    top_lp, top_ids = lp.topk(k, dim=-1)  # (R, k)
    blocks = lp.view(n, n_rows, -1)  # (n, L+1, V)
    tok = torch.as_tensor(list(token_ids), dtype=torch.long).view(n, 1, 1).expand(n, n_rows, 1)
    chosen = blocks.gather(-1, tok)  # (n, L+1, 1)
    rank = (blocks > chosen).sum(-1, dtype=torch.int32) + 1  # (n, L+1); int32: twice as fast
    p = lp.exp().view(n, n_rows, -1)
    plogp = (p.unsqueeze(-2) @ blocks.unsqueeze(-1)).view(n, n_rows)  # Σ p·lp per row
    final_p = p[:, -1:, :]  # (n, 1, V)
    cross = (blocks @ final_p.transpose(1, 2)).view(n, n_rows)  # Σ p_f·lp_l
    kl = cross[:, -1:] - cross  # the same product for both terms: the last row's KL is 0
    ent = -plogp
    if not (torch.isfinite(kl).all() and torch.isfinite(ent).all()):
        # a -inf log-probability (a masked token): 0·log 0 is 0, which the dots cannot see
        safe = torch.where(torch.isfinite(blocks), blocks, torch.zeros(()))
        ent = -(p * safe).sum(-1)
        kl = (final_p * (safe[:, -1:, :] - safe)).sum(-1)
    kl, ent = kl.clamp_min(0.0), ent.clamp_min(0.0)
    top_ids = top_ids.view(n, n_rows, k).numpy().astype(np.int64)
    top_p = top_lp.exp().view(n, n_rows, k).numpy()
    rank, chosen = rank.numpy().astype(np.int64), chosen.view(n, n_rows).exp().numpy()
    kl, ent = kl.numpy(), ent.numpy()
    return [(top_ids[s], top_p[s], rank[s], chosen[s], kl[s], ent[s]) for s in range(n)]


class _Cache:
    """Step summaries by (model, record) identity, least recently used out first. An entry
    holds its record, so the identity cannot be reused while it is cached."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[tuple[int, int, str], tuple[object, object]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, model, rec, kind: str):
        key = (id(model), id(rec), kind)
        with self._lock:
            hit = self._d.get(key)
            if hit is None or hit[0] is not rec:
                return None
            self._d.move_to_end(key)
            return hit[1]

    def put(self, model, rec, kind: str, value) -> None:
        with self._lock:
            self._d[(id(model), id(rec), kind)] = (rec, value)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


_cache = _Cache(CACHE_STEPS)


def clear_cache() -> None:
    """Forget every cached step summary (the benchmarks time the first computation)."""
    _cache.clear()


def _compute_steps(model, recs: Sequence[StepRecord], k: int) -> list[LensStep]:
    rows = torch.cat([_rows(r) for r in recs])  # (n·(L+1), d)
    n_rows = recs[0].residual.shape[0]
    parts = _summaries(_logits(model, rows), [r.token_id for r in recs], n_rows, k)
    return [
        LensStep(r.index, r.token_id, *p)  # type: ignore[arg-type]
        for r, p in zip(recs, parts, strict=True)
    ]


def lens_step(lm, rec: StepRecord, *, k: int = TOP) -> LensStep:
    """The lens summary of one step (cached): top tokens, the chosen token's rank and
    probability, KL from the final distribution and entropy, per layer."""
    model = _unwrap(lm)
    hit = _cache.get(model, rec, f"step{k}")
    if hit is not None:
        return hit
    _check(model, rec)
    out = _compute_steps(model, [rec], k)[0]
    _cache.put(model, rec, f"step{k}", out)
    return out


@dataclass(frozen=True)
class LensGrid:
    """The classic grid: layers × steps, each cell the layer's top token and its probability.

    Attributes
    ----------
    steps : (n,) step indices (columns)
    top_id, top_prob : (L+1, n) the top token and its probability, rows the embedding then
        each block
    chosen_prob, chosen_rank : (L+1, n) the probability and 1-based rank of the token the
        step chose
    """

    steps: np.ndarray
    top_id: np.ndarray
    top_prob: np.ndarray
    chosen_prob: np.ndarray
    chosen_rank: np.ndarray


def lens_grid(lm, steps: Sequence[StepRecord], *, k: int = TOP) -> LensGrid:
    """The grid for ``steps`` (cached per step; the steps not yet seen are projected
    :data:`GRID_CHUNK` at a time). Steps decoded with the lens off are refused."""
    model = _unwrap(lm)
    kind = f"step{k}"
    found: list[LensStep | None] = [_cache.get(model, r, kind) for r in steps]
    todo = [r for r, f in zip(steps, found, strict=True) if f is None]
    for r in todo:
        _check(model, r)
    done: dict[int, LensStep] = {}
    for i in range(0, len(todo), GRID_CHUNK):
        chunk = todo[i : i + GRID_CHUNK]
        for r, s in zip(chunk, _compute_steps(model, chunk, k), strict=True):
            _cache.put(model, r, kind, s)
            done[id(r)] = s
    cols = [f if f is not None else done[id(r)] for r, f in zip(steps, found, strict=True)]
    if not cols:
        empty = np.zeros((0, 0))
        return LensGrid(np.zeros(0, dtype=np.int64), empty, empty, empty, empty)
    return LensGrid(
        steps=np.array([c.step for c in cols], dtype=np.int64),
        top_id=np.stack([c.top_ids[:, 0] for c in cols], axis=1),
        top_prob=np.stack([c.top_probs[:, 0] for c in cols], axis=1),
        chosen_prob=np.stack([c.chosen_prob for c in cols], axis=1),
        chosen_rank=np.stack([c.chosen_rank for c in cols], axis=1),
    )


# -- direct logit attribution -------------------------------------------------------------------


def runner_up(rec: StepRecord) -> int:
    """The most likely token other than the one the step chose (by raw logit)."""
    ids = rec.cand_ids.tolist()
    return int(next(i for i in ids if i != rec.token_id)) if len(ids) > 1 else rec.token_id


@dataclass(frozen=True)
class BlockAttribution:
    """What each block wrote into the final residual, read as each token's logit.

    Attributes
    ----------
    token_ids : (T,) the tokens attributed (default: the chosen one and the runner-up)
    embedding : (T,) the embedding's term
    attn, mlp : (T, L) each block's attention and MLP terms
    bias : (T,) the final norm's and the LM head's biases (0 for an RMSNorm without head bias)
    logit : (T,) the model's logit (the sum of all the terms)
    """

    token_ids: np.ndarray
    embedding: np.ndarray
    attn: np.ndarray
    mlp: np.ndarray
    bias: np.ndarray
    logit: np.ndarray

    def total(self) -> np.ndarray:
        """(T,) the terms summed: equals ``logit`` up to float rounding."""
        return self.embedding + self.attn.sum(1) + self.mlp.sum(1) + self.bias


def _attn_out(path: _Attention, z: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
    """Per head (H, d) and bias (d,) parts of an attention block's output, and the output
    (d,), all as the residual receives them (through the block's post-attention norm, frozen
    at the output, when there is one)."""
    H = z.shape[0]
    w = path.weight.view(path.weight.shape[0], H, -1)  # (d, H, D)
    per_head = torch.einsum("ehd,hd->he", w, z.float())  # (H, d)
    bias = path.bias
    pre = per_head.sum(0) + (0.0 if bias is None else bias)  # (d,)
    if path.post_norm is None:
        return per_head, bias, pre
    frozen = _freeze(path.post_norm, pre, "post-attention norm")
    with torch.inference_mode():
        dt = _norm_dtype(path.post_norm)
        out = path.post_norm(pre.to(dt)).float()
    per_head = frozen.apply(per_head)
    bias_img = None if bias is None else frozen.apply(bias)
    if frozen.bias is not None:
        bias_img = frozen.bias if bias_img is None else bias_img + frozen.bias
    return per_head, bias_img, out


def _parts(model, rec: StepRecord) -> tuple[Tensor, Tensor, Tensor, _Norm]:
    """The final residual's parts: embedding (d,), attention (L, d), MLP (L, d), and the
    final norm frozen at the final residual (cached per step: every attribution reads them)."""
    hit = _cache.get(model, rec, "parts")
    if hit is not None:
        return hit
    _check(model, rec)
    if rec.head_out is None:
        raise LensError(
            f"step {rec.index} has no head outputs recorded, so its blocks cannot be split "
            "into attention and MLP."
        )
    rows = _rows(rec)  # (L+1, d)
    block = rows[1:] - rows[:-1]  # (L, d)
    blocks = decoder_layers(model)
    attn = torch.stack(
        [
            _attn_out(_attention_path(model, i, blocks), rec.head_out[i])[2]
            for i in range(block.shape[0])
        ]
    )
    frozen = _freeze(_final_norm(model), rows[-1], "final norm")
    out = (rows[0], attn, block - attn, frozen)
    _cache.put(model, rec, "parts", out)
    return out


def _read(model, token_ids: Sequence[int], frozen: _Norm, parts: Tensor) -> Tensor:
    """(T, P) the direct logit terms of ``parts`` (P, d) for ``token_ids``."""
    w, _ = _unembed(model)
    u = w[torch.as_tensor(list(token_ids), dtype=torch.long)].float().cpu()  # (T, d)
    return u @ frozen.apply(parts).T


def _bias_terms(model, token_ids: Sequence[int], frozen: _Norm) -> Tensor:
    w, b = _unembed(model)
    ids = torch.as_tensor(list(token_ids), dtype=torch.long)
    out = torch.zeros(len(ids))
    if frozen.bias is not None:
        out += w[ids].float().cpu() @ frozen.bias
    if b is not None:
        out += b.cpu()[ids]
    return out


def block_attribution(
    lm, rec: StepRecord, token_ids: Sequence[int] | None = None
) -> BlockAttribution:
    """Each attention and MLP block's direct contribution to each token's logit.

    The final norm is linearised at the final residual (its scale frozen there), so
    ``embedding + attn.sum() + mlp.sum() + bias`` equals the token's logit.
    """
    model = _unwrap(lm)
    ids = [rec.token_id, runner_up(rec)] if token_ids is None else [int(t) for t in token_ids]
    emb, attn, mlp, frozen = _parts(model, rec)
    L = attn.shape[0]
    terms = _read(model, ids, frozen, torch.cat([emb[None], attn, mlp]))  # (T, 1 + 2L)
    logit = _logits(model, rec.residual_last[None])[0, ids]
    return BlockAttribution(
        token_ids=np.array(ids, dtype=np.int64),
        embedding=terms[:, 0].numpy(),
        attn=terms[:, 1 : 1 + L].numpy(),
        mlp=terms[:, 1 + L :].numpy(),
        bias=_bias_terms(model, ids, frozen).numpy(),
        logit=logit.numpy(),
    )


@dataclass(frozen=True)
class HeadAttribution:
    """One layer's attention block split by head, read as each token's logit.

    Attributes
    ----------
    layer : the block
    token_ids : (T,)
    heads : (T, H) each head's term
    bias : (T,) the output projection's bias (and the post-attention norm's), 0 without
    """

    layer: int
    token_ids: np.ndarray
    heads: np.ndarray
    bias: np.ndarray

    def total(self) -> np.ndarray:
        """(T,) the block's attention term: the heads and the bias summed."""
        return self.heads.sum(1) + self.bias


def head_attribution(
    lm, rec: StepRecord, layer: int, token_ids: Sequence[int] | None = None
) -> HeadAttribution:
    """Layer ``layer``'s heads' direct contributions to each token's logit; they sum (with
    the bias) to that layer's ``BlockAttribution.attn`` term."""
    model = _unwrap(lm)
    ids = [rec.token_id, runner_up(rec)] if token_ids is None else [int(t) for t in token_ids]
    _check(model, rec)
    n_layers = rec.residual.shape[0] - 1
    if not 0 <= int(layer) < n_layers:
        raise LensError(f"layer must be in [0, {n_layers - 1}], got {layer}")
    if rec.head_out is None:
        raise LensError(f"step {rec.index} has no head outputs recorded.")
    per_head, bias, _ = _attn_out(_attention_path(model, int(layer)), rec.head_out[int(layer)])
    frozen = _freeze(_final_norm(model), _rows(rec)[-1], "final norm")
    heads = _read(model, ids, frozen, per_head)  # (T, H)
    b = torch.zeros(len(ids)) if bias is None else _read(model, ids, frozen, bias[None])[:, 0]
    return HeadAttribution(int(layer), np.array(ids, dtype=np.int64), heads.numpy(), b.numpy())


@dataclass(frozen=True)
class BlockTokens:
    """The tokens each part of the residual pushed up and down most (its direct effect on
    every logit through the frozen final norm).

    Attributes
    ----------
    names : (P,) "embedding", "attn 0", "mlp 0", "attn 1", …
    promoted, promoted_by : (P, k) token ids and their logit terms, largest first
    suppressed, suppressed_by : (P, k) token ids and their logit terms, most negative first
    """

    names: list[str]
    promoted: np.ndarray
    promoted_by: np.ndarray
    suppressed: np.ndarray
    suppressed_by: np.ndarray


def block_tokens(lm, rec: StepRecord, *, k: int = 8) -> BlockTokens:
    """For the embedding and each attention and MLP block, the ``k`` tokens it promoted and
    suppressed most (cached per step)."""
    model = _unwrap(lm)
    hit = _cache.get(model, rec, f"tokens{k}")
    if hit is not None:
        return hit
    emb, attn, mlp, frozen = _parts(model, rec)
    L = attn.shape[0]
    parts = torch.cat([emb[None], torch.stack([attn, mlp], 1).reshape(2 * L, -1)])  # (P, d)
    names = ["embedding"] + [f"{kind} {i}" for i in range(L) for kind in ("attn", "mlp")]
    w, _ = _unembed(model)
    with torch.inference_mode():
        effect = frozen.apply(parts).to(w.dtype) @ w.T  # (P, V)
    effect = effect.float()
    up = effect.topk(k, dim=-1)
    down = effect.topk(k, dim=-1, largest=False)
    out = BlockTokens(
        names, up.indices.numpy(), up.values.numpy(), down.indices.numpy(), down.values.numpy()
    )
    _cache.put(model, rec, f"tokens{k}", out)
    return out


# -- attention metrics over a run ------------------------------------------------------------------


def attention_series(trace: Trace, *, layer: int | None = -1) -> dict[str, np.ndarray]:
    """Per step, each :data:`ATTENTION_METRICS` averaged over heads, plus entropix's
    ``head_spread``: the variance over heads of the attention entropy (entropix calls it the
    attention varentropy).

    ``layer``: one layer (entropix reads the last, -1, the default) or None for the mean
    over every layer. Steps recorded without metrics are NaN.
    """
    n = len(trace.steps)
    out = {name: np.full(n, np.nan) for name in (*ATTENTION_METRICS, "head_spread")}
    for i, rec in enumerate(trace.steps):
        m = rec.attn_metrics
        if m is None:
            continue
        for name in ATTENTION_METRICS:
            t = m[name].double()  # (L, H)
            t = t.mean(0) if layer is None else t[layer]  # (H,)
            out[name][i] = float(t.mean())
        ent = m["entropy"].double()
        spread = ent.var(-1, unbiased=False)  # (L,) over heads
        out["head_spread"][i] = float(spread.mean() if layer is None else spread[layer])
    return out
