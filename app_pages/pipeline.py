"""Pipeline: tokenisation → prefill → KV cache → logits → sampling chain, measured live."""

import html

import numpy as np
import streamlit as st

from semviz.decoding.decoder import encode_prompt
from semviz.model.forward import kv_bytes_per_token
from semviz.output import charts, escape, style
from semviz.tasks import PrefillScanTask
from ui import page, server, views, work
from ui.errors import guard

ctx = page.context("Pipeline")
views.page_css()
lm = ctx.lm if ctx.lm is not None else (ctx.decoder.lm if ctx.decoder is not None else None)
if lm is None:
    st.info("Load a model (sidebar) to see its pipeline.")
    st.stop()

summary = lm.summary()
if summary["source"].startswith("gguf:"):
    # A quantised file is dequantised for torch: the weights are exact, but they are the
    # quantised model's, so its probabilities are the 4- or 8-bit model's, not the original's.
    quant = summary["source"].removesuffix(".gguf").rsplit(".", 1)[-1]
    st.caption(
        f"Model **{escape.markdown(summary['name'])}** is the GGUF file "
        f"{escape.markdown(summary['source'][5:])}, dequantised to {summary['dtype']}: "
        f"its probabilities are those of the {escape.markdown(quant)}-quantised model."
    )
st.subheader("1 · Tokenisation: the prompt as subword tokens")
ids = None
with guard("tokenising the prompt"):
    ids = encode_prompt(lm, ctx.settings.prompt, ctx.settings.chat)
if ids is not None:
    texts = ctx.labels(ids)
    n_chars = len(ctx.settings.prompt)
    m = st.columns(4)
    m[0].metric("characters (typed)", f"{n_chars:,}")
    m[1].metric("tokens (model input)", f"{len(ids):,}")
    # of the typed text alone: the chat template's tokens are not the user's characters
    typed = len(lm.tokenizer(ctx.settings.prompt, add_special_tokens=False)["input_ids"])
    m[2].metric(
        "characters per token",
        f"{n_chars / max(typed, 1):.2f}",
        help=f"The typed text alone: {typed:,} tokens. The model input adds the chat "
        "template's tokens, when the chat template is on.",
    )
    m[3].metric("vocabulary", f"{summary['vocab_size']:,}")
    chips = " ".join(
        f'<span class="semviz-chip" title="id {i}" style="background:{style.chip_background(k)}">'
        f"{html.escape(charts.display_token(t))}<sub> {i}</sub></span>"
        for k, (i, t) in enumerate(zip(ids[:400], texts[:400], strict=False))
    )
    more = f" … {len(ids) - 400} more" if len(ids) > 400 else ""
    st.html(f'<div style="line-height:2.1">{chips}{more}</div>')
    if ctx.settings.chat:
        st.caption("The chat template adds the role markers around the typed text.")

st.subheader("2 · Prefill once, then one token per forward")
dec = ctx.decoder
if dec is None or not ctx.steps:
    st.info("Generate a few tokens to compare prefill with decode.")
else:
    tr = ctx.trace
    decode = [s.t_forward for s in tr.steps[1:]]  # step 0's logits come from the prefill
    views.chart(
        charts.timing_figure(tr.prefill_seconds, len(tr.prompt_ids), decode), key="pipe_timing"
    )
    med = float(np.median(decode)) if decode else float("nan")
    st.caption(
        f"Prefill read {len(tr.prompt_ids)} tokens in {1e3 * tr.prefill_seconds:.1f} ms "
        f"({1e3 * tr.prefill_seconds / max(len(tr.prompt_ids), 1):.2f} ms per token, all in "
        f"parallel); each decode forward reads one token and takes {1e3 * med:.1f} ms (median)."
    )

st.subheader("3 · KV cache size: formula vs measured")
el = lm.dtype.itemsize
bpt = kv_bytes_per_token(summary)
st.latex(
    rf"2 \cdot {summary['num_layers']}\,\text{{layers}} \cdot {summary['num_kv_heads']}\,"
    rf"\text{{kv heads}} \cdot {summary['head_dim']}\,\text{{head dim}} \cdot {el}\,"
    rf"\text{{bytes}} = {bpt:,}\ \text{{bytes per token}}"
)
if dec is not None and ctx.steps:
    last = ctx.trace.steps[-1]
    predicted = bpt * last.cache_len
    heads = f"({summary['num_heads']} query heads share {summary['num_kv_heads']} KV heads)"
    if predicted != last.cache_bytes and last.eviction is not None:
        # the record's positions are those the step's query read; its bytes, the cache after
        # the step's eviction
        st.write(
            f"At the last step the query read **{last.cache_len}** positions (formula: "
            f"{predicted:,} bytes); the cache policy then evicted, leaving the measured "
            f"**{last.cache_bytes:,}** bytes, {last.cache_bytes / bpt:g} positions' worth {heads}."
        )
    else:
        ok = "matches" if predicted == last.cache_bytes else "differs from"
        st.write(
            f"At the last step the cache holds **{last.cache_len}** positions: formula "
            f"{predicted:,} bytes {ok} the measured **{last.cache_bytes:,}** bytes {heads}."
        )

st.subheader("4 · Prefill time vs prompt length")
limit = min(lm.max_context - 1, 2048, server.config().max_prompt_tokens or 2048)
lengths = [n for n in (32, 128, 256, 512, 1024, 1536, 2048) if n <= limit]
st.button(
    "Measure prefill times",
    key="pipe_measure",
    help="Runs the model on prompts of several lengths.",
    on_click=lambda: work.start(ctx.sess, "scan", PrefillScanTask(lm, lengths)),
    disabled=work.running(ctx.sess, "scan"),
)


def _scan() -> None:
    made = work.result(ctx.sess, "scan")  # (lengths, seconds) so far
    if made is not None and made[0]:
        views.chart(charts.prefill_scaling_figure(*made), key="pipe_prefill")
        st.caption(
            "Attention compares every token with every earlier one, so prefill grows as n² "
            "once the prompt is long; the MLPs and projections grow as n."
        )
    elif not work.running(ctx.sess, "scan"):  # while it runs, the panel says how far it is
        st.caption(f"Press the button to time prefill at {', '.join(map(str, lengths))} tokens.")


work.panel(ctx.sess, "scan", _scan)

st.subheader("5 · The sampling chain, in the order the live settings run it")
if ctx.params is not None:
    views.chart(charts.chain_figure(ctx.params), key="pipe_chain")
    st.caption(
        "Grey: the model's logits; purple: gravity; blue: temperature; red: the filters that "
        "cut candidates; green: the kept set is renormalised and sampled."
    )
