"""Compare: two settings on the sidebar's prompt and seed, side by side on one step axis.

Each side is a spec as in ``python -m semviz compare`` (a preset, ``plain``, or
``key=value`` overrides). ``semviz.analysis.compare.advance`` decodes both sides, as rows of one
forward, in short ticks, so Stop answers within a tick and keeps every token made so far.
"""

import streamlit as st

from semviz.analysis import compare as cmp
from semviz.decoding.decoder import encode_prompt
from ui import page, server
from ui.errors import report

TICK_SECONDS = 0.4
TICK_EVERY = 0.5

ctx = page.context("Compare", run=False)  # it decodes its own sides
sess = ctx.sess
settings = ctx.settings
job = sess.compare_job

st.caption(
    "A side is a preset (`code`, `story`, `qa`, `brainstorm`), `plain`, or comma-separated "
    "`key=value` settings such as `top_p=0.9,gravity_lambda=0.5`; a preset can be followed by "
    "overrides (`story,temperature=0.7`). Both sides use the sidebar's prompt, model and seed."
)
for key, default in (
    ("cmp_a", "top_p=0.9"),
    ("cmp_b", "top_p=0.9,gravity_lambda=0.5,gravity_mode=rerank"),
):
    if key not in st.session_state:
        st.session_state[key] = job.get(key, default)
c1, c2, c3 = st.columns([3, 3, 1])
c1.text_input("Side A", key="cmp_a")
c2.text_input("Side B", key="cmp_b")
most = server.config().cap_steps(512)
c3.number_input("Tokens", 1, most, min(32, most), key="cmp_steps")
job["cmp_a"], job["cmp_b"] = st.session_state["cmp_a"], st.session_state["cmp_b"]


def _start() -> None:
    job["error"] = None
    try:
        sides = [
            cmp.parse_side(st.session_state["cmp_a"]),
            cmp.parse_side(st.session_state["cmp_b"]),
        ]
        if ctx.lm is None:
            raise ValueError("the model is not loaded")
        server.check_prompt(encode_prompt(ctx.lm, settings.prompt, settings.chat))
        with server.model_turn():
            res = cmp.start(
                ctx.lm, settings.prompt, sides, steps=int(st.session_state["cmp_steps"]),
                seed=int(settings.seed), chat=settings.chat,
            )  # fmt: skip
    except Exception as exc:  # shown above the results; nothing else is touched
        job.update(error=report(exc, "Compare"), running=False)
        return
    job.update(result=res, running=True)


def _stop() -> None:
    job["running"] = False
    res = job.get("result")
    if res is not None and not res.finished:
        res.stopped = True
        res.release()  # the sides' caches go; their tokens stay


b1, b2, _ = st.columns([1, 1, 4])
b1.button("Run both", type="primary", key="cmp_run", on_click=_start, disabled=job["running"])
b2.button("Stop", key="cmp_stop", on_click=_stop, disabled=not job["running"])
if job.get("error"):
    st.error(job["error"], icon="⚠️")

ticking = job["running"]


@st.fragment(run_every=TICK_EVERY if ticking else None)
def results() -> None:
    res = job.get("result")
    if job["running"]:
        try:
            with server.model_turn() as turn:  # one tick; between tokens others go first
                cmp.advance(res, seconds=TICK_SECONDS, on_step=lambda *_: turn.let_others())
        except Exception as exc:
            job.update(error=report(exc, "Compare"), running=False)
        if res.finished:
            job["running"] = False
            res.release()
    if ticking and not job["running"]:
        st.rerun()  # done or stopped: redraw once, without the timer, the buttons updated
    if res is None:
        st.info("Press **Run both** to decode both sides on the sidebar's prompt.")
        return
    state = "running…" if job["running"] else ("stopped" if res.stopped else "done")
    fd = res.first_divergence()
    # per side: a side that ended early (the model chose EOS) is finished, not behind
    ended = [t.stop_reason not in (None, "max_new_tokens") for t in res.traces]
    made = [len(t.steps) for t in res.traces]
    st.progress(
        sum(
            1.0 if e else min(n / max(res.target, 1), 1.0) for n, e in zip(made, ended, strict=True)
        )
        / max(len(made), 1)
    )
    sides = [
        f"{side.label}: {n} of {res.target} tokens" + (f" ({t.stop_reason})" if e else "")
        for side, t, n, e in zip(res.sides, res.traces, made, ended, strict=True)
    ]
    st.caption(
        " · ".join(sides)
        + f" · {state} · first divergence: "
        + ("none" if fd is None else f"step {fd}")
    )
    texts = [[s.token_text for s in t.steps] for t in res.traces]
    left, right = cmp.diff_html(*texts)
    c1, c2 = st.columns(2)
    for col, name, side, body in ((c1, "A", res.sides[0], left), (c2, "B", res.sides[1], right)):
        col.markdown(f"**{name}** · `{side.label}`")
        col.html(body)
    # the table's columns are A and B: a side's spec can be too long for a header
    st.dataframe(res.metrics_table(["A", "B"]), width="stretch")
    st.plotly_chart(cmp.comparison_figure(res), key="cmp_figure", config={"displaylogo": False})


results()
