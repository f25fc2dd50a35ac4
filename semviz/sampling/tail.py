"""The unrecorded tail of a step, and what the recorded candidates plus its summary decide.

A recorded step keeps its top-K candidates' raw logits exactly. The rest of the vocabulary
(the *tail*) is kept as a :func:`summarize`: a histogram of its logits in bins of
``WIDTH`` nats, each bin with its count and the logsumexp of its logits. Since a bin's
logits lie within its edges and their exponentials have a known sum, the bin's mass at any
inverse temperature β is bounded from both sides (:meth:`Tail.weights`: Jensen's inequality
on one side, the two-point extreme on the other), and so is the mass above any threshold.

:func:`decide` runs the chain in interval form over the candidates and these bounds, and
returns the candidate the draw ``u`` picks when every vocabulary consistent with the record
makes the same pick, or ``None`` when the pick depends on what the record does not hold.
What can be decided this way, per stage:

- temperature: fixed, mirostat, and the target/EDT controllers and llama.cpp-free dynatemp
  (their entropy is the recorded full vocabulary's) are exact without full-mode gravity;
- top-k, min-p, free energy: thresholds on the score, exact up to the tail's bins when
  they cut inside the tail;
- top-p, epsilon, eta: thresholds that depend on the normaliser (and, for eta, the entropy)
  at the filter's temperature: bounded from the tail's bins;
- mirostat's cut: a threshold on the kept set's normaliser, bounded the same way;
- gravity in rerank mode only touches recorded candidates (exact); full-mode gravity moves
  the tail by ``λ·G``, bounded by the tail's recorded per-bin range of ``G`` when the
  replay uses the recorded gravity, unknown otherwise;
- locally typical sampling keeps a set in surprise order that the bins cannot place: it is
  exact only when nothing of the vocabulary is unrecorded.

The pick itself is exact when the draw's place in the final CDF, ``u·Z_kept``, lies inside
one recorded candidate's interval for every admissible tail. A draw that lands in the tail,
or near enough to a boundary that the bounds (or float32 rounding in the live run, taken as
a relative margin of ``MARGIN``) could move it, is left undecided.

Examples
--------
>>> import torch
>>> x = torch.linspace(8.0, -8.0, 400)  # a vocabulary of 400 tokens, sorted
>>> t = Tail.from_record(summarize(x[50:]))  # the top 50 recorded, the rest summarised
>>> lo, hi = t.weights(1.0 / 1.5, shift=0.0)  # the tail's mass at T = 1.5, per bin
>>> exact = float(torch.exp(x[50:].double() / 1.5).sum())
>>> bool(lo.sum() <= exact <= hi.sum())
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from semviz.sampling.filters import active_filters
from semviz.sampling.params import PruneParams
from semviz.sampling.thermo import LN2, adaptive_temperature

__all__ = ["MARGIN", "WIDTH", "Decision", "Tail", "decide", "edges", "summarize"]

WIDTH = 1.0 / 16  # bin width in nats: the bounds' slack grows with the square of it
MAX_BINS = 1024  # tokens far below the tail's top share the last bin
MARGIN = 1e-5  # relative slack for float32 rounding in the live run's softmax and cumsum
_LSE_SLACK = 1e-6  # the logsumexp's own float64 rounding, with room (nats)
NEG_INF = float("-inf")


def summarize(x: Tensor, gravity: Tensor | None = None, width: float = WIDTH) -> dict:
    """The tail's summary, as a step record stores it.

    Parameters
    ----------
    x : (N,) the raw logits of the tokens not recorded (any order); ``-inf`` ones are counted
        in ``dead`` (no temperature or filter can give them mass).
    gravity : (N,) the step's normalised ``G`` on the same tokens, when full-mode gravity ran.

    Returns
    -------
    dict with ``top`` and ``bottom`` (the largest and smallest finite logit), ``width``,
    ``counts`` (B,) int32, ``lse`` (B,) float32 and ``dead``; with gravity also ``g_lo`` and
    ``g_hi`` (B,) float32, each bin's smallest and largest ``G``. Bin ``b`` holds the logits in
    ``[top - (b+1)·width, top - b·width]``; the last one reaches down to ``bottom``.
    """
    x = x.detach().float().flatten()  # (N,)
    finite = x > NEG_INF
    xf = x[finite]  # (F,)
    out: dict = {"width": float(width), "dead": int(x.numel() - xf.numel())}
    if xf.numel() == 0:
        empty = torch.zeros(0)
        return {**out, "top": 0.0, "bottom": 0.0, "counts": empty.int(), "lse": empty}
    top, bottom = float(xf.max()), float(xf.min())
    xd = xf.double()
    b = ((top - xd) / width).floor().long().clamp(0, MAX_BINS - 1)  # (F,)
    n_bins = int(b.max()) + 1
    counts = torch.bincount(b, minlength=n_bins)  # (B,)
    upper = top - torch.arange(n_bins, dtype=torch.float64) * width  # (B,) each bin's top edge
    # logits at most `width` below their bin's top edge, except in the last merged bin: shift
    # by each bin's own maximum so no exponential underflows
    bmax = torch.full((n_bins,), NEG_INF, dtype=torch.float64).scatter_reduce(0, b, xd, "amax")
    sums = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, b, torch.exp(xd - bmax[b]))
    lse = torch.where(counts > 0, bmax + torch.log(sums), torch.full_like(upper, NEG_INF))
    out.update(top=top, bottom=bottom, counts=counts.int(), lse=lse.float())
    if gravity is not None:
        g = gravity.detach().float().flatten()[finite].double()
        lo = torch.full((n_bins,), math.inf, dtype=torch.float64).scatter_reduce(0, b, g, "amin")
        hi = torch.full((n_bins,), -math.inf, dtype=torch.float64).scatter_reduce(0, b, g, "amax")
        out.update(g_lo=lo.where(counts > 0, 0.0).float(), g_hi=hi.where(counts > 0, 0.0).float())
    return out


def edges(d: dict) -> tuple[Tensor, Tensor]:
    """Each bin's low and high edge (B,), (B,) float64, from a summary."""
    n_bins = d["counts"].numel()
    w = float(d["width"])
    upper = float(d["top"]) - torch.arange(n_bins, dtype=torch.float64) * w  # (B,)
    lower = (upper - w).clamp(min=float(d["bottom"]))
    if n_bins:
        lower[-1] = float(d["bottom"])
    return lower, upper


@dataclass
class Tail:
    """A tail summary read for bounds: per bin, a score range ``[a, c]`` and count ``n``;
    ``lse`` (the bins' exact mass at β = 1) while the scores are the raw logits.

    Shapes: (B,) float64 each.
    """

    a: Tensor
    c: Tensor
    n: Tensor
    lse: Tensor | None
    dead: int = 0
    g_lo: Tensor | None = None
    g_hi: Tensor | None = None

    @classmethod
    def from_record(cls, d: dict) -> Tail:
        lower, upper = edges(d)
        g_lo, g_hi = d.get("g_lo"), d.get("g_hi")
        return cls(
            a=lower,
            c=upper,
            n=d["counts"].double(),
            lse=d["lse"].double(),
            dead=int(d.get("dead", 0)),
            g_lo=None if g_lo is None else g_lo.double(),
            g_hi=None if g_hi is None else g_hi.double(),
        )

    @classmethod
    def from_lse(cls, top: float, lse: float, count: int) -> Tail:
        """A one-bin tail for a record without a summary: ``count`` tokens at or below
        ``top`` whose logsumexp is ``lse``, reaching down without a known floor."""
        n = torch.tensor([float(count)], dtype=torch.float64)
        return cls(
            a=torch.tensor([top - 1e4], dtype=torch.float64),
            c=torch.tensor([top], dtype=torch.float64),
            n=n,
            lse=torch.tensor([lse], dtype=torch.float64),
        )

    @property
    def count(self) -> int:
        """Finite tokens in the tail."""
        return int(self.n.sum())

    def shifted(self, lam: float) -> Tail | None:
        """The tail's score ranges under full-mode gravity ``s = x + λ·G`` (None when the
        record holds no range of ``G``); the logsumexp no longer applies."""
        if lam == 0.0:
            return self
        if self.g_lo is None or self.g_hi is None:
            return None
        lo, hi = (
            (lam * self.g_lo, lam * self.g_hi) if lam > 0 else (lam * self.g_hi, lam * self.g_lo)
        )
        return Tail(a=self.a + lo, c=self.c + hi, n=self.n, lse=None, dead=self.dead)

    def weights(self, beta: float, shift: float) -> tuple[Tensor, Tensor]:
        """Bounds on each bin's ``Σ exp(β·s - shift)``. (B,), (B,) float64

        Without a logsumexp: every score at the bin's low or high edge. With one, the bin's
        scores have a known ``Σ e^s = S``: ``y ↦ y^β`` is convex for β ≥ 1 (concave below), so
        one side is all scores equal (``n·(S/n)^β``) and the other the two-point split
        between the edges with the same sum.
        """
        n, a, c = self.n, self.a, self.c
        lo = n * torch.exp(beta * a - shift)
        hi = n * torch.exp(beta * c - shift)
        if self.lse is None or beta == 0.0:
            return lo, hi
        safe = n > 0
        m = (self.lse - torch.log(n.clamp(min=1.0))).clamp(min=a, max=c)  # log of the mean e^s
        # the logsumexp is stored in float32: its rounding, in nats, scaled by β
        slack = beta * (_LSE_SLACK + 2.4e-7 * self.lse.abs().nan_to_num(0.0, 0.0, 0.0))
        equal = n * torch.exp(beta * m - shift)
        # the share of the bin's tokens at c in the split: (e^m - e^a) / (e^c - e^a), written
        # so that a bin reaching far down (a last bin, or an old record's one-bin tail) stays
        # finite
        ea = torch.exp(a - c)
        q = ((torch.exp(m - c) - ea) / (1 - ea).clamp(min=1e-300)).clamp(0.0, 1.0)
        q = torch.where(c > a, q, torch.ones_like(q))
        split = n * (q * torch.exp(beta * c - shift) + (1 - q) * torch.exp(beta * a - shift))
        if beta >= 1.0:
            lo2, hi2 = equal * torch.exp(-slack), split * torch.exp(slack)
        else:
            lo2, hi2 = split * torch.exp(-slack), equal * torch.exp(slack)
        lo = torch.where(safe, torch.maximum(lo, lo2), lo)
        hi = torch.where(safe, torch.minimum(hi, hi2), hi)
        return lo, torch.maximum(hi, lo)


# --------------------------------------------------------------------------------------------
# The chain in interval form
# --------------------------------------------------------------------------------------------


class _Unknown(Exception):
    """The record cannot decide this step (the message says why); ``share`` is an estimate
    of the tail's share of the final mass, when one was reached."""

    def __init__(self, why: str, share: float | None = None) -> None:
        super().__init__(why)
        self.share = share


@dataclass
class Decision:
    """What the record decides for one step.

    Attributes
    ----------
    index : the candidate the draw picks (into the record's candidates), or None.
    why : when ``index`` is None, why the record cannot decide.
    tail_share : an estimate of the final mass outside the recorded candidates (0 when the
        kept set holds none of the tail; None when the record gives no estimate).
    final_q : the final probability of ``token_rank``'s candidate (for mirostat's state), an
        estimate when ``q_exact`` is False.
    """

    index: int | None
    why: str | None = None
    tail_share: float | None = 0.0
    final_q: float | None = None
    q_exact: bool = True

    @property
    def exact(self) -> bool:
        return self.index is not None


class _Space:
    """Candidates (exact scores) and tail bins (score ranges) on one score axis.

    A kept set is ``{s ≥ θ}`` for a threshold ``θ`` known to lie in ``[lo, hi]``: scores at
    or above ``hi`` are surely kept, below ``lo`` surely removed, in between unknown.
    """

    def __init__(self, s: Tensor, ids: Tensor, tail: Tail | None) -> None:
        order = torch.argsort(ids)  # stable order: score descending, ties by token id
        order = order[torch.sort(s[order], descending=True, stable=True).indices]
        self.order = order  # (K,) candidate index of each place
        self.s = s[order]  # (K,) float64, descending; -inf: removed (rerank)
        self.finite = torch.isfinite(self.s)
        live = tail is not None and tail.count > 0
        keep = tail.n > 0 if live else None
        self.a = tail.a[keep] if live else torch.zeros(0, dtype=torch.float64)  # (B,)
        self.c = tail.c[keep] if live else torch.zeros(0, dtype=torch.float64)
        self.n = tail.n[keep] if live else torch.zeros(0, dtype=torch.float64)
        self._tail = tail if live else None
        self._keep = keep
        self._cache: dict = {}
        # ascending copies for counting at many thresholds at once
        self._s_asc = self.s[self.finite].flip(0)
        self._a_order = torch.argsort(self.a)
        self._c_order = torch.argsort(self.c)

    @property
    def top(self) -> float:
        """The largest score that can be present: the top candidate or a tail bin's edge."""
        c = float(self.c.max()) if self.c.numel() else NEG_INF
        return max(float(self.s[0]), c)

    def weights(self, beta: float) -> tuple[Tensor, Tensor, Tensor]:
        """Candidates' ``exp(β·s - shift)`` (K,) and the bins' bounds (B,), (B,)."""
        hit = self._cache.get(beta)
        if hit is None:
            shift = beta * self.top
            w = torch.exp(beta * self.s - shift)  # (K,), 0 where removed
            if self._tail is None:
                lo = hi = torch.zeros(0, dtype=torch.float64)
            else:
                lo, hi = self._tail.weights(beta, shift)
                lo, hi = lo[self._keep], hi[self._keep]
            hit = self._cache[beta] = (w, lo, hi, shift)
        return hit[:3]

    def shift(self, beta: float) -> float:
        self.weights(beta)
        return self._cache[beta][3]

    def _above(
        self, v: Tensor, edge: Tensor, order: Tensor, vals: Tensor, *, strict: bool = False
    ) -> Tensor:
        """``Σ vals[edge ≥ v]`` (``edge > v`` with ``strict``) for each ``v`` (M,), by one
        sort and a cumulative sum."""
        if edge.numel() == 0:
            return torch.zeros(v.shape, dtype=torch.float64)
        e = edge[order]  # ascending
        tail_sum = torch.cat(
            [vals[order].flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=vals.dtype)]
        )
        return tail_sum[torch.searchsorted(e, v, right=strict)]

    def mass_at(self, v: Tensor, beta: float, *, upper: bool) -> Tensor:
        """For each threshold ``v`` (M,), the most (``upper``) or least mass ``{s ≥ v}`` can
        hold at β: candidates exactly, bins reaching ``v`` at their high bound, or bins
        wholly above it at their low bound."""
        key = ("sums", beta, upper)
        sums = self._cache.get(key)
        if sums is None:  # suffix sums per β, reused by every threshold a step asks about
            w, blo, bhi = self.weights(beta)
            ws = w[self.finite].flip(0)  # ascending scores
            cw = torch.cat([ws.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.float64)])
            edge, order, vals = (
                (self.c, self._c_order, bhi) if upper else (self.a, self._a_order, blo)
            )
            e = edge[order]  # ascending
            tail = torch.cat(
                [vals[order].flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.float64)]
            )
            sums = self._cache[key] = (cw, e, tail)
        cw, e, tail = sums
        atoms = cw[torch.searchsorted(self._s_asc, v, right=False)]
        if e.numel() == 0:
            return atoms
        return atoms + tail[torch.searchsorted(e, v, right=False)]

    def mass(self, th: tuple[float, float], beta: float) -> tuple[float, float]:
        """Bounds on ``Σ exp(β·s - shift)`` over the kept set ``{s ≥ θ}``, θ in ``th``."""
        lo = self.mass_at(torch.tensor([th[1]], dtype=torch.float64), beta, upper=False)
        hi = self.mass_at(torch.tensor([th[0]], dtype=torch.float64), beta, upper=True)
        return float(lo[0]), float(hi[0])

    def count_at(self, v: Tensor, *, upper: bool) -> Tensor:
        atoms = self._s_asc.numel() - torch.searchsorted(self._s_asc, v, right=False)
        if upper:
            return atoms.double() + self._above(v, self.c, self._c_order, self.n)
        return atoms.double() + self._above(v, self.a, self._a_order, self.n)

    def kth(self, k: int) -> tuple[float, float]:
        """Where the ``k``-th largest score lies."""
        values = torch.cat([self._s_asc, self.a, self.c]).unique().flip(0)  # descending
        lo_ok = torch.nonzero(self.count_at(values, upper=False) >= k).flatten()
        hi_ok = torch.nonzero(self.count_at(values, upper=True) >= k).flatten()
        lo = float(values[lo_ok[0]]) if lo_ok.numel() else NEG_INF
        hi = float(values[hi_ok[0]]) if hi_ok.numel() else NEG_INF
        # exact ties at the k-th value: the live run keeps k of them by token id
        if hi > NEG_INF and int((self.s > hi).sum()) < k < int((self.s >= hi).sum()):
            hi = math.nextafter(hi, math.inf)
        return (min(lo, hi), hi)


def _th_max(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return (max(a[0], b[0]), max(a[1], b[1]))


def _th_min(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return (min(a[0], b[0]), min(a[1], b[1]))


def _value_threshold(
    lo: float, hi: float, beta: float, margin: float = MARGIN
) -> tuple[float, float]:
    """A threshold computed in block units (``β·s``) as an interval of scores, widened by
    the rounding margin."""
    return ((lo - margin * (1 + abs(lo))) / beta, (hi + margin * (1 + abs(hi))) / beta)


def _entropy(sp: _Space, th: tuple[float, float], beta: float) -> tuple[float, float]:
    """Bounds on the entropy of ``softmax(β·s)`` over ``{s ≥ θ}`` (nats)."""
    w, blo, bhi = sp.weights(beta)
    z_lo, z_hi = sp.mass(th, beta)
    if not z_lo > 0:
        raise _Unknown("the kept set's normaliser is not bounded away from zero")
    shift = sp.shift(beta)
    lo, hi = th
    sure = sp.finite & (sp.s >= hi)
    maybe = sp.finite & (sp.s >= lo) & ~sure
    b = torch.where(sp.finite, beta * sp.s - shift, torch.zeros_like(sp.s))  # (K,) log-weights
    e_sure = float((w[sure] * b[sure]).sum())
    wb = (w * b)[maybe]
    e_lo, e_hi = e_sure + float(wb.clamp(max=0).sum()), e_sure + float(wb.clamp(min=0).sum())
    full, part = sp.a >= hi, (sp.c >= lo) & ~(sp.a >= hi)
    ba, bc = beta * sp.a - shift, beta * sp.c - shift  # each bin's log-weight range
    for sel, optional in ((full, False), (part, True)):
        if not bool(sel.any()):
            continue
        corners = torch.stack(
            [blo[sel] * ba[sel], blo[sel] * bc[sel], bhi[sel] * ba[sel], bhi[sel] * bc[sel]]
        )
        lo_t, hi_t = corners.min(0).values, corners.max(0).values
        if optional:  # a bin that may be partly or wholly out
            lo_t, hi_t = lo_t.clamp(max=0), hi_t.clamp(min=0)
        e_lo, e_hi = e_lo + float(lo_t.sum()), e_hi + float(hi_t.sum())
    # H = log Z - E[b], E[b] = (Σ w·b)/Z
    ratios = [e_lo / z_lo, e_lo / z_hi, e_hi / z_lo, e_hi / z_hi]
    return max(math.log(z_lo) - max(ratios), 0.0), max(math.log(z_hi) - min(ratios), 0.0)


def _ahead(sp: _Space, th_in: tuple[float, float], beta: float) -> tuple[Tensor, Tensor, Tensor]:
    """For each candidate place, bounds on the input's mass strictly ahead of it in the
    stable order, and its own weight if surely in the input (0 otherwise). (K,) each"""
    w, blo, bhi = sp.weights(beta)
    lo_in, hi_in = th_in
    sure_w = torch.where(sp.finite & (sp.s >= hi_in), w, torch.zeros_like(w))
    maybe_w = torch.where(sp.finite & (sp.s >= lo_in), w, torch.zeros_like(w))
    ahead_lo = torch.cumsum(sure_w, 0) - sure_w
    ahead_hi = torch.cumsum(maybe_w, 0) - maybe_w
    if sp.n.numel():
        # bins wholly above place j count at least their low bound (if surely in the
        # input); bins reaching up to j's score at most their high bound (ties: any order)
        # (sorted sums rather than a (K, B) matrix: this runs for every replayed step)
        full_in = torch.where(sp.a >= hi_in, blo, torch.zeros_like(blo))  # (B,)
        any_in = torch.where(sp.c >= lo_in, bhi, torch.zeros_like(bhi))  # (B,)
        ahead_lo = ahead_lo + sp._above(sp.s, sp.a, sp._a_order, full_in, strict=True)
        ahead_hi = ahead_hi + sp._above(sp.s, sp.c, sp._c_order, any_in)
    return ahead_lo, ahead_hi, sure_w


TOP_P_MARGIN = 1e-4  # the live top-p sums float32 probabilities: its rounding grows with the set


def _top_p(sp: _Space, th_in: tuple[float, float], beta: float, p: float) -> tuple[float, float]:
    """The nucleus as a threshold: tokens whose mass strictly ahead of them (stable order)
    is below ``p`` of the input's mass are kept."""
    z_lo, z_hi = sp.mass(th_in, beta)
    goal_lo, goal_hi = p * z_lo * (1 - TOP_P_MARGIN), p * z_hi * (1 + TOP_P_MARGIN)
    ahead_lo, ahead_hi, _ = _ahead(sp, th_in, beta)
    kept = sp.finite & (ahead_hi < goal_lo) & (sp.s >= th_in[1])
    out = sp.finite & (ahead_lo >= goal_hi)
    hi = float(sp.s[kept].min()) if bool(kept.any()) else math.inf
    lo = float(sp.s[out].max()) if bool(out.any()) else NEG_INF
    if sp.n.numel():
        # a bin is wholly kept when even its last token has less than the goal ahead of it,
        # wholly out when what lies surely above its top edge already reaches the goal
        reach = sp.mass_at(sp.a, beta, upper=True)  # (B,) the most mass at or above a
        whole = (reach < goal_lo) & (sp.a >= th_in[1])
        if bool(whole.any()):
            hi = min(hi, float(sp.a[whole].min()))
        over = sp.mass_at(torch.nextafter(sp.c, torch.full_like(sp.c, math.inf)), beta, upper=False)
        gone = over >= goal_hi
        if bool(gone.any()):
            lo = max(lo, float(sp.c[gone].max()))
    lo = math.nextafter(lo, math.inf) if lo > NEG_INF else th_in[0]
    if hi == math.inf:
        hi = max(lo, th_in[1])
    return (min(lo, hi), hi)


def _filter_threshold(
    name: str,
    p: PruneParams,
    sp: _Space,
    th_in: tuple[float, float],
    beta_f: float,
    t_f: float,
    h_s: tuple[float, float],
    whole: bool,
) -> tuple[float, float]:
    """The threshold one filter puts on its input ``{s ≥ θ}``, θ in ``th_in``."""
    if name == "top_k":
        return sp.kth(max(p.top_k, p.min_tokens_to_keep))
    if name == "min_p":  # p ≥ min_p·p_max ⇔ β·s ≥ β·s_max + log min_p
        step = math.log(p.min_p)
        return _value_threshold(beta_f * float(sp.s[0]) + step, beta_f * sp.top + step, beta_f)
    if name == "top_p":
        return _top_p(sp, th_in, beta_f, p.top_p)
    if name in ("epsilon", "eta"):
        z_lo, z_hi = sp.mass(th_in, beta_f)
        if not z_lo > 0:
            raise _Unknown("the filter's normaliser is not bounded away from zero")
        shift = sp.shift(beta_f)
        if name == "epsilon":
            e_lo = e_hi = math.log(p.epsilon)
        else:  # η = min(ε, √ε·e^(-H)): a larger entropy lowers the bar
            h_lo, h_hi = _entropy(sp, th_in, beta_f)
            e_lo = min(math.log(p.eta), 0.5 * math.log(p.eta) - h_hi)
            e_hi = min(math.log(p.eta), 0.5 * math.log(p.eta) - h_lo)
        return _value_threshold(
            e_lo + math.log(z_lo) + shift, e_hi + math.log(z_hi) + shift, beta_f
        )
    if name == "free_energy":  # keep s_max - s ≤ κ·T·H(softmax(s))
        h_lo, h_hi = h_s if whole else _entropy(sp, th_in, 1.0)
        k = p.free_energy_kappa * t_f
        return _value_threshold(float(sp.s[0]) - k * h_hi, sp.top - k * h_lo, 1.0)
    raise _Unknown(f"{name} cannot be decided from the recorded candidates")


def _pick(sp: _Space, th: tuple[float, float], beta: float, u: float) -> tuple[int, float]:
    """The candidate place whose CDF interval holds ``u·Z_kept`` for every admissible tail,
    and the tail's estimated share of the kept mass."""
    lo, hi = th
    undecided = sp.finite & (sp.s >= lo) & (sp.s < hi)
    if bool(undecided.any()):
        # a cut among the candidates that the bounds leave open: the pick is known only if
        # every admissible cut gives the same one
        cuts = sorted(set(sp.s[undecided].tolist()) | {hi})
        if len(cuts) > 16:
            raise _Unknown("a filter's cut among the candidates is not known")
        picks = {_pick(sp, (v, v), beta, u) for v in cuts}
        if len({j for j, _ in picks}) > 1:
            raise _Unknown(
                "the draw's pick depends on where a filter cuts", max(sh for _, sh in picks)
            )
        return picks.pop()
    _, blo, bhi = sp.weights(beta)
    z_lo, z_hi = sp.mass(th, beta)
    tail_lo = float(blo[sp.a >= hi].sum())
    tail_hi = float(bhi[sp.c >= lo].sum())
    share = 0.5 * (tail_lo / max(z_lo, 1e-300) + tail_hi / max(z_hi, 1e-300))
    b_lo, b_hi, w = _ahead(sp, th, beta)
    t_lo, t_hi = u * z_lo * (1 - MARGIN), u * z_hi * (1 + MARGIN)
    ok = (w > 0) & (b_hi <= t_lo) & (t_hi < b_lo + w * (1 - MARGIN))
    hit = torch.nonzero(ok).flatten()
    if hit.numel() != 1:
        if tail_hi > 0 and t_hi >= float(b_lo[w > 0][-1] + w[w > 0][-1]) * (1 - MARGIN):
            raise _Unknown("the draw may land in the tail the record does not hold", share)
        raise _Unknown("the draw lies too close to a boundary for the tail's bounds", share)
    j = int(hit[0])
    # neighbours whose float32 probabilities could tie with this one's are ordered by id in
    # the live run: a near-tie next to the draw is left undecided
    for k in (j - 1, j + 1):
        if 0 <= k < w.numel() and w[k] > 0 and abs(float(w[k] - w[j])) <= 1e-6 * float(w[j]):
            raise _Unknown("the draw lands on one of two near-equal candidates")
    return j, share


def decide(
    cand_ids: Tensor,
    cand_logits: Tensor,
    tail: Tail | dict | None,
    params: PruneParams,
    *,
    temperature: float,
    greedy: bool,
    u: float,
    entropy: float,
    gravity: Tensor | None = None,
    gravity_recorded: bool = True,
    mirostat_mu: float | None = None,
    token_rank: int = -1,
) -> Decision:
    """What the draw ``u`` picks under ``params`` over the whole vocabulary, from the record.

    Parameters
    ----------
    cand_ids, cand_logits : (K,) the recorded candidates and their raw logits.
    tail : the step's tail summary (:func:`summarize`, or a :class:`Tail`), None when
        nothing is known of the unrecorded tokens.
    params : the effective settings of the step (after a fallback, if one fired).
    temperature, greedy : the step's effective temperature and whether it is greedy, as the
        chain computed them (exact when their inputs are; see the module docstring).
    entropy : the full vocabulary's raw entropy (nats), as recorded.
    gravity : (K,) ``G`` over the candidates when gravity is on.
    gravity_recorded : whether ``gravity`` is the one the run recorded (the tail's range of
        ``G`` then applies).
    mirostat_mu : mirostat's mu before this step.
    token_rank : the recorded token's place among the candidates, for ``final_q``.

    Returns
    -------
    Decision, with ``index`` None when the record cannot decide.
    """
    try:
        return _decide(
            cand_ids,
            cand_logits,
            tail,
            params,
            temperature,
            greedy,
            u,
            entropy,
            gravity,
            gravity_recorded,
            mirostat_mu,
            token_rank,
        )
    except _Unknown as why:
        return Decision(index=None, why=str(why), tail_share=why.share, q_exact=False)


def _decide(ids, x, tail, p, t, greedy, u, entropy, g, g_recorded, mu, token_rank) -> Decision:
    x = x.double()  # (K,)
    if tail is None:
        raise _Unknown("the record holds no summary of the unrecorded tail")
    full: Tail = tail if isinstance(tail, Tail) else Tail.from_record(tail)
    tl: Tail | None = full
    lam = p.gravity_lambda if g is not None else 0.0
    s, s_is_x = x, True
    if lam != 0.0 and not bool(g.max() == g.min()):  # a constant G changes nothing
        s, s_is_x = x + lam * g.double(), False
    rerank = lam != 0.0 and p.gravity_mode == "rerank"
    if rerank:
        # only the top rerank_k raw candidates stay; they are recorded when that many
        # candidates lie above the tail's top (candidates are in raw order, ties by id)
        k = max(p.rerank_k, p.min_tokens_to_keep)
        above = int((x > float(full.c.max())).sum()) if full.count else x.numel()
        if k > above:
            raise _Unknown("gravity reranks tokens below the recorded candidates")
        keep = torch.arange(x.numel()) < k
        s = torch.where(keep & torch.isfinite(x), s, torch.full_like(s, NEG_INF))
        tl = None
    elif not s_is_x:
        tl = tl.shifted(lam) if g_recorded else None
        if tl is None and full.count:
            raise _Unknown("full-mode gravity moves tokens the record does not hold")
    sp = _Space(s, ids.long(), tl)
    if greedy:
        if sp.c.numel() and float(sp.c.max()) >= float(sp.s[0]):
            raise _Unknown("a token of the tail may hold the largest score")
        top = float(sp.s[0])
        return _decision(sp, 0, 0.0, token_rank, (top, top), None)
    alive = (NEG_INF, NEG_INF)
    if s_is_x:
        h_s = (entropy, entropy)  # the record's: the whole vocabulary's, as the live chain
    else:
        if not rerank and p.adaptive in ("target", "edt", "dynatemp"):
            raise _Unknown("adaptive temperature reads the entropy of unrecorded scores")
        h_s = _entropy(sp, alive, 1.0)
    hf = p.order == "hf"
    beta_f = 1.0 / t if hf else 1.0
    t_f = p.temperature if (not hf and p.adaptive == "dynatemp") else t
    seq = p.combine == "sequential"
    th_m = sp.kth(p.min_tokens_to_keep)
    th = alive
    for f in active_filters(p):
        if f.name == "typical" and sp.n.numel():
            raise _Unknown("typical sampling ranks tokens the record does not hold")
        th_in = th if seq else alive
        th_f = _filter_threshold(f.name, p, sp, th_in, beta_f, t_f, h_s, not seq or th == alive)
        # no stage leaves fewer than min_tokens_to_keep: the top-up takes the most probable
        th = _th_min(_th_max(th, th_f), _th_max(th_m, th))
    if not hf and p.adaptive == "dynatemp":
        lo_n, hi_n = sp.count_at(torch.tensor([th[1], th[0]], dtype=torch.float64), upper=True)
        if sp.n.numel() and float(sp.c.max()) >= th[0] or int(lo_n) != int(hi_n):
            raise _Unknown("dynatemp's temperature depends on survivors the record does not hold")
        kept = torch.where(sp.s >= th[1], sp.s, torch.full_like(sp.s, NEG_INF)).float()
        t = max(adaptive_temperature(p, kept), 1e-4)
    beta = 1.0 / t
    if p.adaptive == "mirostat":
        mu = 2.0 * p.mirostat_tau if mu is None else mu
        z_lo, z_hi = sp.mass(th, beta)
        if not z_lo > 0:
            raise _Unknown("mirostat's normaliser is not bounded away from zero")
        shift = sp.shift(beta)
        lo = math.log(z_lo) + shift - mu * LN2
        th_miro = _value_threshold(lo, math.log(z_hi) + shift - mu * LN2, beta)
        th = _th_min(_th_max(th, th_miro), _th_max(th_m, th))
    j, share = _pick(sp, th, beta, u)
    return _decision(sp, j, share, token_rank, th, beta)


def _decision(sp: _Space, place: int, share: float, token_rank: int, th, beta) -> Decision:
    """The decision at ``place`` in ``sp``'s order, with the recorded token's final
    probability (mirostat's state reads it)."""
    index = int(sp.order[place])
    q, q_exact = None, True
    if token_rank >= 0:
        k = int(torch.nonzero(sp.order == token_rank).flatten()[0])
        if beta is None:  # greedy: a point mass
            q = 1.0 if k == place else 0.0
        elif not (float(sp.s[k]) >= th[0]):
            q = 0.0
        else:
            w = sp.weights(beta)[0]
            z_lo, z_hi = sp.mass(th, beta)
            q = float(w[k]) / (0.5 * (z_lo + z_hi))
            q_exact = float(sp.s[k]) >= th[1] and z_hi - z_lo <= MARGIN * z_lo
    return Decision(index=index, tail_share=share, final_q=q, q_exact=q_exact)
