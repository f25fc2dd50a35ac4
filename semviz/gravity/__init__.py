"""Narrative gravity (seed §4.3): ``score(w) = log P(w|C) + λ·G(w|C)``.

The parts, one module each:

- :mod:`~semviz.gravity.kinds`: what ``G`` is. One class per kind in the ``KINDS`` registry,
  and :func:`compute`, the one call of the decoder, the ``generate`` processor and replay.
- :mod:`~semviz.gravity.pull`: kind ``"pull"``, the seed's potential
  ``G(w) = Σ_i m_i·sim(w, t_i)``, z-scored over the vocabulary; :func:`context_pull` turns a
  context into the masses and the pull vector.
- :mod:`~semviz.gravity.contrast`: kind ``"contrast"``, coherence boosting,
  ``G(w) = log P(w|C) - log P(w|last k tokens)``.
- :mod:`~semviz.gravity.masses`: how much each context position pulls. One class per source
  in the ``MASSES`` registry: attention, its EMA, uniform, idf, embedding norm, info.
- :mod:`~semviz.gravity.context`: what a step's gravity reads (:class:`GravityContext`), the
  roles of the prompt's positions, a recorded step as a context.
- :mod:`~semviz.gravity.projection`: the candidate matrices and ``G = Ĉ·p`` as one
  ``(V, d)`` product, inside the LM head's own pass where it can.
- :mod:`~semviz.gravity.guards`: topic, not copies (the n-gram and near-copy guards).
- :mod:`~semviz.gravity.side`: the forwards gravity runs for itself.
- :mod:`~semviz.gravity.registry`: the registries, which are also the settings' choices.

A kind or a mass source is one class, registered: ``PruneParams.gravity_kind`` and
``gravity_mass`` take their choices from the registries, so the new one is a setting in the
decoder, the processor, replay, the CLI and the app at once.
"""

from __future__ import annotations

from semviz.gravity.context import (
    GENERATED,
    SYSTEM,
    TEMPLATE,
    USER,
    GravityContext,
    model_special_ids,
    positions_of,
    prompt_roles,
    trace_context,
)
from semviz.gravity.guards import copy_guard, near_copies, ngram_guard, repeat_tokens
from semviz.gravity.kinds import (
    KINDS,
    GravityKind,
    GravityOut,
    GravityStep,
    compute,
    describe,
    get_kind,
    gravity_for_step,
    gravity_params,
    gravity_terms,
    reads,
    reads_attention,
    reads_hidden,
    register_kind,
    unregister_kind,
)
from semviz.gravity.masses import (
    INFO_QUANTILE,
    MASSES,
    MassSource,
    context_mass,
    ema_mass,
    get_mass,
    information_mass,
    mean_attention,
    register_mass,
    unregister_mass,
)
from semviz.gravity.projection import (
    BareEmbedding,
    candidate_matrix,
    fuses_with_lm_head,
    gravity_potential,
    logits_and_gravity,
    normalize_gravity,
    project,
    pull_vector,
    row_norms,
)
from semviz.gravity.side import in_side_forward, log_probs, short_window_logits

# isort: off
# the kinds register as they are imported, in the order the settings list them
from semviz.gravity.pull import (
    FIRST_GRAVITY,
    ContextPull,
    Pull,
    context_pull,
    mass_mask,
    trace_pulls,
)
from semviz.gravity.contrast import Contrast, contrast_gravity

# isort: on

__all__ = [
    "FIRST_GRAVITY",
    "GENERATED",
    "INFO_QUANTILE",
    "KINDS",
    "MASSES",
    "SYSTEM",
    "TEMPLATE",
    "USER",
    "BareEmbedding",
    "ContextPull",
    "Contrast",
    "GravityContext",
    "GravityKind",
    "GravityOut",
    "GravityStep",
    "MassSource",
    "Pull",
    "candidate_matrix",
    "compute",
    "context_mass",
    "context_pull",
    "contrast_gravity",
    "copy_guard",
    "describe",
    "ema_mass",
    "fuses_with_lm_head",
    "get_kind",
    "get_mass",
    "gravity_for_step",
    "gravity_params",
    "gravity_potential",
    "gravity_terms",
    "in_side_forward",
    "information_mass",
    "log_probs",
    "logits_and_gravity",
    "mass_mask",
    "mean_attention",
    "model_special_ids",
    "near_copies",
    "ngram_guard",
    "normalize_gravity",
    "positions_of",
    "project",
    "prompt_roles",
    "pull_vector",
    "reads",
    "reads_attention",
    "reads_hidden",
    "register_kind",
    "register_mass",
    "repeat_tokens",
    "row_norms",
    "short_window_logits",
    "trace_context",
    "trace_pulls",
    "unregister_kind",
    "unregister_mass",
]
