"""A plain reference of the sampling chain, written for clarity rather than speed.

One filter after another over the whole index set, orders as sorted Python lists, no sorted
head, no shared code with ``semviz.sampling``. Tie rule ``"stable"`` only (``"hf"`` is checked
against transformers itself), no fallback. The arithmetic on tensors is written the way the
definitions read, in float32 like the core, so kept sets can be compared exactly.
"""

from __future__ import annotations

import math

import torch

NEG = float("-inf")


def order(v: torch.Tensor) -> list[int]:
    """Finite entries of ``v`` by value, largest first, ties by the lower index."""
    vals = v.tolist()
    return sorted((i for i, a in enumerate(vals) if a > NEG), key=lambda i: (-vals[i], i))


def entropy(v: torch.Tensor) -> torch.Tensor:
    """H of softmax(v) in nats, float32; -inf entries contribute nothing."""
    logp = torch.log_softmax(v, -1)
    return (-(logp.exp() * logp).nansum()).clamp_min(0.0)


def first(idx: list[int], n: int, k: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=torch.bool)
    out[idx[:k]] = True
    return out


def temperature(p, s: torch.Tensor, x: torch.Tensor | None = None, attention=None) -> float:
    t0, h = p.temperature, float(entropy(s))
    if p.adaptive == "entropix":  # entropix's sampler: the raw logits x, everything in bits
        logq = torch.log_softmax(x.float(), -1) / math.log(2)
        q = torch.softmax(x.float(), -1)
        hb = -(q * logq).nansum()
        vb = (q * (logq + hb) ** 2).nansum()
        a = attention
        t = t0 * (
            1
            + p.entropix_logits_gain * float(hb + vb)
            + p.entropix_attention_gain * (a.entropy + a.spread)
            - p.entropix_agreement_gain * a.agreement
        )
        return min(max(t, p.adaptive_t_min), p.adaptive_t_max)
    if p.adaptive == "target":
        t = t0 + p.controller_sign * p.controller_gain * (h - p.target_entropy)
        return min(max(t, p.adaptive_t_min), p.adaptive_t_max)
    if p.adaptive == "edt":
        return 0.0 if h <= 1e-12 else t0 * p.edt_n ** (p.edt_theta / h)
    n = int(torch.isfinite(s).sum())
    if p.adaptive == "dynatemp" and n > 1:
        lo, hi = max(0.0, t0 - p.dynatemp_range), t0 + p.dynatemp_range
        return lo + (hi - lo) * min(h / math.log(n), 1.0) ** p.dynatemp_exponent
    return t0


def keep(name: str, x: torch.Tensor, s: torch.Tensor, p, t: float) -> torch.Tensor:
    """What one filter keeps of its input ``x`` (K,) (``s``: the T = 1 scores)."""
    K, m, probs, o = x.shape[0], p.min_tokens_to_keep, torch.softmax(x, -1), order(x)
    guard = first(o, K, m)
    if name == "top_k":
        return first(o, K, max(p.top_k, m))
    if name == "top_p":
        q = probs[o]
        inside = (q.cumsum(0) - q < p.top_p).tolist()  # mass ahead of each token < p
        return first([i for i, a in zip(o, inside, strict=True) if a], K, K) | guard
    if name == "min_p":
        return ~(probs < p.min_p * probs.max()) | guard
    if name == "epsilon":
        return ~(probs < p.epsilon) | guard
    if name == "eta":
        cut = torch.clamp(math.sqrt(p.eta) * torch.exp(-entropy(x)), max=p.eta)
        return ~(probs < cut) | guard
    if name == "typical":
        logp = torch.log_softmax(x, -1)
        h = -(logp.exp() * logp).nansum()
        dist = torch.abs(-logp - h).tolist()  # |surprise - H|
        by = sorted(range(K), key=lambda i: (dist[i], i))  # closest to H first
        cum = torch.softmax(x[by], -1).cumsum(0)
        last = by[min(int((cum < p.typical_p).sum()), K - 1)]
        return torch.tensor([d <= dist[last] for d in dist]) | first(by, K, m)
    s2 = s.masked_fill(torch.isneginf(x), NEG)  # free energy: the T = 1 scores
    window = p.free_energy_kappa * t * entropy(s2)
    return (s2.max() - s2 <= window) | first(order(s2), K, m)


FILTER_FIELDS = {
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical": "typical_p",
    "epsilon": "epsilon",
    "eta": "eta",
    "free_energy": "free_energy",
}
NEUTRAL = {
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "epsilon": 0.0,
    "eta": 0.0,
    "free_energy": False,
}


def chain(x: torch.Tensor, p, gravity=None, mu=None, attention=None):
    """``(kept (K,), final (K,), [(stage, n_kept)])`` of one step, tie rule "stable"."""
    x = x.float()
    K, m = x.shape[0], p.min_tokens_to_keep
    alive, s, stages = x > NEG, x, []
    if gravity is not None and p.gravity_lambda != 0.0:
        g = gravity.float()
        s = x if bool(g.max() == g.min()) else x + p.gravity_lambda * g
        if p.gravity_mode == "rerank":
            alive = alive & first(order(x), K, max(p.rerank_k, m))
            s = s.masked_fill(~alive, NEG)
            stages.append(("rerank", int(alive.sum())))
        else:
            stages.append(("gravity", int(alive.sum())))
    t = p.temperature
    if t > 0 and (p.order == "hf" or p.adaptive != "dynatemp"):
        t = temperature(p, s, x, attention)
    if p.temperature == 0.0 or t < 1e-4:
        kept = first(order(s), K, 1)
        return kept, kept.float(), [*stages, ("greedy", 1)]
    block = (s / t if p.order == "hf" else s).masked_fill(~alive, NEG)
    cur = alive.clone()
    for name, fld in FILTER_FIELDS.items():
        if getattr(p, fld) == NEUTRAL[fld]:
            continue
        src = block.masked_fill(~cur, NEG) if p.combine == "sequential" else block
        after = cur & keep(name, src, s, p, t)
        for i in order(block.masked_fill(~cur, NEG)):  # never fewer than m (or all there is)
            if int(after.sum()) >= min(m, int(cur.sum())):
                break
            after[i] = True
        cur = after
        stages.append((name, int(cur.sum())))
    if p.order == "llama.cpp":
        if p.adaptive == "dynatemp":
            t = temperature(p, s.masked_fill(~cur, NEG))
        t = max(t, 1e-4)
        stages.append(("temperature", int(cur.sum())))
    if p.adaptive == "mirostat":
        z = (s / t).masked_fill(~cur, NEG)
        surprise = -torch.log_softmax(z, -1) / math.log(2)
        mu = torch.tensor(2.0 * p.mirostat_tau if mu is None else mu, dtype=torch.float32)
        cur = cur & ((surprise <= mu) | first(order(z), K, m))
        stages.append(("mirostat", int(cur.sum())))
    z = torch.full((K,), NEG)
    z[cur] = s[cur] / t
    return cur, torch.softmax(z, -1), stages


def pick(final: torch.Tensor, u: float) -> int:
    """Inverse CDF: the token where the running mass, largest first, passes ``u``."""
    q = final.double()
    target, acc = u * float(q.sum()), 0.0
    ids = [i for i in order(q) if q[i] > 0]
    for i in ids:
        acc += float(q[i])
        if acc > target:
            return i
    return ids[-1]
