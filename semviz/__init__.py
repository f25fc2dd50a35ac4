"""semviz: watch, and steer, a real language model choosing its next token.

The public API lives here, whatever module it comes from::

    from semviz import load_model, Decoder, DecodeSettings, PruneParams, Trace, logit_lens

Names other than the model loader are imported on first use, so ``import semviz`` (and the
CLI's ``--help``) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from semviz.model.load import DEFAULT_MODEL, LoadedModel, ModelLoadError, load_model

if TYPE_CHECKING:
    from semviz.analysis.lens import logit_lens
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.output.trace import Trace
    from semviz.sampling import PruneParams

# public name -> the module that defines it
_LAZY = {
    "Decoder": "semviz.decoding.decoder",
    "DecodeSettings": "semviz.decoding.decoder",
    "PruneParams": "semviz.sampling",
    "Trace": "semviz.output.trace",
    "logit_lens": "semviz.analysis.lens",
}

__all__ = [
    "DEFAULT_MODEL",
    "DecodeSettings",
    "Decoder",
    "LoadedModel",
    "ModelLoadError",
    "PruneParams",
    "Trace",
    "load_model",
    "logit_lens",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'semviz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
