"""Presenter mode: one step of the current run, sized for a lecture hall.

The page fits one 1440×900 or 1920×1080 screen without scrolling: no sidebar or toolbar, big
type at full contrast, large ◀ ▶ buttons that the ← → keys also press. The step shown is
fixed when the page opens (the URL's ``step``, else the selected step) and does not follow
new tokens. It shows what the other pages show: the what-if replay when the sliders differ
from the run's, else the recorded run, and says which. A token taken from below the drawn
candidates gets its own bar and a note. Leave with the link at the bottom.
"""

import html

import streamlit as st

from semviz.output import charts, report
from ui import page as ui_page
from ui import views, whatif
from ui.errors import guard
from ui.state import Settings, session, url_count

SHOWN = 8  # candidates drawn; the token taken is added below them when it ranks lower
CONTEXT_CHARS = 170  # about two lines of context at 1440 px

st.html(
    """<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"],
[data-testid="stSidebarNav"], header[data-testid="stHeader"] {display: none !important;}
[data-testid="stMainBlockContainer"] {max-width: 100%; padding: 1rem 2.5rem 0.5rem;}
[data-testid="stMain"] [data-testid="stVerticalBlock"] {gap: 0.6rem;}
.stApp .stMarkdown p, .stApp .stCaption p {font-size: 1.25rem;}
/* type grows with the screen: 1440 px wide → 46 px titles, 1920 → 61 px */
.semviz-title {font-size: clamp(2.4rem, 3.2vw, 4rem); font-weight: 700; line-height: 1.15;
  margin: 0;}
.semviz-context {font-size: clamp(1.5rem, 1.9vw, 2.4rem); line-height: 1.45;
  white-space: pre-wrap; word-break: break-word;}
[data-testid="stMetricValue"] {font-size: clamp(2.2rem, 2.6vw, 3.4rem);}
[data-testid="stMetricLabel"] p {font-size: clamp(1.1rem, 1.25vw, 1.6rem);}
.st-key-pres_prev button, .st-key-pres_next button {min-width: 5.5rem; min-height: 5rem;}
.st-key-pres_prev button p, .st-key-pres_next button p {font-size: 2.6rem; line-height: 1.25;}
.st-key-pres_prev [data-testid="stMarkdownContainer"],
.st-key-pres_next [data-testid="stMarkdownContainer"] {overflow: visible;}
/* the chart's labels at full contrast in either theme (the SVG text takes the page's colour) */
.js-plotly-plot .xtick text, .js-plotly-plot .ytick text, .js-plotly-plot .g-xtitle text,
.js-plotly-plot .legendtext {fill: currentColor !important;}
/* the chart takes the screen's remaining height */
.stApp .st-key-pres_chart {height: clamp(340px, calc(100vh - 480px), 1000px) !important;
  flex: 0 0 auto !important;}
.stApp .semviz-context .semviz-muted {opacity: .85;}  /* the prompt: set apart, still legible */
.stApp .semviz-state, .stApp .semviz-state + * {font-size: 1.2rem;}
.stApp p:has(> .semviz-state) {font-size: 1.2rem; margin: 0;}
</style>"""
)
views.page_css()
sess = session(st.session_state)
tr = sess.trace


def _frozen_step(n: int) -> int:
    """The step on show: frozen per run, from the URL's ``step`` or the selected step."""
    if sess.presenter_run != id(tr):  # a new run: freeze afresh
        sess.presenter_run, sess.presenter_step = id(tr), None
    if sess.presenter_step is None:
        start = url_count("step", st.query_params.get("step"))
        if start is None:  # not in the link, or not a count
            start = sess.selected_step()
        sess.presenter_step = start
    i = max(0, min(int(sess.presenter_step), n - 1))
    sess.presenter_step = i
    st.query_params["step"] = str(i)
    return i


def _whatif():
    """The replay under the current sliders when they differ from the run's, else None."""
    stored = st.session_state.get("settings")
    dec = sess.decoder
    if not isinstance(stored, Settings):
        return None
    try:
        params = stored.prune_params()
    except ValueError:
        return None
    if params == dec.params:
        return None
    with guard("the what-if replay"):
        return whatif.cached(sess.replay_memo, tr, params, model=dec.lm.model, hidden=dec.hidden)
    return None


def _move(d: int) -> None:
    n = len(sess.trace.steps)
    sess.presenter_step = max(0, min(sess.presenter_step + d, n - 1))


if tr is None or not tr.steps:
    st.title("Presenter mode")
    st.info("Nothing generated yet: make a run on the Generate page first.")
else:
    n = len(tr.steps)
    i = _frozen_step(n)
    rec = tr.steps[i]
    wi = _whatif()
    res = wi.results[i] if wi is not None else None
    chosen = wi.chosen[i] if wi is not None else rec.chosen_rank
    lm = sess.decoder.lm
    cand = rec.cand_ids.tolist()
    token = ui_page.token_texts(lm.tokenizer, (cand[chosen],))[0] if chosen >= 0 else rec.token_text
    stages = charts.step_stages(rec, res)

    c0, c1, c2 = st.columns([1, 14, 1], vertical_alignment="center")
    c0.button("◀", key="pres_prev", on_click=_move, args=(-1,), disabled=i == 0,
              shortcut="Left", help="Previous step (← key)")  # fmt: skip
    c2.button("▶", key="pres_next", on_click=_move, args=(1,), disabled=i == n - 1,
              shortcut="Right", help="Next step (→ key)")  # fmt: skip
    c1.html(
        f"<p class='semviz-title'>Step {i} of {n} (numbered 0–{n - 1}) → "
        f"<span class='semviz-focus'>{html.escape(charts.display_token(token))}</span></p>"
    )
    kind, sentence = report.shown_state(wi)
    views.state_badge(kind, sentence)

    before = "".join(s.token_text for s in tr.steps[:i])
    if len(before) < CONTEXT_CHARS:
        prompt = tr.prompt[-(CONTEXT_CHARS - len(before)) :]
        lead = f"<span class='semviz-muted'>{html.escape(prompt)}</span>"
    else:
        before, lead = "…" + before[-CONTEXT_CHARS:], ""
    plain = token.strip() and "<|" not in token and token.isprintable()
    word = token.lstrip(" ") if plain else charts.display_token(token)  # ↵, ·, ⟨im_end⟩
    space = token[: len(token) - len(word)] if plain else ""  # outside the highlight
    st.html(
        f"<div class='semviz-box semviz-context'>{lead}{html.escape(before + space)}"
        f"<span class='semviz-focus'>{html.escape(word)}</span></div>"
    )

    final = stages.get("final")
    p_final = float(final[chosen]) if final is not None and 0 <= chosen < len(final) else None
    raw = stages.get("raw")
    p_raw = float(raw[chosen]) if raw is not None and 0 <= chosen < len(raw) else rec.chosen_prob
    m = st.columns(5)
    m[0].metric("raw probability", charts.fmt_prob(p_raw))
    m[1].metric("after the chain", "–" if p_final is None else charts.fmt_prob(p_final))
    m[2].metric("entropy, nats", f"{(res.entropy_raw if res else rec.entropy):.2f}")
    m[3].metric("kept set", f"{(res.n_kept if res else rec.n_kept):,}")
    m[4].metric("temperature", f"{(res.temperature if res else rec.temperature):.2f}")

    labels = ui_page.token_texts(lm.tokenizer, tuple(cand[: max(SHOWN, chosen + 1)]))
    keep = {k: stages[k] for k in ("raw", "final") if k in stages}
    fig = charts.distribution_figure(
        labels, keep, chosen=chosen if chosen >= 0 else None, mode="overlay", top=SHOWN,
        horizontal=True,
    )  # fmt: skip
    fig.update_layout(
        height=None, autosize=True, font={"size": 18}, legend={"font": {"size": 18}},
        margin={"l": 10, "r": 20, "t": 36, "b": 10},
    )  # fmt: skip
    fig.update_yaxes(tickfont={"size": 20}, dtick=1)  # every candidate labelled
    fig.update_xaxes(tickfont={"size": 16}, title={"text": "probability", "font": {"size": 18}})
    with st.container(key="pres_chart"):
        st.plotly_chart(fig, key="pres_dist", height="stretch", config={"displayModeBar": False})
    shown_tok = charts.display_token(token)
    if chosen >= SHOWN:
        st.caption(
            f"{shown_tok} ranked {chosen + 1} (raw p = {charts.fmt_prob(p_raw)}): the draw "
            f"landed below the top {SHOWN}, so it has its own bar at the bottom."
        )
    elif chosen < 0:
        st.caption(
            f"{shown_tok} is outside the {len(cand):,} recorded candidates (raw p = "
            f"{charts.fmt_prob(p_raw)}), so it has no bar."
        )
st.page_link("app_pages/generate.py", label="Leave presenter mode", icon=":material/arrow_back:")
