"""Inside the choice: the logit lens, direct logit attribution and the attention metrics."""

import streamlit as st

from semviz.analysis import lens
from semviz.output import charts, headview, style
from ui import page, runner, views
from ui.errors import guard

GRID_STEPS = 128  # steps drawn in the grid: the last ones up to the selected step

ctx = page.context("Inside the choice")
views.page_css()


def _model(ctx):
    """The model that made the run: the decoder's, or the page's for a recorded run."""
    dec = ctx.decoder
    if dec is None or isinstance(dec, runner.TraceRun):
        return ctx.lm
    return dec.lm


if page.need_trace(ctx):
    i = page.step_selector(ctx)
    rec = ctx.steps[i]
    tr = ctx.trace
    lm = _model(ctx)
    if rec.residual is None:
        st.info(
            "This run did not record the logit lens: generate with the lens on (it is on by "
            "default) to look inside the choice.",
            icon=":material/info:",
        )
    elif lm is None:
        st.info("The model is not loaded, so the lens cannot be read.", icon=":material/info:")
    else:
        token = style.token_md(style.step_token(rec))
        with guard("reading the logit lens"):
            s = lens.lens_step(lm, rec)
            tops = ctx.labels(s.top_ids[:, 0].tolist())
            st.subheader(f"Step {i}: how {token} rose through the layers")
            decided = s.decided
            st.caption(
                "Each row is the residual stream after a layer, read through the model's final "
                "norm and LM head (the logit lens); the last row is the model's own "
                "distribution. "
                + (
                    f"{token} is the top token from layer {s.decided - 1} on."
                    if decided is not None and decided > 0
                    else f"{token} is the top token from the embedding on."
                    if decided == 0
                    else f"{token} is not the model's top token at this step (it was sampled)."
                )
            )
            views.chart(
                charts.lens_layers_figure(s, style.piece_text(rec.token_text, rec.token_hex), tops),
                key="lens_layers",
            )

        with guard("drawing the lens grid"):
            lo = max(0, i + 1 - GRID_STEPS)
            shown = [r for r in ctx.steps[lo : i + 1] if r.residual is not None]
            grid = lens.lens_grid(lm, shown)
            texts = [ctx.labels(row) for row in grid.top_id.tolist()]
            st.subheader("Every step: each layer's top token")
            views.step_chart(
                ctx,
                charts.lens_grid_figure(
                    grid,
                    texts,
                    [style.piece_text(r.token_text, r.token_hex) for r in shown],
                    selected=i,
                ),
                key="lens_grid",
            )
            st.caption(
                "Colour is the probability of the layer's top token; hover a cell for the "
                "chosen token's probability and rank there. Click a cell to select its step."
                + (f" The last {GRID_STEPS} steps up to the selected one." if lo > 0 else "")
            )

        with guard("direct logit attribution"):
            ba = lens.block_attribution(lm, rec)
            names = ctx.labels(ba.token_ids.tolist())
            st.subheader(f"Who wrote {token}: each block's share of the logit")
            views.chart(charts.block_contributions_figure(ba, names), key="lens_blocks")
            shown_names = [style.token_md(charts.display_token(t)) for t in names]
            st.caption(
                "Direct logit attribution: what each layer's attention and MLP added to the "
                "final residual, read as the logit of the chosen token and of the runner-up, "
                "with the final norm's scale frozen at the final residual. The terms, the "
                "embedding's and the biases sum to the logit: "
                + "; ".join(
                    f"{n} {float(lg):.2f} (embedding {float(e):+.2f})"
                    for n, lg, e in zip(shown_names, ba.logit, ba.embedding, strict=True)
                )
                + "."
            )
            L = ba.attn.shape[1]
            diff = ba.attn[0] - ba.attn[1] if len(names) > 1 else ba.attn[0]
            c1, c2 = st.columns([1, 1])
            layer = c1.selectbox(
                "Layer to split by head",
                list(range(L)),
                index=int(diff.argmax()),
                key="lens_layer",
                help="Default: the layer whose attention favoured the chosen token most.",
            )
            ha = lens.head_attribution(lm, rec, int(layer))
            views.chart(charts.head_contributions_figure(ha, names), key="lens_heads")
            if rec.attention is not None:
                ctx_labels = ctx.context_labels(rec.cache_positions.tolist())
                st.html(
                    headview.head_view_html(
                        rec.attention[int(layer)].float().numpy(),
                        ctx_labels,
                        query=ctx_labels[-1],
                        layer=int(layer),
                        key="lens-hv",
                    )
                )
            bt = lens.block_tokens(lm, rec, k=6)
            part = c2.selectbox("Block", bt.names, index=len(bt.names) - 1, key="lens_part")
            j = bt.names.index(part)
            up = ctx.labels(bt.promoted[j].tolist())
            down = ctx.labels(bt.suppressed[j].tolist())
            st.markdown(f"**What {part} pushed up and down most** (its direct logit term)")
            st.dataframe(
                {
                    "promoted": [charts.display_token(t) for t in up],
                    "by": [f"{v:+.2f}" for v in bt.promoted_by[j]],
                    "suppressed": [charts.display_token(t) for t in down],
                    "by ": [f"{v:+.2f}" for v in bt.suppressed_by[j]],
                },
                hide_index=True,
            )

    if any(r.attn_metrics is not None for r in ctx.steps):
        with guard("the attention metrics"):
            st.subheader("Attention metrics (entropix), step by step")
            n_layers = int(tr.model.get("num_layers") or 1)
            which = st.selectbox(
                "Attention of",
                ["last layer", "mean of every layer"],
                key="lens_att_layer",
                help="entropix reads the last layer's attention.",
            )
            series = lens.attention_series(tr, layer=-1 if which == "last layer" else None)
            df = charts.step_frame(tr)
            views.step_chart(
                ctx, charts.attention_metrics_figure(df, series, selected=i), key="lens_metrics"
            )
            st.caption(
                f"Attention entropy and varentropy of the last query's row (nats), averaged "
                f"over the heads of {'the last' if which == 'last layer' else 'all'} of "
                f"{n_layers} layers; head agreement is how far each head's row is from the "
                "heads' mean, and interaction strength the mean size of the pre-softmax scores."
            )
            st.subheader("The quadrant: entropy × varentropy of the logits")
            views.step_chart(ctx, charts.quadrant_figure(df, selected=i), key="lens_quadrant")
