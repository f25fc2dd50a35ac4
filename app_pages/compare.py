"""Compare: two settings on the sidebar's prompt and seed, side by side on one step axis.

Each side is a spec as in ``python -m semviz compare`` (a preset, ``plain``, or
``key=value`` overrides). A ``CompareTask`` decodes both sides, as rows of one forward, a
token a unit, in the page's task panel (``ui.work``), so Stop answers within a tick and keeps
every token made so far.
"""

import streamlit as st

from semviz.analysis import compare as cmp
from semviz.decoding.decoder import encode_prompt
from semviz.output import style
from semviz.tasks import CompareTask
from ui import page, server, work
from ui.errors import report

ctx = page.context("Compare", run=False)  # it decodes its own sides
sess = ctx.sess
settings = ctx.settings

st.caption(
    "A side is a preset (`code`, `story`, `qa`, `brainstorm`), `plain`, or comma-separated "
    "`key=value` settings such as `top_p=0.9,gravity_lambda=0.5`; a preset can be followed by "
    "overrides (`story,temperature=0.7`). Both sides use the sidebar's prompt, model and seed."
)
for key, spec in zip(("cmp_a", "cmp_b"), sess.compare_sides, strict=True):
    if key not in st.session_state:
        st.session_state[key] = spec
c1, c2, c3 = st.columns([3, 3, 1])
c1.text_input("Side A", key="cmp_a")
c2.text_input("Side B", key="cmp_b")
most = server.config().cap_steps(512)
c3.number_input("Tokens", 1, most, min(32, most), key="cmp_steps")
sess.compare_sides = (st.session_state["cmp_a"], st.session_state["cmp_b"])


def _start() -> None:
    try:
        sides = [cmp.parse_side(st.session_state[k]) for k in ("cmp_a", "cmp_b")]
        if ctx.lm is None:
            raise ValueError("the model is not loaded")
        server.check_prompt(encode_prompt(ctx.lm, settings.prompt, settings.chat))
        task = CompareTask(
            ctx.lm,
            settings.prompt,
            sides,
            steps=int(st.session_state["cmp_steps"]),
            seed=int(settings.seed),
            chat=settings.chat,
        )
    except Exception as exc:  # shown by the panel; the last comparison stays
        work.fail(sess, "cmp", report(exc, "Compare"))
        return
    work.start(sess, "cmp", task)


st.button(
    "Run both", type="primary", key="cmp_run", on_click=_start, disabled=work.running(sess, "cmp")
)


def results() -> None:
    res = work.result(sess, "cmp")
    if res is None:
        st.info("Press **Run both** to decode both sides on the sidebar's prompt.")
        return
    state = "running…" if work.running(sess, "cmp") else ("stopped" if res.stopped else "done")
    fd = res.first_divergence()
    # per side: a side that ended early (the model chose EOS) is finished, not behind
    ended = [t.stop_reason not in (None, "max_new_tokens") for t in res.traces]
    made = [len(t.steps) for t in res.traces]
    sides = [
        f"{side.label}: {n} of {res.target} tokens" + (f" ({t.stop_reason})" if e else "")
        for side, t, n, e in zip(res.sides, res.traces, made, ended, strict=True)
    ]
    st.caption(
        " · ".join(sides)
        + f" · {state} · first divergence: "
        + ("none" if fd is None else f"step {fd}")
    )
    texts = [[style.piece_text(s.token_text, s.token_hex) for s in t.steps] for t in res.traces]
    left, right = cmp.diff_html(*texts)
    c1, c2 = st.columns(2)
    for col, name, side, body in ((c1, "A", res.sides[0], left), (c2, "B", res.sides[1], right)):
        col.markdown(f"**{name}** · `{side.label}`")
        col.html(body)
    # the table's columns are A and B: a side's spec can be too long for a header
    st.dataframe(res.metrics_table(["A", "B"]), width="stretch")
    st.plotly_chart(cmp.comparison_figure(res), key="cmp_figure", config={"displaylogo": False})


work.panel(sess, "cmp", results)
