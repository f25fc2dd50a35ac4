"""KV cache: what the policy kept and evicted, cache bytes per step, quality vs budget."""

import streamlit as st

from semviz import charts
from ui import analysis, kv, page, server

ctx = page.context("KV cache")
tr = ctx.trace
if page.need_trace(ctx):
    dec = ctx.decoder
    ev = tr.settings.get("eviction") if isinstance(tr.settings, dict) else None
    st.caption(
        f"Policy of this run: **{ev['policy']}**, budget {ev.get('budget')}"
        if ev
        else "This run keeps the full cache (KV policy *none*): pick a policy in the sidebar "
        "and press Step to start a run with eviction."
    )
    n_pos = len(tr.prompt_ids) + len(tr.steps)
    st.subheader("Eviction timeline: steps × original positions")
    st.plotly_chart(charts.kv_timeline_figure(tr.steps, n_positions=n_pos), key="kv_timeline")
    st.subheader("Cache size per step")
    el = dec.lm.dtype.itemsize if hasattr(dec.lm.dtype, "itemsize") else 4
    bpt = analysis.bytes_per_token(tr.model, el)
    st.plotly_chart(
        charts.cache_bytes_figure(tr.steps, bytes_per_token=bpt, prompt_len=len(tr.prompt_ids)),
        key="kv_bytes",
    )
    last = tr.steps[-1]
    st.caption(
        f"Last step: {last.cache_len} cached positions, {last.cache_bytes / 1024:.1f} KiB; "
        f"the formula gives {bpt} bytes per token."
    )

st.divider()
st.subheader("Quality vs budget (kv-eval)")
fn = kv.kv_eval_function()
if fn is None:
    st.info("kv-eval is not available in this build.")
elif ctx.lm is None:
    st.info("Load a model to run kv-eval.")
else:
    names = [n for n in kv.policy_names() if n not in ("none", "full")]
    with st.form("kv_eval_form"):
        c1, c2, c3 = st.columns([3, 2, 1])
        pols = c1.multiselect("Policies", names, default=names[:2], key="kve_policies")
        budgets_text = c2.text_input("Budgets (tokens or fractions)", "16, 32", key="kve_budgets")
        most = max(16, min(2048, server.config().max_prompt_tokens or 2048))
        n_tok = c3.number_input("Tokens", 16, most, min(64, most), step=16, key="kve_tokens")
        go = st.form_submit_button("Run kv-eval", type="primary")
    st.caption(
        "Teacher-forced on the current run's text (prompt + generated, or the prompt repeated): "
        "each policy's next-token distributions are compared with the full cache's."
    )
    if go:
        sess = ctx.sess
        try:
            budgets = [
                float(b) if "." in b else int(b)
                for b in budgets_text.replace(" ", "").split(",")
                if b
            ]
            if not budgets or not pols:
                raise ValueError("pick at least one policy and one budget")
        except ValueError as exc:
            st.error(f"Settings not accepted: {exc}", icon="⚠️")
        else:
            base = tr.prompt_ids + tr.token_ids if ctx.steps else []
            if not base:
                from semviz.decoding import encode_prompt

                base = encode_prompt(ctx.lm, ctx.settings.prompt or "hello", ctx.settings.chat)
            ids = (base * (int(n_tok) // max(len(base), 1) + 1))[: int(n_tok)]
            bar = st.progress(0.0, text="kv-eval: starting…")

            def progress(done: int, total: int, label: str) -> None:
                bar.progress(
                    min(done / max(total, 1), 1.0), text=f"kv-eval: {label} ({done}/{total})"
                )

            def progress_and_yield(done: int, total: int, label: str) -> None:
                progress(done, total, label)
                turn.let_others()  # between two forwards: other sessions go first

            try:
                with server.model_turn() as turn:
                    rows = fn(ctx.lm, ids, ["full", *pols], budgets, on_progress=progress_and_yield)
                sess.kv_eval = rows
                bar.progress(1.0, text="kv-eval: done")
            except Exception as exc:  # one line, the page stays usable
                st.error(f"kv-eval failed: {exc}", icon="⚠️")
    rows = ctx.sess.kv_eval
    if rows:
        metric = st.segmented_control(
            "Metric", ["kl", "top1_agree", "ppl", "evicted_mass"], default="kl", key="kve_metric"
        )
        sub = [r for r in rows if r.get("budget") is not None]
        st.plotly_chart(charts.kv_eval_figure(sub, ys=[metric or "kl"]), key="kv_eval")
        st.dataframe(rows, hide_index=True)
