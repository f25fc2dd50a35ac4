"""Generate: the prompt, Step / Run / Play, the token strip (click a token, hover for its
alternatives, click one to branch), the what-if ghost text, branches, each step's details."""

import numpy as np
import streamlit as st

from semviz import sampling
from semviz.analysis import replay
from semviz.output import charts, escape, style
from semviz.output.style import display_token
from ui import clicks, page, runner, server, views
from ui.errors import report

ctx = page.context("Generate", header=False)
sess = ctx.sess
settings = ctx.settings
job = runner.job(sess)

st.text_area(
    "Prompt",
    key="s_prompt",
    max_chars=server.prompt_chars(),
    height=96,
    placeholder="Type the text for the model to continue, then press Step or Run.",
    help="With the chat template on (sidebar) the prompt is the user's message.",
)


def _act(kind: str, n: int = 1) -> None:
    """Button callbacks: they run before the page is drawn, so no rerun is needed.

    They read the settings afresh: a prompt typed just before the click arrives with it."""
    sess.error = None
    s = page.current_settings()
    try:
        if kind == "reset":
            runner.reset(sess, s)
        elif kind == "step" and not runner.add_step(sess, n):  # else queued on a Step job
            if runner.needs_build(sess, s) or n > 1:
                runner.start(sess, s, "step", n)  # a prefill shows its spinner
            else:
                runner.step(sess, s, 1)
        elif kind == "run":
            runner.start(sess, s, "run", int(s.run_n))
        elif kind == "play":
            runner.start(sess, s, "play", None)
    except Exception as exc:  # shown by the page header; the session's run is kept
        sess.error = report(exc, kind.capitalize())


# a horizontal container wraps on a narrow screen instead of stacking one button per row
bar = st.container(horizontal=True, vertical_alignment="bottom", gap="small")


def _steps(total: int) -> None:
    """Step's clicks, counted in the browser: act on those not acted on yet, in one go."""
    n, sess.step_clicks = total - sess.step_clicks, max(sess.step_clicks, total)
    if n > 0:
        _act("step", n)


clicks.counted_button(
    "Step",
    key="btn_step",
    acted=sess.step_clicks,
    on_clicks=_steps,
    where=bar,
    disabled=job is not None and job.kind != "step",  # Steps during a Step job queue on it
    help="Decode one token with the current sliders.",
)
bar.button(
    f"Run {settings.run_n}",
    key="btn_run",
    disabled=job is not None,
    on_click=_act,
    args=("run",),
    help="Decode this many tokens (set N in the sidebar).",
)
if job is not None:  # here, not beside the progress: the buttons stay put while it streams
    page.stop_button(sess, bar, "Pause" if job.kind == "play" else "Stop", "content")
else:
    bar.button(
        "Play",
        key="btn_play",
        on_click=_act,
        args=("play",),
        help="Decode until Pause, the end of text or the token limit.",
    )
bar.button(
    "Reset",
    key="btn_reset",
    on_click=_act,
    args=("reset",),
    help="Start over from the prompt (stops any task).",
)
color_by = (
    bar.segmented_control(
        "Colour tokens by",
        ["probability", "entropy"],
        default="probability",
        key="color_by",
        label_visibility="collapsed",
    )
    or "probability"
)


def _branch(k: int, token_id: int) -> None:
    sess.error = None
    try:
        runner.branch_from(sess, page.current_settings(), k, token_id)
    except Exception as exc:
        sess.error = report(exc, "Branch")
    sess.rerun_app = True


def _select(i: int) -> None:
    n = len(ctx.steps)
    sess.selected = None if i >= n - 1 else int(i)
    sess.rerun_app = True


def _ghost() -> None:
    """The what-if continuation: started on a full run, decoded by its task meanwhile."""
    k = ctx.first_diff
    if k is not None and ctx.params is not None:
        runner.ghost(sess, settings, ctx.params, k)


def _ghost_payload() -> dict | None:
    k = ctx.first_diff
    if k is None:
        return None
    g = sess.ghost
    rest = len(ctx.steps) - k
    if g is not None and g.at == k and g.tokens:
        gt = g.trace
        texts = [style.piece_text(s.token_text, s.token_hex) for s in gt.steps[k:]]
        if not g.complete:
            note = "… decoding"
        elif gt.stop_reason is not None:
            note = f"[{gt.stop_reason}]"
        elif len(texts) < rest:
            note = f"… (first {len(texts)} of {rest}; Regenerate decodes the rest)"
        else:
            note = ""
        return {"tokens": texts, "note": note}
    # until the model has decoded it, the replay's pick at step k (no model run): exact
    # unless the record cannot decide it, which the note says
    pick = page.first_pick(ctx)
    first, why = ctx.labels([pick.token_id])[0], pick.why
    if why is not None and (g is None or not g.error):
        note = f"… (an estimate: {why})"
    elif g is not None and g.error:
        note = f"… (the continuation was not decoded: {g.error})"
    elif g is not None and g.refeeding:
        note = f"… re-feeding the {k} recorded tokens before it, then decoding"
    elif g is None:
        note = "…"
    else:
        note = "… decoding"
    return {"tokens": [first], "note": note}


def live() -> None:
    """Status and token strip; inside the task's panel, so they stream while it runs."""
    ctx.update_whatif()
    dec = sess.decoder
    if dec is None:
        page.status_line(ctx, here=True)
        return
    j = runner.job(sess)
    state = (
        "working…" if j is not None else (f"stopped: {dec.stop_reason}" if dec.done else "ready")
    )
    tr = sess.trace
    name = escape.markdown(tr.model.get("name", "?"))
    bits = [f"model **{name}**", f"{len(tr.prompt_ids)} prompt tokens"]
    if isinstance(dec, runner.TraceRun) and dec.source:
        bits.append(f"recorded run **{escape.markdown(dec.source)}**: no model run")
    st.caption(
        " · ".join([*bits, f"**{style.count(len(tr.steps), 'token')} generated · {state}**"])
    )
    if runner.is_stale(sess, settings) and j is None:
        st.info(
            "The prompt, model, seed or cache policy changed: the next **Step** starts a new "
            "run. The strip still shows the current run.",
            icon=":material/info:",
        )
    if tr.steps:
        views.token_strip(
            ctx,
            color_by,
            ghost=_ghost_payload(),
            on_select=_select,
            on_branch=_branch if j is None else None,
        )


if ctx.params is not None:
    page.whatif_banner(ctx)
if job is None:
    _ghost()
page.job_panel(ctx, body=live, stop=False)


def _switch(key: str) -> None:
    sess.error = None
    try:
        runner.switch_branch(sess, int(st.session_state[key]))
    except Exception as exc:
        sess.error = report(exc, "switching branches")


bs = runner.branches(sess)
if len(bs) > 1:
    cur = runner.current_branch(sess)
    st.session_state["branch_pick"] = cur

    def _label(i: int) -> str:
        # no token count: the current branch's grows while a task decodes, and a label that
        # changes under the widget between two reruns would not name the option it stood for
        return f"{i} · {escape.markdown(bs[i].note)}"

    st.radio(
        "Branches",
        list(range(len(bs))),
        key="branch_pick",
        format_func=_label,
        horizontal=True,
        on_change=_switch,
        args=("branch_pick",),
        disabled=runner.job(sess) is not None,
        help="Every branch keeps its own decoder and cache: switching back is instant.",
    )


def _entropix_caption(rec, p) -> None:
    """The step's entropix temperature written out with its numbers, when that rule set it."""
    reading = replay.record_reading(rec)
    if p is None or p.adaptive != "entropix" or p.temperature == 0 or reading is None:
        return
    text, _ = sampling.entropix_formula(p, rec.entropy, rec.varentropy, reading)
    st.caption(
        f"entropix: {text} (logits' H + V and the last layer's attention H + head spread, "
        "in bits; head agreement)"
    )


def _rewind(k: int) -> None:
    sess.error = None
    try:
        runner.rewind(sess, page.current_settings(), k)
    except Exception as exc:
        sess.error = report(exc, "Rewind")


def _branch_here(k: int, key: str) -> None:
    tid = st.session_state.get(key)
    if tid is not None:
        _branch(k, int(tid))
        sess.rerun_app = False


if ctx.steps and runner.job(sess) is None:
    ctx.update_whatif()
    st.divider()
    i = page.step_selector(ctx)
    rec = ctx.steps[i]
    res = ctx.result(i)
    c1, c2 = st.columns([3, 2])
    with c1:
        st.subheader(f"Step {i}: {style.token_md(style.step_token(rec))}")
        stages = charts.step_stages(rec, res)
        keep = {k: stages[k] for k in ("raw", "final") if k in stages}
        labels = ctx.labels(rec.cand_ids[: charts.TOP].tolist())
        kept = res.kept.numpy() if res is not None else None
        chosen = ctx.chosen(i)
        fig = charts.distribution_figure(
            labels, keep, kept=kept, chosen=chosen, mode="overlay", top=15
        )
        # on hover Plotly's modebar covers the top right of this half-width chart: give it a
        # row of its own above the legend
        fig.update_layout(margin={"t": 60})
        views.chart(fig, key="gen_alternatives")
    with c2:
        st.subheader("Top alternatives")
        rows = []
        final = stages.get("final", np.zeros(0))
        raw = stages.get("raw", np.zeros(0))
        for r in range(min(10, len(labels))):
            rows.append(
                {
                    "rank": r + 1,
                    "token": display_token(labels[r]),
                    "raw p": float(raw[r]),
                    "final p": float(final[r]) if len(final) else float("nan"),
                    "taken": "◀" if r == rec.chosen_rank else "",
                }
            )
        st.dataframe(rows, hide_index=True, width="stretch")
        m1, m2, m3 = st.columns(3)
        # units in the labels: a value with its unit is cut on a narrow column ("2.46 …")
        m1.metric("entropy, nats", f"{(res.entropy_raw if res else rec.entropy):.2f}")
        m2.metric("kept, tokens", f"{res.n_kept if res else rec.n_kept}")
        m3.metric("temperature", f"{(res.temperature if res else rec.temperature):.2f}")
        _entropix_caption(rec, res.params if res else ctx.params)
        alt_ids = [int(t) for t in rec.cand_ids[:10].tolist() if int(t) != rec.token_id]
        b1, b2 = st.columns([3, 2], vertical_alignment="bottom")
        b1.selectbox(
            "Branch here with",
            alt_ids,
            key="branch_tok",
            format_func=lambda t: display_token(ctx.labels([t])[0]),
            help="Take this token at this step instead, keep the current branch, and decode "
            "on as far as the run went. Clicking a row in a token's hover card does the same.",
        )
        b2.button(
            "Branch",
            key="btn_branch",
            on_click=_branch_here,
            args=(i, "branch_tok"),
            width="stretch",
        )
        st.button(
            f"Rewind to step {i}",
            key="btn_rewind",
            on_click=_rewind,
            args=(i,),
            help="Drop this step and everything after it; the next Step decides it again "
            "with the current sliders.",
        )
    views.all_removed_warning(ctx, i)
