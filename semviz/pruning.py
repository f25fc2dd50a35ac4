"""Former home of the sampling core, kept so code outside this package keeps importing.

Everything now lives in :mod:`semviz.sampling`; import from there.
"""

from semviz.gravity import (  # noqa: F401  (were re-exported here)
    candidate_matrix,
    context_mass,
    gravity_for_step,
    gravity_potential,
    normalize_gravity,
)
from semviz.sampling import *  # noqa: F403
from semviz.sampling import __all__ as _names
from semviz.sampling.params import ema_mass  # noqa: F401

__all__ = [
    *_names,
    "candidate_matrix",
    "context_mass",
    "gravity_for_step",
    "gravity_potential",
    "normalize_gravity",
]
