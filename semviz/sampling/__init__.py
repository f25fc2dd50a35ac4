"""The sampling core: one step's logits -> gravity -> temperature -> filters -> distribution.

Everything here is a pure tensor function. Live decoding, counterfactual replay, the HF
``LogitsProcessor`` classes and the CLI all call :func:`prune` and :func:`choose`.

- :mod:`~semviz.sampling.params`: :class:`PruneParams` (each field's range, help and widget
  in its metadata) and the one value parser.
- :mod:`~semviz.sampling.state`: what a step produced (:class:`PruneResult`, its :class:`Stage`
  rows) and what a sequence carries between steps (:class:`SamplerState`).
- :mod:`~semviz.sampling.filters`: one class per truncation filter, ``FILTERS`` in chain order.
- :mod:`~semviz.sampling.thermo`: entropy, free energy, adaptive temperature.
- :mod:`~semviz.sampling.chain`: :func:`prune` and :func:`choose`.
- :mod:`~semviz.sampling.presets`: the scenario presets.

The chain, per step::

    raw logits x ─► [candidates: drop tail] ─► gravity: s = x + λ·G (full or rerank)
      ─► order "hf":        temperature s/T ─► filters ─► final
      ─► order "llama.cpp": filters on s    ─► temperature ─► final

The filters (``FILTERS``: top-k, top-p, min-p, typical, epsilon, eta, free energy) are
evaluated on the same input distribution and their kept sets intersected
(``combine="intersection"``, the default), or applied one after another as HF ``generate``
does (``combine="sequential"``). Mirostat, when on, truncates the survivors last.

Tie rule. ``tie_rule="hf"`` reproduces transformers' warpers operation for operation, so the
kept set equals theirs for any input, ties included (their top-p/typical use an unstable sort,
so which tied tokens survive is whatever ``torch.sort`` returns). ``tie_rule="stable"`` (the
default) orders by value with ties broken by the lower index, so the result is
deterministic: top-k keeps exactly ``k`` tokens, top-p the smallest such prefix, and the
``min_tokens_to_keep`` guard protects the first tokens of that order.
"""

from semviz.sampling.chain import (
    T_GREEDY,
    choose,
    default_params,
    gravity_dominance,
    prune,
)
from semviz.sampling.filters import (
    FILTERS,
    Filter,
    HeadInput,
    active_filters,
    epsilon_mask,
    eta_mask,
    free_energy_mask,
    get_filter,
    min_p_mask,
    mirostat_mask,
    register,
    stable_head,
    stable_order,
    top_k_mask,
    top_p_mask,
    typical_mask,
    unregister,
)
from semviz.sampling.params import (
    GRAVITY_FIELDS,
    SPECS,
    FieldSpec,
    GravityParams,
    PruneParams,
    check_model_shape,
    field_spec,
    parse_bool,
    parse_field,
    parse_scalar,
    parse_value,
    setting,
)
from semviz.sampling.state import PruneResult, SamplerState, Stage
from semviz.sampling.thermo import (
    LN2,
    AttentionReading,
    adaptive_temperature,
    attention_reading,
    entropix_formula,
    entropy_stats,
    free_energy,
)

__all__ = [
    "FILTERS",
    "GRAVITY_FIELDS",
    "LN2",
    "SPECS",
    "T_GREEDY",
    "FieldSpec",
    "Filter",
    "GravityParams",
    "HeadInput",
    "PruneParams",
    "PruneResult",
    "SamplerState",
    "Stage",
    "active_filters",
    "AttentionReading",
    "adaptive_temperature",
    "attention_reading",
    "entropix_formula",
    "check_model_shape",
    "choose",
    "default_params",
    "entropy_stats",
    "epsilon_mask",
    "eta_mask",
    "field_spec",
    "free_energy",
    "free_energy_mask",
    "get_filter",
    "gravity_dominance",
    "min_p_mask",
    "mirostat_mask",
    "parse_bool",
    "parse_field",
    "parse_scalar",
    "parse_value",
    "prune",
    "register",
    "setting",
    "stable_head",
    "stable_order",
    "top_k_mask",
    "top_p_mask",
    "typical_mask",
    "unregister",
]
