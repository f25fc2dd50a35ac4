"""Gravity kinds: what ``G`` is, one small class each, and the one call every path makes.

A :class:`GravityKind` turns steps (:class:`GravityStep`: a context, and the step's logits or
the hidden state they come from) into their ``G``. The decoder, the ``generate`` processor and
replay all call :func:`compute`, which hands the steps to the kind ``gravity_kind`` names, so
the three compute the same ``G`` by construction. ``KINDS`` lists the kinds in order;
``PruneParams.gravity_kind`` takes its choices from it, so a kind registered with
:func:`register_kind` is a setting in all three paths, the CLI and the app's sidebar.

Adding one: subclass :class:`GravityKind` with a ``name`` and a :meth:`~GravityKind.potential`
(``G`` of one step over its ``tokens()``), say in :meth:`~GravityKind.reads` what it needs from
the forward, and register it. The base :meth:`~GravityKind.compute` computes the logits where a
step brings only a hidden state and applies the n-gram guard; a kind overrides ``compute``
only to batch its work (as the pull and the contrast do). A setting of its own is one more
``PruneParams`` field declared with ``gravity="shape"``.

Kinds see only the settings that shape ``G`` (``PruneParams.gravity_params``): a field that is
not declared so cannot be read by a kind, so it cannot be left out of replay's key either.

Examples
--------
>>> list(KINDS)
['pull', 'contrast']
>>> get_kind("pul")
Traceback (most recent call last):
...
ValueError: unknown gravity kind 'pul' (did you mean pull?); registered: ('pull', 'contrast')
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from semviz.gravity.context import GravityContext
from semviz.gravity.guards import ngram_guard
from semviz.gravity.registry import Registry
from semviz.gravity.side import log_probs

__all__ = [
    "KINDS",
    "GravityKind",
    "GravityOut",
    "GravityStep",
    "compute",
    "describe",
    "get_kind",
    "gravity_for_step",
    "gravity_params",
    "gravity_terms",
    "reads",
    "reads_attention",
    "reads_hidden",
    "register_kind",
    "unregister_kind",
]


@dataclass
class GravityStep:
    """One step whose ``G`` is wanted.

    Attributes
    ----------
    ctx : what the step's gravity reads (:class:`~semviz.gravity.context.GravityContext`).
    logits : the step's logits over the vocabulary (V,), or over ``index`` (K,); None when
        ``head`` stands for them, or when the kind does not read them.
    lse : their log-sum-exp over the whole vocabulary, when ``logits`` cover only ``index``.
    index : (K,) the token ids ``G`` is wanted for; None: the whole vocabulary.
    head : (d,) the last position's final normed hidden state, when the logits are still to
        be computed: the kind computes them (a pull in the same pass over the LM head's
        weight as ``G``) and returns them in :attr:`GravityOut.logits`.
    """

    ctx: GravityContext
    logits: Tensor | None = None
    lse: float | Tensor | None = None
    index: Tensor | None = None
    head: Tensor | None = None

    def log_probs(self) -> Tensor:
        """``log P(w | C)`` over :meth:`tokens`, float32. (V,) or (K,)"""
        if self.logits is None:
            raise ValueError("this gravity needs the step's logits")
        if self.lse is None:
            return log_probs(self.logits)
        return self.logits.float() - self.lse

    def tokens(self) -> Tensor:
        """The token ids ``G`` is wanted for: ``index``, else every id of the logits. (K,)"""
        if self.index is not None:
            return self.index.long()
        if self.logits is None:
            raise ValueError("a step without index needs its logits to know the vocabulary")
        return torch.arange(self.logits.shape[-1])


@dataclass
class GravityOut:
    """One step's answer from :func:`compute`.

    Attributes
    ----------
    gravity : ``G`` over the step's ``index`` (K,) or the vocabulary (V,), float32.
    logits : (V,) the logits computed from the step's ``head``; None when it had none.
    ema : what the mass source carries to the next step (hand it back as ``ctx.ema``).
    head_seconds : seconds the LM head took (the model's share of the work, not gravity's).
    """

    gravity: Tensor
    logits: Tensor | None = None
    ema: Tensor | None = None
    head_seconds: float = 0.0


class GravityKind:
    """One kind of gravity. Subclasses set ``name`` and implement :meth:`potential`."""

    name: ClassVar[str]
    label: ClassVar[str] = ""
    has_terms: ClassVar[bool] = False  # True when :meth:`terms` splits G over the context

    def reads(self, params: Any) -> frozenset[str]:
        """What ``G`` needs beyond the token ids and the step's logits: ``"attention"`` (the
        step's last-query attention), ``"hidden"`` (the context's final normed hidden
        states) or ``"model"`` (the language model itself, not a bare embedding matrix)."""
        return frozenset()

    def describe(self, params: Any) -> str:
        """A few words for the chain chart: the kind and what it is set to."""
        return self.label or self.name

    def degrade(self, params: Any, missing: frozenset[str]) -> tuple[Any, str | None]:
        """Settings that do without ``missing`` (a subset of :meth:`reads`, e.g. a recorded
        trace without hidden states), and one sentence saying what changed (None: nothing).
        ``ValueError`` when this kind cannot do without them."""
        lack = missing & self.reads(params)
        if lack:
            raise ValueError(f"{self.name} gravity needs {', '.join(sorted(lack))}")
        return params, None

    def potential(self, model: torch.nn.Module, params: Any, step: GravityStep) -> Tensor:
        """``G`` of one step over ``step.tokens()``, before the guards. (V,) or (K,)"""
        raise NotImplementedError

    def compute(
        self,
        model: torch.nn.Module,
        params: Any,
        steps: Sequence[GravityStep],
        *,
        batched: bool = False,
        chained: bool = False,
        memo: dict | None = None,
    ) -> list[GravityOut]:
        """``G`` of every step: :meth:`potential`, then the n-gram guard.

        Parameters
        ----------
        batched : the steps are rows of one batched forward, so the kind's own forwards
            may batch them too (each row then differs from a lone forward by float rounding,
            as the rows of the model's forward do).
        chained : the steps are consecutive steps of one run: each one's ``ctx.ema`` is the
            ``ema`` the step before it gave.
        memo : a dict the caller keeps between calls, for work a kind can reuse (a pull's
            projection when its pull vector does not change).
        """
        out = []
        for step in steps:
            step, logits, seconds = with_logits(model, step)
            g = self.potential(model, params, step).float()
            g = ngram_guard(g, step.ctx.ids, params.gravity_ngram, step.index)
            out.append(GravityOut(gravity=g, logits=logits, head_seconds=seconds))
        return out

    def terms(
        self, model: torch.nn.Module, params: Any, trace: Any, i: int, token_id: int, hidden=None
    ) -> tuple[Any, Any]:
        """Positions (S,) and their terms (S,) whose sum is the raw ``G`` of ``token_id`` at
        step ``i`` of ``trace``; ``ValueError`` for a kind without per-token terms."""
        raise ValueError(f"{self.label or self.name} gravity has no per-token terms.")

    def __repr__(self) -> str:
        return f"<gravity kind {self.name}>"


KINDS: Registry[GravityKind] = Registry("gravity kind", GravityKind)
get_kind = KINDS.get
register_kind = KINDS.register
unregister_kind = KINDS.unregister


def with_logits(
    model: torch.nn.Module, step: GravityStep
) -> tuple[GravityStep, Tensor | None, float]:
    """``step`` with its logits computed from ``head`` where it has one; the logits (V,) and
    the seconds the LM head took (None and 0 when there was nothing to compute)."""
    if step.head is None or step.logits is not None:
        return step, None, 0.0
    t0 = time.perf_counter()
    logits = model.get_output_embeddings()(step.head[None])[0].float()  # (V,)
    return dataclasses.replace(step, logits=logits), logits, time.perf_counter() - t0


def gravity_params(params: Any) -> Any:
    """The settings a kind sees: ``params.gravity_params`` (only the fields that shape
    ``G``) when ``params`` is a ``PruneParams``, else ``params`` as given."""
    return getattr(params, "gravity_params", params)


def compute(
    model: torch.nn.Module,
    params: Any,
    steps: Sequence[GravityStep],
    *,
    batched: bool = False,
    chained: bool = False,
    memo: dict | None = None,
) -> list[GravityOut]:
    """``G`` of every step under ``params``' gravity: the one call of the decoder, the
    ``generate`` processor and replay (see :meth:`GravityKind.compute`)."""
    p = gravity_params(params)
    kind = get_kind(p.gravity_kind)
    return kind.compute(model, p, steps, batched=batched, chained=chained, memo=memo)


def reads(params: Any) -> frozenset[str]:
    """What ``params``' gravity needs (:meth:`GravityKind.reads`); nothing when λ is 0."""
    if getattr(params, "gravity_lambda", 1.0) == 0.0:
        return frozenset()
    p = gravity_params(params)
    return get_kind(p.gravity_kind).reads(p)


def reads_attention(params: Any) -> bool:
    """True when ``params``' gravity needs the step's last-query attention."""
    return "attention" in reads(params)


def reads_hidden(params: Any) -> bool:
    """True when ``params``' gravity needs the final normed hidden states of the context."""
    return "hidden" in reads(params)


def describe(params: Any) -> str:
    """A few words on ``params``' gravity, for the chain chart (:meth:`GravityKind.describe`)."""
    p = gravity_params(params)
    return get_kind(p.gravity_kind).describe(p)


def gravity_for_step(
    model: torch.nn.Module,
    params: Any,
    ctx: GravityContext | None = None,
    *,
    context_ids: Tensor | None = None,
    attention: Tensor | None = None,
    hidden: Tensor | None = None,
    logits: Tensor | None = None,
    normalize: bool = True,
) -> Tensor:
    """The step's gravity ``G`` over the vocabulary, ``(V,)``, from a :class:`GravityContext`.

    ``context_ids`` / ``attention`` / ``hidden`` build a context with every position in the
    cache and the whole context as prompt, when ``ctx`` is not given. A kind that reads the
    step's logits (``contrast``) needs the full ``logits`` (V,). ``normalize=False`` returns
    the kind's raw potential (:meth:`GravityKind.potential`; a pull's ``Σ m_i sim(w, t_i)``):
    no z-score, no floor, no guard.
    """
    if ctx is None:
        if context_ids is None:
            raise ValueError("gravity_for_step needs ctx or context_ids")
        ctx = GravityContext(ids=context_ids.long().flatten(), attention=attention, hidden=hidden)
    step = GravityStep(ctx=ctx, logits=logits)
    if not normalize:
        p = gravity_params(params)
        return get_kind(p.gravity_kind).potential(model, p, step)
    return compute(model, params, [step])[0].gravity


def gravity_terms(
    model: torch.nn.Module,
    trace: Any,
    i: int,
    token_id: int,
    params: Any,
    hidden: Tensor | None = None,
) -> tuple[Any, Any]:
    """The terms of the raw ``G(w)`` of token ``w`` at step ``i`` of ``trace``: positions (S,)
    and terms (S,) as numpy arrays (:meth:`GravityKind.terms`). A pull's are
    ``m_j · sim(w, t_j)``, summing to its raw ``G(w)`` before the vocabulary-wide z-score;
    a kind without per-token terms (``contrast``) raises ``ValueError``."""
    p = gravity_params(params)
    return get_kind(p.gravity_kind).terms(model, p, trace, i, token_id, hidden)
