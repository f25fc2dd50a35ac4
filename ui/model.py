"""The shared model: loaded once per process and name, read-only, for every session."""

from __future__ import annotations

import streamlit as st

from semviz.model import LoadedModel, load_model


@st.cache_resource(show_spinner="Loading the model…", max_entries=3)
def _load(name: str) -> LoadedModel:
    # Failures raise and are not cached, so a fixed name can be retried.
    return load_model(name or None)


def get_model(name: str) -> LoadedModel:
    """The shared ``LoadedModel`` for ``name`` ('' = offline default); ``ModelLoadError`` if not."""
    return _load(name)
