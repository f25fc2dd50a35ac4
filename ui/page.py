"""What every page starts with: ``ctx = page.context("Title")``.

The context carries the current ``Settings``, the session's decoder and trace, the shared
model, the what-if replay of the recorded steps under the current sliders, and the selected
step. It also draws the common header (errors, status line, what-if banner) so pages only
draw their own views.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import streamlit as st

from semviz.sampling import PruneParams
from ui import runner, whatif
from ui.errors import guard, message
from ui.model import get_model
from ui.state import SessionData, Settings, session, url_count


@dataclass
class PageContext:
    settings: Settings
    sess: SessionData
    lm: object | None  # LoadedModel for the current settings, or the decoder's when that failed
    params: PruneParams | None  # None when the sliders are out of range
    wi: whatif.WhatIf | None

    @property
    def decoder(self):
        return self.sess.decoder

    @property
    def trace(self):
        return self.sess.trace

    @property
    def steps(self):
        tr = self.trace
        return [] if tr is None else tr.steps

    @property
    def selected(self) -> int | None:
        return self.sess.selected_step()

    def update_whatif(self) -> None:
        """(Re)compute the what-if for the current trace; cached, so cheap when unchanged."""
        tr = self.sess.trace
        self.wi = None
        if tr is None or not tr.steps or self.params is None:
            return
        dec = self.sess.decoder
        with guard("the what-if replay"):
            self.wi = whatif.cached(
                self.sess.extra, tr, self.params, model=dec.lm.model, hidden=dec.hidden
            )

    @property
    def first_diff(self) -> int | None:
        """First step whose pick changes under the current sliders; None when they are the
        run's own (replay then only re-derives the recorded views)."""
        if self.wi is None or not params_changed(self):
            return None
        return self.wi.first_diff

    def chosen(self, i: int) -> int:
        """Candidate index step ``i`` picks under the current sliders."""
        if self.wi is not None and i < len(self.wi.chosen):
            return self.wi.chosen[i]
        return self.steps[i].chosen_rank

    def result(self, i: int):
        """The what-if ``PruneResult`` of step ``i`` (None: use the recorded values)."""
        if self.wi is None or i >= len(self.wi.results):
            return None
        return self.wi.results[i]

    def labels(self, ids) -> list[str]:
        """Token texts for ids (the model's tokenizer)."""
        lm = self.lm or (self.decoder.lm if self.decoder is not None else None)
        if lm is None:
            return [str(int(i)) for i in ids]
        return token_texts(lm.tokenizer, tuple(int(i) for i in ids))

    def context_labels(self, positions) -> list[str]:
        """Token texts of original sequence positions (prompt + generated)."""
        tr = self.trace
        toks = list(tr.prompt_tokens) + [s.token_text for s in tr.steps]
        return [toks[int(p)] if int(p) < len(toks) else "?" for p in positions]


@lru_cache(maxsize=64)
def _tok_cache(tok_id: int):
    return {}


def token_texts(tokenizer, ids: tuple[int, ...]) -> list[str]:
    """Decode ids one by one, memoised per tokenizer."""
    memo = _tok_cache(id(tokenizer))
    out = []
    for i in ids:
        s = memo.get(i)
        if s is None:
            s = tokenizer.decode([i])
            memo[i] = s
        out.append(s)
    return out


def context(title: str, *, icon: str = "") -> PageContext:
    """Draw the page title and the shared header; return the page's context."""
    st.title(f"{icon} {title}".strip())
    from ui import controls

    settings = controls.sidebar()
    sess = session(st.session_state)
    lm = None
    with guard("loading the model", show=False) as err:
        lm = get_model(settings.model_name())
    if err:
        st.error(err[0] + " The current run is kept.", icon="⚠️")
        lm = sess.decoder.lm if sess.decoder is not None else None
    params = None
    with guard("the sampling settings") as err2:
        params = settings.prune_params()
    if sess.error:
        st.error(sess.error, icon="⚠️")
    if sess.notice:
        st.info(sess.notice)
    ctx = PageContext(settings=settings, sess=sess, lm=lm, params=params, wi=None)
    share_url(ctx)
    ctx.update_whatif()
    status_line(ctx)
    if not err2:
        whatif_banner(ctx)
    return ctx


def share_url(ctx: PageContext) -> None:
    """Keep the URL's query string equal to the settings and the selected step.

    A copied link therefore reopens the same settings (``Settings.from_query_params`` reads
    them on a session's first run). A ``step`` in the link the session opened with is
    selected once the run has that many steps, so the same views come back.
    """
    sess = ctx.sess
    if "url_step" not in sess.extra:
        sess.extra["url_step"] = url_count("step", st.query_params.get("step"))
    want = sess.extra.get("url_step")
    if want is not None and len(ctx.steps) > want and not sess.playing:  # play resets it
        sess.selected, sess.extra["url_step"] = want, None
        want = None
    qp = ctx.settings.to_query_params()
    step = sess.selected if ctx.steps else None
    step = want if want is not None else step
    if step is not None:
        qp["step"] = str(step)
    if st.query_params.to_dict() != qp:
        st.query_params.from_dict(qp)


def status_line(ctx: PageContext) -> None:
    dec = ctx.decoder
    if dec is None:
        st.caption("No run yet: press **Step** on the Generate page to start.")
        return
    tr = dec.trace
    bits = [
        f"model **{tr.model.get('name', '?')}**",
        f"{len(tr.prompt_ids)} prompt tokens",
        f"{len(tr.steps)} steps",
    ]
    if dec.done:
        bits.append(f"stopped: {dec.stop_reason}")
    st.caption(" · ".join(bits))
    if runner.is_stale(ctx.sess, ctx.settings):
        st.info(
            "The prompt, model, seed or cache policy changed: the next **Step** starts a new run. "
            "The views below still show the current run.",
            icon="ℹ️",
        )


def params_changed(ctx: PageContext) -> bool:
    dec = ctx.decoder
    return dec is not None and ctx.params is not None and dec.params != ctx.params


def whatif_banner(ctx: PageContext) -> None:
    """When the sliders differ from the run's, say so and mark the first changed choice."""
    wi = ctx.wi
    if wi is None or not params_changed(ctx):
        return
    if wi.first_diff is None:
        st.success(
            f"What-if: the sliders moved after generation. Replaying the {wi.n} recorded steps "
            f"through the core ({1e3 * wi.seconds:.0f} ms, no model run) changes no choice.",
            icon="🔁",
        )
    else:
        k = wi.first_diff
        rec = ctx.steps[k]
        new = ctx.labels([wi.token_ids[k]])[0]
        c1, c2 = st.columns([4, 1])
        c1.warning(
            f"What-if: with these sliders step **{k}** would pick {new!r} instead of "
            f"{rec.token_text!r} (replayed {wi.n} steps in {1e3 * wi.seconds:.0f} ms, "
            "no model run). Views show the replay; steps from the marked one on are "
            "counterfactual.",
            icon="🔀",
        )
        c2.button(
            f"Regenerate from step {k}", key="regen_from", type="primary",
            on_click=_regenerate, args=(ctx.sess, ctx.settings, k),
            help="Rewind the run to this step with the current sliders and decode on.",
        )  # fmt: skip
    if wi.note:
        st.caption(wi.note)


def _regenerate(sess: SessionData, settings: Settings, k: int) -> None:
    sess.error = None
    try:
        runner.regenerate_from(sess, settings, k)
    except Exception as exc:  # shown by the header; the run is kept
        sess.error = message(exc)


def step_selector(ctx: PageContext, *, key: str = "step_sel") -> int | None:
    """A slider over the recorded steps, shared by every page through ``sess.selected``."""
    n = len(ctx.steps)
    if n == 0:
        return None
    if n == 1:
        ctx.sess.selected = 0
        return 0

    def _moved():
        v = st.session_state[key]
        ctx.sess.selected = None if v == n - 1 else int(v)

    st.session_state[key] = ctx.selected
    st.slider(
        "Selected step", 0, n - 1, key=key, on_change=_moved,
        help="Every view on every page shows this step. The last step follows new tokens.",
    )  # fmt: skip
    return ctx.selected


def need_trace(ctx: PageContext) -> bool:
    """Show a hint and return False when there is nothing recorded yet."""
    if ctx.steps:
        return True
    st.info("Nothing generated yet: go to **Generate** and press **Step** or **Play**.", icon="👉")
    if ctx.lm is not None:
        from ui import nav

        st.page_link(nav.GENERATE, label="Open Generate", icon="▶️")
    return False
