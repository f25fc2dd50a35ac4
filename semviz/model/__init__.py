"""The model and its forward: loading (``load``), the one forward of B rows with per-layer
caches (``forward``), last-query attention capture (``capture``) and the queue every model call
of a server takes its turn in (``queue``).

The loader's names are re-exported here, so ``from semviz.model import load_model`` works.
"""

from semviz.model.load import (
    DEFAULT_GGUF,
    DEFAULT_MODEL,
    DEFAULT_PACKAGE,
    LoadedModel,
    ModelLoadError,
    cache_dir,
    default_device,
    default_gguf_path,
    ensure_default_converted,
    load_model,
    model_key,
    new_cache,
    require_full_attention,
    require_rope,
    rope_inv_freq,
    sliding_window,
    unsupported_reason,
    uses_rope,
)

__all__ = [
    "DEFAULT_GGUF",
    "DEFAULT_MODEL",
    "DEFAULT_PACKAGE",
    "LoadedModel",
    "ModelLoadError",
    "cache_dir",
    "default_device",
    "default_gguf_path",
    "ensure_default_converted",
    "load_model",
    "model_key",
    "new_cache",
    "require_full_attention",
    "require_rope",
    "rope_inv_freq",
    "sliding_window",
    "unsupported_reason",
    "uses_rope",
]
