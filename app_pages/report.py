"""Report: the views a report holds, for the current run or a saved trace; build and download.

The charts are ``semviz.output.report.views`` (the same list ``python -m semviz report`` writes), so a
trace reloaded here shows exactly what its report shows. Building writes report.html, one
PNG per chart, trace.json and trace.parquet and offers them as one zip. Stop ends the PNG
export after the current image; what was made is kept and can still be downloaded.
"""

import tempfile
import time
from pathlib import Path

import streamlit as st

from semviz.analysis.metrics import METRIC_INFO, run_metrics
from semviz.output import escape, report
from semviz.output.trace import Trace, TraceError
from ui import page, server, views
from ui.errors import log

ctx = page.context("Report")
views.page_css()
sess = ctx.sess
store = sess.report_files

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
        if up is not None and store.get("upload_id") != up.file_id:
            # the size is checked before the bytes are parsed
            store["loaded"] = Trace.from_json(up.getvalue(), max_bytes=cfg.trace_bytes())
            store["upload_id"] = up.file_id
        elif path.strip() and store.get("path") != path.strip():
            store["loaded"] = Trace.load(path.strip())
            store["path"] = path.strip()
    except TraceError as exc:
        st.error(f"Trace not read: {escape.markdown(exc)}", icon="⚠️")
    trace = store.get("loaded")
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
    c1, c2, c3 = st.columns([2, 1, 1])
    pngs = c1.toggle(
        "One PNG per chart (takes a few seconds a chart)", value=True, key="report_png"
    )
    build = c2.button("Build report", type="primary", key="report_build")
    c3.button("Stop", key="report_stop", help="Ends the PNG export after the current image.")
    if build:
        store.update({"zip": None, "done": False, "pngs": 0, "started": time.time()})
        bar = st.progress(0.0, text="starting…")

        def progress(msg: str, frac: float) -> None:
            bar.progress(min(max(frac, 0.0), 1.0), text=msg)  # a Stop click interrupts here

        # The folder lives only while the report is built: its zip is what the page keeps, and
        # the folder goes even when Stop or an error ends the build early.
        with tempfile.TemporaryDirectory(prefix="semviz-report-") as tmp:
            out = Path(tmp)
            try:
                report.build(
                    trace,
                    out,
                    tokenizer=tok,
                    selected=selected,
                    png=pngs,
                    progress=progress,
                    whatif=wi,
                    lm=lm,
                )
                store["done"] = True
            except Exception as exc:  # e.g. no browser for the PNGs: keep the rest
                log.error("The report was not finished", exc_info=exc)
                st.error(f"The report was not finished: {escape.markdown(exc)}", icon="⚠️")
            finally:
                store["pngs"] = len(list(out.glob("png/*.png")))
                store["zip"] = report.zip_bytes(out)
    if store.get("zip") is not None:
        state = "complete" if store.get("done") else "stopped early"
        st.success(
            f"Report {state}: report.html, trace.json, trace.parquet and {store['pngs']} PNGs.",
            icon=":material/inventory_2:",
        )
        st.download_button(
            "Download report.zip",
            store["zip"],
            file_name="semviz-report.zip",
            mime="application/zip",
            key="report_download",
        )

    # -- the views -----------------------------------------------------------------------------
    st.divider()
    for v in vs:
        st.subheader(escape.markdown(v.title))
        st.caption(escape.markdown(v.caption))  # the captions quote token text
        views.chart(v.figure, key=f"report_{v.name}")
