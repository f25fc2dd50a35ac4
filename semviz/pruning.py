"""Former home of the sampling core, kept so code outside this package keeps importing.

Everything now lives in :mod:`semviz.sampling` (gravity in :mod:`semviz.gravity`); import
from there.
"""

from semviz.gravity import (  # noqa: F401  (were re-exported here)
    candidate_matrix,
    context_mass,
    ema_mass,
    gravity_for_step,
    gravity_potential,
    normalize_gravity,
)
from semviz.sampling import *  # noqa: F403
from semviz.sampling import __all__ as _names

__all__ = [
    *_names,
    "candidate_matrix",
    "context_mass",
    "ema_mass",
    "gravity_for_step",
    "gravity_potential",
    "normalize_gravity",
]
