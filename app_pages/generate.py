"""Generate: step, run N, play / pause, stop, reset; the text as tokens, each step's alternatives."""

import numpy as np
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from semviz import charts
from ui import page, runner, views
from ui.errors import message

TICK_SECONDS = 0.35  # decode time per play tick; a Stop click waits at most this long
TICK_EVERY = 0.5

ctx = page.context("Generate")
sess = ctx.sess
settings = ctx.settings


def _stop_playing() -> None:
    sess.playing = False
    sess.run_target = None


def _act(kind: str) -> None:
    """Button callbacks: they run before the page is drawn, so no rerun is needed."""
    sess.error = sess.notice = None
    try:
        if kind == "reset":
            runner.reset(sess, settings)
        elif kind == "step":
            runner.step(sess, settings, 1)
        elif kind in ("run", "play"):
            dec = runner.ensure_decoder(sess, settings)
            sess.run_target = dec.n_steps + int(settings.run_n) if kind == "run" else None
            sess.playing = not dec.done
            if dec.done:
                sess.notice = f"The run has stopped ({dec.stop_reason}): press Reset to start over."
        elif kind in ("pause", "stop"):
            _stop_playing()
    except Exception as exc:  # shown by the page header; the session's run is kept
        _stop_playing()
        sess.error = message(exc)


def _in_fragment_run() -> bool:
    ctx_ = get_script_run_ctx()
    return bool(ctx_ is not None and ctx_.fragment_ids_this_run)


def _tick() -> None:
    """One play tick: decode for ~TICK_SECONDS, then hand back to the browser."""
    dec = sess.decoder
    n = dec.n_steps if dec is not None else 0
    limit = (sess.run_target - n) if sess.run_target is not None else 10**9
    made = 0
    try:
        made = runner.step_for(sess, settings, TICK_SECONDS, max(limit, 0))
    except Exception as exc:
        sess.error = message(exc)
        made = 0
    dec = sess.decoder
    finished = (
        made == 0
        or dec is None
        or dec.done
        or (sess.run_target is not None and dec.n_steps >= sess.run_target)
    )
    if finished:
        _stop_playing()
        if _in_fragment_run():
            st.rerun()  # the whole page catches up once playing stops


cols = st.columns([1, 1, 1, 1, 1, 3])
cols[0].button(
    "Step", key="btn_step", type="primary", disabled=sess.playing, on_click=_act, args=("step",)
)
cols[1].button(
    f"Run {settings.run_n}", key="btn_run", disabled=sess.playing, on_click=_act, args=("run",)
)
if sess.playing:
    cols[2].button("Pause", key="btn_pause", on_click=_act, args=("pause",))
else:
    cols[2].button("Play", key="btn_play", on_click=_act, args=("play",))
cols[3].button("Stop", key="btn_stop", disabled=not sess.playing, on_click=_act, args=("stop",))
cols[4].button("Reset", key="btn_reset", on_click=_act, args=("reset",))
color_by = cols[5].segmented_control(
    "Colour tokens by", ["probability", "entropy"], default="probability", key="color_by"
)


@st.fragment(run_every=TICK_EVERY if sess.playing else None)
def live() -> None:
    if sess.playing:
        _tick()
    dec = sess.decoder
    if dec is None:
        st.info("Type a prompt in the sidebar and press **Step** (one token) or **Play**.")
        return
    tr = dec.trace
    state = "playing…" if sess.playing else (f"stopped: {dec.stop_reason}" if dec.done else "ready")
    st.caption(f"{len(tr.steps)} tokens generated · {state}")
    views.token_strip(ctx, color_by or "probability")


live()


def _rewind(k: int) -> None:
    sess.error = None
    try:
        runner.rewind(sess, settings, k)
    except Exception as exc:
        sess.error = message(exc)


if ctx.steps and not sess.playing:
    ctx.update_whatif()  # the fragment may have added steps in this run
    st.divider()
    i = page.step_selector(ctx)
    rec = ctx.steps[i]
    res = ctx.result(i)
    c1, c2 = st.columns([3, 2])
    with c1:
        st.subheader(f"Step {i}: {rec.token_text!r}")
        stages = charts.step_stages(rec, res)
        keep = {k: stages[k] for k in ("raw", "final") if k in stages}
        labels = ctx.labels(rec.cand_ids[: charts.TOP].tolist())
        kept = res.kept.numpy() if res is not None else None
        chosen = ctx.chosen(i)
        fig = charts.distribution_figure(
            labels, keep, kept=kept, chosen=chosen, mode="overlay", top=15
        )
        st.plotly_chart(fig, key="gen_alternatives", config={"displaylogo": False})
    with c2:
        st.subheader("Top alternatives")
        rows = []
        final = stages.get("final", np.zeros(0))
        raw = stages.get("raw", np.zeros(0))
        for r in range(min(10, len(labels))):
            rows.append(
                {
                    "rank": r + 1,
                    "token": labels[r],
                    "raw p": float(raw[r]),
                    "final p": float(final[r]) if len(final) else float("nan"),
                    "taken": "◀" if r == rec.chosen_rank else "",
                }
            )
        st.dataframe(rows, hide_index=True, width="stretch")
        m1, m2, m3 = st.columns(3)
        m1.metric("entropy", f"{(res.entropy_raw if res else rec.entropy):.2f} nats")
        m2.metric("kept", f"{res.n_kept if res else rec.n_kept}")
        m3.metric("T", f"{(res.temperature if res else rec.temperature):.2f}")
        st.button(
            f"Rewind to step {i}", key="btn_rewind", on_click=_rewind, args=(i,),
            help="Drop this step and everything after it; the next Step decides it again "
            "with the current sliders.",
        )  # fmt: skip
    views.all_removed_warning(ctx, i)
