"""HF ``LogitsProcessor``s on the semviz sampling core, for ``model.generate``.

Every class validates its arguments in ``__init__`` (``ValueError`` naming the argument),
never modifies ``scores`` in place, and works on batches ``(B, V)``. The standard warpers
keep transformers' names and, with the default ``tie_rule="hf"``, return exactly what
transformers' own warpers return; ``tie_rule="stable"`` breaks ties by the lower index.

Examples
--------
>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList
>>> from semviz.processors import NarrativeGravityLogitsProcessor, TopPLogitsWarper
>>> _ = torch.manual_seed(0)
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
...                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
>>> model = LlamaForCausalLM(cfg).eval()
>>> procs = LogitsProcessorList([
...     NarrativeGravityLogitsProcessor(model, gravity_lambda=0.5, mass="idf"),
...     TopPLogitsWarper(0.9),
... ])
>>> out = model.generate(torch.tensor([[1, 2, 3]]), do_sample=True, max_new_tokens=3,
...                      min_new_tokens=3, logits_processor=procs, pad_token_id=0)
>>> out.shape
torch.Size([1, 6])
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor

from semviz import gravity as grav
from semviz import sampling as core
from semviz.gravity import in_side_forward
from semviz.sampling import (
    LN2,
    SPECS,
    PruneParams,
    adaptive_temperature,
    get_filter,
    mirostat_mask,
)

__all__ = [
    "EntropyAdaptiveTemperatureLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "FilterLogitsWarper",
    "FreeEnergyLogitsWarper",
    "HiddenSink",
    "MinPLogitsWarper",
    "MirostatLogitsWarper",
    "NarrativeGravityLogitsProcessor",
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "TypicalLogitsWarper",
    "capture_attention",
    "capture_hidden",
]


def _check_min_tokens(min_tokens_to_keep: int) -> int:
    if isinstance(min_tokens_to_keep, bool) or not isinstance(min_tokens_to_keep, int):
        raise ValueError(
            f"`min_tokens_to_keep` has to be a positive int, got {min_tokens_to_keep!r}"
        )
    if min_tokens_to_keep < 1:
        raise ValueError(f"`min_tokens_to_keep` has to be a positive int, got {min_tokens_to_keep}")
    return min_tokens_to_keep


def _check_tie_rule(tie_rule: str) -> str:
    if tie_rule not in ("hf", "stable"):
        raise ValueError(f"`tie_rule` must be 'hf' or 'stable', got {tie_rule!r}")
    return tie_rule


def _check_unit(name: str, value: float, lo_open: bool, hi_open: bool) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` has to be a float, got {value!r}") from None
    ok = (v > 0 if lo_open else v >= 0) and (v < 1 if hi_open else v <= 1)
    if not ok or math.isnan(v):
        lo, hi = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(f"`{name}` has to be in {lo}0, 1{hi}, got {value}")
    return v


def _params(renames: dict[str, str] | None = None, **kw) -> PruneParams:
    """Build PruneParams, re-raising its errors with the processor's argument name.

    ``renames`` maps a ``PruneParams`` field to the processor's own argument name.
    """
    try:
        return PruneParams(**kw)
    except ValueError as e:
        msg = str(e)
        for field_name, arg in (renames or {}).items():
            msg = msg.replace(f"PruneParams.{field_name}=", f"PruneParams.{arg}=", 1)
        raise ValueError(msg.replace("PruneParams.", "`", 1).replace("=", "`=", 1)) from None


class FilterLogitsWarper(LogitsProcessor):
    """Any filter of the core's registry (``semviz.sampling.FILTERS``) as a warper.

    The kept set is the filter's own full-length rule on float32 scores, row by row of a
    batch ``(B, V)``; the rest gets ``filter_value``. The standard warpers below are this
    class bound to one filter; a filter registered later works the same way.

    Examples
    --------
    >>> import torch
    >>> w = FilterLogitsWarper("min_p", PruneParams(min_p=0.4))
    >>> w(None, torch.log(torch.tensor([[0.1, 0.6, 0.3]])))
    tensor([[   -inf, -0.5108, -1.2040]])
    """

    def __init__(
        self, name: str, params: PruneParams | None = None, filter_value: float = -float("inf")
    ) -> None:
        self.filter = get_filter(name)
        self.params = params if params is not None else PruneParams()
        self.filter_value = float(filter_value)

    def keep(self, scores: Tensor) -> Tensor:  # (B, V) float32 -> (B, V) bool
        return self.filter.mask(scores, self.params)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        x = scores if scores.dtype == torch.float32 else scores.float()
        return scores.masked_fill(~self.keep(x), self.filter_value)  # new tensor


class _StandardWarper(FilterLogitsWarper):
    """A registry filter behind transformers' argument names, with their validation."""

    def __init__(
        self, name: str, filter_value: float, min_tokens_to_keep: int, tie_rule: str, **kw
    ):
        self.min_tokens_to_keep = _check_min_tokens(min_tokens_to_keep)
        self.tie_rule = _check_tie_rule(tie_rule)
        params = _params(min_tokens_to_keep=min_tokens_to_keep, tie_rule=tie_rule, **kw)
        super().__init__(name, params, filter_value)


class TemperatureLogitsWarper(LogitsProcessor):
    """Divide scores by ``temperature > 0`` (for greedy, use ``do_sample=False``).

    Examples
    --------
    >>> import torch
    >>> TemperatureLogitsWarper(2.0)(None, torch.tensor([[2.0, 4.0]]))
    tensor([[1., 2.]])
    """

    def __init__(self, temperature: float) -> None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError(
                f"`temperature` has to be a strictly positive float, got {temperature!r}"
            )
        if not (temperature > 0) or not math.isfinite(temperature):
            raise ValueError(
                f"`temperature` (={temperature}) has to be a strictly positive float; "
                "for greedy decoding set `do_sample=False`."
            )
        self.temperature = float(temperature)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return scores / self.temperature


class TopKLogitsWarper(_StandardWarper):
    """Keep the ``top_k`` highest scores (``hf``: plus ties with the k-th; ``stable``: exactly k).

    Examples
    --------
    >>> import torch
    >>> TopKLogitsWarper(2)(None, torch.tensor([[1.0, 3.0, 2.0, 0.0]]))
    tensor([[-inf, 3., 2., -inf]])
    """

    def __init__(
        self,
        top_k: int,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
        tie_rule: str = "hf",
    ) -> None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
            raise ValueError(f"`top_k` has to be a strictly positive integer, got {top_k!r}")
        self.top_k = max(top_k, _check_min_tokens(min_tokens_to_keep))
        super().__init__("top_k", filter_value, min_tokens_to_keep, tie_rule, top_k=self.top_k)


class TopPLogitsWarper(_StandardWarper):
    """Keep the smallest most-probable set whose probability is at least ``top_p``.

    Examples
    --------
    >>> import torch
    >>> TopPLogitsWarper(0.5)(None, torch.log(torch.tensor([[0.1, 0.6, 0.3]])))
    tensor([[   -inf, -0.5108,    -inf]])
    """

    def __init__(
        self,
        top_p: float,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
        tie_rule: str = "hf",
    ) -> None:
        self.top_p = _check_unit("top_p", top_p, lo_open=True, hi_open=False)
        super().__init__("top_p", filter_value, min_tokens_to_keep, tie_rule, top_p=self.top_p)


class MinPLogitsWarper(_StandardWarper):
    """Keep tokens with probability at least ``min_p`` times the top token's.

    Examples
    --------
    >>> import torch
    >>> MinPLogitsWarper(0.4)(None, torch.log(torch.tensor([[0.1, 0.6, 0.3]])))
    tensor([[   -inf, -0.5108, -1.2040]])
    """

    def __init__(
        self,
        min_p: float,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
        tie_rule: str = "hf",
    ) -> None:
        self.min_p = _check_unit("min_p", min_p, lo_open=False, hi_open=False)
        super().__init__("min_p", filter_value, min_tokens_to_keep, tie_rule, min_p=self.min_p)


class TypicalLogitsWarper(_StandardWarper):
    """Locally typical sampling: keep the tokens whose surprise is closest to the entropy.

    Examples
    --------
    >>> import torch
    >>> TypicalLogitsWarper(0.5)(None, torch.log(torch.tensor([[0.1, 0.6, 0.3]]))).isinf()
    tensor([[ True, False, False]])
    """

    def __init__(
        self,
        mass: float = 0.9,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
        tie_rule: str = "hf",
    ) -> None:
        self.mass = _check_unit("mass", mass, lo_open=True, hi_open=True)
        super().__init__("typical", filter_value, min_tokens_to_keep, tie_rule, typical_p=self.mass)


class EpsilonLogitsWarper(_StandardWarper):
    """Keep tokens with probability at least ``epsilon``.

    Examples
    --------
    >>> import torch
    >>> EpsilonLogitsWarper(0.2)(None, torch.log(torch.tensor([[0.1, 0.6, 0.3]]))).isinf()
    tensor([[ True, False, False]])
    """

    def __init__(
        self,
        epsilon: float,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
        tie_rule: str = "hf",
    ) -> None:
        self.epsilon = _check_unit("epsilon", epsilon, lo_open=True, hi_open=True)
        super().__init__(
            "epsilon", filter_value, min_tokens_to_keep, tie_rule, epsilon=self.epsilon
        )


class EtaLogitsWarper(_StandardWarper):
    """Eta sampling: keep tokens with ``p >= min(eps, sqrt(eps)·exp(-H))``.

    Examples
    --------
    >>> import torch
    >>> EtaLogitsWarper(0.2)(None, torch.log(torch.tensor([[0.1, 0.6, 0.3]]))).isinf()
    tensor([[ True, False, False]])
    """

    def __init__(
        self,
        epsilon: float,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
        tie_rule: str = "hf",
        device: str = "cpu",
    ) -> None:
        self.epsilon = _check_unit("epsilon", epsilon, lo_open=True, hi_open=True)
        super().__init__("eta", filter_value, min_tokens_to_keep, tie_rule, eta=self.epsilon)


class FreeEnergyLogitsWarper(_StandardWarper):
    """Free-energy criterion (seed §4.4): keep ``w`` iff ``U(w) - U_min <= kappa·T·H``.

    ``U = -scores`` and ``H`` is the entropy of ``softmax(scores)``, so a token survives iff
    ``p(w) >= p_max·exp(-kappa·T·H)``: decisive when the entropy is low, tolerant when it is
    high. Put it before a temperature warper and set ``temperature`` to that warper's value
    (the scores it sees are then the T = 1 energies).

    Examples
    --------
    >>> import torch
    >>> FreeEnergyLogitsWarper()(None, torch.log(torch.tensor([[0.05, 0.9, 0.05]]))).isinf()
    tensor([[ True, False,  True]])
    """

    def __init__(
        self,
        kappa: float = 1.0,
        temperature: float = 1.0,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
    ) -> None:
        if not isinstance(kappa, (int, float)) or not (kappa >= 0) or not math.isfinite(kappa):
            raise ValueError(f"`kappa` has to be a finite float >= 0, got {kappa!r}")
        if not isinstance(temperature, (int, float)) or not (temperature > 0):
            raise ValueError(f"`temperature` has to be a float > 0, got {temperature!r}")
        self.kappa, self.temperature = float(kappa), float(temperature)
        super().__init__(
            "free_energy",
            filter_value,
            min_tokens_to_keep,
            "stable",
            free_energy=True,
            free_energy_kappa=self.kappa,
            temperature=self.temperature,
        )


class EntropyAdaptiveTemperatureLogitsWarper(LogitsProcessor):
    """Per-row temperature from the row's entropy (seed §5.2, EDT or llama.cpp dynatemp).

    Modes: ``target`` ``T = clip(T0 + sign·gain·(H - H*), t_min, t_max)`` (``sign=-1``
    cools uncertain steps, ``+1`` heats them), ``edt`` ``T = T0·N^(θ/H)``, ``dynatemp``
    ``T = T_lo + (T_hi - T_lo)·(H / ln n)^exponent``, and ``entropix``
    ``T = clip(T0·(1 + a·(H + V) + b·(H_attn + V_attn) − c·agreement), t_min, t_max)``
    (:func:`semviz.sampling.adaptive_temperature`). ``last_temperatures`` holds the
    temperatures of the last call (B,).

    ``entropix`` reads the step's attention too: pass ``attention_sink`` from
    ``capture_attention(model, lens=True)`` opened around the ``generate`` call, and put this
    warper first, since it reads the scores it gets as the model's raw logits. transformers
    runs its own processors before any passed in ``logits_processor`` (``min_new_tokens``'
    end-of-text mask, ``repetition_penalty``, ``suppress_tokens``): with those on, the warper
    reads their output, and its temperature is no longer the decoder's::

        with capture_attention(model, lens=True) as sink:
            w = EntropyAdaptiveTemperatureLogitsWarper("entropix", 0.7, attention_sink=sink)
            model.generate(ids, do_sample=True, logits_processor=[w])

    Examples
    --------
    >>> import torch
    >>> w = EntropyAdaptiveTemperatureLogitsWarper("target", temperature=1.0, target_entropy=0.0)
    >>> out = w(None, torch.zeros(1, 4))  # H = ln 4 > 0: cooled below 1
    >>> w.last_temperatures[0] < 1
    tensor(True)
    """

    def __init__(
        self,
        mode: str = "target",
        temperature: float = 1.0,
        *,
        target_entropy: float = 2.0,
        controller_gain: float = 0.1,
        controller_sign: int = -1,
        t_min: float = 0.05,
        t_max: float = 2.0,
        edt_theta: float = 1.0,
        edt_n: float = 0.8,
        dynatemp_range: float = 0.5,
        dynatemp_exponent: float = 1.0,
        logits_gain: float = 0.3,
        attention_gain: float = 0.2,
        agreement_gain: float = 0.2,
        attention_sink=None,
    ) -> None:
        if mode not in ("target", "edt", "dynatemp", "entropix"):
            raise ValueError(
                f"`mode` must be 'target', 'edt', 'dynatemp' or 'entropix', got {mode!r}"
            )
        if mode == "entropix" and not getattr(attention_sink, "lens", False):
            raise ValueError(
                "`attention_sink` is required for mode 'entropix', which reads the attention: "
                "open capture_attention(model, lens=True) around generate and pass its sink"
            )
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError(f"`temperature` has to be a float > 0, got {temperature!r}")
        if not temperature > 0:
            raise ValueError(f"`temperature` has to be a float > 0, got {temperature}")
        self.params = _params(
            {
                "adaptive_t_min": "t_min",
                "adaptive_t_max": "t_max",
                "entropix_logits_gain": "logits_gain",
                "entropix_attention_gain": "attention_gain",
                "entropix_agreement_gain": "agreement_gain",
            },
            temperature=float(temperature),
            adaptive=mode,
            target_entropy=float(target_entropy),
            controller_gain=float(controller_gain),
            controller_sign=controller_sign,
            adaptive_t_min=float(t_min),
            adaptive_t_max=float(t_max),
            edt_theta=float(edt_theta),
            edt_n=float(edt_n),
            dynatemp_range=float(dynatemp_range),
            dynatemp_exponent=float(dynatemp_exponent),
            entropix_logits_gain=float(logits_gain),
            entropix_attention_gain=float(attention_gain),
            entropix_agreement_gain=float(agreement_gain),
        )
        self.attention_sink = attention_sink
        self.last_temperatures: Tensor | None = None

    def _readings(self, b: int) -> list:
        """Each row's :class:`~semviz.sampling.AttentionReading` of the last layer, from the
        sink's latest forward, as the decoder reads its own (entropix reads the last layer)."""
        from semviz.model.capture import attention_metrics

        sink = self.attention_sink
        sink.finish()
        last = max(sink.rows)
        att = sink.rows[last][None].float().cpu()  # (1, B, H, S)
        if att.shape[1] != b:
            raise ValueError(
                f"attention_sink holds {att.shape[1]} rows but scores have {b}: "
                "open capture_attention around this generate call only"
            )
        m = attention_metrics(att, torch.zeros(att.shape[:3]), sink.n_keys[last][None])
        return [core.attention_reading(m[0, 0, r], m[2, 0, r]) for r in range(b)]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        x = scores.float()
        if self.params.adaptive == "entropix":
            reads = self._readings(x.shape[0])
            ts = [
                adaptive_temperature(self.params, r, attention=a)
                for r, a in zip(x, reads, strict=True)
            ]
        else:
            ts = [adaptive_temperature(self.params, row) for row in x]
        t = torch.tensor([max(v, 1e-6) for v in ts], dtype=torch.float32)  # (B,)
        self.last_temperatures = t
        return (x / t.to(x.device)[:, None]).to(scores.dtype)


class MirostatLogitsWarper(LogitsProcessor):
    """Mirostat v2: truncate to tokens with surprise ``<= mu`` bits, steer ``mu`` towards ``tau``.

    ``mu`` starts at ``2·tau`` and is kept per batch row. Inside ``generate`` the token chosen
    at the previous step is the last entry of ``input_ids``; its surprise under the
    distribution this warper returned updates ``mu -= eta·(surprise - tau)``. A call whose
    ``input_ids`` did not grow by exactly one resets the state (a new ``generate``).
    Put it last in the list so that what it returns is what gets sampled.

    Examples
    --------
    >>> import torch
    >>> w = MirostatLogitsWarper(tau=1.0)
    >>> w(torch.tensor([[0]]), torch.log(torch.tensor([[0.7, 0.2, 0.1]]))).isinf()
    tensor([[False,  True,  True]])
    """

    def __init__(
        self,
        tau: float = 5.0,
        eta: float = 0.1,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
    ) -> None:
        if not isinstance(tau, (int, float)) or not (tau > 0) or not math.isfinite(tau):
            raise ValueError(f"`tau` has to be a float > 0 (bits), got {tau!r}")
        if not isinstance(eta, (int, float)) or not (eta > 0) or not math.isfinite(eta):
            raise ValueError(f"`eta` has to be a float > 0, got {eta!r}")
        self.tau, self.eta = float(tau), float(eta)
        self.filter_value = float(filter_value)
        self.min_tokens_to_keep = _check_min_tokens(min_tokens_to_keep)
        self.reset()

    def reset(self) -> None:
        self.mu: Tensor | None = None  # (B,)
        self._logq: Tensor | None = None  # (B, V) last returned log-distribution
        self._len = -1

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        B = scores.shape[0]
        n = -1 if input_ids is None else input_ids.shape[-1]
        if self.mu is None or self.mu.shape[0] != B or n != self._len + 1 or self._logq is None:
            self.mu = torch.full((B,), 2.0 * self.tau)
        else:
            last = input_ids[:, -1].long().cpu()  # (B,)
            surprise = -self._logq.gather(-1, last[:, None])[:, 0] / LN2  # (B,) bits
            surprise = torch.nan_to_num(surprise, posinf=2.0 * self.tau)
            self.mu = self.mu - self.eta * (surprise - self.tau)
        x = scores.float()
        keep = mirostat_mask(x, self.mu.to(x.device), self.min_tokens_to_keep)  # (B, V)
        out = scores.masked_fill(~keep, self.filter_value)
        self._logq = torch.log_softmax(out.float(), -1).cpu()
        self._len = n
        return out


# -- gravity inside generate -------------------------------------------------------------------


@dataclass
class HiddenSink:
    """Final normed hidden states seen so far, ``hidden`` (B, N, d); filled by :func:`capture_hidden`."""

    hidden: Tensor | None = None
    chunks: list[Tensor] = field(default_factory=list)

    def add(self, h: Tensor) -> None:
        if in_side_forward():  # gravity's own forwards (short window, info prior) are not the text
            return
        self.chunks.append(h.detach().float())
        self.hidden = None

    def get(self) -> Tensor | None:
        if self.hidden is None and self.chunks:
            self.hidden = torch.cat(self.chunks, dim=1)  # (B, N, d)
            self.chunks = [self.hidden]
        return self.hidden

    def clear(self) -> None:
        self.hidden, self.chunks = None, []


@contextlib.contextmanager
def capture_hidden(model: torch.nn.Module) -> Iterator[HiddenSink]:
    """Collect the final normed hidden states of every forward while the block runs.

    A forward hook on the base model (``model.get_decoder()``, whose output is the LM head's
    input in every family: the final norm is its last module, whatever it is called) is added
    on entry and removed in ``finally``; only forwards run inside the block are recorded (use
    it around one ``generate`` call).

    Examples
    --------
    >>> with capture_hidden(model) as hs:  # doctest: +SKIP
    ...     proc = NarrativeGravityLogitsProcessor(model, 0.5, space="hidden", hidden_sink=hs)
    ...     model.generate(ids, do_sample=True, logits_processor=[proc])
    """
    sink = HiddenSink()
    handle = model.get_decoder().register_forward_hook(lambda mod, args, out: sink.add(out[0]))
    try:
        yield sink
    finally:
        handle.remove()


@contextlib.contextmanager
def capture_attention(model: torch.nn.Module, *, lens: bool = False) -> Iterator:
    """Collect each forward's last-query attention while the block runs, for ``generate``.

    Yields a :class:`semviz.model.capture.AttentionSink` whose ``stacked()`` is ``(L, B, H, S)``
    for the latest forward. ``lens=True`` also records the keys each row read and what the
    attention metrics read (entropix's temperature in
    :class:`EntropyAdaptiveTemperatureLogitsWarper` needs it). The model is switched to
    semviz's capturing sdpa (plain sdpa for every call without a sink), and a forward
    pre-hook that hands the sink to each call is added on entry and removed in ``finally``.

    Examples
    --------
    >>> with capture_attention(model) as sink:  # doctest: +SKIP
    ...     proc = NarrativeGravityLogitsProcessor(model, 0.5, mass="attention",
    ...                                            attention_sink=sink)
    ...     model.generate(ids, do_sample=True, logits_processor=[proc])
    """
    from semviz.model.capture import AttentionSink, enable_capture

    enable_capture(model)
    sink = AttentionSink(lens=lens)

    def pre_hook(module, args, kwargs):
        kwargs["semviz_sink"] = sink
        return args, kwargs

    handle = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield sink
    finally:
        handle.remove()


# gravity's PruneParams fields (declared with gravity=...) as the processor's keywords, named
# without their gravity_ prefix; λ is the second positional argument
_GRAVITY_ARGS: dict[str, str] = {
    name.removeprefix("gravity_"): name
    for name, spec in SPECS.items()
    if spec.gravity and name != "gravity_lambda"
}


@dataclass
class _Row:
    """One batch row's gravity state inside a ``generate`` call."""

    pad: int  # left-padding positions before the row's first real token
    roles: Tensor  # (P,) prompt roles (semviz.gravity.prompt_roles)
    ema: Tensor | None = None  # what the mass source carries (the attention EMA by position)


class NarrativeGravityLogitsProcessor(LogitsProcessor):
    """Adds ``λ·G`` to ``log_softmax(scores)``: narrative gravity inside ``model.generate``.

    Each gravity setting of :class:`~semviz.sampling.PruneParams` (a field declared with
    ``gravity=``) is a keyword argument named without its ``gravity_`` prefix: ``kind``,
    ``mass``, ``sim``, ``space``, ``anchor``, ``mode``, ``rerank_k``, ``ema_decay``, …
    (``help()`` lists them all). One left out takes ``PruneParams``' default, so
    ``NarrativeGravityLogitsProcessor(lm, 0.5)`` is the default gravity at λ 0.5 (coherence
    boosting; with only an ``embedding`` matrix, a pull). Each row's ``G`` comes from
    :func:`semviz.gravity.compute`, the call the :class:`~semviz.decoding.decoder.Decoder`
    makes, so it is the ``G`` the decoder computes for the same context. ``from_params``
    builds one from a ``PruneParams``.

    Batches: rows may be left-padded. Padding is the leading run of ``pad_token_id`` in the
    first call's ``input_ids`` (pass ``attention_mask`` to say it exactly). Per-row state
    (prompt roles, the attention EMA) starts on a call whose ``input_ids`` did not grow by
    one token, i.e. at each new ``generate``. Pass ``tokenizer`` (or a ``LoadedModel`` as
    ``model``) so that chat-template tokens and the system prompt are recognised; without
    it only the model's bos/eos/pad ids are.

    What the gravity reads from the forward pass (:func:`semviz.gravity.reads`) comes from
    a sink:

    - the attention (``mass="attention"`` / ``"ema"``): pass ``attention_sink`` from
      :func:`capture_attention`::

          with capture_attention(model) as sink:
              proc = NarrativeGravityLogitsProcessor(model, 0.5, kind="pull",
                                                     mass="attention", attention_sink=sink)
              model.generate(ids, do_sample=True, logits_processor=[proc])

    - the hidden states (``space="hidden"`` / ``"contextual"``): pass ``hidden_sink`` from
      :func:`capture_hidden`.

    ``kind="contrast"`` (coherence boosting) runs the model on each row's last
    ``contrast_k`` tokens at every step. ``mode="rerank"`` keeps only the top ``rerank_k``
    raw candidates (others get ``filter_value``); ``mode="full"`` adjusts the whole
    vocabulary.

    Examples
    --------
    >>> import torch
    >>> emb = torch.eye(4)  # token i points along axis i
    >>> proc = NarrativeGravityLogitsProcessor(embedding=emb, gravity_lambda=1.0, mass="uniform",
    ...                                        anchor="context", sinks=0, ngram=0, copy_cos=0)
    >>> out = proc(torch.tensor([[2, 2]]), torch.zeros(1, 4))
    >>> int(out.argmax())  # the context pulls towards token 2 (no copy guard: it is token 2)
    2
    """

    def __init__(
        self,
        model: Any = None,
        gravity_lambda: float = 0.5,
        *,
        embedding: Tensor | None = None,
        tokenizer: Any = None,
        attention_sink=None,
        hidden_sink: HiddenSink | None = None,
        pad_token_id: int | None = None,
        attention_mask: Tensor | None = None,
        filter_value: float = -float("inf"),
        min_tokens_to_keep: int = 1,
        **gravity: Any,
    ) -> None:
        if hasattr(model, "model") and hasattr(model, "tokenizer"):  # a semviz LoadedModel
            tokenizer = model.tokenizer if tokenizer is None else tokenizer
            model = model.model
        if model is None and embedding is None:
            raise ValueError("`model` or `embedding` is required")
        for name in gravity:
            if name not in _GRAVITY_ARGS:
                close = difflib.get_close_matches(name, list(_GRAVITY_ARGS), n=1)
                hint = f" (did you mean `{close[0]}`?)" if close else ""
                raise ValueError(
                    f"`{name}` is not an argument of NarrativeGravityLogitsProcessor{hint}"
                )
        if model is None and gravity.get("kind") is None:
            gravity["kind"] = grav.Pull.name  # a bare embedding matrix can only pull
        if not isinstance(gravity_lambda, (int, float)) or not math.isfinite(gravity_lambda):
            raise ValueError(f"`gravity_lambda` has to be a finite float, got {gravity_lambda!r}")
        kw = {_GRAVITY_ARGS[k]: v for k, v in gravity.items() if v is not None}
        self.params = _params(
            gravity_lambda=float(gravity_lambda), min_tokens_to_keep=min_tokens_to_keep, **kw
        )
        p = self.params
        need = grav.reads(p)
        what = f"{p.gravity_kind} gravity ({grav.describe(p)})"
        if "hidden" in need and hidden_sink is None:
            raise ValueError(
                f"`hidden_sink` is required: {what} reads the hidden states (see capture_hidden)"
            )
        if "model" in need and model is None:
            raise ValueError(f"`model` is required: {what} runs the language model itself")
        if "attention" in need and attention_sink is None:
            raise ValueError(
                f"`attention_sink` is required: {what} reads the attention (see capture_attention)"
            )
        self.model, self.embedding, self.tokenizer = model, embedding, tokenizer
        self.attention_sink, self.hidden_sink = attention_sink, hidden_sink
        if pad_token_id is None and tokenizer is not None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None and model is not None:
            pad_token_id = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
        self.pad_token_id = pad_token_id
        self.attention_mask = attention_mask
        self.filter_value = float(filter_value)
        self._source = model if model is not None else grav.BareEmbedding(embedding)
        self._rows: list[_Row] = []
        self._memo: dict = {}  # the last call's pull projections (semviz.gravity.Pull)
        self._len = -1
        self.last_gravity: Tensor | None = None  # (B, V) G of the last call

    @classmethod
    def from_params(cls, model: Any, params: PruneParams, **kw) -> NarrativeGravityLogitsProcessor:
        """The processor for ``params``' gravity (λ, kind, mass, anchor, …); ``kw`` as in
        ``__init__`` (sinks for attention and hidden states, ``tokenizer``, padding)."""
        args = {k: getattr(params, f) for k, f in _GRAVITY_ARGS.items()}
        args.update(kw)
        return cls(
            model, params.gravity_lambda, min_tokens_to_keep=params.min_tokens_to_keep, **args
        )

    def _new_rows(self, input_ids: Tensor) -> list[_Row]:
        B, N = input_ids.shape
        special = grav.model_special_ids(self.model) if self.model is not None else []
        rows = []
        for b in range(B):
            ids = input_ids[b].long().cpu()
            if self.attention_mask is not None and self.attention_mask.shape == input_ids.shape:
                pad = int(N - self.attention_mask[b].long().sum())
            elif self.pad_token_id is not None:
                real = (ids != self.pad_token_id).nonzero()
                pad = int(real[0, 0]) if real.numel() else N
            else:
                pad = 0
            roles = grav.prompt_roles(self.tokenizer, ids[pad:], special_ids=special)
            rows.append(_Row(pad=pad, roles=roles))
        return rows

    def gravity(self, input_ids: Tensor, scores: Tensor | None = None) -> Tensor:
        """``G`` ``(B, V)`` for each row of ``input_ids`` (B, N); ``scores`` (B, V) for a kind
        that reads the step's logits (``contrast``)."""
        p = self.params
        B, N = input_ids.shape
        if len(self._rows) != B or N != self._len + 1:
            self._rows, self._memo = self._new_rows(input_ids), {}
        self._len = N
        need = grav.get_kind(p.gravity_kind).reads(p.gravity_params)
        attn = None
        if "attention" in need:
            attn = self.attention_sink.stacked().float()  # (L, B, H, S)
            if attn.shape[-1] != N:
                raise ValueError(
                    f"attention_sink holds {attn.shape[-1]} positions but input_ids has {N}: "
                    "open capture_attention around this generate call only"
                )
        hidden = None
        if "hidden" in need:
            hidden = self.hidden_sink.get()  # (B, N, d)
            if hidden is None or hidden.shape[1] != N:
                got = 0 if hidden is None else hidden.shape[1]
                raise ValueError(
                    f"hidden_sink holds {got} positions but input_ids has {N}: "
                    "open capture_hidden around this generate call only"
                )
        steps = []
        for b, row in enumerate(self._rows):
            ctx = grav.GravityContext(
                ids=input_ids[b, row.pad :].long().cpu(),  # (T,) the row without its padding
                roles=row.roles,
                attention=None if attn is None else attn[:, b, :, row.pad :],  # (L, H, T)
                hidden=None if hidden is None else hidden[b, row.pad :],  # (T, d)
                ema=row.ema,
            )
            logits = None if scores is None else scores[b].float().cpu()  # (V,)
            steps.append(grav.GravityStep(ctx=ctx, logits=logits))
        outs = grav.compute(self._source, p, steps, batched=True, memo=self._memo)
        for row, out in zip(self._rows, outs, strict=True):
            row.ema = out.ema
        return torch.stack([out.gravity for out in outs])  # (B, V)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        p = self.params
        if p.gravity_lambda == 0.0 and p.gravity_mode == "full":
            return scores.clone()  # λ = 0 is the identity
        x = scores.float()  # (B, V)
        g = self.gravity(input_ids, x).to(x.device)  # (B, V_model)
        V = x.shape[-1]
        if g.shape[-1] < V:
            g = torch.nn.functional.pad(g, (0, V - g.shape[-1]))
        g = g[:, :V]
        self.last_gravity = g
        out = torch.log_softmax(x, -1) + p.gravity_lambda * g  # (B, V)
        if p.gravity_mode == "rerank":
            cand = core.top_k_mask(x, p.rerank_k, p.min_tokens_to_keep, "stable")  # (B, V)
            out = out.masked_fill(~cand, self.filter_value)
        return out.to(scores.dtype)


def _gravity_signature() -> inspect.Signature:
    """``__init__``'s signature with every gravity keyword spelled out, for ``help()``."""
    sig = inspect.signature(NarrativeGravityLogitsProcessor.__init__)
    kw = inspect.Parameter.KEYWORD_ONLY
    named = [q for q in sig.parameters.values() if q.kind is not inspect.Parameter.VAR_KEYWORD]
    extra = [inspect.Parameter(a, kw, default=None) for a in _GRAVITY_ARGS]
    at = [q.name for q in named].index("attention_sink")
    return sig.replace(parameters=named[:at] + extra + named[at:])


NarrativeGravityLogitsProcessor.__init__.__signature__ = _gravity_signature()  # type: ignore[attr-defined]
