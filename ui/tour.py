"""Shared pieces of the guided tour (app_pages/tour_1…5): the step header, the settings each step
applies, and the navigation between steps. The tour follows the seed's learning path (§8)."""

from __future__ import annotations

import dataclasses

import streamlit as st

from semviz.sampling import PruneParams
from ui.state import Settings

STEPS = (
    ("app_pages/tour_1_baseline.py", "Tour 1 · The baseline chain"),
    ("app_pages/tour_2_entropy.py", "Tour 2 · Log entropy only"),
    ("app_pages/tour_3_distribution.py", "Tour 3 · Watch its distribution"),
    ("app_pages/tour_4_gravity.py", "Tour 4 · Gravity as a rerank"),
    ("app_pages/tour_5_ab.py", "Tour 5 · A/B: latency and quality"),
)

# The plain chain of step 1 (HF generate's usual sampling defaults).
BASELINE = PruneParams(temperature=0.8, top_k=50, top_p=0.95)
# What step 4 turns on, and all it changes: the gravity its page draws, the seed's pull
# G(w) = Σ m_i·sim(w, t_i) with each context token weighted by the last query's attention,
# as a rerank of the top 64 raw candidates. Step 5 compares the baseline with it.
GRAVITY_ON = {
    "gravity_lambda": 0.5,
    "gravity_mode": "rerank",
    "gravity_kind": "pull",
    "gravity_mass": "attention",
}
GRAVITY_OFF = {"gravity_lambda": 0.0}
GRAVITY = BASELINE.replace(**GRAVITY_ON)
BASELINE_SPEC = "temperature=0.8,top_k=50,top_p=0.95"
GRAVITY_SPEC = BASELINE_SPEC + "".join(f",{k}={v}" for k, v in GRAVITY_ON.items())


def header(n: int, goal: str) -> None:
    """Where the reader is on the path, and what this step is for."""
    st.progress(n / len(STEPS), text=f"Step {n} of {len(STEPS)}")
    st.markdown(f"**Goal of this step.** {goal}")


def apply(params: PruneParams | dict, *, label: str, key: str, help: str | None = None) -> None:
    """A button that loads ``params`` into the sidebar (the next Step/Run uses them); a dict
    changes only the fields it names and keeps every other slider as it is."""

    def _apply() -> None:
        current = Settings.from_state(st.session_state)
        if isinstance(params, dict):
            s = dataclasses.replace(current, **params, preset="custom")
        else:
            s = dataclasses.replace(current.with_params(params), preset="custom")
        s.impose(st.session_state)
        st.session_state["settings"] = s

    st.button(
        label,
        key=key,
        on_click=_apply,
        help=help or "Sets the sidebar's sliders; nothing runs yet.",
    )


def footer(n: int) -> None:
    """Links to the previous and next steps."""
    st.divider()
    c1, c2, c3 = st.columns([1, 1, 1])
    if n > 1:
        c1.page_link(STEPS[n - 2][0], label="← " + STEPS[n - 2][1])
    c2.page_link(
        "app_pages/generate.py", label="Generate (step, run, play)", icon=":material/play_arrow:"
    )
    if n < len(STEPS):
        c3.page_link(STEPS[n][0], label=STEPS[n][1] + " →")
