"""Presenter mode: one step of the current run in large type, frozen, with no sidebar.

The step shown is fixed when the page opens (the URL's ``step``, else the selected step) and
does not follow new tokens; ◀ and ▶ move it on purpose. Leave with the link at the bottom.
"""

import html

import streamlit as st

from semviz import charts
from ui import page as ui_page
from ui.state import session

st.html(
    """<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"],
[data-testid="stSidebarNav"], header[data-testid="stHeader"] {display: none !important;}
.block-container {max-width: 1400px; padding-top: 1.5rem;}
.stApp, .stMarkdown p {font-size: 1.45rem;}
[data-testid="stMetricValue"] {font-size: 3rem;}
[data-testid="stMetricLabel"] p {font-size: 1.3rem;}
</style>"""
)
sess = session(st.session_state)
tr = sess.trace
if tr is None or not tr.steps:
    st.title("Presenter mode")
    st.info("Nothing generated yet: make a run on the Generate page first.")
else:
    n = len(tr.steps)
    if sess.extra.get("presenter_trace") != id(tr):  # a new run: freeze afresh
        sess.extra.pop("presenter_step", None)
        sess.extra["presenter_trace"] = id(tr)
    if "presenter_step" not in sess.extra:
        url = st.query_params.get("step")
        try:
            start = int(url) if url is not None else sess.selected_step()
        except ValueError:
            start = sess.selected_step()
        sess.extra["presenter_step"] = start
    i = max(0, min(int(sess.extra["presenter_step"]), n - 1))
    sess.extra["presenter_step"] = i
    st.query_params["step"] = str(i)

    def _move(d: int) -> None:
        sess.extra["presenter_step"] = max(0, min(sess.extra["presenter_step"] + d, n - 1))

    rec = tr.steps[i]
    c0, c1, c2 = st.columns([1, 10, 1])
    c0.button("◀", key="pres_prev", on_click=_move, args=(-1,), disabled=i == 0)
    c2.button("▶", key="pres_next", on_click=_move, args=(1,), disabled=i == n - 1)
    c1.markdown(
        f"<h1 style='font-size:3.2rem;margin:0'>Step {i} → "
        f"<code>{html.escape(repr(rec.token_text))}</code></h1>",
        unsafe_allow_html=True,
    )
    before = "".join(s.token_text for s in tr.steps[max(0, i - 60) : i])
    st.html(
        "<div style='font-family:ui-monospace,monospace;font-size:2rem;line-height:1.6;"
        "white-space:pre-wrap;border:1px solid #ddd;border-radius:8px;padding:12px'>"
        f"<span style='color:#888'>…{html.escape(before)}</span>"
        f"<span style='background:#ffd54f;outline:3px solid #000'>"
        f"{html.escape(rec.token_text) or '∅'}</span></div>"
    )
    m = st.columns(4)
    m[0].metric("probability", f"{rec.chosen_prob:.3f}")
    m[1].metric("entropy", f"{rec.entropy:.2f} nats")
    m[2].metric("kept", f"{rec.n_kept}")
    m[3].metric("temperature", f"{rec.temperature:.2f}")
    lm = sess.decoder.lm
    labels = ui_page.token_texts(lm.tokenizer, tuple(rec.cand_ids[:10].tolist()))
    stages = charts.step_stages(rec)
    keep = {k: stages[k] for k in ("raw", "final") if k in stages}
    fig = charts.distribution_figure(labels, keep, chosen=rec.chosen_rank, mode="overlay", top=10)
    fig.update_layout(font={"size": 22}, height=520, legend={"font": {"size": 20}})
    fig.update_xaxes(tickfont={"size": 20}, tickangle=-30)
    fig.update_yaxes(tickfont={"size": 18}, title_font={"size": 20})
    st.plotly_chart(fig, key="pres_dist", config={"displayModeBar": False})
st.page_link("app_pages/generate.py", label="Leave presenter mode", icon=":material/arrow_back:")
