"""Presenter mode: one step of the current run, sized for a lecture hall.

The page fits one 1440×900 or 1920×1080 screen without scrolling: no sidebar or toolbar, big
type at full contrast, large ◀ ▶ buttons that the ← → keys also press. The step shown is the
selected step, which ◀ ▶ move. The URL carries it with the run's settings and length, so a
presenter link opened alone regenerates the run and shows the same step; while a run grows,
the step on show stays put. It shows what the other pages show: the what-if replay when the
sliders differ from the run's, else the recorded run, and says which. A token taken from below
the drawn candidates gets its own bar and a note. Leave with the link at the bottom.
"""

import html

import streamlit as st

from semviz.output import charts, report, style
from ui import page as ui_page
from ui import runner, views

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
# the shared settings, the link's run and the URL, as on every page, with no sidebar and the
# page's own title
ctx = ui_page.context("", header=False, sidebar=False)
sess = ctx.sess
tr = sess.trace


def _move(to: int) -> None:
    """◀ ▶: select step ``to``, so the URL carries the step on show."""
    n = len(sess.trace.steps)
    to = max(0, min(to, n - 1))
    sess.selected = None if to == n - 1 and runner.job(sess) is None else to


linked = sess.link.steps is not None and runner.job(sess) is not None
if linked:  # the link's run is being regenerated: its step shows when it is whole
    st.title("Presenter mode")
    ui_page.job_panel(ctx)
elif tr is None or not tr.steps:
    st.title("Presenter mode")
    st.info("Nothing generated yet: make a run on the Generate page first.")
else:
    n = len(tr.steps)
    i = sess.selected_step()
    if sess.selected is None and runner.job(sess) is not None:
        sess.selected = i  # a run still growing: the step on show stays put
    rec = tr.steps[i]
    wi = ctx.wi if ui_page.params_changed(ctx) else None
    res = wi.results[i] if wi is not None else None
    chosen = wi.chosen[i] if wi is not None else rec.chosen_rank
    cand = rec.cand_ids.tolist()
    token = ctx.labels((wi.token_ids[i] if wi is not None else rec.token_id,))[0]
    stages = charts.step_stages(rec, res)

    c0, c1, c2 = st.columns([1, 14, 1], vertical_alignment="center")
    c0.button(
        "◀",
        key="pres_prev",
        on_click=_move,
        args=(i - 1,),
        disabled=i == 0,
        shortcut="Left",
        help="Previous step (← key)",
    )
    c2.button(
        "▶",
        key="pres_next",
        on_click=_move,
        args=(i + 1,),
        disabled=i == n - 1,
        shortcut="Right",
        help="Next step (→ key)",
    )
    c1.html(
        f"<p class='semviz-title'>Step {i} of {n} (numbered 0–{n - 1}) → "
        f"<span class='semviz-focus'>{html.escape(charts.display_token(token))}</span></p>"
    )
    kind, sentence = report.shown_state(wi)
    views.state_badge(kind, sentence)

    before = style.piece_text("", tr.bytes_upto(i))  # a split character as its bytes
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

    labels = ctx.labels(cand[: max(SHOWN, chosen + 1)])
    keep = {k: stages[k] for k in ("raw", "final") if k in stages}
    fig = charts.distribution_figure(
        labels,
        keep,
        chosen=chosen if chosen >= 0 else None,
        mode="overlay",
        top=SHOWN,
        horizontal=True,
    )
    fig.update_layout(
        height=None,
        autosize=True,
        font={"size": 18},
        legend={"font": {"size": 18}},
        margin={"l": 10, "r": 20, "t": 36, "b": 10},
    )
    fig.update_yaxes(tickfont={"size": 20}, dtick=1)  # every candidate labelled
    fig.update_xaxes(tickfont={"size": 16}, title={"text": "probability", "font": {"size": 18}})
    with st.container(key="pres_chart"):
        st.plotly_chart(fig, key="pres_dist", height="stretch", config={"displayModeBar": False})
    shown_tok = style.token_md(charts.display_token(token))
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
