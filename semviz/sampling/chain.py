"""One step of the chain (:func:`prune`) and the pick (:func:`choose`).

:func:`prune` runs the raw logits through gravity, temperature and the registered filters
(:data:`~semviz.sampling.filters.FILTERS`, in order) and records every stage. Long index
sets run each filter's head-only rule on a short sorted head of the vocabulary; short ones,
the ``"hf"`` tie rule, and filters without a head rule run the full-length masks. Both give
the same kept set.

Examples
--------
>>> import torch
>>> x = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
>>> r = prune(x, PruneParams(top_p=0.7))
>>> r.kept.tolist(), [(s.name, s.n_kept) for s in r.waterfall]
([True, True, False, False], [('top_p', 2)])
>>> [round(v, 3) for v in r.probs.tolist()]
[0.625, 0.375, 0.0, 0.0]
>>> choose(r, 0.1), choose(r, 0.9)  # inverse CDF of the final distribution
(0, 1)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from semviz.sampling.filters import (
    Filter,
    HeadInput,
    active_filters,
    mirostat_mask,
    stable_head,
    top_k_mask,
)
from semviz.sampling.params import PruneParams
from semviz.sampling.state import PruneResult, SamplerState, Stage
from semviz.sampling.thermo import (
    AttentionReading,
    adaptive_temperature,
    entropy_parts,
    entropy_stats,
)

__all__ = ["choose", "default_params", "gravity_dominance", "prune"]

T_GREEDY = 1e-4  # an effective temperature below this is greedy: s/T would overflow
NEG_INF = float("-inf")
# Index sets at least this long run the filters on a short sorted head (see _head_filters).
HEAD_MIN_K = 512
_HEAD_START = 256
_HEAD_MAX = 16384


@dataclass
class _Work:
    """One step's intermediate values, shared by the stages of :func:`prune`."""

    x: Tensor  # (K,) raw logits, float32
    waterfall: list[Stage]
    alive: Tensor  # (K,) bool: tokens still in play before the filters
    n_alive: int
    p_raw: Tensor  # (K,)
    h_raw: Tensor
    v_raw: Tensor
    logp_raw: Tensor | None  # (K,) when the set is the whole distribution
    tail_mass: float
    s: Tensor | None = None  # (K,) adjusted score
    p_grav: Tensor | None = None  # (K,) softmax(s)
    h_s: float | None = None  # entropy of softmax(s), when a stage needs it
    h_known: bool = False  # h_raw is the whole vocabulary's (a subset's caller gave it)
    block: Tensor | None = None  # (K,) the filters' input, masked to alive
    p_block: Tensor | None = None  # (K,) softmax(block)
    t_f: float = 1.0  # the temperature the filters see
    kept_idx: Tensor | None = None  # (n,) the kept indices ascending, when the filters know them
    p_temp_plain: bool = False  # p_temp is softmax(s / T) over the whole set, T the final one

    @property
    def K(self) -> int:
        return self.x.shape[0]

    @property
    def dense(self) -> bool:
        """Nothing masked: every "masked(·, alive)" is the tensor itself."""
        return self.n_alive == self.K


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------


def prune(
    logits: Tensor,
    params: PruneParams,
    *,
    gravity: Tensor | None = None,
    state: SamplerState | None = None,
    tail_logsumexp: float | Tensor | None = None,
    raw_moments: tuple[float, float] | None = None,
    tail_count: int = 0,
    attention: AttentionReading | None = None,
) -> PruneResult:
    """Run one step of the chain over an index set and record every stage.

    Parameters
    ----------
    logits : (K,) raw logits: the full vocabulary, or the top-K recorded candidates.
    params : the frozen chain settings.
    gravity : (K,) normalised gravity ``G`` over the same index set, or None.
    state : per-sequence state (mirostat mu, histories); read, not modified here:
        :func:`choose` advances it.
    tail_logsumexp : logsumexp of every logit NOT in the set, when ``logits`` is a subset.
    raw_moments : the full vocabulary's raw (entropy, varentropy) in nats, when the caller
        knows them (a recorded step does): used instead of the subset's lower bound, for the
        result, the fallback rule and the state's entropy history, and, while no gravity
        changes the scores, for the entropy that adaptive temperature and the free-energy
        filter read.
    tail_count : finite tokens outside the set, which dynatemp counts as the whole
        vocabulary's run does.
    attention : what entropix's temperature reads of the step's attention
        (:func:`~semviz.sampling.thermo.attention_reading`); required by ``adaptive="entropix"``,
        which reads it with the raw entropy and varentropy.

    With a subset, raw probabilities are exact (the tail's mass is known) and the raw
    entropy/varentropy treat the tail as one lumped outcome, a lower bound. The tail is then
    dropped (waterfall stage ``"candidates"``): later stages see the set renormalised, so
    mass-based filters (top-p, typical, epsilon, eta) act as if the set were the whole
    vocabulary. Rank-based ones (top-k, min-p) are exact when the set is the top-K.

    Returns
    -------
    PruneResult, computed in float32 whatever the input dtype. Inputs are never modified.

    Examples
    --------
    >>> import torch
    >>> r = prune(torch.tensor([1.0, 3.0, 3.0, 0.0]), PruneParams(temperature=0.0))
    >>> r.greedy, r.argmax, r.n_kept  # greedy: the lowest index among the maxima
    (True, 1, 1)
    """
    x = _check_logits(logits)  # (K,)
    w = _raw(x, tail_logsumexp, raw_moments)
    g = _check_gravity(gravity, x)
    dominance = None
    if g is not None and params.gravity_lambda != 0.0:
        logp = w.logp_raw if w.logp_raw is not None else torch.log_softmax(x, -1)  # (K,)
        dominance = gravity_dominance(logp, g, params.gravity_lambda, params.rerank_k)
    reason = None
    eff = params
    if params.fallback:
        reason = _fallback_reason(params, state, float(w.h_raw), dominance)
        if reason is not None:
            eff = default_params(params)
    _gravity(w, eff, g, tail=tail_logsumexp is not None)

    if eff.temperature == 0.0:
        t = 0.0
    elif eff.adaptive == "entropix":
        t = adaptive_temperature(
            eff, x, float(w.h_raw), varentropy=float(w.v_raw), attention=attention
        )
    elif eff.order == "hf" or eff.adaptive != "dynatemp":
        t = adaptive_temperature(eff, w.s, w.h_s, n_extra=0 if w.s is not x else tail_count)
    else:
        t = math.nan  # llama.cpp dynatemp: decided on the survivors
    greedy = eff.temperature == 0.0 or t < T_GREEDY  # NaN compares False
    if greedy:
        arg = _greedy(w)
        kept = torch.zeros(w.K, dtype=torch.bool)
        kept[arg] = True
        final, p_temp, t, mu = kept.float(), kept.float(), 0.0, None
        stats, n_kept = (arg, 0.0, float(-w.s[arg])), 1
    else:
        kept, p_temp, t, mu = _sample_chain(w, eff, t, state)
        p_every = p_temp if w.p_temp_plain else None
        final, support, stats = _final(w.s, t, kept, w.kept_idx, p_every)
        n_kept = support[0].numel()
    return PruneResult(
        index_probs={"raw": w.p_raw, "gravity": w.p_grav, "temperature": p_temp, "final": final},
        kept=kept,
        waterfall=w.waterfall,
        entropy_raw=float(w.h_raw),
        varentropy_raw=float(w.v_raw),
        temperature=float(t),
        n_kept=n_kept,
        fallback=reason,
        gravity=g if eff.gravity_lambda != 0.0 else None,
        greedy=greedy,
        scores=w.s,
        params=eff,
        tail_mass=w.tail_mass,
        gravity_dominance=dominance,
        mirostat_mu=mu,
        mirostat_tau=eff.mirostat_tau,
        mirostat_eta=eff.mirostat_eta,
        state=state,
        _support=None if greedy else support,
        _final_stats=stats,
    )


def _final(
    s: Tensor,
    t: float,
    kept: Tensor,
    kept_idx: Tensor | None = None,
    p_every: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor], Callable[[], tuple[int, float, float]]]:
    """The distribution sampled from, softmax(s/T) over ``kept`` (K,); its support, the kept
    indices (n,) ascending and their probabilities (n,), which the pick reads instead of the
    (K,); and a function giving its argmax (lowest index on ties), entropy and free energy,
    which only a reader of those pays for.

    ``kept_idx`` is the kept indices when the caller has them (no pass over ``kept``), and
    ``p_every`` is ``softmax(s / t)`` when the caller computed it (used when every token is
    kept: the same operation on the same input)."""
    if kept_idx is None:
        every = bool(kept.all())
        kept_idx = (
            torch.arange(kept.shape[0], device=kept.device)
            if every
            else torch.nonzero(kept).flatten()
        )  # (n,)
    else:
        every = kept_idx.numel() == kept.shape[0]
    if every:
        v = s / t  # (K,)
        final = q = torch.softmax(v, -1) if p_every is None else p_every  # (K,)
    else:
        # the softmax over the kept alone, in index order: the same values whatever else the
        # index set holds (the vocabulary or the recorded candidates), at the cost of the
        # kept set rather than of K
        v = s[kept_idx] / t  # (n,)
        q = torch.softmax(v, -1)  # (n,)
        final = torch.zeros(s.shape).index_copy_(0, kept_idx, q)  # (K,)

    def stats() -> tuple[int, float, float]:
        arg = int(kept_idx[q.max(0).indices])  # first maximal index
        h = float(entropy_stats(torch.log(q))[0])  # over the kept: often few
        return arg, h, float(-t * torch.logsumexp(v, -1))

    return final, (kept_idx, q), stats


def _raw(
    x: Tensor, tail_logsumexp: float | Tensor | None, moments: tuple[float, float] | None
) -> _Work:
    """Raw probabilities, log-probabilities and entropy moments: one log-softmax. The
    moments are computed only when the caller does not know them (``moments``)."""
    K = x.shape[0]
    waterfall: list[Stage] = []
    finite = x > NEG_INF  # (K,)
    n_alive = int(torch.count_nonzero(finite))
    if tail_logsumexp is None:
        src = x
        tail_mass = 0.0
    else:
        tail = torch.as_tensor(tail_logsumexp, dtype=torch.float32).reshape(())
        src = torch.cat([x, tail.view(1)])  # (K+1,) tail lumped as one outcome
    if moments is None:
        h_raw, v_raw, logp, p = entropy_parts(src)
    else:  # the same log-softmax and exp as entropy_parts, without the moments' passes
        logp = torch.log_softmax(src, -1)
        p = logp.exp()
        h_raw, v_raw = (torch.tensor(float(m)) for m in moments)
    if tail_logsumexp is None:
        logp_raw, p_raw = logp, p  # (K,) each
    else:
        p_raw = p[:K]  # (K,) exact
        tail_mass = float(1.0 - p_raw.sum().clamp(max=1.0))
        waterfall.append(Stage("candidates", n_alive, tail_mass))
        logp_raw = None
    return _Work(
        x=x,
        waterfall=waterfall,
        alive=finite,
        n_alive=n_alive,
        p_raw=p_raw,
        h_raw=h_raw,
        v_raw=v_raw,
        logp_raw=logp_raw,
        tail_mass=tail_mass,
        h_known=moments is not None,
    )


def _check_gravity(gravity: Tensor | None, x: Tensor) -> Tensor | None:
    if gravity is None:
        return None
    if gravity.shape != x.shape:
        raise ValueError(f"gravity shape {tuple(gravity.shape)} != logits {tuple(x.shape)}")
    g = gravity.detach().float()
    return torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)


def _gravity(w: _Work, eff: PruneParams, g: Tensor | None, *, tail: bool) -> None:
    """The adjusted score ``s = x + λ·G`` (full or rerank) and ``softmax(s)``."""
    x = w.x
    w.s = x
    if g is not None and eff.gravity_lambda != 0.0:
        # a constant G shifts every score alike: the distribution is unchanged, so add
        # nothing rather than let float rounding break near-ties (exact identity)
        lg = 0.0 if bool(g.max() == g.min()) else eff.gravity_lambda * g
        if eff.gravity_mode == "rerank":
            cand = top_k_mask(x, eff.rerank_k, eff.min_tokens_to_keep, "stable")[0] & w.alive
            p_in = w.p_raw / max(w.p_raw.sum(), 1e-30)
            w.waterfall.append(_stage("rerank", p_in, w.alive, cand))
            w.alive = cand
            w.n_alive = int(torch.count_nonzero(cand))
            w.s = _masked(x + lg, cand)
        else:
            w.s = x + lg if isinstance(lg, torch.Tensor) else x
            w.waterfall.append(Stage("gravity", w.n_alive, 0.0))
    logp_s = None
    if w.s is x:
        w.p_grav, logp_s = (None if tail else w.p_raw), w.logp_raw
    if eff.free_energy or eff.adaptive not in ("none", "entropix"):  # entropix reads the raw H
        h_s_t, _, logp_s, p_s = entropy_parts(w.s)
        # with the raw scores unchanged, softmax(s) is the raw distribution: a subset then
        # reads the whole vocabulary's entropy, as the live run did, not the subset's
        w.h_s = float(w.h_raw) if (w.h_known and w.s is x) else float(h_s_t)
        w.p_grav = p_s if w.p_grav is None else w.p_grav
    if w.p_grav is None:
        w.p_grav = torch.softmax(w.s, -1)  # (K,)


def _greedy(w: _Work) -> int:
    """The argmax of the scores (lowest index on ties); records the stage."""
    arg = int(w.s.max(0).indices)  # first maximal index
    m_in = float(w.p_grav.sum()) if w.dense else _mass(w.p_grav, w.alive)
    removed = m_in - float(w.p_grav[arg])
    w.waterfall.append(Stage("greedy", 1, removed / m_in if m_in > 0 else 0.0))
    return arg


def _sample_chain(
    w: _Work, eff: PruneParams, t: float, state: SamplerState | None
) -> tuple[Tensor, Tensor, float, float | None]:
    """Filters, temperature and mirostat: ``(kept (K,), p_temp (K,), T, mirostat mu)``."""
    s = w.s
    block_in = s / t if eff.order == "hf" else s  # (K,) what the filters look at
    w.t_f = eff.temperature if math.isnan(t) else t
    active = active_filters(eff)
    w.block = block_in if w.dense else _masked(block_in, w.alive)  # (K,)
    w.p_block = torch.softmax(w.block.unsqueeze(0), -1)[0] if active else None  # (K,)
    cur = None
    if active and _head_ok(eff, active, w.K):
        cur = _head_filters(w, eff, active)
    if cur is None:
        cur = _full_filters(w, eff, active, block_in)

    if eff.order == "llama.cpp":
        if eff.adaptive == "dynatemp":
            t = adaptive_temperature(eff, _masked(s, cur))
        elif math.isnan(t):
            t = eff.temperature
        t = max(t, T_GREEDY)
        w.waterfall.append(Stage("temperature", int(torch.count_nonzero(cur)), 0.0))
    # temperature, before truncation; in "hf" order that is the filters' own input
    if eff.order == "hf" and w.p_block is not None:
        p_temp = w.p_block
    else:
        p_temp = torch.softmax((s if w.dense else _masked(s, w.alive)) / t, -1)  # (K,)
        w.p_temp_plain = w.dense

    mu = None
    if eff.adaptive == "mirostat":
        prev = state.mirostat_mu if state is not None else None
        mu = 2.0 * eff.mirostat_tau if prev is None else prev
        src = _masked(s / t, cur)  # (K,)
        after = cur & mirostat_mask(src, mu, eff.min_tokens_to_keep)[0]
        w.waterfall.append(_stage("mirostat", torch.softmax(src, -1), cur, after))
        cur, w.kept_idx = after, None
    return cur, p_temp, t, mu


# --------------------------------------------------------------------------------------------
# The filters: full-length path and head-only path
# --------------------------------------------------------------------------------------------


def _full_filters(w: _Work, eff: PruneParams, active: list[Filter], block_in: Tensor) -> Tensor:
    """Every active filter as a full-length mask: any tie rule, any filter. ``kept`` (K,)."""
    seq = eff.combine == "sequential"
    cur = w.alive.clone()
    for f in active:
        src = _masked(block_in, cur if seq else w.alive)  # (K,)
        # the entropy of softmax(s) serves while nothing is masked in this filter's input
        # (the head path decides the same way, so both compute the same window)
        whole = not seq or int(cur.sum()) == w.K
        keep = f.mask(src, eff, scores=w.s, temperature=w.t_f, entropy=w.h_s if whole else None)
        after = cur & keep[0]
        need = min(eff.min_tokens_to_keep, int(cur.sum()))
        if int(after.sum()) < need:
            # filters protect different "best" tokens (typical's are not top-k's), so an
            # intersection can come up short: top up with the stage's most probable
            # inputs, in stable order, so no stage leaves fewer than min_tokens_to_keep.
            order = stable_head(_masked(block_in, cur), need + int(after.sum()))
            for i in order.tolist():
                if int(after.sum()) >= need:
                    break
                after[i] = True
        # mass ratios are the same in any renormalisation, so one softmax serves every stage
        w.waterfall.append(_stage(f.name, w.p_block, cur, after))
        cur = after
    return cur


def _head_ok(p: PruneParams, active: list[Filter], K: int) -> bool:
    """Whether :func:`_head_filters` applies: long index sets, stable ties, head rules."""
    return K >= HEAD_MIN_K and p.tie_rule == "stable" and all(f.has_head_rule for f in active)


def _head_filters(w: _Work, eff: PruneParams, active: list[Filter]) -> Tensor | None:
    """The filters evaluated on a short head of the stable order; the same kept set as
    :func:`_full_filters`, or None when no head up to ``_HEAD_MAX`` is enough.

    Every filter with a head rule keeps an upper set of the tokens ordered by its input
    (top-k and top-p a prefix of the stable order, min-p / epsilon / eta a threshold on the
    probability, free energy a threshold on ``s``, which ``block = s/T`` orders the same way
    up to rounding ties). The head holds every token tied with its last value, so each token
    outside it is strictly below every token inside it, in ``block`` and in ``s``. A filter
    that removes any token of the head therefore removes every token outside it, and from
    then on the chain only needs the head. Each value on the head is computed exactly as the
    full-length mask computes it (same softmax over the same full-length input), so the kept
    sets are identical. When no filter removes anything from the head, the head is grown.
    """
    hint = max(f.head_size(eff) for f in active)
    size = max(_HEAD_START, eff.min_tokens_to_keep, hint)
    while True:
        head = stable_head(w.block, min(size, w.n_alive))  # (H,) stable order of block
        rows = _head_pass(w, eff, active, head)
        if rows is not None:
            cur_h, stages = rows
            w.waterfall.extend(stages)
            cur = torch.zeros(w.K, dtype=torch.bool)
            w.kept_idx = head[cur_h].sort().values  # (n,) ascending, as a pass over cur gives
            cur[w.kept_idx] = True
            return cur
        if size >= _HEAD_MAX or size >= w.n_alive:
            return None
        size *= 4


def _head_pass(
    w: _Work, eff: PruneParams, active: list[Filter], head: Tensor
) -> tuple[Tensor, list[Stage]] | None:
    """One try of :func:`_head_filters` on ``head`` (H,); None when the head is too short."""
    m = eff.min_tokens_to_keep
    seq = eff.combine == "sequential"
    bh, sh = w.block[head], w.s[head]  # (H,) each, bh descending with ties by index
    in_h = w.alive[head]  # (H,) the kept set restricted to the head
    bounded = head.numel() >= w.n_alive  # True once every token outside the head is out
    n_cur = w.n_alive
    stages: list[Stage] = []
    unknown = False  # a filter kept the whole head while tokens outside it were alive
    p_in = float(w.p_block.sum())  # mass of the kept set under p_block, while all alive
    for f in active:
        if seq and bounded and n_cur < w.n_alive:  # the input: block masked by the kept set
            src_h, src_full, probs = in_h, _from_head(w.K, head, in_h, bh), None
        else:  # block masked by alive
            src_h, src_full, probs = w.alive[head], w.block, w.p_block
        rank = torch.cumsum(src_h, 0) - 1  # (H,) position among the input's finite tokens
        view = HeadInput(
            head=head,
            src=src_h,
            src_full=src_full,
            rank=rank,
            protect=src_h & (rank < m),
            bounded=bounded,
            probs_full=probs,
            scores=sh,
            scores_full=w.s,
            alive=w.alive,
            n_src=n_cur if seq else w.n_alive,
            sequential=seq,
            temperature=w.t_f,
            entropy=w.h_s,
            m=m,
        )
        keep = f.head_keep(view, eff)
        if keep is None:
            return None
        after = in_h & keep
        if not bounded:
            if bool(after[in_h].all()):
                # the whole head kept: what this filter did outside it is not known yet, so
                # this head cannot give its count (a later cut returns None, as does no cut)
                unknown = True
                continue
            if unknown:
                # a later filter cuts the head, so the kept set is right, but an earlier
                # filter that kept the whole head may have removed tokens outside it (a
                # min-p threshold under the head's last value): its count needs a longer head
                return None
            bounded = True
        n_after = int(after.sum())
        need = min(m, n_cur)
        if n_after < need:
            # top up with the stage's most probable inputs, in stable order (head order)
            for i in torch.nonzero(in_h & ~after).flatten().tolist():
                after[i] = True
                n_after += 1
                if n_after >= need:
                    break
        m_in = p_in if n_cur == w.n_alive else float(w.p_block[head[in_h]].sum())
        removed = m_in - float(w.p_block[head[after]].sum())
        stages.append(Stage(f.name, n_after, max(removed, 0.0) / m_in if m_in > 0 else 0.0))
        in_h, n_cur = after, n_after
    return (in_h, stages) if bounded else None


def _from_head(K: int, head: Tensor, mask_h: Tensor, values_h: Tensor) -> Tensor:
    """(K,) ``values_h`` at ``head[mask_h]``, ``-inf`` elsewhere: bit for bit the masked input."""
    z = torch.full((K,), NEG_INF)
    z[head[mask_h]] = values_h[mask_h]
    return z


# --------------------------------------------------------------------------------------------
# Helpers: checks, stages, fallback
# --------------------------------------------------------------------------------------------


def _masked(x: Tensor, keep: Tensor) -> Tensor:
    return x.masked_fill(~keep, NEG_INF)


def _mass(probs: Tensor, keep: Tensor) -> float:
    return float(probs[keep].sum())


def _stage(name: str, probs: Tensor, before: Tensor, after: Tensor) -> Stage:
    """Waterfall row: ``probs`` (K,) is the distribution the stage looked at."""
    m_in = _mass(probs, before)
    removed = _mass(probs, before & ~after)
    return Stage(name, int(after.sum()), removed / m_in if m_in > 0 else 0.0)


def _check_logits(logits: Tensor) -> Tensor:
    if logits.dim() != 1:
        raise ValueError(f"logits must be 1-D (K,), got shape {tuple(logits.shape)}")
    x = logits.detach().float()
    if x.numel() == 0:
        raise ValueError("logits must contain at least one finite entry")
    # one reduction answers all three checks: max propagates NaN and shows +inf / all -inf
    mx = float(x.max())
    if math.isnan(mx) or mx == math.inf:
        raise ValueError("logits must not contain NaN or +inf")
    if mx == NEG_INF:
        raise ValueError("logits must contain at least one finite entry")
    return x


def gravity_dominance(logp_raw: Tensor, gravity: Tensor, lam: float, k: int) -> float:
    """``λ·range(G) / range(log P)`` over the top-``k`` raw candidates (0 when undefined)."""
    finite = torch.isfinite(logp_raw)
    k = min(k, int(finite.sum()))
    if k < 2 or lam == 0.0:
        return 0.0
    idx = stable_head(logp_raw, k)[:k]
    lp, g = logp_raw[idx], gravity.float()[idx]
    spread = float(lp.max() - lp.min())
    g_spread = abs(lam) * float(g.max() - g.min())
    if spread <= 1e-12:
        return math.inf if g_spread > 0 else 0.0
    return g_spread / spread


def _fallback_reason(
    params: PruneParams, state: SamplerState | None, h_raw: float, dominance: float | None
) -> str | None:
    if dominance is not None and dominance > params.fallback_gravity_ratio:
        return (
            f"gravity dominates the score (ratio {dominance:.2f} > {params.fallback_gravity_ratio})"
        )
    if state is None:
        return None
    k = params.fallback_collapse_steps
    hist = state.entropies[-(k - 1) :] if k > 1 else []
    if len(hist) == k - 1 and all(h < params.fallback_collapse_threshold for h in [*hist, h_raw]):
        return f"entropy collapsed below {params.fallback_collapse_threshold} nats for {k} steps"
    n, toks = params.fallback_ngram, state.tokens
    if len(toks) >= n:
        tail = toks[-n:]
        count = sum(1 for i in range(len(toks) - n) if toks[i : i + n] == tail)
        if count >= params.fallback_ngram_repeats:
            return f"{n}-gram {tail} repeated {count + 1} times"
    return None


def default_params(params: PruneParams) -> PruneParams:
    """The "default sampling" a fallback step switches to: the standard chain, no steering.

    Gravity, free energy and adaptive temperature are off; greedy becomes T = 1 so a
    repetition loop can break.
    """
    return params.replace(
        gravity_lambda=0.0,
        free_energy=False,
        adaptive="none",
        temperature=params.temperature if params.temperature > 0 else 1.0,
        fallback=False,
    )


# --------------------------------------------------------------------------------------------
# The pick
# --------------------------------------------------------------------------------------------


def choose(
    result: PruneResult, u: float, *, state: SamplerState | None = None, token_id: int | None = None
) -> int:
    """Pick an index by inverse CDF of the final distribution with one uniform ``u``.

    The CDF runs over tokens sorted by probability (descending, ties by lower index), so the
    same ``u`` picks the same token under small changes of the distribution: replay with a
    recorded ``u`` gives counterfactuals with common random numbers. Greedy results return
    the argmax (lowest index on ties) and ignore ``u``.

    The state given here (or to :func:`prune`) is advanced once with the choice.

    Examples
    --------
    >>> import torch
    >>> r = prune(torch.log(torch.tensor([0.2, 0.5, 0.3])), PruneParams())
    >>> [choose(r, u) for u in (0.0, 0.49, 0.51, 0.79, 0.81)]  # CDF over 0.5, 0.3, 0.2
    [1, 1, 2, 2, 0]
    """
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    if result.greedy:
        idx = result.argmax
    else:
        idx = _inverse_cdf(result.index_probs["final"], u, result._support)
    st = state if state is not None else result.state
    if st is not None and not result._observed:
        st.observe(result, idx, token_id)
        result._observed = True
    return idx


def _inverse_cdf(probs: Tensor, u: float, support: tuple[Tensor, Tensor] | None = None) -> int:
    """Index at CDF position ``u·total`` of ``probs`` (K,) in stable descending order.

    Only the tokens that can be picked (probability > 0) are read, in index order, and only
    the head of their order that the CDF crosses is sorted: the first 256 tokens, where most
    draws land, and else every token at or above a threshold whose mass holds ``u·total``
    (:func:`_mass_head`). A final distribution over the vocabulary costs one pass to find its
    kept tokens (none when ``support``, the kept indices ascending and their probabilities,
    is known), then work on those alone. The total is summed over them in index order, and
    each head is a prefix of the one stable order, so the pick depends neither on the head's
    length nor on how many zeros surround them.
    """
    if support is not None:
        live, q = support  # (n,) each: probs[live] == q, and probs is 0 elsewhere
        pos = q > 0  # (n,)
        if not bool(pos.all()):  # a kept token whose probability underflowed
            live, q = live[pos], q[pos]  # (n',) each
    else:
        live = torch.nonzero(probs > 0).flatten()  # (n,) ascending: the tokens that can be picked
        q = probs[live]  # (n,)
    if live.numel() == 0:
        return int(probs.max(0).indices)
    p = q.double()  # (n,) exact: the CDF sums in float64
    n = live.numel()
    target = torch.tensor([u * float(p.sum())], dtype=torch.float64, device=p.device)
    # (h,) a prefix of p's stable descending order; q orders (and ties) exactly as p does,
    # and a top-k over float32 costs less than over float64
    head = stable_head(q, 256)
    for wider in ("mass", "all", None):
        cdf = p[head].cumsum(0)  # (h,)
        pos = int(torch.searchsorted(cdf, target, right=True))
        if pos < head.numel() or head.numel() >= n or wider is None:
            return int(live[head[min(pos, head.numel() - 1)]])
        # the draw lands beyond this head: the tokens whose mass holds it, or (rounding
        # left the target just outside those) the whole order
        head = _mass_head(p, float(target)) if wider == "mass" else stable_head(p, n)


def _mass_head(p: Tensor, target: float) -> Tensor:
    """Every index of ``p`` (n,) float64 > 0 at or above a threshold, in stable descending
    order, where the tokens above the threshold hold at least ``target`` of mass.

    The threshold comes from a histogram of mass over eighths of an octave of ``p`` (one
    pass), so the head holds the tokens the CDF needs and at most one bin more; it is the
    smallest value in the bins that reach the target, and every token at or above it is in
    the head, ties included, so the head is a prefix of the stable order."""
    b = (torch.log2(p) * -8.0).floor()  # (n,) larger probabilities, lower bins
    b = (b - b.min()).long()
    mass = torch.zeros(int(b.max()) + 1, dtype=p.dtype, device=p.device).index_add_(0, b, p)
    at = torch.tensor([target], dtype=p.dtype, device=p.device)
    j = int(torch.searchsorted(mass.cumsum(0), at))  # the first bin where the mass reaches it
    tau = p[b <= j].min()  # the smallest value in the bins that reach the target
    idx = torch.nonzero(p >= tau).flatten()  # (h,) ascending index order
    return idx[torch.sort(p[idx], descending=True, stable=True).indices]
