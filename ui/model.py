"""The shared model: loaded once per process and model, read-only, for every session.

Names are normalised first (``semviz.model.load.model_key``), so ``dir`` and ``dir/`` are one
cache entry, and a shared server (``ui.server``) refuses a model it does not allow before
anything is read.
"""

from __future__ import annotations

import streamlit as st

from semviz.model.load import LoadedModel, load_model
from semviz.model.queue import QUEUE, lanes_for
from ui.server import check_model


@st.cache_resource(show_spinner="Loading the model…", max_entries=3)
def _load(key: str) -> LoadedModel:
    # Failures raise and are not cached, so a fixed name can be retried.
    lm = load_model(key)
    fit_lanes()
    return lm


def fit_lanes() -> None:
    """As many forwards side by side as the cores hold, each of torch's threads: one lane,
    unless the server was started with fewer threads than cores. For a class, start it with
    ``OMP_NUM_THREADS=1``: a small model's single-token forward gains little from a second
    thread, so forwards go further one per core (README, "Load on one server")."""
    import torch

    QUEUE.set_lanes(lanes_for(torch.get_num_threads()))


def get_model(name: str) -> LoadedModel:
    """The shared ``LoadedModel`` for ``name`` ('' = the server's default); ``ModelLoadError``
    if it cannot be loaded or this server does not allow it."""
    return _load(check_model(name))
