"""Report: the views a report holds, for the current run or a saved trace; build and download.

The charts are ``semviz.output.report.views`` (the same list ``python -m semviz report`` writes), so a
trace reloaded here shows exactly what its report shows. Building writes report.html, one
PNG per chart, trace.json and trace.parquet and offers them as one zip. The build is a
``ReportTask`` in the page's task panel (``ui.work``), so the page stays live while it runs:
Stop ends the PNG export after the current image; what was made is kept and can still be
downloaded.
"""

from pathlib import Path

import streamlit as st

from semviz.analysis.metrics import METRIC_INFO, run_metrics
from semviz.output import escape, report
from semviz.output.trace import Trace, TraceError
from semviz.tasks import ReportTask
from ui import page, server, views, work

ctx = page.context("Report")
views.page_css()
sess = ctx.sess


def _file_key(path: str) -> tuple:
    """A file as read: its path and when it was last written (None when it cannot be read)."""
    try:
        return ("path", path, Path(path).stat().st_mtime_ns)
    except OSError:
        return ("path", path, None)


source = st.radio(
    "Report on", ["the current run", "a saved trace"], horizontal=True, key="report_source"
)
trace = None
if source == "the current run":
    trace = ctx.trace if ctx.steps else None
    selected = ctx.selected
    if trace is None:
        page.need_trace(ctx)
else:
    c1, c2 = st.columns(2)
    cfg = server.config()
    up = c1.file_uploader(
        "Trace JSON", type=["json"], key="report_upload", max_upload_size=cfg.max_upload_mb
    )
    if cfg.shared:  # a shared server never reads a path a visitor typed
        path = ""
        c2.caption("This server takes traces by upload only.")
    else:
        path = c2.text_input(
            "…or a trace file on this machine", key="report_path", placeholder="out/trace.json"
        )
    try:
        if up is not None and sess.report_from != ("upload", up.file_id):
            # the size is checked before the bytes are parsed
            sess.report_trace = Trace.from_json(up.getvalue(), max_bytes=cfg.trace_bytes())
            sess.report_from = ("upload", up.file_id)
        elif path.strip() and sess.report_from != (here := _file_key(path.strip())):
            sess.report_trace = Trace.load(path.strip())  # again when the file has changed
            sess.report_from = here
    except TraceError as exc:
        st.error(f"Trace not read: {escape.markdown(exc)}", icon="⚠️")
    trace = sess.report_trace
    selected = None
    if trace is None:
        st.info("Upload a trace JSON (written by the app, `trace` or `report`) to see its report.")
    elif len(trace.steps) > 1:
        selected = st.slider(
            "Selected step", 0, len(trace.steps) - 1, len(trace.steps) - 1, key="report_step"
        )

if trace is not None:
    tok = ctx.lm.tokenizer if ctx.lm is not None else None
    if tok is not None and trace.model.get("vocab_size") not in (None, len(tok)):
        tok = None  # another model's ids: show them as ids rather than wrong words
    wi = None
    if source == "the current run" and ctx.wi is not None and page.params_changed(ctx):
        shows = st.radio(
            "Show",
            ["the what-if under the current sliders", "the recorded run"],
            horizontal=True,
            key="report_state",
            help="The other pages show the what-if while the sliders differ from the run's.",
        )
        wi = ctx.wi if shows.startswith("the what-if") else None
    kind, sentence = report.shown_state(wi)
    views.state_badge(kind, sentence)
    lm = ctx.lm if tok is not None else None  # the lens views need the run's own model
    vs = report.views(trace, tokenizer=tok, selected=selected, whatif=wi, lm=lm)
    m = run_metrics(trace).to_dict()
    cols = st.columns(5)
    for c, k in zip(
        cols,
        ("distinct_1", "distinct_2", "repetition_rate", "mean_entropy", "pruning_ratio"),
        strict=True,
    ):
        c.metric(METRIC_INFO[k][0], "–" if m[k] is None else f"{m[k]:.3f}")
    st.caption(
        f"metrics of the recorded tokens · model **{escape.markdown(trace.model.get('name', '?'))}** · "
        f"{len(trace.steps)} tokens · "
        f"stop: {escape.markdown(trace.stop_reason or 'not stopped')}"
    )
    with st.expander("Generated text", expanded=True):
        st.code(report.text_preview(trace), language=None, wrap_lines=True)
        st.caption("The prompt from its beginning, then the generated tokens in ⟨ ⟩.")

    # -- build and download --------------------------------------------------------------------
    st.subheader("Build the report")
    c1, c2 = st.columns([3, 1])
    c1.toggle("One PNG per chart (takes a few seconds a chart)", value=True, key="report_png")
    build = ReportTask(trace, tokenizer=tok, selected=selected, whatif=wi, lm=lm)

    def _build(task: ReportTask) -> None:
        task.kw["png"] = st.session_state["report_png"]
        work.start(sess, "report", task)

    c2.button(
        "Build report",
        type="primary",
        key="report_build",
        on_click=_build,
        args=(build,),
        disabled=work.running(sess, "report"),
    )

    def _made() -> None:
        made = work.result(sess, "report")  # a Bundle once a build has ended
        if made is None:
            return
        state = "complete" if made.complete else "stopped early"
        st.success(
            f"Report {state}: report.html, trace.json, trace.parquet and {made.pngs} PNGs.",
            icon=":material/inventory_2:",
        )
        st.download_button(
            "Download report.zip",
            made.zip,
            file_name="semviz-report.zip",
            mime="application/zip",
            key="report_download",
        )

    work.panel(sess, "report", _made)

    # -- the views -----------------------------------------------------------------------------
    st.divider()
    for v in vs:
        st.subheader(escape.markdown(v.title))
        st.caption(escape.markdown(v.caption))  # the captions quote token text
        views.chart(v.figure, key=f"report_{v.name}")
