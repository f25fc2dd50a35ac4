"""The chain's settings (:class:`PruneParams`), each field described once, and the step state.

Every field of :class:`PruneParams` carries a :class:`FieldSpec` in its metadata: its type,
valid range or choices, a help sentence, and, for the fields the app shows, its widget's
label, range and section. Everything that reads a setting goes through it: validation
(:meth:`PruneParams.validate`), the CLI flags, the compare specs, the app's ``Settings``,
its sidebar and its URL (:func:`parse_field`), so a field's rules live in one place.

Adding a field
--------------
Add one line to :class:`PruneParams`::

    anchor_weight: float = setting(0.0, "Pull towards the prompt's first tokens; 0 is off.", lo=0)

That is all the validation, ``--anchor-weight`` on the CLI, ``anchor_weight=…`` in compare
specs and trace round trips need. Give ``app=(lo, hi, step)`` for a slider (or ``app=True``
for a toggle or a select box), ``label=`` and ``group=`` to show it in the app's sidebar;
``shown_if=("other_field", value)`` hides the widget unless another field has that value.
Cross-field rules go in :meth:`PruneParams.validate` after the per-field loop.

A field that gravity reads says so: ``gravity="shape"`` for one that changes ``G`` itself
(gravity kinds and mass sources see only these, :attr:`PruneParams.gravity_params`, and they
are replay's key for reusing a recorded ``G``), ``gravity="use"`` for one that changes how
``G`` enters the score (λ, the mode). Both are arguments of
``semviz.processors.NarrativeGravityLogitsProcessor``. ``gravity_kind`` and ``gravity_mass``
take their choices from the registries in :mod:`semviz.gravity`, so a kind or a mass source
registered there is a valid value, a CLI choice and an app option.

Examples
--------
>>> PruneParams(top_p=0.9).replace(temperature=0.7).temperature
0.7
>>> parse_field("top_p", "1.5", clamp=True)
(1.0, 'top_p=1.5 must be in (0, 1]; using 1.0.')
>>> parse_field("free_energy", "on")
(True, None)
>>> PruneParams(top_p=0.0)
Traceback (most recent call last):
...
ValueError: PruneParams.top_p=0.0: must be in (0, 1]
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any

from semviz.gravity.kinds import KINDS
from semviz.gravity.masses import MASSES

__all__ = [
    "GRAVITY_FIELDS",
    "SPECS",
    "FieldSpec",
    "GravityParams",
    "PruneParams",
    "check_model_shape",
    "field_spec",
    "parse_bool",
    "parse_field",
    "parse_scalar",
    "parse_value",
    "setting",
]

_UNSET = object()
_TRUE = ("1", "on", "true", "yes")
_FALSE = ("0", "off", "false", "no")


@dataclass(frozen=True)
class FieldSpec:
    """What one setting accepts and how the app shows it.

    ``kind`` is ``"bool"``, ``"int"``, ``"float"``, ``"choice"``, ``"indices"`` (None or a
    tuple of non-negative ints) or ``"str"``. ``lo``/``hi`` bound numbers (``lo_open``/``hi_open`` for
    strict bounds); ``note`` follows the range in error messages ("0 means off").
    ``app`` is ``(lo, hi, step)`` for a slider or number box, ``True`` for a toggle or a
    select box, ``False`` for a field the sidebar does not show; ``app_default`` replaces
    the field's default in the app. ``gravity`` is ``"shape"`` for a field that changes
    gravity's ``G``, ``"use"`` for one that changes how ``G`` enters the score, else ``""``.
    ``choices`` is a tuple of the allowed values, read at each use from ``choice_source``
    (``setting(choices=...)``), which may be a live registry (``semviz.gravity.KINDS``).
    ``optional`` makes None a valid value too (``note`` says what it means; ``"auto"`` reads
    as None). ``flag`` is the CLI flag when it is not the field's name (``"--steps"``).
    """

    kind: str
    help: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choice_source: Sequence = ()
    note: str = ""
    app: bool | tuple[float, float, float] = False
    label: str = ""
    group: str = ""
    shown_if: tuple[str, Any] | None = None
    app_default: Any = _UNSET
    gravity: str = ""
    optional: bool = False
    flag: str = ""

    @property
    def choices(self) -> tuple:
        """The allowed values as they stand (a registry may have grown since declaration)."""
        return tuple(self.choice_source)

    # -- text ------------------------------------------------------------------------------
    def range_text(self) -> str:
        """``"in (0, 1]"``, ``">= 0"``, ``"one of ('hf', 'llama.cpp')"``, or ``""``."""
        if self.kind == "choice":
            return f"one of {self.choices}"
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            a, b = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"in {a}{_num(lo)}, {_num(hi)}{b}"
        if lo is not None:
            return f"{'>' if self.lo_open else '>='} {_num(lo)}"
        if hi is not None:
            return f"{'<' if self.hi_open else '<='} {_num(hi)}"
        return ""

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not valid for this field (the end of a sentence), or None."""
        k = self.kind
        if value is None and self.optional:
            return None
        if k == "str":
            return None if isinstance(value, str) else "must be text"
        if k == "bool":
            return None if isinstance(value, bool) else "must be a bool"
        if k == "choice":
            return None if value in self.choices else f"must be {self.range_text()}"
        if k == "indices":
            if value is None:
                return None
            ok = isinstance(value, tuple) and value and all(_is_int(i) for i in value)
            if not ok:
                return "must be None or a non-empty tuple of ints"
            return None if min(value) >= 0 else "indices must be >= 0"
        if k == "int" and not _is_int(value):
            return "must be an int"
        if k == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return "must be a number"
        if not math.isfinite(value):
            return "must be finite"
        if not self._in_range(value):
            note = f" ({self.note})" if self.note else ""
            return f"must be {self.range_text()}{note}"
        return None

    def _in_range(self, v: float) -> bool:
        lo, hi = self.lo, self.hi
        if lo is not None and (v <= lo if self.lo_open else v < lo):
            return False
        return hi is None or (v < hi if self.hi_open else v <= hi)

    # -- parsing ---------------------------------------------------------------------------
    def coerce(self, raw: Any) -> Any:
        """``raw`` (a string from a URL, a flag or a spec, or a widget's value) as this
        field's type, without checking the range. ``ValueError`` says what was expected."""
        k = self.kind
        if self.optional and (raw is None or str(raw).strip().lower() == "auto"):
            return None
        if k == "bool":
            return parse_bool(raw)
        if k == "indices":
            return _parse_indices(raw)
        if k == "choice":
            if self.choices and all(_is_int(c) for c in self.choices):
                return _parse_int(raw)
            text = str(raw).strip()
            if text not in self.choices:
                close = difflib.get_close_matches(text, [str(c) for c in self.choices], n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ValueError(f"expected {self.range_text()}{hint}")
            return text
        if k == "int":
            try:
                return _parse_int(raw)
            except ValueError as exc:  # past 32 bits: say this field's range, not int32's
                if str(exc) == "expected an integer" or self.hi is None or self.lo is None:
                    raise
                raise ValueError(f"expected an integer {self.range_text()}") from None
        if k == "float":
            return _parse_float(raw)
        return "" if raw is None else str(raw)

    def clamp(self, value: float, *, app: bool = False) -> float | None:
        """``value`` moved into the range (the widget's with ``app``); None if impossible.

        A strict bound cannot be reached, so a value past it cannot be clamped.
        """
        if isinstance(self.app, tuple) and app:
            lo, hi, lo_open, hi_open = self.app[0], self.app[1], False, False
        else:
            lo, hi, lo_open, hi_open = self.lo, self.hi, self.lo_open, self.hi_open
        if lo is not None and value < lo:
            return None if lo_open else type(value)(lo)
        if hi is not None and value > hi:
            return None if hi_open else type(value)(hi)
        return value

    @property
    def default_in_app(self) -> bool:
        return self.app_default is not _UNSET


def setting(default: Any, help: str, **spec: Any) -> Any:
    """A dataclass field with its :class:`FieldSpec` (``kind`` follows from ``default``)."""
    kind = spec.pop("kind", None) or _kind_of(default, spec)
    if "choices" in spec:
        spec["choice_source"] = spec.pop("choices")
    return field(default=default, metadata={"spec": FieldSpec(kind=kind, help=help, **spec)})


def _kind_of(default: Any, spec: dict) -> str:
    # present, not truthy: a registry is still empty while its package is being imported
    # (another thread's import, or a circle), and its field is a choice all the same
    if "choices" in spec:
        return "choice"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if default is None or isinstance(default, tuple):
        return "indices"
    return "str"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# -- the one parser --------------------------------------------------------------------------


def parse_bool(raw: Any) -> bool:
    """``on/off``, ``true/false``, ``yes/no``, ``1/0`` (any case), or a bool.

    >>> parse_bool("Off"), parse_bool(1)
    (False, True)
    """
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected on or off")


INT_LIMIT = 2**31 - 1  # every integer setting fits in 32 bits, as torch's kernels need


def _parse_int(raw: Any) -> int:
    """An integer from an int, an integral float or its text (``"1e3"`` is 1000), within
    ±``INT_LIMIT``, so a huge value is refused here rather than overflowing in torch."""
    v: Any = None
    if _is_int(raw):
        v = raw
    elif isinstance(raw, float) and raw.is_integer():
        v = int(raw)
    else:
        text = str(raw).strip()
        try:
            v = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            v = int(f) if math.isfinite(f) and f.is_integer() else None
    if v is None:
        raise ValueError("expected an integer")
    if abs(v) > INT_LIMIT:
        raise ValueError(f"expected an integer between {-INT_LIMIT} and {INT_LIMIT}")
    return v


def _parse_float(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number")
    try:
        v = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number") from None
    if not math.isfinite(v):
        raise ValueError("expected a finite number")
    return v


def _parse_indices(raw: Any) -> tuple[int, ...] | None:
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)):
        return tuple(_parse_int(i) for i in raw) or None
    text = str(raw).strip()
    if text.lower() in ("", "all", "none"):
        return None
    parts = [p.strip() for p in text.replace("/", ",").split(",")]
    try:
        return tuple(_parse_int(p) for p in parts)
    except ValueError:
        raise ValueError("expected integers separated by '/' or ','") from None


def parse_scalar(raw: str) -> Any:
    """A setting without a declared type: ``none`` → None, on/off words → bool, then int,
    float, and otherwise the text itself (used for eviction policies' extra arguments).

    >>> [parse_scalar(s) for s in ("none", "on", "3", "0.25", "h2o")]
    [None, True, 3, 0.25, 'h2o']
    """
    text = str(raw).strip()
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("on", "off", "true", "false", "yes", "no"):
        return parse_bool(low)
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_value(
    spec: FieldSpec, name: str, raw: Any, *, clamp: bool = False, app: bool = False
) -> tuple[Any, str | None]:
    """Parse ``raw`` for the field ``name`` described by ``spec``: ``(value, note)``.

    A value of the wrong type raises ``ValueError`` naming the field. A number out of range
    raises too, unless ``clamp``: then it is moved to the nearest end of the range (of the
    app widget's range with ``app``) and ``note`` says so in one sentence.
    """
    try:
        value = spec.coerce(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: {exc}") from None
    why = spec.problem(value)
    if clamp and spec.kind in ("int", "float"):
        fixed = spec.clamp(value, app=app)
        if fixed is not None and fixed != value:
            widget = app and isinstance(spec.app, tuple)
            where = f"is outside the app's range {_app_range(spec)}" if widget else why
            return fixed, f"{name}={raw} {where}; using {fixed}."
    if why is not None:
        raise ValueError(f"{name}={raw!r}: {why}")
    return value, None


def _app_range(spec: FieldSpec) -> str:
    lo, hi, _ = spec.app  # type: ignore[misc]
    return f"[{_num(lo)}, {_num(hi)}]"


def field_spec(name: str) -> FieldSpec:
    """The :class:`FieldSpec` of ``PruneParams.<name>``; ``ValueError`` with a suggestion."""
    try:
        return SPECS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(SPECS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"{name!r} is not a sampling setting{hint}") from None


def parse_field(
    name: str, raw: Any, *, clamp: bool = False, app: bool = False
) -> tuple[Any, str | None]:
    """``(value, note)`` for ``PruneParams.<name>`` from a URL, CLI or compare-spec string.

    See :func:`parse_value`; ``note`` is None unless a value was clamped.
    """
    return parse_value(field_spec(name), name, raw, clamp=clamp, app=app)


# -- the parameters --------------------------------------------------------------------------

SAMPLING, GRAVITY = "Sampling", "Gravity & free energy"
UNIT = {"lo": 0.0, "hi": 1.0}
# entropix's three weights: a slider each, shown while that rule is chosen
ENTROPIX_GAIN = {
    "lo": 0.0,
    "app": (0.0, 1.0, 0.01),
    "group": SAMPLING,
    "shown_if": ("adaptive", "entropix"),
}


@dataclass(frozen=True)
class PruneParams:
    """Everything that shapes one step's distribution. Defaults are plain sampling.

    Filters count as off at their neutral value: ``top_k=0``, ``top_p=1``, ``min_p=0``,
    ``typical_p=1``, ``epsilon=0``, ``eta=0``. ``temperature=0`` means greedy. Each field's
    range and meaning is in its metadata (:func:`field_spec`); see the module docstring of
    :mod:`semviz.sampling` for ``order``, ``combine`` and ``tie_rule``.
    """

    temperature: float = setting(
        1.0,
        "Divide the scores by T before sampling; 0 is greedy (argmax).",
        lo=0.0,
        note="0 means greedy",
        app=(0.0, 2.0, 0.05),
        label="Temperature",
        group=SAMPLING,
        app_default=0.8,
    )
    top_k: int = setting(
        0,
        "Keep the k most probable tokens; 0 is off.",
        lo=0,
        note="0 means off",
        app=(0, 200, 1),
        label="top-k",
        group=SAMPLING,
    )
    top_p: float = setting(
        1.0,
        "Keep the smallest most-probable set with mass >= p; 1 is off.",
        **UNIT,
        lo_open=True,
        app=(0.01, 1.0, 0.01),
        label="top-p",
        group=SAMPLING,
    )
    min_p: float = setting(
        0.0,
        "Keep tokens with p >= min_p·p_max; 0 is off.",
        **UNIT,
        app=(0.0, 1.0, 0.01),
        label="min-p",
        group=SAMPLING,
    )
    typical_p: float = setting(
        1.0,
        "Locally typical sampling: keep the tokens whose surprise is closest to the "
        "entropy, up to this mass; 1 is off.",
        **UNIT,
        lo_open=True,
        app=(0.01, 1.0, 0.01),
        label="typical-p",
        group=SAMPLING,
    )
    epsilon: float = setting(0.0, "Keep tokens with p >= epsilon; 0 is off.", **UNIT, hi_open=True)
    eta: float = setting(
        0.0,
        "Eta sampling: keep tokens with p >= min(eta, sqrt(eta)·exp(-H)); 0 is off.",
        **UNIT,
        hi_open=True,
    )
    order: str = setting(
        "hf",
        "Where temperature sits: 'hf' divides before the filters, 'llama.cpp' after.",
        choices=("hf", "llama.cpp"),
    )
    combine: str = setting(
        "intersection",
        "'intersection' keeps what every filter keeps on the same "
        "distribution; 'sequential' applies them one after another, as HF generate does.",
        choices=("intersection", "sequential"),
    )
    tie_rule: str = setting(
        "stable",
        "'stable' breaks ties by the lower token id; 'hf' reproduces transformers' "
        "warpers operation for operation.",
        choices=("stable", "hf"),
    )
    min_tokens_to_keep: int = setting(1, "No filter leaves fewer tokens than this.", lo=1)
    # narrative gravity: s = log P + λ·G (semviz.gravity)
    gravity_lambda: float = setting(
        0.0,
        "Narrative gravity: s = log P + λ·G; 0 is off. A pull's G is z-scored over the "
        "vocabulary, a contrast's is in nats.",
        app=(-2.0, 3.0, 0.05),
        label="Gravity λ",
        group=GRAVITY,
        gravity="use",
    )
    gravity_kind: str = setting(
        "contrast",
        "'contrast' is coherence boosting, G = log P(w|C) - log P(w|last k "
        "tokens) (a second, short forward per step); 'pull' is the seed's "
        "G = Σ m_i·sim(w, t_i) towards the context.",
        choices=KINDS,
        app=True,
        label="Kind",
        group=GRAVITY,
        gravity="shape",
    )
    gravity_contrast_k: int = setting(
        8,
        "Contrast: the short context is the last k tokens.",
        lo=1,
        hi=4096,
        app=(1, 64, 1),
        label="Short context k",
        group=GRAVITY,
        shown_if=("gravity_kind", "contrast"),
        gravity="shape",
    )
    gravity_mode: str = setting(
        "full",
        "'full' adjusts every token; 'rerank' only the top rerank_k raw candidates.",
        choices=("full", "rerank"),
        app=True,
        label="Mode",
        group=GRAVITY,
        gravity="use",
    )
    rerank_k: int = setting(
        64, "How many raw candidates gravity reranks in rerank mode.", lo=1, gravity="use"
    )
    gravity_mass: str = setting(
        "info",
        "Pull: each context token's weight: last-query attention, its EMA, uniform, "
        "IDF, embedding norm, or 'info' (the token's surprise under the model; stopwords "
        "and punctuation get none).",
        choices=MASSES,
        app=True,
        label="Mass source",
        group=GRAVITY,
        shown_if=("gravity_kind", "pull"),
        gravity="shape",
    )
    gravity_sim: str = setting(
        "cosine",
        "Pull: similarity of a candidate to the context.",
        choices=("cosine", "dot"),
        app=True,
        label="Similarity",
        group=GRAVITY,
        shown_if=("gravity_kind", "pull"),
        gravity="shape",
    )
    gravity_space: str = setting(
        "embedding",
        "Pull: the vectors compared: input embeddings, final hidden states, or "
        "'contextual' (the state each context token was predicted from).",
        choices=("embedding", "hidden", "contextual"),
        app=True,
        label="Space",
        group=GRAVITY,
        shown_if=("gravity_kind", "pull"),
        gravity="shape",
    )
    gravity_anchor: str = setting(
        "prompt",
        "Pull: which tokens may carry mass: the user's prompt, the whole context, "
        "or the last gravity_window positions.",
        choices=("prompt", "context", "window"),
        app=True,
        label="Anchor",
        group=GRAVITY,
        shown_if=("gravity_kind", "pull"),
        gravity="shape",
    )
    gravity_window: int = setting(
        64,
        "Pull with anchor 'window': how many recent positions may carry mass.",
        lo=1,
        hi=1 << 20,
        app=(4, 512, 4),
        label="Window (positions)",
        group=GRAVITY,
        shown_if=("gravity_anchor", "window"),
        gravity="shape",
    )
    gravity_sinks: int = setting(
        1,
        "Pull: the first positions (attention sinks) carry no mass.",
        lo=0,
        hi=1 << 20,
        gravity="shape",
    )
    gravity_skip_template: bool = setting(
        True,
        "Pull: special and chat-template tokens and the system prompt carry no mass.",
        app=True,
        label="No mass on template tokens",
        group=GRAVITY,
        shown_if=("gravity_kind", "pull"),
        gravity="shape",
    )
    gravity_ngram: int = setting(
        2,
        "A token that would repeat an n-gram of the context keeps no positive gravity; 0 is off.",
        lo=0,
        hi=64,
        note="0 means off",
        gravity="shape",
    )
    gravity_copy_cos: float = setting(
        0.65,
        "Pull: a token whose embedding cosine with a context token is at least this "
        "keeps no positive gravity; 0 is off.",
        **UNIT,
        note="0 means off",
        gravity="shape",
    )
    gravity_attract_only: bool = setting(
        True,
        "Pull: G = max(z - gravity_floor, 0), so nothing is pushed away.",
        gravity="shape",
    )
    gravity_floor: float = setting(
        1.0,
        "Pull with attract-only: the z-score above which a token is pulled.",
        lo=0.0,
        hi=10.0,
        gravity="shape",
    )
    gravity_layers: tuple[int, ...] | None = setting(
        None,
        "Layers whose attention gives the mass (all when unset).",
        kind="indices",
        gravity="shape",
    )
    gravity_heads: tuple[int, ...] | None = setting(
        None,
        "Heads whose attention gives the mass (all when unset).",
        kind="indices",
        gravity="shape",
    )
    ema_decay: float = setting(
        0.9, "Decay of the attention EMA (mass 'ema').", **UNIT, hi_open=True, gravity="shape"
    )
    # free-energy criterion: keep w iff U(w) - U_min <= kappa * T * H
    free_energy: bool = setting(
        False,
        "Free-energy filter: keep w iff U(w) - U_min <= kappa·T·H.",
        app=True,
        label="Free-energy pruning",
        group=GRAVITY,
    )
    free_energy_kappa: float = setting(
        1.0,
        "kappa of the free-energy window.",
        lo=0.0,
        app=(0.0, 5.0, 0.1),
        label="κ (keep U − U_min ≤ κ·T·H)",
        group=GRAVITY,
        shown_if=("free_energy", True),
    )
    # adaptive temperature
    adaptive: str = setting(
        "none",
        "Adaptive temperature: a target-entropy controller, EDT, llama.cpp's "
        "dynatemp, mirostat v2, or entropix's rule, which also reads the attention.",
        choices=("none", "target", "edt", "dynatemp", "mirostat", "entropix"),
        app=True,
        label="Adaptive temperature",
        group=SAMPLING,
    )
    target_entropy: float = setting(
        2.0,
        "Entropy the 'target' controller steers towards (nats).",
        lo=0.0,
        note="nats",
        app=(0.0, 6.0, 0.1),
        label="Target entropy (nats)",
        group=SAMPLING,
        shown_if=("adaptive", "target"),
    )
    controller_gain: float = setting(0.1, "Gain of the 'target' controller.", lo=0.0)
    controller_sign: int = setting(
        -1,
        "-1 cools when the model is unsure (stable long text), +1 heats (exploration).",
        choices=(-1, 1),
    )
    adaptive_t_min: float = setting(0.05, "Lowest adaptive temperature.", lo=0.0, lo_open=True)
    adaptive_t_max: float = setting(2.0, "Highest adaptive temperature.", lo=0.0, lo_open=True)
    edt_theta: float = setting(1.0, "EDT: T = T0·N^(theta/H).", lo=0.0)
    edt_n: float = setting(0.8, "EDT's base N.", **UNIT, lo_open=True, hi_open=True)
    dynatemp_range: float = setting(0.5, "dynatemp: T spans T0 ± this range.", lo=0.0)
    dynatemp_exponent: float = setting(
        1.0, "dynatemp: exponent on the normalised entropy.", lo=0.0, lo_open=True
    )
    mirostat_tau: float = setting(
        5.0, "Mirostat's target surprise (bits).", lo=0.0, lo_open=True, note="bits"
    )
    mirostat_eta: float = setting(0.1, "Mirostat's learning rate.", lo=0.0, lo_open=True)
    # entropix: T = T0·(1 + a·(H + V) + b·(H_attn + V_attn) − c·agreement), in bits
    entropix_logits_gain: float = setting(
        0.3,
        "entropix: weight a of the logits' entropy + varentropy (bits, bits²). entropix's "
        "0.3 holds T at its cap on most steps of SmolLM2 (10–25 bits of H + V): try 0.02.",
        label="a: logits' H + V",
        **ENTROPIX_GAIN,
    )
    entropix_attention_gain: float = setting(
        0.2,
        "entropix: weight b of the last layer's attention entropy + its variance over heads.",
        label="b: attention H + head spread",
        **ENTROPIX_GAIN,
    )
    entropix_agreement_gain: float = setting(
        0.2,
        "entropix: weight c of the heads' agreement, which cools.",
        label="c: head agreement",
        **ENTROPIX_GAIN,
    )
    # safety fallback
    fallback: bool = setting(
        False,
        "Loops or collapse switch the step to plain sampling.",
        app=True,
        label="Safety fallback",
        group=GRAVITY,
    )
    fallback_ngram: int = setting(4, "Fallback: the n of the repeated n-gram.", lo=1)
    fallback_ngram_repeats: int = setting(2, "Fallback: repeats that count as a loop.", lo=1)
    fallback_collapse_steps: int = setting(8, "Fallback: steps of collapsed entropy.", lo=1)
    fallback_collapse_threshold: float = setting(
        0.05, "Fallback: entropy (nats) below which a step counts as collapsed.", lo=0.0
    )
    fallback_gravity_ratio: float = setting(
        2.0,
        "Fallback: λ·range(G) / range(log P) above which gravity dominates.",
        lo=0.0,
        lo_open=True,
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            kind = f.metadata["spec"].kind
            if kind == "indices" and isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
            elif kind == "float" and _is_int(v):
                object.__setattr__(self, f.name, float(v))
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that is out of range."""
        for f in fields(self):
            why = f.metadata["spec"].problem(getattr(self, f.name))
            if why is not None:
                raise ValueError(f"PruneParams.{f.name}={getattr(self, f.name)!r}: {why}")
        if self.adaptive_t_min > self.adaptive_t_max:
            raise ValueError(
                f"PruneParams.adaptive_t_min={self.adaptive_t_min!r}: must satisfy "
                "0 < adaptive_t_min <= adaptive_t_max"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @cached_property
    def gravity_params(self) -> GravityParams:
        """Only the fields that shape gravity's ``G`` (declared ``gravity="shape"``): what the
        gravity kinds and mass sources see, and replay's key for reusing a recorded ``G``."""
        return GravityParams(**{name: getattr(self, name) for name in GRAVITY_FIELDS})

    def replace(self, **changes: Any) -> PruneParams:
        """A copy with ``changes``, validated (``ValueError`` names the field)."""
        unknown = sorted(set(changes) - set(SPECS))
        if unknown:
            raise ValueError(f"PruneParams.replace: unknown keys {unknown}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("gravity_layers", "gravity_heads"):
            if d[name] is not None:
                d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PruneParams:
        unknown = sorted(set(d) - set(SPECS))
        if unknown:
            raise ValueError(f"PruneParams.from_dict: unknown keys {unknown}")
        return cls(**d)


SPECS: dict[str, FieldSpec] = {f.name: f.metadata["spec"] for f in fields(PruneParams)}

# the fields that shape gravity's G, in declaration order (see the module docstring)
GRAVITY_FIELDS: tuple[str, ...] = tuple(n for n, s in SPECS.items() if s.gravity == "shape")


class _GravityView:
    """What :class:`GravityParams` adds to its fields: validation and ``replace``."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.metadata["spec"].kind == "indices" and isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
            why = f.metadata["spec"].problem(getattr(self, f.name))
            if why is not None:
                raise ValueError(f"PruneParams.{f.name}={v!r}: {why}")

    def replace(self, **changes: Any) -> GravityParams:
        """A copy with ``changes``, validated (``ValueError`` names the field)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


GravityParams = dataclasses.make_dataclass(
    "GravityParams",
    [
        (
            n,
            PruneParams.__dataclass_fields__[n].type,
            field(
                default=PruneParams.__dataclass_fields__[n].default,
                metadata=PruneParams.__dataclass_fields__[n].metadata,
            ),
        )
        for n in GRAVITY_FIELDS
    ],
    bases=(_GravityView,),
    frozen=True,
)
GravityParams.__module__ = __name__
GravityParams.__doc__ = """The ``PruneParams`` fields that shape gravity's ``G``, and no other
(``PruneParams.gravity_params``). Gravity kinds and mass sources are handed one, so a field
they read must be declared ``gravity="shape"``, and then it is in replay's key too."""


def check_model_shape(params: PruneParams, *, n_layers: int, n_heads: int) -> None:
    """``ValueError`` naming ``gravity_layers`` / ``gravity_heads`` when an index is past
    the model's ``n_layers`` layers or ``n_heads`` attention heads.

    >>> check_model_shape(PruneParams(gravity_layers=(3, 30)), n_layers=30, n_heads=9)
    Traceback (most recent call last):
    ...
    ValueError: PruneParams.gravity_layers=(3, 30): the model has 30 layers, so indices must be in 0..29
    """
    for name, n, what in (
        ("gravity_layers", n_layers, "layers"),
        ("gravity_heads", n_heads, "heads"),
    ):
        v = getattr(params, name)
        if v is not None and max(v) >= n:
            raise ValueError(
                f"PruneParams.{name}={v!r}: the model has {n} {what}, so indices must be in "
                f"0..{n - 1}"
            )
