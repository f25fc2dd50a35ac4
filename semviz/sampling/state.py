"""What one step of the chain produced (:class:`PruneResult`, its waterfall of
:class:`Stage` rows) and what a sequence carries from step to step (:class:`SamplerState`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import Tensor

from semviz.sampling.params import PruneParams
from semviz.sampling.thermo import LN2


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
    """Mutable per-sequence state: mirostat's mu, the controllers, histories.

    The attention EMA of gravity's ``"ema"`` mass is kept by position with the gravity
    context (:class:`semviz.gravity.ContextPull`), not here.

    :func:`~semviz.sampling.prune` only reads it; :func:`~semviz.sampling.choose` (or
    :meth:`observe`) advances it once the step's token is known. Replay should work on a
    :meth:`copy`.
    """

    mirostat_mu: float | None = None
    last_temperature: float | None = None
    tokens: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    steps: int = 0
    mu_estimated: bool = False  # mu came from an estimated probability (a replay's tail)

    def copy(self) -> SamplerState:
        return SamplerState(
            mirostat_mu=self.mirostat_mu,
            last_temperature=self.last_temperature,
            tokens=list(self.tokens),
            entropies=list(self.entropies),
            steps=self.steps,
            mu_estimated=self.mu_estimated,
        )

    def observe(
        self,
        result: PruneResult,
        index: int,
        token_id: int | None = None,
        q: float | None = None,
        q_exact: bool = True,
    ) -> None:
        """Advance the state with the token chosen at this step.

        Parameters
        ----------
        result : the step's :class:`~semviz.sampling.PruneResult`.
        index : position of the chosen token in the index set.
        token_id : vocabulary id (defaults to ``index``, right for full-vocabulary logits).
        q : the chosen token's final probability over the whole vocabulary, when ``result``
            holds a subset (a replayed record); ``q_exact`` False marks it an estimate.
        """
        self.tokens.append(int(index if token_id is None else token_id))
        self.entropies.append(float(result.entropy_raw))
        self.last_temperature = float(result.temperature)
        self.steps += 1
        if result.mirostat_mu is not None:
            q = float(result.index_probs["final"][index]) if q is None else q
            self.mu_estimated = self.mu_estimated or not q_exact
            surprise = -math.log2(max(q, 1e-45))  # bits
            self.mirostat_mu = result.mirostat_mu - result.mirostat_eta * (
                surprise - result.mirostat_tau
            )


@dataclass
class PruneResult:
    """What :func:`prune` found for one step (everything over the index set ``(K,)``)."""

    index_probs: dict[str, Tensor]  # "raw", "gravity", "temperature", "final": (K,) each
    kept: Tensor  # (K,) bool
    waterfall: list[Stage]
    entropy_raw: float
    varentropy_raw: float
    temperature: float
    n_kept: int
    fallback: str | None
    gravity: Tensor | None
    greedy: bool
    scores: Tensor  # (K,) adjusted score s = x + λG (−inf where removed by rerank)
    params: PruneParams
    tail_mass: float = 0.0
    gravity_dominance: float | None = None
    mirostat_mu: float | None = None
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    state: SamplerState | None = None
    _observed: bool = False
    # the kept indices (n,) ascending and their final probabilities (n,), for the pick
    _support: tuple[Tensor, Tensor] | None = None
    # (argmax, entropy_sampled, free_energy) of the final distribution, or the function that
    # computes them on first read: a pick reads only the support, and replay's picks over the
    # whole vocabulary would otherwise pay for a max, a log-softmax and a log-sum-exp over it
    _final_stats: tuple[int, float, float] | Callable[[], tuple[int, float, float]] = (0, 0.0, 0.0)

    def _stats(self) -> tuple[int, float, float]:
        if callable(self._final_stats):
            self._final_stats = self._final_stats()
        return self._final_stats

    @property
    def argmax(self) -> int:
        """The final distribution's most probable index (lowest index on ties)."""
        return self._stats()[0]

    @property
    def entropy_sampled(self) -> float:
        """Entropy (nats) of the distribution sampled from, over the kept tokens."""
        return self._stats()[1]

    @property
    def free_energy(self) -> float:
        """``F = -T log Σ_kept exp(s/T)``; at T = 0 the lowest energy, ``-s[argmax]``."""
        return self._stats()[2]

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
