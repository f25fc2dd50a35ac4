"""Does it help? Coherence against diversity for two or more settings, judged by an outside model.

Opens on the shipped result (``data/frontier/``), so the frontier shows at once. A results
file written by ``python -m semviz frontier`` (or by a sweep started here) can be opened
instead. A sweep started here is a ``FrontierTask`` in the task panel (``ui.work``), on the
sidebar's model in its turns or on Ray workers, and writes its Parquet after every batch:
Stop drops only the batch in flight, and starting the same sweep again resumes it.

A shared server (``SEMVIZ_SHARED``) shows the shipped result only: a visitor types no path the
server would read or write, and starts no sweep that would hold the model outside its queue.
"""

from pathlib import Path

import pandas as pd
import streamlit as st

from semviz.frontier import sweep as fr
from semviz.tasks import FrontierTask
from ui import page, server, work
from ui.errors import message, report

ctx = page.context("Does it help?", run=False)  # it reads results files, not the run
SHARED = server.config().shared  # read after the sidebar, which stops on a bad configuration

st.caption(
    "Each curve is one setting with one knob swept (temperature by default). Every point "
    "continues a prompt set with several seeds; **coherence** is the cosine between the "
    "prompt's and the continuation's sentence embeddings from an outside judge "
    "(all-MiniLM-L6-v2, never the LM being steered). **Diversity** has five axes: within a "
    "text (distinct-1, distinct-2) and between a prompt's seeds (the judge's dissimilarity, "
    "1 − self-BLEU, distinct-2 pooled over the seeds); the verdict is given on each. "
    "Up and to the right is better. Bars are 95% bootstrap CIs over prompts. "
    "B dominates A only when the CI of its coherence gap at matched diversity excludes 0."
)


@st.cache_data(show_spinner=False, max_entries=8)
def _read(path: str, mtime: float) -> pd.DataFrame:
    return fr.load_results(path)


@st.cache_data(show_spinner="Bootstrapping…", max_entries=16)
def _summary(path: str, mtime: float, knob: str, labels: tuple, x: str) -> fr.Summary:
    df = _read(path, mtime)
    df = df[df["knob"] == knob]
    ordered = pd.concat([df[df["setting"] == s] for s in labels])  # the first is A
    return fr.summarize(ordered, x=x, n_boot=500)


def _new_file() -> None:
    """Another file holds other settings: the pick of settings starts again from all."""
    st.session_state.pop("fr_settings", None)


def _source() -> str | None:
    shipped = [f"Shipped: {name}" for name in fr.SHIPPED_SWEEPS]
    if SHARED:
        st.caption(
            "This server shows the shipped results. Run your own sweep with "
            "`python -m semviz frontier` on your machine."
        )
    choices = shipped if SHARED else [*shipped, "A results file"]
    if st.session_state.get("fr_source") not in choices:  # a file this server does not offer
        st.session_state.pop("fr_source", None)
    pick = st.radio("Results (test half)", choices, key="fr_source", on_change=_new_file)
    if pick in shipped:
        return str(list(fr.SHIPPED_SWEEPS.values())[shipped.index(pick)])
    if "fr_path" not in st.session_state:
        st.session_state["fr_path"] = fr.DEFAULT_OUT
    path = st.text_input(
        "Parquet written by `python -m semviz frontier`", key="fr_path", on_change=_new_file
    )
    return path.strip() or None


def _load(path: str | None) -> pd.DataFrame | None:
    if path is None:
        st.info("Give the path of a results file.")
        return None
    p = Path(path)
    if not p.is_file():
        st.info(
            f"No results at `{path}` yet: run a sweep below or with `python -m semviz frontier`."
        )
        return None
    try:
        df = _read(str(p), p.stat().st_mtime)
    except ValueError as exc:
        st.error(f"Results not read: {exc}", icon="⚠️")
        return None
    if not len(df):
        st.info("The file holds no rows yet.")
        return None
    return df


def _controls(df: pd.DataFrame) -> tuple[str, tuple, str] | None:
    knobs = list(dict.fromkeys(df["knob"]))
    c1, c3 = st.columns(2)
    knob = c1.selectbox("Knob", knobs, key="fr_knob")
    x = c3.selectbox(
        "Diversity axis",
        [fr.AUTO, *fr.X_AXES],
        key="fr_x",
        format_func=lambda a: "the best resolved (auto)" if a == fr.AUTO else fr.X_AXES[a],
        help="Auto opens on the axis whose range the settings share spans the most widths of "
        "a point's 95% CI: an axis that saturates, or on which the curves do not overlap, "
        "cannot tell the settings apart.",
    )
    labels = list(dict.fromkeys(df.loc[df["knob"] == knob, "setting"]))
    picked = st.multiselect(  # a row of its own: the settings' specs are long
        "Settings (the first is A, the reference)", labels, default=labels, key="fr_settings"
    )
    if not picked:
        st.info("Pick at least one setting.")
        return None
    return knob, tuple(picked), x


def _frontier(path: str, df: pd.DataFrame) -> None:
    sel = _controls(df)
    if sel is None:
        return
    knob, labels, x = sel
    try:
        s = _summary(path, Path(path).stat().st_mtime, knob, labels, x)
    except ValueError as exc:
        st.error(message(exc), icon="⚠️")
        return
    if x == fr.AUTO:
        st.caption(
            f"Axis: **{fr.X_AXES[s.x]}**, the one this sweep resolves best: its shared range "
            f"spans {s.resolution[s.x]:.1f} widths of a point's 95% CI (the table below gives "
            "every axis's)."
        )
    st.plotly_chart(fr.frontier_figure(s), key="fr_chart", config={"displaylogo": False})
    for d in s.dominance:
        (st.success if " dominates " in d.verdict and "neither" not in d.verdict else st.info)(
            d.verdict
        )
    _every_axis(s)
    st.caption(f"{s.n_prompts} prompts · {len(df[df['knob'] == knob])} continuations in the file")
    cols = [
        "setting",
        "value",
        "coherence",
        "coherence_lo",
        "coherence_hi",
        "distinct_1",
        "distinct_2",
        "cross_sim",
        "repetition",
        "short",
        "ppl",
        "prompts",
    ]
    st.dataframe(
        s.points[cols].rename(columns={"value": knob, "short": "<4 words", "ppl": "perplexity"}),
        hide_index=True,
        width="stretch",
    )
    _samples(df[df["knob"] == knob], s, knob)


def _every_axis(s: fr.Summary) -> None:
    """The verdict on every diversity axis: one sentence per compared setting, and a table."""
    st.subheader("On every diversity axis")
    for sentence in s.agreement:
        st.markdown(sentence)
    rows = [
        {
            "axis": fr.X_AXES[a],
            "CI widths spanned": s.resolution.get(a),
            "B": d.b,
            "A": d.a,
            "coherence B − A": d.gap,
            "95% CI lo": d.lo,
            "95% CI hi": d.hi,
            "matched from": d.x_lo,
            "matched to": d.x_hi,
            "winner": {"a": d.a, "b": d.b, "neither": "neither", "none": "no common range"}[
                d.winner
            ],
        }
        for a, doms in s.by_axis.items()
        for d in doms
    ]
    fmt = st.column_config.NumberColumn
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        width="stretch",
        column_config={
            "CI widths spanned": fmt(format="%.1f"),
            **{k: fmt(format="%+.3f") for k in ("coherence B − A", "95% CI lo", "95% CI hi")},
            **{k: fmt(format="%.3f") for k in ("matched from", "matched to")},
        },
    )


def _samples(df: pd.DataFrame, s: fr.Summary, knob: str) -> None:
    st.subheader("Sample continuations")
    pts = [(r["setting"], r["value"]) for r in s.points.to_dict("records")]
    c1, c2 = st.columns([2, 3])
    i = c1.selectbox(
        "Point",
        range(len(pts)),
        key="fr_point",
        format_func=lambda k: f"{pts[k][0]} · {knob}={pts[k][1]:g}",
    )
    setting, value = pts[i]
    rows = df[(df["setting"] == setting) & (df["value"] == value)]
    kinds = ["all", *sorted(rows["kind"].unique())]
    kind = c2.radio("Kind", kinds, horizontal=True, key="fr_kind")
    if kind != "all":
        rows = rows[rows["kind"] == kind]
    show = rows[["prompt", "seed", "text", "coherence", "distinct_2", "repetition", "ppl"]]
    st.dataframe(
        show.rename(columns={"text": "continuation", "ppl": "perplexity"}),
        hide_index=True,
        width="stretch",
        column_config={
            "prompt": st.column_config.TextColumn(width="medium"),
            "continuation": st.column_config.TextColumn(width="large"),
        },
    )


# -- a sweep from the page ------------------------------------------------------------------


def _start() -> None:
    from semviz.analysis.compare import parse_side

    ss = st.session_state
    try:
        if ctx.lm is None:
            raise ValueError("the model is not loaded")
        specs = [ss["fr_a"], ss["fr_b"], *([ss["fr_c"]] if ss["fr_c"].strip() else [])]
        values = tuple(float(v) for v in ss["fr_values"].split(",") if v.strip())
        cfg = fr.SweepConfig(
            settings=tuple(parse_side(s) for s in specs),
            knob=ss["fr_new_knob"],
            values=values,
            split=ss["fr_split"],
            n_prompts=int(ss["fr_n"]),
            seeds=int(ss["fr_seeds"]),
            new_tokens=int(ss["fr_tokens"]),
            chat=ctx.settings.chat,
        )
        out = ss["fr_out"].strip() or fr.DEFAULT_OUT
    except Exception as exc:
        work.fail(ctx.sess, "fr", report(exc, "the sweep"))
        return
    task = FrontierTask(
        ctx.lm, cfg, out, workers=int(ss.get("fr_workers", 0)), model=ctx.settings.model_name()
    )
    # a sweep's one unit is the whole sweep: a thread of the task panel runs it
    work.start(ctx.sess, "fr", task)
    ss["fr_source"], ss["fr_path"] = "A results file", out


def _finished() -> None:
    e = work.ended(ctx.sess, "fr")
    res = None if e is None else e.result
    if res is not None:
        w = res.workers
        where = f" on {w} Ray worker{'s' if w > 1 else ''}" if w else ""
        st.success(
            f"Sweep finished{where}: {res.new_rows} new rows, {res.skipped_rows} already there"
            + (", stopped" if res.stopped else "")
            + f", in `{res.path}`."
        )


def _sweep_form() -> None:
    said = work.slot(ctx.sess, "fr") is not None  # a sweep ran, runs, or could not start
    with st.expander("Run a sweep on the sidebar's model", expanded=said):
        c1, c2, c3 = st.columns(3)
        c1.text_input("Setting A", "top_p=0.95", key="fr_a")
        c2.text_input("Setting B", "top_p=0.95,gravity_lambda=0.5", key="fr_b")
        c3.text_input("Setting C (optional)", "", key="fr_c")
        c1.selectbox("Knob", list(fr.KNOBS), key="fr_new_knob")
        c2.text_input("Values", "0.7,1.0,1.3", key="fr_values")
        c3.selectbox(
            "Prompt half", ["dev", "test"], key="fr_split", help="Tune on dev; report on test."
        )
        half = len(fr.load_prompts(split=st.session_state.get("fr_split", "dev")))
        c1.number_input(
            "Prompts",
            1,
            half,
            min(12, half),
            key="fr_n",
            help=f"The first N of the half's {half} prompts (the kinds stay balanced).",
        )
        # the CLI's defaults: self-BLEU and pooled distinct-n compare a prompt's seeds
        defaults = fr.SweepConfig.__dataclass_fields__
        c2.number_input("Seeds", 1, 16, defaults["seeds"].default, key="fr_seeds")
        c3.number_input("New tokens", 4, 512, defaults["new_tokens"].default, key="fr_tokens")
        c1, c2 = st.columns([3, 1])
        c1.text_input("Write results to", fr.DEFAULT_OUT, key="fr_out")
        c2.number_input(
            "Ray workers",
            0,
            64,
            0,
            key="fr_workers",
            help="0 runs the sweep here, on the sidebar's model. N hands its batches to N "
            "workers of a local Ray started for it, each loading the model once "
            "(`python -m semviz frontier --workers N`).",
        )
        st.button(
            "Run sweep",
            type="primary",
            on_click=_start,
            disabled=work.running(ctx.sess, "fr"),
            key="fr_run",
        )
        work.panel(ctx.sess, "fr", _finished)


path = _source()
df = _load(path)
if df is not None:
    _frontier(path, df)
if not SHARED:
    _sweep_form()
