"""The shared sidebar: every setting of ``ui.state.Settings`` as a keyed widget.

Every page draws it through ``ui.page.context``. Widgets are created with ``key`` only (never
``value=``); their values are also kept in one ``Settings`` at ``st.session_state["settings"]``
and written back into the widget keys before drawing, so a page switch keeps them.
"""

from __future__ import annotations

import streamlit as st

from semviz.model import DEFAULT_MODEL
from semviz.presets import PRESETS
from ui import kv
from ui.state import (
    ADAPTIVE_MODES,
    GRAVITY_KINDS,
    GRAVITY_MODES,
    GRAVITY_SPACES,
    KEY_PREFIX,
    MASS_SOURCES,
    SIMILARITIES,
    Settings,
    default_model_name,
)

K = KEY_PREFIX


STORE = "settings"  # the last Settings, kept outside any widget


def init_state() -> Settings:
    """Bring the widget keys up to date and return the current ``Settings``.

    The first time: URL query parameters over the defaults. Afterwards: the widgets' values
    where Streamlit still holds them, else the stored ``Settings`` (Streamlit drops the state
    of widgets that were not drawn in a run, e.g. on a page switch), so settings survive.
    """
    state = st.session_state
    stored = state.get(STORE)
    if stored is None:
        try:
            stored = Settings.from_query_params(st.query_params)
        except Exception:  # a malformed URL must not stop the app
            stored = Settings()
    current = Settings.from_state(_Layered(state, stored))
    current.seed_state(state, overwrite=True)
    state[STORE] = current
    return current


class _Layered:
    """Widget keys from session_state where present, else the stored Settings' fields."""

    def __init__(self, state, stored: Settings) -> None:
        self.state, self.stored = state, stored

    def __contains__(self, key: str) -> bool:
        return key in self.state or hasattr(self.stored, key[len(K) :])

    def __getitem__(self, key: str):
        if key in self.state:
            return self.state[key]
        return getattr(self.stored, key[len(K) :])


def apply_preset() -> None:
    """on_change of the preset box: copy the preset's parameters into the sliders."""
    name = st.session_state.get(K + "preset", "custom")
    if name not in PRESETS:
        return
    current = Settings.from_state(st.session_state)
    s = current.with_params(PRESETS[name].params)
    s.seed_state(st.session_state, overwrite=True)


def sidebar() -> Settings:
    """Draw the shared controls and return the current ``Settings``."""
    init_state()
    sb = st.sidebar
    with sb.expander("Model & prompt", expanded=True):
        default = default_model_name() or DEFAULT_MODEL
        st.text_input(
            "Model",
            key=K + "model",
            placeholder=f"default: {default}",
            help="Empty for the offline default; or a local model folder, a .gguf file, "
            "or a Hugging Face id (needs the hub).",
        )
        st.text_area("Prompt", key=K + "prompt", height=90)
        st.toggle(
            "Chat template", key=K + "chat", help="Wrap the prompt in the model's chat template."
        )
        st.selectbox(
            "Scenario preset",
            ["custom", *PRESETS],
            key=K + "preset",
            on_change=apply_preset,
            format_func=lambda n: n if n == "custom" else f"{n} — {PRESETS[n].why[:40]}…",
            help="Sets the sliders below to a scenario's parameters.",
        )
    with sb.expander("Sampling", expanded=True):
        st.slider("Temperature", 0.0, 2.0, step=0.05, key=K + "temperature", help="0 = greedy")
        st.selectbox("Adaptive temperature", ADAPTIVE_MODES, key=K + "adaptive")
        if st.session_state.get(K + "adaptive") == "target":
            st.slider("Target entropy (nats)", 0.0, 6.0, step=0.1, key=K + "target_entropy")
        st.slider("top-k", 0, 200, step=1, key=K + "top_k", help="0 = off")
        st.slider("top-p", 0.01, 1.0, step=0.01, key=K + "top_p", help="1 = off")
        st.slider("min-p", 0.0, 1.0, step=0.01, key=K + "min_p", help="0 = off")
        st.slider("typical-p", 0.01, 1.0, step=0.01, key=K + "typical_p", help="1 = off")
    with sb.expander("Gravity & free energy", expanded=False):
        st.slider(
            "Gravity λ", -2.0, 3.0, step=0.05, key=K + "gravity_lambda",
            help="s = log P + λ·G, G z-scored over the vocabulary; 0 = off",
        )  # fmt: skip
        st.selectbox(
            "Kind", GRAVITY_KINDS, key=K + "gravity_kind",
            help="pull: Σ m·sim towards the prompt; contrast: coherence boosting (a 2nd forward)",
        )  # fmt: skip
        c1, c2 = st.columns(2)
        c1.selectbox("Mass source", MASS_SOURCES, key=K + "gravity_mass")
        c2.selectbox("Similarity", SIMILARITIES, key=K + "gravity_sim")
        c1.selectbox("Space", GRAVITY_SPACES, key=K + "gravity_space")
        c2.selectbox("Mode", GRAVITY_MODES, key=K + "gravity_mode")
        st.toggle("Free-energy pruning", key=K + "free_energy")
        if st.session_state.get(K + "free_energy"):
            st.slider("κ (keep U − U_min ≤ κ·T·H)", 0.0, 5.0, step=0.1, key=K + "free_energy_kappa")
        st.toggle("Safety fallback", key=K + "fallback", help="Loops or collapse → plain sampling")
    with sb.expander("KV cache & run", expanded=False):
        st.selectbox("KV policy", kv.policy_names(), key=K + "kv_policy")
        st.number_input("KV budget (tokens)", 8, 8192, step=8, key=K + "kv_budget")
        c1, c2 = st.columns(2)
        c1.number_input("Seed", 0, 2**31 - 1, step=1, key=K + "seed")
        c2.number_input("Run N", 1, 2048, step=1, key=K + "run_n")
        st.number_input("Max new tokens", 1, 8192, step=16, key=K + "max_new_tokens")
    current = Settings.from_state(st.session_state)
    st.session_state[STORE] = current
    return current
