"""The pull: the seed's potential ``G(w) = Σ_i m_i·sim(w, t_i)`` towards the story so far.

:func:`context_pull` is the one place that turns a context into the masses ``m_i`` and the
pull vector ``Σ_i m_i t̂_i``; :class:`Pull` projects it on every candidate (one ``(V, d)``
product, :mod:`semviz.gravity.projection`), z-scores it over the vocabulary, so ``λ = 1``
means "one standard deviation of gravity is worth one nat", and applies the guards.

What gets mass (:func:`mass_mask`). Attention parks much of its weight on the first token and
on chat-template tokens, which say nothing about the story. By default the first
``gravity_sinks`` positions, special and template tokens and the system prompt get none
(``gravity_skip_template``), and ``gravity_anchor`` picks the story: the user's prompt only
(``"prompt"``: the feedback loop in which generated words pull towards themselves cannot
start), everything (``"context"``) or the last ``gravity_window`` positions (``"window"``).
Among the positions that may pull, the mass source (:mod:`semviz.gravity.masses`) weighs them.

Spaces. ``"embedding"``: candidates ``E[w]`` against context ``E[t_i]`` (input embeddings).
``"hidden"``: candidates are the output embeddings (``lm_head`` rows) and each context
position is the final normed hidden state ``h_i`` read there: what the context led the model
to expect next. ``"contextual"``: the same output embeddings against ``h_{i-1}``, the state
from which ``t_i`` was predicted: the model's in-context reading of the token itself. Both
sides always live in one space.

With ``gravity_attract_only`` the pull is ``max(z - gravity_floor, 0)``: only tokens well above
the vocabulary's mean are pulled, and nothing is pushed (the signed z-score pushes function
words away from a content-word topic, and the text loses its grammar).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from semviz.gravity.context import (
    GENERATED,
    USER,
    GravityContext,
    positions_of,
    trace_context,
)
from semviz.gravity.guards import copy_guard, ngram_guard
from semviz.gravity.kinds import GravityKind, GravityOut, GravityStep, register_kind
from semviz.gravity.masses import get_mass
from semviz.gravity.projection import (
    candidate_matrix,
    fuses_with_lm_head,
    logits_and_gravity,
    normalize_gravity,
    project,
    unit_rows,
)

__all__ = ["FIRST_GRAVITY", "ContextPull", "Pull", "context_pull", "mass_mask", "trace_pulls"]

# the first gravity semviz shipped: attention mass over every cached token, no exclusions
FIRST_GRAVITY = {
    "gravity_kind": "pull",
    "gravity_mass": "attention",
    "gravity_anchor": "context",
    "gravity_sinks": 0,
    "gravity_skip_template": False,
    "gravity_ngram": 0,
    "gravity_copy_cos": 0.0,
    "gravity_attract_only": False,
    "gravity_space": "embedding",
    "gravity_sim": "cosine",
}


@dataclass
class ContextPull:
    """:func:`context_pull`'s answer.

    Attributes
    ----------
    positions : (S,) the positions the masses sit on.
    mass : (S,) ``m_i``, summing to 1 (all zero when no position may pull).
    pull : (d,) ``Σ_i m_i t̂_i`` (cosine) or ``Σ_i m_i t_i`` (dot).
    ema : what the mass source carries to the next step (the attention EMA by position,
        (T,), for mass ``ema``), else None.
    """

    positions: Tensor
    mass: Tensor
    pull: Tensor
    ema: Tensor | None = None


def mass_mask(params: Any, ctx: GravityContext) -> Tensor:
    """Which of ``ctx``'s positions may carry mass under ``params``. ``(S,)`` bool"""
    T = int(ctx.ids.numel())
    pos = positions_of(ctx)
    if ctx.roles is not None:
        roles = ctx.roles.to(torch.int8)
    else:
        n = T if ctx.n_prompt is None else int(ctx.n_prompt)
        roles = torch.full((n,), USER, dtype=torch.int8)
    P = roles.numel()
    role = torch.full((pos.numel(),), GENERATED, dtype=torch.int8)
    inside = pos < P
    role[inside] = roles[pos[inside]]
    ok = pos >= params.gravity_sinks
    if params.gravity_skip_template:
        ok &= (role == USER) | (role == GENERATED)
    if params.gravity_anchor == "prompt":
        ok &= inside
    elif params.gravity_anchor == "window":
        ok &= pos >= T - params.gravity_window
    if params.gravity_space == "contextual":
        ok &= pos >= 1  # h_{i-1} does not exist for the first position
    return ok


def context_pull(model: torch.nn.Module, params: Any, ctx: GravityContext) -> ContextPull:
    """The masses of ``ctx``'s positions and the pull vector they make: THE gravity context.

    Parameters
    ----------
    model : the LM (for the embedding space, any module with ``get_input_embeddings()``).
    params : a :class:`~semviz.sampling.PruneParams` or its ``gravity_params``.
    ctx : the step's :class:`GravityContext`.

    Attention is rounded to float16 before it becomes mass, the precision a trace records
    it in, so a replay of the trace computes the same masses as the live run.
    """
    pos = positions_of(ctx)  # (S,)
    ids = ctx.ids.long().flatten()[pos]  # (S,)
    ok = mass_mask(params, ctx)  # (S,)
    src = get_mass(params.gravity_mass)
    if "attention" in src.reads:
        if ctx.attention is None:
            raise ValueError(f"gravity_mass={src.name!r} needs the step's attention (L, H, S)")
        # the masks and positions live on the CPU, wherever the model ran
        att = ctx.attention.detach().to(torch.float16).float().cpu()  # (L, H, S)
        if att.shape[-1] != pos.numel():
            raise ValueError(
                f"attention covers {att.shape[-1]} positions, the context {pos.numel()}"
            )
        ctx = dataclasses.replace(ctx, attention=att)
    raw, carry = src.weigh(model, params, ctx, ok)  # (S,)
    m = torch.where(ok, raw, torch.zeros_like(raw))  # (S,)
    total = m.sum()
    if bool(total > 0):
        m = m / total
    elif bool(ok.any()):
        m = ok.float() / ok.sum()
    vecs = _context_rows(model, params, ctx, pos[ok], ids[ok])  # (S', d)
    w = m[ok].to(vecs.device)  # (S',) the masses meet the vectors on the model's device
    pull = (w.unsqueeze(0) @ vecs)[0] if vecs.shape[0] else vecs.new_zeros(vecs.shape[1])
    return ContextPull(positions=pos, mass=m, pull=pull, ema=carry)


def _context_rows(
    model: torch.nn.Module, params: Any, ctx: GravityContext, pos: Tensor, ids: Tensor
) -> Tensor:
    """The context vectors of ``pos`` in the gravity space, unit rows for cosine. ``(S', d)``"""
    space, sim = params.gravity_space, params.gravity_sim
    if space == "embedding":
        return candidate_matrix(model, "embedding", sim)[ids]  # (S', d) cached rows
    if ctx.hidden is None:
        raise ValueError(f"gravity_space={space!r} needs the final normed hidden states (T, d)")
    rows = pos - 1 if space == "contextual" else pos
    h = ctx.hidden.detach().float()[rows]  # (S', d)
    return unit_rows(h) if sim == "cosine" else h


def _pulls(model, params, steps: Sequence[GravityStep], chained: bool) -> list[ContextPull]:
    """:func:`context_pull` of every step; with ``chained``, each step's carry from the last."""
    out: list[ContextPull] = []
    for j, step in enumerate(steps):
        ctx = step.ctx
        if chained and j > 0:
            ctx = dataclasses.replace(ctx, ema=out[-1].ema)
        out.append(context_pull(model, params, ctx))
    return out


@register_kind
class Pull(GravityKind):
    """``G(w) = Σ_i m_i·sim(w, t_i)``, z-scored over the vocabulary, then the guards."""

    name, label, has_terms = "pull", "pull", True

    def reads(self, params):
        out = set(get_mass(params.gravity_mass).reads)
        if params.gravity_space != "embedding":
            out |= {"hidden", "model"}
        return frozenset(out)

    def describe(self, params):
        return f"{params.gravity_mass}, {params.gravity_sim}"

    def degrade(self, params, missing):
        changes, notes = {}, []
        if "hidden" in missing and params.gravity_space != "embedding":
            changes["gravity_space"] = "embedding"
            notes.append(
                "Hidden-space gravity needs the live run's hidden states; using embeddings."
            )
        if "attention" in missing and "attention" in get_mass(params.gravity_mass).reads:
            changes["gravity_mass"] = "uniform"
            notes.append("The run recorded no attention; gravity's mass is uniform instead.")
        if not changes:
            return params, None
        return params.replace(**changes), " ".join(notes)

    def potential(self, model, params, step):
        """The raw potential ``Σ_i m_i·sim(w, t_i)`` over ``step``'s tokens, no z-score."""
        pull = context_pull(model, params, step.ctx).pull  # (d,)
        raw = project(model, pull[None], params.gravity_space, params.gravity_sim)[0]  # (V,)
        return raw if step.index is None else raw[step.index.long()]

    def compute(self, model, params, steps, *, batched=False, chained=False, memo=None):
        pulls = _pulls(model, params, steps, chained)
        z: list[Tensor | None] = [None] * len(steps)
        logits: list[Tensor | None] = [None] * len(steps)
        seconds = [0.0] * len(steps)
        for j, (step, cp) in enumerate(zip(steps, pulls, strict=True)):
            if step.head is not None and step.logits is None:
                logits[j], raw, seconds[j] = self._head(model, params, step.head, cp.pull)
                z[j] = normalize_gravity(raw)  # (V,)
        todo = [j for j in range(len(steps)) if z[j] is None]
        if todo:
            zs = self._projected(model, params, [pulls[j].pull for j in todo], memo)
            for j, zj in zip(todo, zs, strict=True):
                z[j] = zj
        out = []
        for step, cp, zj, lg, t in zip(steps, pulls, z, logits, seconds, strict=True):
            g = zj if step.index is None else zj[step.index.long()]  # (V,) or (K,)
            g = self.finish(model, params, g, step.ctx.ids, step.index)
            out.append(GravityOut(gravity=g, logits=lg, ema=cp.ema, head_seconds=t))
        return out

    def finish(self, model, params, z: Tensor, ids: Tensor, index: Tensor | None = None) -> Tensor:
        """The z-scored pull ``z`` after the floor and the guards. (V,) or over ``index``"""
        g = z
        if params.gravity_attract_only:
            g = (g - params.gravity_floor).clamp_min(0.0)  # pull the topic, push nothing away
        g = ngram_guard(g, ids, params.gravity_ngram, index)
        return copy_guard(model, g, ids, params.gravity_copy_cos, index)

    @staticmethod
    def _head(model, params, h: Tensor, pull: Tensor) -> tuple[Tensor, Tensor, float]:
        """Logits (V,) and the raw pull (V,) of the hidden state ``h`` (d,), and the LM head's
        seconds.

        A pull's (V, d) product shares the LM head's pass over its weight when the candidate
        matrix is that weight (tied embeddings, or the hidden spaces), so the whole
        vocabulary's G costs one extra row of a matmul that is bound by reading the weight.
        """
        space, sim = params.gravity_space, params.gravity_sim
        t0 = time.perf_counter()
        if fuses_with_lm_head(model, space):
            logits, raw = logits_and_gravity(model, h, pull, space, sim)
            return logits, raw, (time.perf_counter() - t0) / 2  # one of the two rows is the model's
        logits = model.get_output_embeddings()(h[None])[0].float()  # (V,)
        seconds = time.perf_counter() - t0
        return logits, project(model, pull[None], space, sim)[0], seconds

    @staticmethod
    def _projected(model, params, pulls: list[Tensor], memo: dict | None) -> list[Tensor]:
        """The z-scored projection (V,) of each pull vector, one product per distinct pull.

        ``memo`` keeps the last call's projections by pull vector, so a pull that does not
        change (the prompt anchor's) is projected once per ``generate`` call.
        """
        keys = [p.detach().cpu().numpy().tobytes() for p in pulls]
        known = {} if memo is None else memo
        table = {k: known[k] for k in keys if k in known}
        new = list(dict.fromkeys(k for k in keys if k not in table))
        if new:
            first = {k: pulls[keys.index(k)] for k in new}
            with torch.inference_mode():
                raw = project(
                    model,
                    torch.stack(list(first.values())),
                    params.gravity_space,
                    params.gravity_sim,
                )  # (R, V)
                table.update({k: normalize_gravity(r) for k, r in zip(new, raw, strict=True)})
        if memo is not None:
            memo.clear()
            memo.update(table)
        return [table[k] for k in keys]

    def terms(self, model, params, trace, i, token_id, hidden=None):
        params, _ = self.degrade(params, frozenset() if hidden is not None else {"hidden"})
        cp = trace_pulls(model, params, trace, hidden=hidden, upto=i + 1)[i]
        ctx = trace_context(trace, i, hidden=hidden)
        rows = torch.zeros(cp.positions.numel(), cp.pull.numel())  # (S, d)
        ok = cp.mass > 0
        if bool(ok.any()):
            ids = ctx.ids[cp.positions[ok]]
            rows[ok] = _context_rows(model, params, ctx, cp.positions[ok], ids)
        w = candidate_matrix(model, params.gravity_space, params.gravity_sim)[token_id]  # (d,)
        terms = cp.mass * (rows @ w)  # (S,)
        return cp.positions.numpy(), terms.detach().float().numpy()


def trace_pulls(
    model: torch.nn.Module,
    params: Any,
    trace: Any,
    *,
    hidden: Tensor | None = None,
    upto: int | None = None,
) -> list[ContextPull]:
    """:func:`context_pull` of every recorded step (the mass's carry from step to step).

    A run that recorded no attention gets uniform mass where ``params`` ask for attention.
    """
    n = len(trace.steps) if upto is None else min(upto, len(trace.steps))
    ctxs = [trace_context(trace, i, hidden=hidden) for i in range(n)]
    if any(c.attention is None for c in ctxs):
        params, _ = Pull().degrade(params, frozenset({"attention"}))
    return _pulls(model, params, [GravityStep(ctx=c) for c in ctxs], chained=True)
