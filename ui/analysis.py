"""Computations the pages need beyond the trace: gravity terms, prefill timing."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from semviz import gravity as grav
from semviz.sampling import PruneParams
from semviz.trace import StepRecord, Trace


def gravity_terms(
    model: torch.nn.Module,
    trace: Trace,
    i: int,
    token_id: int,
    params: PruneParams,
    hidden: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The terms ``m_j · sim(w, t_j)`` of ``G(w)`` for token ``w`` at step ``i``.

    Returns the original positions (S,) and the terms (S,); their sum is the raw G(w)
    (before the vocabulary-wide z-score).
    """
    rec: StepRecord = trace.steps[i]
    pos = rec.cache_positions.long()  # (S,)
    seq = torch.tensor(trace.prompt_ids + [s.token_id for s in trace.steps[:i]], dtype=torch.long)
    ids = seq[pos.clamp(max=seq.numel() - 1)]
    space = params.gravity_space if hidden is not None else "embedding"
    if space == "hidden":
        ctx = hidden[pos.clamp(max=hidden.shape[0] - 1)].float()  # (S, d)
    else:
        ctx = grav.context_vectors(model, "embedding", context_ids=ids)  # (S, d)
    source = params.gravity_mass
    att = rec.attention.float() if rec.attention is not None else None
    if source in ("attention", "ema") and att is None:
        source = "uniform"
    if source == "ema":
        source = "attention"  # one step's view: the EMA's newest term
    mass = grav.context_mass(
        source,
        attention=att,
        layers=params.gravity_layers,
        heads=params.gravity_heads,
        context_ids=ids,
        embed=model.get_input_embeddings().weight if source == "norm" else None,
        n=ctx.shape[0],
    )  # (S,)
    w = grav.candidate_matrix(model, space, params.gravity_sim)[token_id]  # (d,)
    c = (
        ctx / ctx.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        if params.gravity_sim == "cosine"
        else ctx
    )
    terms = mass * (c @ w)  # (S,)
    return pos.numpy(), terms.detach().float().numpy()


def prefill_scan(
    lm,
    lengths: list[int],
    *,
    repeats: int = 2,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[int], list[float]]:
    """Measured prefill seconds (best of ``repeats``) for prompts of each length."""
    vocab = lm.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    out_n, out_s = [], []
    total = len(lengths) * repeats
    done = 0
    for n in lengths:
        ids = torch.randint(100, vocab, (1, n), generator=gen)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.inference_mode():
                lm.model.get_decoder()(input_ids=ids, use_cache=False)
            best = min(best, time.perf_counter() - t0)
            done += 1
            if on_progress is not None:
                on_progress(done, total)
        out_n.append(n)
        out_s.append(best)
    return out_n, out_s


def bytes_per_token(summary: dict, element_size: int) -> int:
    """``2 · layers · kv_heads · head_dim · bytes``: keys and values of one token."""
    return 2 * summary["num_layers"] * summary["num_kv_heads"] * summary["head_dim"] * element_size
