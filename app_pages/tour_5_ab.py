"""Tour 5: an A/B of the baseline against baseline + gravity, with latency and quality."""

import streamlit as st

from ui import page, tour, work

ctx = page.context("Tour 5 · A/B: latency and quality")
tour.header(
    5,
    "decide with numbers: run the baseline and the gravity rerank on the same prompt and seed "
    "and compare speed and quality, the way a rollback-able experiment would.",
)
st.markdown(
    """
Both sides decode the same prompt with the same seed, so where their kept sets agree they
draw the same token; the **first divergence** is where the settings start to matter. Then
compare:

- **latency**: tokens/s (the gravity rerank costs one matrix-vector product per step);
- **quality**: distinct-1/2 and repetition rate (diversity vs loops), mean entropy
  (certainty), mean gravity (how hard the context pulled), pruning ratio (how much was cut).
"""
)


def _setup() -> None:
    ctx.sess.compare_sides = (tour.BASELINE_SPEC, tour.GRAVITY_SPEC)
    for k in ("cmp_a", "cmp_b"):
        st.session_state.pop(k, None)


st.button("Set up this A/B on the Compare page", type="primary", key="tour5_setup", on_click=_setup)
st.page_link("app_pages/compare.py", label="Open Compare", icon=":material/compare_arrows:")
st.code(
    f'python -m semviz compare --prompt "{ctx.settings.prompt}" --a "{tour.BASELINE_SPEC}" '
    f'--b "{tour.GRAVITY_SPEC}" --seed {ctx.settings.seed} --json',
    language="sh",
)
res = work.result(ctx.sess, "cmp")
if res is not None:
    st.subheader("The last comparison")
    st.dataframe(res.metrics_table(), width="stretch")
    fd = res.first_divergence()
    st.caption("First divergence: " + ("none" if fd is None else f"step {fd}"))
tour.footer(5)
