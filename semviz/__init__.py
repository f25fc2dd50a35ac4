"""semviz: watch, and steer, a real language model choosing its next token."""

from semviz.model import DEFAULT_MODEL, LoadedModel, ModelLoadError, load_model

__all__ = ["DEFAULT_MODEL", "LoadedModel", "ModelLoadError", "load_model"]
__version__ = "0.1.0"
