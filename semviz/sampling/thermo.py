"""Thermodynamic quantities of one step: entropy, free energy, adaptive temperature.

A token ``w`` is a micro-state with energy ``U(w) = -s(w)`` (``s`` the score); at temperature
``T`` its probability is ``exp(-U/T) / Z`` (seed §4). The entropy ``H`` measures the spread,
``exp(H)`` is the effective number of candidates, and the free energy of a set ``S`` is
``F = -T log sum_{w in S} exp(-U(w)/T) = <U> - T·H``.

Examples
--------
>>> import math, torch
>>> h, var = entropy_stats(torch.zeros(4))  # uniform over 4 tokens
>>> round(float(h), 4) == round(math.log(4), 4), float(var) < 1e-6
(True, True)
>>> round(free_energy(torch.tensor([0.0, 0.0]), 1.0), 4)  # -log 2
-0.6931
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from semviz.sampling.params import PruneParams

__all__ = [
    "LN2",
    "AttentionReading",
    "adaptive_temperature",
    "attention_reading",
    "entropix_formula",
    "entropy_parts",
    "entropy_stats",
    "free_energy",
]

LN2 = math.log(2.0)
NEG_INF = float("-inf")


def entropy_stats(logits: Tensor, dim: int = -1) -> tuple[Tensor, Tensor]:
    """Entropy and varentropy of ``softmax(logits)`` in nats, float32.

    ``-inf`` entries contribute zero (no NaN). Returns 0-d tensors for 1-D input, else one
    value per row.

    >>> h, _ = entropy_stats(torch.tensor([0.0, float("-inf")]))  # one possible token
    >>> float(h)
    0.0
    """
    h, var, _, _ = entropy_parts(logits.float(), dim)
    return h, var


def entropy_parts(x: Tensor, dim: int = -1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(H, varentropy, log p, p)`` of ``softmax(x)``: one normaliser, shared by the callers."""
    logp = torch.log_softmax(x, dim=dim)  # (..., V)
    p = logp.exp()
    # a masked token gives 0·(-inf) = NaN: nansum drops exactly those terms; 0 - x rather
    # than -x, so a single candidate has entropy 0.0, not -0.0
    h = 0.0 - (p * logp).nansum(dim)  # (...)
    var = (p * (logp + h.unsqueeze(dim)).square()).nansum(dim)  # centred: no cancellation
    return h.clamp_min(0.0), var.clamp_min(0.0), logp, p


def free_energy(scores: Tensor, temperature: float, kept: Tensor | None = None) -> float:
    """Free energy ``F = -T log sum_{w in kept} exp(s(w)/T)`` of a set, energies ``U = -s``.

    Equals ``<U> - T·H`` of the Boltzmann distribution on the set. ``T = 0`` gives ``min U``.

    >>> free_energy(torch.tensor([2.0, 1.0]), 0.0)
    -2.0
    """
    s = scores.float()
    if kept is not None:
        s = s.masked_fill(~kept, NEG_INF)
    if temperature == 0.0:
        return float(-s.max())
    return float(-temperature * torch.logsumexp(s / temperature, -1))


@dataclass(frozen=True)
class AttentionReading:
    """What entropix's temperature rule reads of one step's attention: the last query's
    attention in one layer (entropix reads the last), summarised over its heads, in bits.

    ``entropy``: the heads' mean attention entropy; ``spread``: the variance over heads of
    that entropy (bits², what entropix calls the attention varentropy; the population
    variance, as its JAX sampler's ``jnp.var`` takes it, where its torch port's ``torch.var``
    divides by H − 1); ``agreement``: the
    heads' mean ``Σ|p − p̄| / n`` (``p̄`` the mean row of the layer's heads, ``n`` the keys
    read), 0 when every head reads alike.
    """

    entropy: float
    spread: float
    agreement: float


def attention_reading(entropy: Tensor, agreement: Tensor) -> AttentionReading:
    """The :class:`AttentionReading` of one layer from its heads' attention entropy (nats)
    and agreement, each ``(H,)``, as :func:`semviz.model.capture.attention_metrics` gives them.

    >>> r = attention_reading(torch.tensor([LN2, 3 * LN2]), torch.tensor([0.1, 0.3]))
    >>> round(r.entropy, 6), round(r.spread, 6), round(r.agreement, 6)  # bits: 1 and 3
    (2.0, 1.0, 0.2)
    """
    bits = entropy.double() / LN2  # (H,)
    return AttentionReading(
        entropy=float(bits.mean()),
        spread=float(bits.var(unbiased=False)),
        agreement=float(agreement.double().mean()),
    )


def adaptive_temperature(
    params: PruneParams,
    scores: Tensor,
    entropy: float | None = None,
    n_extra: int = 0,
    *,
    varentropy: float | None = None,
    attention: AttentionReading | None = None,
) -> float:
    """Effective temperature for this step from the entropy of ``softmax(scores)`` (nats).

    - ``target`` (seed §5.2): ``T = clip(T0 + sign·gain·(H - H*), t_min, t_max)``;
      ``sign=-1`` cools when the model is unsure (stable long text), ``+1`` heats
      (exploration).
    - ``edt``: ``T = T0 · N^(θ/H)`` (Zhang et al. 2024), ``0 < N < 1``.
    - ``dynatemp`` (llama.cpp): ``T = T_lo + (T_hi - T_lo)·(H/ln n)^exponent`` with
      ``T_lo = max(0, T0 - range)``, ``T_hi = T0 + range``, ``n`` finite candidates.
    - ``entropix`` (its adaptive sampler's temperature):
      ``T = clip(T0·(1 + a·(H + V) + b·(H_attn + V_attn) − c·agreement), t_min, t_max)``,
      every term in bits as entropix computes it: ``H`` and ``V`` the logits' entropy and
      varentropy (``entropy`` and ``varentropy`` in nats, converted here), the attention
      terms from ``attention`` (:class:`AttentionReading`). The caller passes the model's
      raw logits' moments, as entropix reads them.
    - ``none``/``mirostat``: ``T0``.

    ``n_extra`` counts finite tokens not in ``scores`` (a recorded subset's tail).

    >>> p = PruneParams(adaptive="target", target_entropy=0.0, controller_gain=0.1)
    >>> round(adaptive_temperature(p, torch.zeros(4)), 4)  # H = ln 4: cooled by 0.1·ln 4
    0.8614
    >>> p = PruneParams(adaptive="entropix", temperature=0.5)
    >>> a = AttentionReading(entropy=2.0, spread=0.5, agreement=0.5)
    >>> t = adaptive_temperature(p, torch.zeros(2), varentropy=0.0, attention=a)
    >>> round(t, 6)  # H = 1 bit, V = 0: 0.5·(1 + 0.3·1 + 0.2·2.5 − 0.2·0.5)
    0.85
    """
    t0 = params.temperature
    mode = params.adaptive
    if mode in ("none", "mirostat") or t0 == 0.0:
        return t0
    if mode == "entropix":
        return _entropix(params, scores, entropy, varentropy, attention)
    h = float(entropy_stats(scores)[0]) if entropy is None else entropy
    if mode == "target":
        t = t0 + params.controller_sign * params.controller_gain * (h - params.target_entropy)
        return min(max(t, params.adaptive_t_min), params.adaptive_t_max)
    if mode == "edt":
        if h <= 1e-12:
            return 0.0
        return t0 * params.edt_n ** (params.edt_theta / h)
    # dynatemp
    n = int(torch.isfinite(scores).sum()) + n_extra
    if n <= 1:
        return t0
    lo, hi = max(0.0, t0 - params.dynatemp_range), t0 + params.dynatemp_range
    norm_h = min(h / math.log(n), 1.0)
    return lo + (hi - lo) * norm_h**params.dynatemp_exponent


def _entropix(
    params: PruneParams,
    scores: Tensor,
    entropy: float | None,
    varentropy: float | None,
    attention: AttentionReading | None,
) -> float:
    if attention is None:
        raise ValueError(
            "Adaptive temperature 'entropix' reads the attention metrics of the step's own "
            "query, and this step has none (a run recorded with the lens off, or an older "
            "trace): choose another adaptive temperature, or decode again with the lens on."
        )
    if entropy is None or varentropy is None:
        h_t, v_t = entropy_stats(scores)
        entropy = float(h_t) if entropy is None else entropy
        varentropy = float(v_t) if varentropy is None else varentropy
    return entropix_formula(params, entropy, varentropy, attention)[1]


def entropix_formula(
    params: PruneParams, entropy: float, varentropy: float, attention: AttentionReading
) -> tuple[str, float]:
    """entropix's temperature for one step, written out with its numbers, and its value.

    ``entropy`` and ``varentropy``: the raw logits', in nats.

    >>> p = PruneParams(adaptive="entropix", temperature=0.5)
    >>> text, t = entropix_formula(p, LN2, 0.0, AttentionReading(2.0, 0.5, 0.5))
    >>> text, round(t, 6)
    ('T = 0.5·(1 + 0.3·1.00 + 0.2·2.50 − 0.2·0.500) = 0.85', 0.85)
    """
    logits_bits = entropy / LN2 + varentropy / LN2**2
    attn_bits = attention.entropy + attention.spread
    a, b, c = (
        params.entropix_logits_gain,
        params.entropix_attention_gain,
        params.entropix_agreement_gain,
    )
    raw = params.temperature * (1.0 + a * logits_bits + b * attn_bits - c * attention.agreement)
    t = min(max(raw, params.adaptive_t_min), params.adaptive_t_max)
    text = (
        f"T = {params.temperature:g}·(1 + {a:g}·{logits_bits:.2f} + {b:g}·{attn_bits:.2f} "
        f"− {c:g}·{attention.agreement:.3f}) = {raw:.3g}"
    )
    if t != raw:
        text += f", clipped to {t:g}"
    return text, t
