"""KV cache: what the policy kept and evicted, cache bytes per step, quality vs budget.

kv-eval is a ``KVEvalTask`` in the page's task panel (``ui.work``): one batched forward a
unit, so the page shows progress and the time left, and its Stop answers within a tick and
keeps the rows scored so far ("stopped after N of M tokens").
"""

import pandas as pd
import streamlit as st

from semviz.decoding.decoder import encode_prompt
from semviz.eviction import POLICIES, KVEval, parse_budgets, teacher_forced_ids
from semviz.model.forward import kv_bytes_per_token
from semviz.output import charts, style
from semviz.tasks import KVEvalTask
from ui import page, server, work
from ui.errors import report

COLUMNS = {  # row key → (column title, number format)
    "policy": ("policy", None),
    "budget": ("budget", None),
    "tokens": ("tokens", "%d"),
    "ppl": ("ppl", "%.2f"),
    "top1_agree": ("top-1 vs full", "%.3f"),
    "kl": ("KL(full ‖ policy)", "%.4f"),
    "peak_kib": ("peak KiB", "%.0f"),
    "mean_cache_len": ("mean entries", "%.1f"),
    "evicted_mass": ("evicted mass", "%.4f"),
    "regret_est": ("regret (est.)", "%.4f"),
    "tokens_per_s": ("tok/s", "%.1f"),
}

ctx = page.context("KV cache")
sess = ctx.sess
tr = ctx.trace

if page.need_trace(ctx):
    ev = tr.settings.get("eviction") if isinstance(tr.settings, dict) else None
    st.caption(
        f"Policy of this run: **{ev['policy']}**, budget {ev.get('budget')}"
        if ev
        else "This run keeps the full cache (KV policy *none*): pick a policy in the sidebar "
        "and press Step to start a run with eviction."
    )
    n_pos = len(tr.prompt_ids) + len(tr.steps)
    st.subheader("Eviction timeline: steps × original positions, one layer")
    budgets = charts.kv_budgets(tr.steps[-1])
    n_layers = 1 if budgets is None else len(budgets)
    layer = 0
    if n_layers > 1:
        layer = st.selectbox(
            "Layer",
            list(range(n_layers)),
            key="kv_layer",
            help="Each layer keeps its own positions; the timeline shows one layer's cache.",
        )
    sel = sess.selected_step()
    st.plotly_chart(
        charts.kv_timeline_figure(tr.steps, n_positions=n_pos, layer=layer, selected=sel),
        key="kv_timeline",
    )
    held = charts.kv_layer_positions(tr.steps[-1], layer)
    held_n = len(tr.steps[-1].cache_positions) if held is None else len(held)
    budget = "" if budgets is None else f" (budget {budgets[layer]})"
    st.caption(
        f"**Kept**: the position's keys and values are still in layer {layer}'s cache after "
        "the step's eviction, so later queries in that layer can read them. **Evicted**: "
        "written earlier and dropped. Blank: not yet written. At the last step layer "
        f"{layer} holds {style.count(held_n, 'position')}{budget}. "
        + ("The line marks the selected step." if sel is not None else "")
    )
    st.subheader("Cache size per step")
    bpt = kv_bytes_per_token(tr.model)
    st.plotly_chart(
        charts.cache_bytes_figure(tr.steps, bytes_per_token=bpt, prompt_len=len(tr.prompt_ids)),
        key="kv_bytes",
    )
    last = tr.steps[-1]
    st.caption(
        f"Last step: its query read {last.cache_len} cached positions; after the step's "
        f"eviction the cache holds {last.cache_bytes / 1024:.1f} KiB "
        f"({last.cache_bytes / bpt:g} positions' worth at the formula's {bpt} bytes per token)."
    )

st.divider()
st.subheader("Quality vs budget (kv-eval)")


def _start() -> None:
    """The form's callback: build the evaluation; the task panel below runs it."""
    try:
        pols = list(st.session_state["kve_policies"])
        if not pols:
            raise ValueError("pick at least one policy")
        budgets = parse_budgets(st.session_state["kve_budgets"])
        if ctx.lm is None:
            raise ValueError("the model is not loaded")
        base = tr.prompt_ids + tr.token_ids if ctx.steps else []
        if not base:
            base = encode_prompt(ctx.lm, ctx.settings.prompt or "hello", ctx.settings.chat)
        ids = teacher_forced_ids(ctx.lm, base, int(st.session_state["kve_tokens"]), repeat=True)
        run = KVEval(ctx.lm, ids, ["full", *pols], budgets)
    except Exception as exc:  # one line in the panel; the last result is kept
        work.fail(sess, "kve", report(exc, "kv-eval"))
        return
    work.start(sess, "kve", KVEvalTask(run))


if ctx.lm is None:
    st.info("Load a model to run kv-eval.")
else:
    names = [n for n in POLICIES if n != "full"]
    with st.form("kv_eval_form"):
        c1, c2, c3 = st.columns([3, 2, 1])
        c1.multiselect("Policies", names, default=names[:2], key="kve_policies")
        c2.text_input("Budgets (tokens or fractions)", "16, 32", key="kve_budgets")
        most = max(16, min(2048, server.config().max_prompt_tokens or 2048))
        c3.number_input("Tokens", 16, most, min(64, most), step=16, key="kve_tokens")
        st.form_submit_button(
            "Run kv-eval", type="primary", on_click=_start, disabled=work.running(sess, "kve")
        )
    st.caption(
        "Teacher-forced on the current run's text (prompt + generated, repeated to the length): "
        "every policy and budget is a row of one batch, and each row's next-token "
        "distributions are compared with the full cache's (one prefill)."
    )


def _ended(e: work.Ended) -> str:
    done, total = e.progress.done, e.progress.total
    if done < total and (e.failed or e.stopped):
        how = "failed" if e.failed else "stopped"
        return f"kv-eval {how} after {done} of {total} tokens: the rows score the tokens read."
    return f"kv-eval: done, {total} tokens."


def _table(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["budget"] = df["budget"].map(lambda b: "-" if b is None else str(b))
    df["peak_kib"] = df["peak_cache_bytes"] / 1024
    return df[list(COLUMNS)].rename(columns={k: v[0] for k, v in COLUMNS.items()})


def results() -> None:
    e = work.ended(sess, "kve")
    if e is not None and e.progress.total:
        st.progress(e.progress.fraction, text=_ended(e))
    rows = work.result(sess, "kve")
    if not rows:
        return
    metric = st.segmented_control(
        "Metric", ["kl", "top1_agree", "ppl", "evicted_mass"], default="kl", key="kve_metric"
    )
    sub = [r for r in rows if r.get("budget") is not None]
    st.plotly_chart(charts.kv_eval_figure(sub, ys=[metric or "kl"]), key="kv_eval")
    config = {v[0]: st.column_config.NumberColumn(format=v[1]) for v in COLUMNS.values() if v[1]}
    st.dataframe(_table(rows), hide_index=True, width="stretch", column_config=config)


work.panel(sess, "kve", results)  # "kv-eval: <rows> · N of M tokens · about … left"
