"""The pruning core: one step's logits -> gravity -> temperature -> filters -> distribution.

Everything here is a pure tensor function. Live decoding, counterfactual replay, the HF
``LogitsProcessor`` classes and the CLI all call :func:`prune` and :func:`choose`.

Thermodynamic reading (seed §4): a token ``w`` is a micro-state with energy
``U(w) = -logit(w)``; at temperature ``T`` its probability is ``exp(-U/T) / Z``. The entropy
``H`` measures the spread, ``exp(H)`` is the effective number of candidates, and the free
energy of a set ``S`` is ``F = -T log sum_{w in S} exp(-U(w)/T) = <U> - T H``.

The chain, per step::

    raw logits x ─► [candidates: drop tail] ─► gravity: s = x + λ·G (full or rerank)
      ─► order "hf":        temperature s/T ─► filters ─► final
      ─► order "llama.cpp": filters on s    ─► temperature ─► final

Filters (top-k, top-p, min-p, typical, epsilon, eta, free energy) are evaluated on the same
input distribution and their kept sets intersected (``combine="intersection"``, the default),
or applied one after another as HF ``generate`` does (``combine="sequential"``). Mirostat,
when on, truncates the survivors last.

Tie rule. ``tie_rule="hf"`` reproduces transformers' warpers operation for operation, so the
kept set equals theirs for any input, ties included (their top-p/typical use an unstable sort,
so which tied tokens survive is whatever ``torch.sort`` returns). ``tie_rule="stable"`` (the
default) orders by value with ties broken by the lower index, so the result is
deterministic: top-k keeps exactly ``k`` tokens, top-p the smallest such prefix, and the
``min_tokens_to_keep`` guard protects the first tokens of that order.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import torch
from torch import Tensor

from semviz.gravity import (
    candidate_matrix,
    context_mass,
    ema_mass,
    gravity_for_step,
    gravity_potential,
    normalize_gravity,
)

__all__ = [
    "candidate_matrix",
    "context_mass",
    "ema_mass",
    "gravity_for_step",
    "gravity_potential",
    "normalize_gravity",
    "PruneParams",
    "PruneResult",
    "SamplerState",
    "Stage",
    "choose",
    "entropy_stats",
    "free_energy",
    "prune",
    "stable_head",
    "stable_order",
    "top_k_mask",
    "top_p_mask",
    "min_p_mask",
    "typical_mask",
    "epsilon_mask",
    "eta_mask",
    "free_energy_mask",
    "mirostat_mask",
    "adaptive_temperature",
    "LN2",
]

LN2 = math.log(2.0)
T_GREEDY = 1e-4  # an effective temperature below this is greedy: s/T would overflow
NEG_INF = float("-inf")

Order = Literal["hf", "llama.cpp"]
TieRule = Literal["stable", "hf"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "order": ("hf", "llama.cpp"),
    "combine": ("intersection", "sequential"),
    "tie_rule": ("stable", "hf"),
    "gravity_mode": ("full", "rerank"),
    "gravity_mass": ("attention", "ema", "uniform", "idf", "norm", "info"),
    "gravity_sim": ("cosine", "dot"),
    "gravity_space": ("embedding", "hidden", "contextual"),
    "gravity_kind": ("pull", "contrast"),
    "gravity_anchor": ("prompt", "context", "window"),
    "adaptive": ("none", "target", "edt", "dynatemp", "mirostat"),
}


# --------------------------------------------------------------------------------------------
# Parameters and state
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PruneParams:
    """Everything that shapes one step's distribution. Defaults are plain sampling.

    Filters count as off at their neutral value: ``top_k=0``, ``top_p=1``, ``min_p=0``,
    ``typical_p=1``, ``epsilon=0``, ``eta=0``. ``temperature=0`` means greedy.
    See the module docstring for ``order``, ``combine`` and ``tie_rule``.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    epsilon: float = 0.0
    eta: float = 0.0
    order: Order = "hf"
    combine: Literal["intersection", "sequential"] = "intersection"
    tie_rule: TieRule = "stable"
    min_tokens_to_keep: int = 1
    # narrative gravity: s = log P + λ·G
    gravity_lambda: float = 0.0
    gravity_mode: Literal["full", "rerank"] = "full"
    rerank_k: int = 64
    gravity_mass: Literal["attention", "ema", "uniform", "idf", "norm", "info"] = "info"
    gravity_sim: Literal["cosine", "dot"] = "cosine"
    gravity_space: Literal["embedding", "hidden", "contextual"] = "embedding"
    gravity_layers: tuple[int, ...] | None = None
    gravity_heads: tuple[int, ...] | None = None
    ema_decay: float = 0.9
    # gravity variants (see semviz.gravity); one line of help each
    # pull: G = Σ m_i·sim(w, t_i), z-scored; contrast: log P(w|C) - log P(w|last k tokens)
    gravity_kind: Literal["pull", "contrast"] = "contrast"
    # which tokens carry mass: the user's prompt, the whole context, or the last gravity_window
    gravity_anchor: Literal["prompt", "context", "window"] = "prompt"
    # positions in the recency window of gravity_anchor="window"
    gravity_window: int = 64
    # the first positions (attention sinks) get no mass
    gravity_sinks: int = 1
    # special and chat-template tokens and the system prompt get no mass
    gravity_skip_template: bool = True
    # tokens that would repeat an n-gram of the context keep no positive gravity; 0 = off
    gravity_ngram: int = 2
    # a token whose embedding cosine with a context token is >= this keeps no positive gravity
    gravity_copy_cos: float = 0.65
    # pull only attracts: G = max(z - gravity_floor, 0), nothing is pushed away
    gravity_attract_only: bool = True
    # with gravity_attract_only, the z-score above which a token is pulled
    gravity_floor: float = 1.0
    # gravity_kind="contrast": the short context is the last k tokens
    gravity_contrast_k: int = 8
    # free-energy criterion: keep w iff U(w) - U_min <= kappa * T * H
    free_energy: bool = False
    free_energy_kappa: float = 1.0
    # adaptive temperature
    adaptive: Literal["none", "target", "edt", "dynatemp", "mirostat"] = "none"
    target_entropy: float = 2.0
    controller_gain: float = 0.1
    controller_sign: int = -1
    adaptive_t_min: float = 0.05
    adaptive_t_max: float = 2.0
    edt_theta: float = 1.0
    edt_n: float = 0.8
    dynatemp_range: float = 0.5
    dynatemp_exponent: float = 1.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # safety fallback
    fallback: bool = False
    fallback_ngram: int = 4
    fallback_ngram_repeats: int = 2
    fallback_collapse_steps: int = 8
    fallback_collapse_threshold: float = 0.05
    fallback_gravity_ratio: float = 2.0

    def __post_init__(self) -> None:
        for name in ("gravity_layers", "gravity_heads"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that is out of range."""

        def bad(name: str, why: str) -> None:
            raise ValueError(f"PruneParams.{name}={getattr(self, name)!r}: {why}")

        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                bad(name, f"must be one of {choices}")
        ints = (
            "top_k",
            "min_tokens_to_keep",
            "rerank_k",
            "controller_sign",
            "fallback_ngram",
            "fallback_ngram_repeats",
            "fallback_collapse_steps",
        )
        for name in ints:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(name, "must be an int")
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                bad(f.name, "must be finite")
        if self.temperature < 0:
            bad("temperature", "must be >= 0 (0 means greedy)")
        if self.top_k < 0:
            bad("top_k", "must be >= 0 (0 means off)")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        if not 0.0 < self.typical_p <= 1.0:
            bad("typical_p", "must be in (0, 1]")
        if not 0.0 <= self.epsilon < 1.0:
            bad("epsilon", "must be in [0, 1)")
        if not 0.0 <= self.eta < 1.0:
            bad("eta", "must be in [0, 1)")
        if self.min_tokens_to_keep < 1:
            bad("min_tokens_to_keep", "must be >= 1")
        if self.rerank_k < 1:
            bad("rerank_k", "must be >= 1")
        if not 0.0 <= self.ema_decay < 1.0:
            bad("ema_decay", "must be in [0, 1)")
        for name in ("gravity_layers", "gravity_heads"):
            v = getattr(self, name)
            if v is not None and (
                not isinstance(v, tuple)
                or len(v) == 0
                or any(isinstance(i, bool) or not isinstance(i, int) for i in v)
            ):
                bad(name, "must be None or a non-empty tuple of ints")
        for name in ("gravity_window", "gravity_sinks", "gravity_ngram", "gravity_contrast_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(name, "must be an int")
        if self.gravity_window < 1:
            bad("gravity_window", "must be >= 1")
        if self.gravity_sinks < 0:
            bad("gravity_sinks", "must be >= 0")
        if not isinstance(self.gravity_skip_template, bool):
            bad("gravity_skip_template", "must be a bool")
        if self.gravity_ngram < 0:
            bad("gravity_ngram", "must be >= 0 (0 means off)")
        if not isinstance(self.gravity_attract_only, bool):
            bad("gravity_attract_only", "must be a bool")
        if self.gravity_floor < 0:
            bad("gravity_floor", "must be >= 0 (a z-score)")
        if not 0.0 <= self.gravity_copy_cos <= 1.0:
            bad("gravity_copy_cos", "must be in [0, 1] (0 means off)")
        if self.gravity_contrast_k < 1:
            bad("gravity_contrast_k", "must be >= 1")
        if not isinstance(self.free_energy, bool):
            bad("free_energy", "must be a bool")
        if self.free_energy_kappa < 0:
            bad("free_energy_kappa", "must be >= 0")
        if self.target_entropy < 0:
            bad("target_entropy", "must be >= 0 (nats)")
        if self.controller_gain < 0:
            bad("controller_gain", "must be >= 0")
        if self.controller_sign not in (-1, 1):
            bad("controller_sign", "must be -1 (cool when uncertain) or +1 (heat when uncertain)")
        if not 0.0 < self.adaptive_t_min <= self.adaptive_t_max:
            bad("adaptive_t_min", "must satisfy 0 < adaptive_t_min <= adaptive_t_max")
        if self.edt_theta < 0:
            bad("edt_theta", "must be >= 0")
        if not 0.0 < self.edt_n < 1.0:
            bad("edt_n", "must be in (0, 1)")
        if self.dynatemp_range < 0:
            bad("dynatemp_range", "must be >= 0")
        if self.dynatemp_exponent <= 0:
            bad("dynatemp_exponent", "must be > 0")
        if self.mirostat_tau <= 0:
            bad("mirostat_tau", "must be > 0 (bits)")
        if self.mirostat_eta <= 0:
            bad("mirostat_eta", "must be > 0")
        if not isinstance(self.fallback, bool):
            bad("fallback", "must be a bool")
        if self.fallback_ngram < 1:
            bad("fallback_ngram", "must be >= 1")
        if self.fallback_ngram_repeats < 1:
            bad("fallback_ngram_repeats", "must be >= 1")
        if self.fallback_collapse_steps < 1:
            bad("fallback_collapse_steps", "must be >= 1")
        if self.fallback_collapse_threshold < 0:
            bad("fallback_collapse_threshold", "must be >= 0")
        if self.fallback_gravity_ratio <= 0:
            bad("fallback_gravity_ratio", "must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def steering(self) -> bool:
        """True when anything beyond the standard chain is on."""
        return self.gravity_lambda != 0.0 or self.free_energy or self.adaptive != "none"

    def replace(self, **changes: Any) -> PruneParams:
        d = self.to_dict()
        d.update(changes)
        return PruneParams.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("gravity_layers", "gravity_heads"):
            if d[name] is not None:
                d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PruneParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"PruneParams.from_dict: unknown keys {unknown}")
        d = dict(d)
        for name in ("gravity_layers", "gravity_heads"):
            if d.get(name) is not None:
                d[name] = tuple(d[name])
        return cls(**d)


@dataclass
class Stage:
    """One waterfall row: how many tokens survived the stage and what mass it removed.

    ``mass_removed`` is a fraction of the mass entering the stage, measured on the
    distribution the stage looks at.
    """

    name: str
    n_kept: int
    mass_removed: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SamplerState:
    """Mutable per-sequence state: mirostat's mu, the controllers, histories, attention EMA.

    :func:`prune` only reads it; :func:`choose` (or :meth:`observe`) advances it once the
    step's token is known. Replay should work on a :meth:`copy`.
    """

    mirostat_mu: float | None = None
    last_temperature: float | None = None
    tokens: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    attention_ema: Tensor | None = None  # (N,)
    steps: int = 0

    def copy(self) -> SamplerState:
        return SamplerState(
            mirostat_mu=self.mirostat_mu,
            last_temperature=self.last_temperature,
            tokens=list(self.tokens),
            entropies=list(self.entropies),
            attention_ema=None if self.attention_ema is None else self.attention_ema.clone(),
            steps=self.steps,
        )

    def observe(self, result: PruneResult, index: int, token_id: int | None = None) -> None:
        """Advance the state with the token chosen at this step.

        Parameters
        ----------
        result : the step's :class:`PruneResult`.
        index : position of the chosen token in the index set.
        token_id : vocabulary id (defaults to ``index``, right for full-vocabulary logits).
        """
        self.tokens.append(int(index if token_id is None else token_id))
        self.entropies.append(float(result.entropy_raw))
        self.last_temperature = float(result.temperature)
        self.steps += 1
        if result.mirostat_mu is not None:
            q = float(result.index_probs["final"][index])
            surprise = -math.log2(max(q, 1e-45))  # bits
            self.mirostat_mu = result.mirostat_mu - result.mirostat_eta * (
                surprise - result.mirostat_tau
            )

    def update_attention_ema(self, attention_mass: Tensor, decay: float) -> Tensor:
        """Fold this step's attention mass ``(N,)`` into the EMA and return it ``(N,)``.

        Positions are absolute; one new since the last step enters at zero
        (:func:`semviz.gravity.ema_mass`).
        """
        self.attention_ema = ema_mass(self.attention_ema, attention_mass, decay)
        return self.attention_ema


@dataclass
class PruneResult:
    """What :func:`prune` found for one step (everything over the index set ``(K,)``)."""

    index_probs: dict[str, Tensor]
    kept: Tensor  # (K,) bool
    waterfall: list[Stage]
    entropy_raw: float
    varentropy_raw: float
    entropy_sampled: float
    temperature: float
    free_energy: float
    n_kept: int
    fallback: str | None
    gravity: Tensor | None
    greedy: bool
    scores: Tensor  # (K,) adjusted score s = x + λG (−inf where removed by rerank)
    argmax: int
    params: PruneParams
    tail_mass: float = 0.0
    gravity_dominance: float | None = None
    mirostat_mu: float | None = None
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    state: SamplerState | None = None
    _observed: bool = False

    @property
    def entropy_raw_bits(self) -> float:
        return self.entropy_raw / LN2

    @property
    def entropy_sampled_bits(self) -> float:
        return self.entropy_sampled / LN2

    @property
    def varentropy_raw_bits(self) -> float:
        return self.varentropy_raw / LN2**2

    @property
    def effective_candidates_raw(self) -> float:
        """``exp(H_raw)``: how many equally likely tokens the raw distribution is worth."""
        return math.exp(self.entropy_raw)

    @property
    def effective_candidates(self) -> float:
        """``exp(H_sampled)`` of the distribution actually sampled from."""
        return math.exp(self.entropy_sampled)

    @property
    def probs(self) -> Tensor:
        return self.index_probs["final"]


# --------------------------------------------------------------------------------------------
# Thermodynamic quantities
# --------------------------------------------------------------------------------------------


def entropy_stats(logits: Tensor, dim: int = -1) -> tuple[Tensor, Tensor]:
    """Entropy and varentropy of ``softmax(logits)`` in nats, float32.

    ``-inf`` entries contribute zero (no NaN). Returns 0-d tensors for 1-D input, else one
    value per row.
    """
    h, var, _, _ = _entropy_parts(logits.float(), dim)
    return h, var


def _entropy_parts(x: Tensor, dim: int = -1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(H, varentropy, log p, p)`` of ``softmax(x)``: one normaliser, shared by the callers."""
    logp = torch.log_softmax(x, dim=dim)  # (..., V)
    p = logp.exp()
    # a masked token gives 0·(-inf) = NaN: nansum drops exactly those terms
    h = -(p * logp).nansum(dim)  # (...)
    var = (p * (logp + h.unsqueeze(dim)).square()).nansum(dim)  # centred: no cancellation
    return h.clamp_min(0.0), var.clamp_min(0.0), logp, p


def free_energy(scores: Tensor, temperature: float, kept: Tensor | None = None) -> float:
    """Free energy ``F = -T log sum_{w in kept} exp(s(w)/T)`` of a set, energies ``U = -s``.

    Equals ``<U> - T·H`` of the Boltzmann distribution on the set. ``T = 0`` gives ``min U``.
    """
    s = scores.float()
    if kept is not None:
        s = s.masked_fill(~kept, NEG_INF)
    if temperature == 0.0:
        return float(-s.max())
    return float(-temperature * torch.logsumexp(s / temperature, -1))


# --------------------------------------------------------------------------------------------
# Filters: each returns a keep mask (B, V) for logits (B, V)
# --------------------------------------------------------------------------------------------


def stable_order(values: Tensor, descending: bool = True) -> Tensor:
    """Indices sorting ``values`` (B, V) by value, ties broken by the lower index."""
    return torch.sort(values, dim=-1, descending=descending, stable=True).indices


def stable_head(x: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest entries of 1-D ``x`` in stable order (ties: lower index).

    Every entry tied with the k-th value is included, so the result can be longer than ``k``;
    its first ``k`` entries equal ``stable_order(x)[:k]``. Costs a top-k plus a sort of the
    head instead of a sort of the whole vocabulary.
    """
    n = x.shape[-1]
    k = max(1, min(k, n))
    if k >= n // 4:
        return stable_order(x.unsqueeze(0))[0]
    kth = torch.topk(x, k).values[-1]
    idx = torch.nonzero(x >= kth).flatten()  # ascending index order
    order = torch.sort(x[idx], descending=True, stable=True).indices
    return idx[order]


def _protect_head(x: Tensor, n: int) -> Tensor:
    """Mask (B, V) that is True on the first ``n`` entries of each row's stable order."""
    prot = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    if n == 1:
        # max(dim) returns the first maximal index: the stable order's head, no top-k
        prot.scatter_(-1, x.max(-1, keepdim=True).indices, True)
        return prot
    for b in range(x.shape[0]):
        prot[b, stable_head(x[b], n)[:n]] = True
    return prot


def _2d(x: Tensor) -> Tensor:
    return x.unsqueeze(0) if x.dim() == 1 else x


def top_k_mask(x: Tensor, k: int, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Keep the ``k`` highest logits of ``x`` (B, V).

    ``hf`` keeps every token tied with the k-th value; ``stable`` keeps exactly ``k``.
    """
    x = _2d(x)
    k = min(max(k, min_tokens_to_keep), x.shape[-1])
    if tie_rule == "hf":
        kth = torch.topk(x, k)[0][..., -1, None]  # (B, 1)
        return ~(x < kth)
    return _protect_head(x, k)


def top_p_mask(x: Tensor, p: float, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Keep the smallest most-probable prefix whose mass is ``>= p`` (B, V)."""
    x = _2d(x)
    if tie_rule == "hf":
        sorted_logits, sorted_indices = torch.sort(x, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative_probs <= (1 - p)
        remove[..., -min_tokens_to_keep:] = 0
        remove = remove.scatter(1, sorted_indices, remove)
        return ~remove
    probs = torch.softmax(x, -1)  # (B, V)
    keep = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    for b in range(x.shape[0]):
        # grow a stably sorted head until it holds mass p: the nucleus is usually short
        k = max(64, min_tokens_to_keep)
        while True:
            idx = stable_head(x[b], k)  # (k',)
            q = probs[b, idx]  # (k',) descending
            before = q.cumsum(0) - q  # mass strictly ahead of each token
            inside = before < p
            if not bool(inside[-1]) or idx.numel() >= x.shape[-1]:
                break
            k *= 4
        inside[:min_tokens_to_keep] = True
        keep[b, idx[inside]] = True
    return keep


def min_p_mask(x: Tensor, min_p: float, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Keep tokens with ``p >= min_p * p_max`` (B, V)."""
    x = _2d(x)
    probs = torch.softmax(x, dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    if tie_rule == "hf":
        k = min(min_tokens_to_keep, probs.shape[-1])
        remove.scatter_(-1, torch.topk(probs, k, dim=-1).indices, False)
        return ~remove
    return ~remove | _protect_head(x, min_tokens_to_keep)


def typical_mask(x: Tensor, mass: float, min_tokens_to_keep: int = 1, tie_rule: TieRule = "stable"):
    """Locally typical sampling: keep tokens whose surprise is closest to the entropy (B, V)."""
    x = _2d(x)
    normalized = torch.nn.functional.log_softmax(x, dim=-1)
    p = torch.exp(normalized)
    ent = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs((-normalized) - ent)
    if tie_rule == "hf":
        sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
    else:
        sorted_scores, sorted_indices = torch.sort(shifted, descending=False, stable=True)
    cumulative_probs = x.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
    last_ind = (cumulative_probs < mass).sum(dim=1)
    last_ind.clamp_(max=sorted_scores.shape[-1] - 1)
    remove = sorted_scores > sorted_scores.gather(1, last_ind.view(-1, 1))
    remove[..., :min_tokens_to_keep] = 0
    remove = remove.scatter(1, sorted_indices, remove)
    return ~remove


def epsilon_mask(x: Tensor, epsilon: float, min_tokens_to_keep: int = 1, tie_rule="stable"):
    """Keep tokens with ``p >= epsilon`` (B, V)."""
    x = _2d(x)
    return _cutoff_mask(x, x.softmax(dim=-1) < epsilon, min_tokens_to_keep, tie_rule)


def eta_mask(x: Tensor, epsilon: float, min_tokens_to_keep: int = 1, tie_rule="stable"):
    """Keep tokens with ``p >= min(eps, sqrt(eps) * exp(-H))`` (B, V)."""
    x = _2d(x)
    probabilities = x.softmax(dim=-1)
    if tie_rule == "hf":
        eps = torch.tensor(epsilon, device=x.device)
        entropy = torch.distributions.Categorical(logits=x).entropy()
        eta = torch.min(eps, torch.sqrt(eps) * torch.exp(-entropy))[..., None]
    else:
        h, _ = entropy_stats(x)
        eta = torch.clamp(math.sqrt(epsilon) * torch.exp(-h), max=epsilon)[..., None]
    return _cutoff_mask(x, probabilities < eta, min_tokens_to_keep, tie_rule)


def _cutoff_mask(x: Tensor, remove: Tensor, min_tokens_to_keep: int, tie_rule: str) -> Tensor:
    if tie_rule == "hf":
        top_k = min(min_tokens_to_keep, x.size(-1))
        remove = remove & (x < torch.topk(x, top_k)[0][..., -1, None])
        return ~remove
    return ~remove | _protect_head(x, min_tokens_to_keep)


def free_energy_mask(
    scores: Tensor,
    temperature: float,
    kappa: float = 1.0,
    min_tokens_to_keep: int = 1,
    entropy: Tensor | float | None = None,
) -> Tensor:
    """Free-energy criterion (seed §4.4): keep ``w`` iff ``U(w) - U_min <= kappa·T·H``.

    With energies ``U(w) = -s(w)`` (``s`` the gravity-adjusted score at T = 1) the seed
    defines ``F(w) = U(w) - T·H(C)``. A candidate is kept iff its free energy is no higher
    than the ground state's energy, ``F(w) <= U_min`` (scaled by ``kappa``): the thermal
    budget ``T·H`` pays for its excess energy. Equivalently ``p(w) >= p_max·exp(-kappa·T·H)``,
    so at ``kappa = T = 1`` a token survives iff it is at least ``1/exp(H)`` as likely as the
    best one: a single survivor when ``H ≈ 0`` (decisive), a wide window when ``H`` is large
    (tolerant). The argmax always survives. ``H`` is the entropy of ``softmax(s)``.

    Parameters
    ----------
    scores : (B, V) adjusted scores; ``-inf`` marks tokens already removed.
    """
    s = _2d(scores).float()
    h = entropy_stats(s)[0] if entropy is None else torch.as_tensor(entropy).reshape(-1)  # (B,)
    window = kappa * temperature * h  # (B,)
    gap = s.amax(-1, keepdim=True) - s  # (B, V) U(w) - U_min
    keep = gap <= window[..., None]
    return keep | _protect_head(s, min_tokens_to_keep)


def mirostat_mask(x: Tensor, mu: float | Tensor, min_tokens_to_keep: int = 1) -> Tensor:
    """Mirostat v2 truncation: keep tokens whose surprise ``-log2 p`` is ``<= mu`` (B, V).

    ``mu`` is a float or one value per row ``(B,)``.
    """
    x = _2d(x)
    surprise = -torch.log_softmax(x, -1) / LN2  # (B, V) bits
    mu = torch.as_tensor(mu, dtype=surprise.dtype, device=x.device).reshape(-1, 1)  # (B|1, 1)
    return (surprise <= mu) | _protect_head(x, min_tokens_to_keep)


# --------------------------------------------------------------------------------------------
# Adaptive temperature
# --------------------------------------------------------------------------------------------


def adaptive_temperature(
    params: PruneParams, scores: Tensor, entropy: float | None = None
) -> float:
    """Effective temperature for this step from the entropy of ``softmax(scores)`` (nats).

    - ``target`` (seed §5.2): ``T = clip(T0 + sign·gain·(H - H*), t_min, t_max)``;
      ``sign=-1`` cools when the model is unsure (stable long text), ``+1`` heats
      (exploration).
    - ``edt``: ``T = T0 · N^(θ/H)`` (Zhang et al. 2024), ``0 < N < 1``.
    - ``dynatemp`` (llama.cpp): ``T = T_lo + (T_hi - T_lo)·(H/ln n)^exponent`` with
      ``T_lo = max(0, T0 - range)``, ``T_hi = T0 + range``, ``n`` finite candidates.
    - ``none``/``mirostat``: ``T0``.
    """
    t0 = params.temperature
    mode = params.adaptive
    if mode in ("none", "mirostat") or t0 == 0.0:
        return t0
    h = float(entropy_stats(scores)[0]) if entropy is None else entropy
    if mode == "target":
        t = t0 + params.controller_sign * params.controller_gain * (h - params.target_entropy)
        return min(max(t, params.adaptive_t_min), params.adaptive_t_max)
    if mode == "edt":
        if h <= 1e-12:
            return 0.0
        return t0 * params.edt_n ** (params.edt_theta / h)
    # dynatemp
    n = int(torch.isfinite(scores).sum())
    if n <= 1:
        return t0
    lo, hi = max(0.0, t0 - params.dynatemp_range), t0 + params.dynatemp_range
    norm_h = min(h / math.log(n), 1.0)
    return lo + (hi - lo) * norm_h**params.dynatemp_exponent


# --------------------------------------------------------------------------------------------
# The step
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


# Index sets at least this long run the filters on a short sorted head (see _head_filters).
HEAD_MIN_K = 512
_HEAD_START = 256
_HEAD_MAX = 16384


def prune(
    logits: Tensor,
    params: PruneParams,
    *,
    gravity: Tensor | None = None,
    state: SamplerState | None = None,
    tail_logsumexp: float | Tensor | None = None,
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

    With a subset, raw probabilities are exact (the tail's mass is known) and the raw
    entropy/varentropy treat the tail as one lumped outcome, a lower bound. The tail is then
    dropped (waterfall stage ``"candidates"``): later stages see the set renormalised, so
    mass-based filters (top-p, typical, epsilon, eta) act as if the set were the whole
    vocabulary. Rank-based ones (top-k, min-p) are exact when the set is the top-K.

    Returns
    -------
    PruneResult, computed in float32 whatever the input dtype. Inputs are never modified.
    """
    x = _check_logits(logits)  # (K,)
    K = x.shape[0]
    waterfall: list[Stage] = []
    finite = x > NEG_INF  # (K,)
    n_alive = int(torch.count_nonzero(finite))
    dense = n_alive == K  # nothing masked: every "masked(·, alive)" is the tensor itself

    # -- raw ---------------------------------------------------------------------------
    # one log-softmax gives the raw probabilities, log-probabilities and entropy moments
    if tail_logsumexp is not None:
        tail = torch.as_tensor(tail_logsumexp, dtype=torch.float32).reshape(())
        ext = torch.cat([x, tail.view(1)])  # (K+1,) tail lumped as one outcome
        h_raw, v_raw, _, p_ext = _entropy_parts(ext)
        p_raw = p_ext[:K]  # (K,) exact
        tail_mass = float(1.0 - p_raw.sum().clamp(max=1.0))
        waterfall.append(Stage("candidates", n_alive, tail_mass))
        logp_raw = None
    else:
        h_raw, v_raw, logp_raw, p_raw = _entropy_parts(x)  # (K,) each
        tail_mass = 0.0

    g = None
    if gravity is not None:
        if gravity.shape != x.shape:
            raise ValueError(f"gravity shape {tuple(gravity.shape)} != logits {tuple(x.shape)}")
        g = gravity.detach().float()
        g = torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)

    dominance = None
    if g is not None and params.gravity_lambda != 0.0:
        if logp_raw is None:
            logp_raw = torch.log_softmax(x, -1)  # (K,) over the set
        dominance = gravity_dominance(logp_raw, g, params.gravity_lambda, params.rerank_k)

    reason = None
    eff = params
    if params.fallback:
        reason = _fallback_reason(params, state, float(h_raw), dominance)
        if reason is not None:
            eff = default_params(params)

    # -- gravity -------------------------------------------------------------------------
    alive = finite  # (K,) tokens still in play
    s = x  # (K,) adjusted score, log P + λG up to a constant
    if g is not None and eff.gravity_lambda != 0.0:
        # a constant G shifts every score alike: the distribution is unchanged, so add
        # nothing rather than let float rounding break near-ties (exact identity)
        lg = 0.0 if bool(g.max() == g.min()) else eff.gravity_lambda * g
        if eff.gravity_mode == "rerank":
            cand = top_k_mask(x, eff.rerank_k, eff.min_tokens_to_keep, "stable")[0] & finite
            waterfall.append(_stage("rerank", p_raw / max(p_raw.sum(), 1e-30), alive, cand))
            alive = cand
            n_alive = int(torch.count_nonzero(alive))
            dense = n_alive == K
            s = _masked(x + lg, alive)
        else:
            s = x + lg if isinstance(lg, torch.Tensor) else x
            waterfall.append(Stage("gravity", n_alive, 0.0))
    if s is x:
        p_grav, logp_s = p_raw if tail_logsumexp is None else None, logp_raw
    else:
        p_grav, logp_s = None, None
    h_s = None
    if eff.free_energy or eff.adaptive != "none":
        h_s_t, _, logp_s, p_s = _entropy_parts(s)
        h_s = float(h_s_t)
        p_grav = p_s if p_grav is None else p_grav
    if p_grav is None:
        p_grav = torch.softmax(s, -1)  # (K,)

    # -- temperature -----------------------------------------------------------------------
    greedy = eff.temperature == 0.0
    mirostat_mu = None
    if greedy:
        t = 0.0
    elif eff.order == "hf" or eff.adaptive != "dynatemp":
        t = adaptive_temperature(eff, s, h_s)
    else:
        t = float("nan")  # llama.cpp dynatemp: decided on the survivors below
    greedy = greedy or t < T_GREEDY  # NaN (decided later) compares False

    if greedy:
        arg = int(s.max(0).indices)  # first maximal index
        kept = torch.zeros(K, dtype=torch.bool)
        kept[arg] = True
        final = kept.float()
        m_in = float(p_grav.sum()) if dense else _mass(p_grav, alive)
        removed = m_in - float(p_grav[arg])
        waterfall.append(Stage("greedy", 1, removed / m_in if m_in > 0 else 0.0))
        return _result(
            eff, params, p_raw, p_grav, final.clone(), final, kept, waterfall, h_raw, v_raw,
            0.0, s, g, reason, dominance, tail_mass, arg, None, state, True,
            kept_idx=torch.tensor([arg]),
        )  # fmt: skip

    # -- filters ---------------------------------------------------------------------------
    block_in = s / t if eff.order == "hf" else s  # (K,) what the filters look at
    t_f = eff.temperature if math.isnan(t) else t
    filters = _filters(eff, t_f, h_s)
    block = block_in if dense else _masked(block_in, alive)  # (K,)
    p_block = torch.softmax(block.unsqueeze(0), -1)[0] if filters else None  # (K,)
    cur = None
    if filters and _head_ok(eff, K):
        cur = _head_filters(eff, block, s, alive, n_alive, p_block, t_f, h_s, waterfall)
    if cur is None:
        cur = _full_filters(eff, filters, block_in, s, alive, p_block, waterfall)

    if eff.order == "llama.cpp":
        if eff.adaptive == "dynatemp":
            t = adaptive_temperature(eff, _masked(s, cur))
        elif math.isnan(t):
            t = eff.temperature
        t = max(t, T_GREEDY)
        waterfall.append(Stage("temperature", int(torch.count_nonzero(cur)), 0.0))
    # temperature, before truncation; in "hf" order that is the filters' own input
    if eff.order == "hf" and p_block is not None:
        p_temp = p_block
    else:
        p_temp = torch.softmax((s if dense else _masked(s, alive)) / t, -1)  # (K,)

    if eff.adaptive == "mirostat":
        mu = state.mirostat_mu if state is not None and state.mirostat_mu is not None else None
        mirostat_mu = 2.0 * eff.mirostat_tau if mu is None else mu
        after = cur & mirostat_mask(_masked(s / t, cur), mirostat_mu, eff.min_tokens_to_keep)[0]
        waterfall.append(_stage("mirostat", torch.softmax(_masked(s / t, cur), -1), cur, after))
        cur = after

    kept = cur
    kept_idx = torch.nonzero(kept).flatten()  # (n,) ascending
    if kept_idx.numel() == K:
        final = torch.softmax(s / t, -1)  # (K,)
    else:
        z = torch.full((K,), NEG_INF)
        z[kept_idx] = s[kept_idx] / t  # the same values as masking s/t: same softmax
        final = torch.softmax(z, -1)  # (K,)
    arg = int(kept_idx[final[kept_idx].max(0).indices])  # first maximal index
    return _result(
        eff, params, p_raw, p_grav, p_temp, final, kept, waterfall, h_raw, v_raw, t,
        s, g, reason, dominance, tail_mass, arg, mirostat_mu, state, False, kept_idx=kept_idx,
    )  # fmt: skip


def _full_filters(eff, filters, block_in, s, alive, p_block, waterfall) -> Tensor:
    """The filters as full-length masks: any tie rule, any filter. Returns ``kept`` (K,)."""
    cur = alive.clone()
    for name, fn in filters:
        src = _masked(block_in, cur) if eff.combine == "sequential" else _masked(block_in, alive)
        keep = fn(src, s)[0]
        after = cur & keep
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
        waterfall.append(_stage(name, p_block, cur, after))
        cur = after
    return cur


def _head_ok(p: PruneParams, K: int) -> bool:
    """Whether :func:`_head_filters` applies: long index sets, stable ties, no typical."""
    return K >= HEAD_MIN_K and p.tie_rule == "stable" and p.typical_p >= 1.0


def _head_filters(
    eff: PruneParams,
    block: Tensor,
    s: Tensor,
    alive: Tensor,
    n_alive: int,
    p_block: Tensor,
    t: float,
    h_s: float | None,
    waterfall: list[Stage],
) -> Tensor | None:
    """The filters evaluated on a short head of the stable order; the same kept set as
    :func:`_full_filters` (tie rule "stable", no typical), or None when no head is enough.

    Every such filter keeps an upper set of the tokens ordered by its input (top-k and
    top-p a prefix of the stable order, min-p / epsilon / eta / mirostat a threshold on the
    probability, free energy a threshold on ``s``, which ``block = s/T`` orders the same way
    up to rounding ties). The head holds every token tied with its last value, so each token
    outside it is strictly below every token inside it, in ``block`` and in ``s``. A filter
    that removes any token of the head therefore removes every token outside it, and from
    then on the chain only needs the head. Each value on the head is computed exactly as the
    full-length mask computes it (same softmax over the same full-length input), so the kept
    sets are identical. When no filter removes anything from the head, the head is grown;
    past ``_HEAD_MAX`` the full-length path takes over.
    """
    K = block.shape[0]
    m = eff.min_tokens_to_keep
    seq = eff.combine == "sequential"
    # a head one longer than top-k lets top-k alone bound it
    size = max(_HEAD_START, m, eff.top_k + 1 if eff.top_k > 0 else 0)
    while True:
        head = stable_head(block, min(size, n_alive))  # (H,) stable order of block
        covers = head.numel() >= n_alive
        rows = _head_pass(eff, block, s, alive, n_alive, p_block, t, h_s, head, covers, seq, m)
        if rows is not None:
            cur_h, stages = rows
            waterfall.extend(stages)
            cur = torch.zeros(K, dtype=torch.bool)
            cur[head[cur_h]] = True
            return cur
        if size >= _HEAD_MAX or size >= n_alive:
            return None
        size *= 4


def _head_pass(eff, block, s, alive, n_alive, p_block, t, h_s, head, covers, seq, m):
    """One try of :func:`_head_filters` on ``head`` (H,); None when the head is too short."""
    K = block.shape[0]
    H = head.numel()
    bh = block[head]  # (H,) descending, ties by index
    sh = s[head]  # (H,)
    in_h = alive[head]  # (H,) cur restricted to the head
    bounded = covers  # True once every token outside the head is out
    n_cur = n_alive
    stages: list[Stage] = []
    p_in = float(p_block.sum())  # mass of cur under p_block, while cur is all alive

    def full_from_head(mask_h: Tensor, values: Tensor) -> Tensor:
        z = torch.full((K,), NEG_INF)
        z[head[mask_h]] = values[mask_h]
        return z

    for name in _filter_names(eff):
        # the input this filter sees: block masked by cur (sequential) or by alive
        if seq and bounded and n_cur < n_alive:
            src_h = in_h
            src_full = full_from_head(in_h, bh)  # == _masked(block, cur), bit for bit
            probs = None
        else:
            src_h = alive[head]
            src_full = block
            probs = p_block
        rank = torch.cumsum(src_h, 0) - 1  # (H,) position among the input's finite tokens
        protect = src_h & (rank < m)  # first m of the input's stable order
        if name in ("top_p", "min_p", "epsilon", "eta") and probs is None:
            probs = torch.softmax(src_full.unsqueeze(0), -1)[0]
        ph = probs[head] if probs is not None else None  # (H,)
        if name == "top_k":
            kk = min(max(eff.top_k, m), K)
            keep = src_h & (rank < kk)
        elif name == "top_p":
            q = ph[src_h]  # (n,) in stable order
            before = q.cumsum(0) - q  # mass strictly ahead of each token
            inside = before < eff.top_p
            if not bounded and bool(inside.all()):
                return None  # the nucleus may reach past the head
            inside[:m] = True
            keep = torch.zeros(H, dtype=torch.bool)
            keep[src_h] = inside
        elif name == "min_p":
            pmax = ph[src_h].max()
            keep = ~(ph < eff.min_p * pmax) | protect
        elif name == "epsilon":
            keep = ~(ph < eff.epsilon) | protect
        elif name == "eta":
            h, _ = entropy_stats(src_full.unsqueeze(0))
            eta = torch.clamp(math.sqrt(eff.eta) * torch.exp(-h), max=eff.eta)  # (1,)
            keep = ~(ph < eta) | protect
        else:  # free_energy, on the T = 1 scores with the same removals
            s2 = sh if bool(src_h.all()) else torch.where(src_h, sh, NEG_INF)  # (H,)
            n_src = n_cur if seq else n_alive  # finite entries of this stage's input
            if seq and n_src < K:
                # sequential with removals: the entropy of what this stage sees, computed on
                # the same full-length input as free_energy_mask computes it
                s2_full = full_from_head(src_h, sh) if bounded else _masked(s, alive)
                h_t = entropy_stats(s2_full.unsqueeze(0))[0]  # (1,)
            else:
                h_t = torch.as_tensor(h_s).reshape(-1)  # (1,)
            window = eff.free_energy_kappa * t * h_t  # (1,) as free_energy_mask rounds it
            gap = s2.max() - s2  # (H,) U(w) - U_min
            keep = (gap <= window) | _protect_by(s2, head, m)
        after = in_h & keep
        if not bounded:
            if bool(after[in_h].all()):
                # nothing in the head removed, so nothing outside is either
                stages.append(Stage(name, n_cur, 0.0))
                continue
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
        m_in = p_in if n_cur == n_alive else float(p_block[head[in_h]].sum())
        removed = m_in - float(p_block[head[after]].sum())
        stages.append(Stage(name, n_after, max(removed, 0.0) / m_in if m_in > 0 else 0.0))
        in_h, n_cur = after, n_after
    if not bounded:
        return None
    return in_h, stages


def _protect_by(values_h: Tensor, head: Tensor, n: int) -> Tensor:
    """First ``n`` head entries in stable order of ``values_h`` (H,) (ties: lower index)."""
    if n == 1:
        # lowest index among the maxima
        top = values_h == values_h.max()
        i = int(torch.argmin(torch.where(top, head, head.max() + 1)))
        out = torch.zeros_like(top)
        out[i] = True
        return out
    by_index = torch.argsort(head)  # (H,) ascending token index
    order = by_index[torch.sort(values_h[by_index], descending=True, stable=True).indices]
    out = torch.zeros(values_h.shape, dtype=torch.bool)
    out[order[:n]] = True
    return out


def _filter_names(p: PruneParams) -> list[str]:
    return [name for name, _ in _filters(p, 1.0, None)]


def _filters(p: PruneParams, t: float, h_s: float | None):
    """Active filters in chain order, each ``fn(block_logits (K,), scores (K,)) -> (1, K)``."""
    m, tie = p.min_tokens_to_keep, p.tie_rule
    out = []
    if p.top_k > 0:
        out.append(("top_k", lambda x, s: top_k_mask(x, p.top_k, m, tie)))
    if p.top_p < 1.0:
        out.append(("top_p", lambda x, s: top_p_mask(x, p.top_p, m, tie)))
    if p.min_p > 0.0:
        out.append(("min_p", lambda x, s: min_p_mask(x, p.min_p, m, tie)))
    if p.typical_p < 1.0:
        out.append(("typical", lambda x, s: typical_mask(x, p.typical_p, m, tie)))
    if p.epsilon > 0.0:
        out.append(("epsilon", lambda x, s: epsilon_mask(x, p.epsilon, m, tie)))
    if p.eta > 0.0:
        out.append(("eta", lambda x, s: eta_mask(x, p.eta, m, tie)))
    if p.free_energy:

        def fe(x: Tensor, s: Tensor) -> Tensor:
            # same removals as x, but on the T = 1 energies
            removed = torch.isneginf(x)
            # the entropy of softmax(s) is shared with the temperature stage unless earlier
            # filters removed tokens from what this one sees (sequential mode)
            h = h_s if p.combine == "intersection" or not removed.any() else None
            return free_energy_mask(s.masked_fill(removed, NEG_INF), t, p.free_energy_kappa, m, h)

        out.append(("free_energy", fe))
    return out


def _result(
    eff, params, p_raw, p_grav, p_temp, final, kept, waterfall, h_raw, v_raw, t,
    s, g, reason, dominance, tail_mass, arg, mirostat_mu, state, greedy, *, kept_idx,
) -> PruneResult:  # fmt: skip
    n_kept = kept_idx.numel()
    if greedy:
        h_s, f = 0.0, float(-s[arg])
    else:
        h_s = float(entropy_stats(torch.log(final[kept_idx]))[0])  # kept entries: often few
        f = float(-t * torch.logsumexp(s[kept_idx] / t, -1))
    return PruneResult(
        index_probs={"raw": p_raw, "gravity": p_grav, "temperature": p_temp, "final": final},
        kept=kept,
        waterfall=waterfall,
        entropy_raw=float(h_raw),
        varentropy_raw=float(v_raw),
        entropy_sampled=h_s,
        temperature=float(t),
        free_energy=f,
        n_kept=n_kept,
        fallback=reason,
        gravity=g if eff.gravity_lambda != 0.0 else None,
        greedy=greedy,
        scores=s,
        argmax=arg,
        params=eff,
        tail_mass=tail_mass,
        gravity_dominance=dominance,
        mirostat_mu=mirostat_mu,
        mirostat_tau=eff.mirostat_tau,
        mirostat_eta=eff.mirostat_eta,
        state=state,
    )


def choose(
    result: PruneResult, u: float, *, state: SamplerState | None = None, token_id: int | None = None
) -> int:
    """Pick an index by inverse CDF of the final distribution with one uniform ``u``.

    The CDF runs over tokens sorted by probability (descending, ties by lower index), so the
    same ``u`` picks the same token under small changes of the distribution: replay with a
    recorded ``u`` gives counterfactuals with common random numbers. Greedy results return
    the argmax (lowest index on ties) and ignore ``u``.

    The state given here (or to :func:`prune`) is advanced once with the choice.
    """
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    if result.greedy:
        idx = result.argmax
    else:
        idx = _inverse_cdf(result.index_probs["final"], u)
    st = state if state is not None else result.state
    if st is not None and not result._observed:
        st.observe(result, idx, token_id)
        result._observed = True
    return idx


def _inverse_cdf(probs: Tensor, u: float) -> int:
    """Index at CDF position ``u·total`` of ``probs`` (K,) in stable descending order.

    Only the head of the order that the CDF crosses is sorted (grown 8× until it holds
    ``u·total``), so a wide final distribution costs a top-k, not a sort of the vocabulary.
    The total is summed in index order, so the pick does not depend on the head's length.
    """
    p = probs.double()  # (K,)
    n = max(int(torch.count_nonzero(p > 0)), 1)  # tokens that can be picked
    target = torch.tensor([u * float(p.sum())], dtype=torch.float64)
    k = min(256, n)
    while True:
        head = stable_head(p, k) if k < n else stable_order(p.unsqueeze(0))[0][:n]  # (k',)
        cdf = p[head].cumsum(0)  # (k',)
        pos = int(torch.searchsorted(cdf, target, right=True))
        if pos < cdf.numel() or k >= n:
            return int(head[min(pos, n - 1, head.numel() - 1)])
        k = min(8 * k, n)
