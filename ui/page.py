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

from semviz.decoding.decoder import token_hex
from semviz.output import escape, style
from semviz.output.style import display_token
from semviz.sampling import PruneParams
from semviz.tasks import GravityTask
from ui import nav, runner, server, whatif, work
from ui.errors import guard, report
from ui.model import get_model
from ui.state import SessionData, Settings, read_run_query, run_query, session, url_count

GRAVITY = "gravity"  # the session's task recomputing gravity for the what-if, in ``ui.work``


@dataclass
class PageContext:
    settings: Settings
    sess: SessionData
    lm: object | None  # LoadedModel for the current settings, or the decoder's when that failed
    params: PruneParams | None  # None when the sliders are out of range
    wi: whatif.WhatIf | None
    gravity_pending: bool = False  # the what-if waits for gravity a task recomputes
    # the trace and settings whose replay failed in this script run: its sentence is shown
    # once, where the first call drew it, not again by each later call on the page
    whatif_failed: tuple | None = None

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
        self.wi, self.gravity_pending = None, False
        if tr is None or not tr.steps or self.params is None:
            return
        dec = self.sess.decoder
        key = (id(tr), len(tr.steps), id(tr.steps[-1]), self.params)  # a regrown run: new records
        if key == self.whatif_failed:
            return
        # a recorded run (an example) uses the page's model, and none when it did not load:
        # the replay needs one only to recompute gravity for settings the run did not use
        lm = self.lm if isinstance(dec, runner.TraceRun) else dec.lm
        model = None if lm is None else lm.model
        with guard("the what-if replay") as err:
            if model is not None and not self._gravity_first(tr, model, dec.hidden):
                return  # gravity is being recomputed: the page draws the recorded views
            self.wi = whatif.cached(
                self.sess.replay_memo, tr, self.params, model=model, hidden=dec.hidden
            )
        if err:
            self.whatif_failed = key

    def _gravity_first(self, tr, model, hidden) -> bool:
        """True when the gravity these sliders use is at hand: the record holds it, or a
        ``GravityTask`` recomputed it with the model. Otherwise that task runs on the one
        runner (a few steps a unit, each in the model's line), and the page draws the recorded
        views meanwhile with the task's progress (:func:`gravity_panel`); its end reruns the
        page, whose replay then uses it. A slider moved meanwhile starts the task anew; while
        the run's own task decodes, none starts (the what-if waits for the run's end)."""
        sess, memo, p = self.sess, self.sess.replay_memo, self.params
        cache = memo.setdefault("gravity_cache", whatif.GravityCache())
        work.refresh(sess, (GRAVITY,))  # a task that ended meanwhile (on another page) is kept
        if not whatif.needs_new_gravity(tr, p) or cache.has(tr, p, hidden):
            memo.pop("gravity_key", None)  # a failed one is tried again when next needed
            return True
        if runner.job(sess) is not None:  # the run grows a token at a time: gravity waits for
            return False  # its end, which reruns the page (the old gravity would be redone)
        self.gravity_pending = True
        key = cache.key(tr, p, hidden)
        if memo.get("gravity_key") == key:  # the task for these sliders runs, or failed
            return False
        memo["gravity_key"] = key

        def keep(task: GravityTask, error: str | None) -> None:
            if task.finished and not task.stopped and error is None:
                cache.put(tr, p, hidden, task.result())

        work.start(sess, GRAVITY, GravityTask(model, tr, p, hidden), on_tick=keep)
        return False

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

    def taken(self, i: int) -> int:
        """Token id step ``i`` takes under the current sliders (a what-if can take a token
        outside the recorded candidates, whose candidate index is then -1)."""
        if self.wi is not None and i < len(self.wi.token_ids):
            return int(self.wi.token_ids[i])
        return int(self.steps[i].token_id)

    def result(self, i: int):
        """The what-if ``PruneResult`` of step ``i`` (None: use the recorded values)."""
        if self.wi is None or i >= len(self.wi.results):
            return None
        return self.wi.results[i]

    def labels(self, ids) -> list[str]:
        """Token texts for ids (the model's tokenizer)."""
        dec = self.decoder
        lm = self.lm
        if lm is None and dec is not None and not isinstance(dec, runner.TraceRun):
            lm = dec.lm
        if lm is None:
            return [str(int(i)) for i in ids]
        return token_texts(lm.tokenizer, tuple(int(i) for i in ids))

    def context_labels(self, positions) -> list[str]:
        """Token texts of original sequence positions (prompt + generated)."""
        tr = self.trace
        toks = [
            style.piece_text(t, tr.prompt_hex.get(str(i))) for i, t in enumerate(tr.prompt_tokens)
        ] + [style.piece_text(s.token_text, s.token_hex) for s in tr.steps]
        return [toks[int(p)] if int(p) < len(toks) else "?" for p in positions]


@lru_cache(maxsize=64)
def _tok_cache(tok_id: int):
    return {}


def token_texts(tokenizer, ids: tuple[int, ...]) -> list[str]:
    """Decode ids one by one, memoised per tokenizer; a piece of a character shows its bytes
    (``style.piece_text``), not the replacement character its decode alone gives."""
    memo = _tok_cache(id(tokenizer))
    out = []
    for i in ids:
        s = memo.get(i)
        if s is None:
            s = tokenizer.decode([i])
            if "\ufffd" in s:
                s = style.piece_text(s, token_hex(tokenizer, i))
            memo[i] = s
        out.append(s)
    return out


def context(
    title: str, *, icon: str = "", header: bool = True, sidebar: bool = True, run: bool = True
) -> PageContext:
    """Draw the page title and the shared header; return the page's context.

    ``header``: draw the long task's progress (with Stop), the status line (which ticks with
    the task) and the what-if banner here. Generate passes False and draws them itself,
    below its prompt and buttons and around its token strip, so the strip streams.
    An empty ``title`` draws none. ``sidebar``: draw the settings' widgets; without them the
    page still reads the settings and the link (Presenter, which has no sidebar).
    ``run``: the page shows the session's run. A page that decodes on its own (Compare, Does
    it help?) passes False: it draws no status line or what-if banner, which speak of that
    run (a "No run yet" there reads as if the page needed one), and computes no what-if
    (``ctx.wi`` stays None); a task's progress still shows.
    """
    if title:
        st.title(f"{icon} {title}".strip())
    from ui import controls

    settings = controls.sidebar() if sidebar else controls.settings()
    server.apply_upload_limit()  # follows the server's settings file as it changes
    sess = session(st.session_state)
    work.refresh(sess, (runner.RUN, runner.GHOST))  # the run as its task has made it by now
    lm = None
    with guard("loading the model", show=False) as err:
        lm = get_model(settings.model_name())
    if err:
        st.error(err[0] + " The current run is kept.", icon=":material/error:")
        lm = (
            None
            if sess.decoder is None or isinstance(sess.decoder, runner.TraceRun)
            else sess.decoder.lm
        )
    params = None
    with guard("the sampling settings") as err2:
        params = settings.prune_params()
    runner.follow(sess, params)  # a task decoding the run takes the sliders as they are now
    ctx = PageContext(settings=settings, sess=sess, lm=lm, params=params, wi=None)
    open_link(ctx)
    if runner.job(sess) is not None:  # e.g. the linked run: the full run at its end shows
        nav.keep_link_notes(st.session_state)  # the link's notes again (taken by the sidebar)
    messages(ctx)
    if header:  # the status line streams with the task's ticks, its step count with them
        job_panel(ctx, body=(lambda: status_line(ctx)) if run else None)
    share_url(ctx)
    if run:  # a page that does not show the run has no use for its what-if replay
        ctx.update_whatif()
        gravity_panel(ctx)
    if header and run and not err2:
        whatif_banner(ctx)
    return ctx


def messages(ctx: PageContext) -> None:
    """The session's last error and notice (each shown once, until the next action)."""
    sess = ctx.sess
    if sess.error:
        st.error(sess.error, icon=":material/error:")
    if sess.notice:
        st.info(sess.notice, icon=":material/info:")
        sess.notice = None


def open_link(ctx: PageContext) -> None:
    """On a session's first run: a link with ``steps`` regenerates that many steps with the
    link's settings (a job, so the page stays usable), then selects the link's ``step``."""
    sess = ctx.sess
    if sess.link.read:
        return
    sess.link.read = True
    qp = st.query_params
    sess.link.step = url_count("step", qp.get("step"))
    want = url_count("steps", qp.get("steps"))
    if sess.decoder is not None or ctx.lm is None or ctx.params is None:
        return
    notes: list[str] = []
    recorded, takes = read_run_query(qp, ctx.settings, ctx.lm.model.config.vocab_size, notes)
    if takes and not want:
        want = max(takes) + 1
    sess.link.steps = want
    if not want:
        return
    try:
        runner.start(sess, ctx.settings, "reproduce", want, takes=takes, sample_params=recorded)
        what = "a branch of the run" if takes else "a run"
        at = " recorded at other sliders than the link shows" if recorded is not None else ""
        sess.notice = " ".join(
            [
                f"This link carries {what} of {want} steps{at}: regenerating it with the link's "
                "settings (same seed, same tokens).",
                *notes,
            ]
        )
    except Exception as exc:  # shown by the header; nothing to lose yet
        sess.error = report(exc, "reproducing the linked run")


def job_panel(ctx: PageContext, body=None, *, stop: bool = True) -> None:
    """The run's task (and the what-if ghost's) on the one panel of ``ui.work``: progress,
    an estimate, the place in the model's line and Stop, with ``body()`` (the status line,
    Generate's token strip) drawn inside it, so it streams while the task runs.

    ``stop``: draw Stop beside the progress (Generate draws it among its own buttons)."""
    if stop and runner.job(ctx.sess) is not None:
        stop_button(ctx.sess)
    work.panel(ctx.sess, (runner.RUN, runner.GHOST), body, stop=False)


def stop_button(sess: SessionData, where=st, label: str = "Stop", width="stretch") -> None:
    """Stop (or Pause) for the run's task; drawn outside the panel (``work.stop_button``)."""
    where.button(
        label,
        key="job_stop",
        on_click=runner.stop,
        args=(sess,),
        width=width,
        help="Stop after the token being decoded; everything made so far is kept.",
    )


def current_settings() -> Settings:
    """The settings as the widgets hold them now (for callbacks, which run before the page
    reads the sidebar); fields whose widget was not drawn come from the stored settings."""
    from dataclasses import fields

    state = st.session_state
    stored = state.get("settings") or Settings()
    vals = {}
    for f in fields(Settings):
        key = "s_" + f.name
        vals[key] = state[key] if key in state else getattr(stored, f.name)
    return Settings.from_state(vals)


def share_url(ctx: PageContext) -> None:
    """Keep the URL's query string equal to the settings, the run's length and its step.

    A copied link therefore reopens the same settings (``Settings.from_query_params`` reads
    them on a session's first run) and, through ``steps``, the same run (``open_link``).
    The link's ``step`` is selected once the run has that many steps.
    """
    sess = ctx.sess
    follow_history(sess)
    want = sess.link.step
    if want is not None and len(ctx.steps) > want and runner.job(sess) is None:
        sess.selected, sess.link.step = want, None
        want = None
    n = len(ctx.steps)
    pending = sess.link.steps
    if pending is not None and (n >= pending or runner.job(sess) is None):
        sess.link.steps = pending = None
    qp = ctx.settings.to_query_params()
    steps = max(n, pending or 0)
    j = runner.job(sess)
    if j is not None and j.target:  # a reload during the task reproduces all it will make
        steps = max(steps, j.target)
    if steps:
        qp["steps"] = str(steps)
    if steps and ctx.decoder is not None:
        qp.update(run_query(ctx.decoder.params, ctx.params, runner.branch_tokens(sess)))
    step = sess.selected if ctx.steps else None
    step = want if want is not None else step
    if step is not None:
        qp["step"] = str(step)
    if st.query_params.to_dict() != qp:
        st.query_params.from_dict(qp)
    sess.link.written = qp


def follow_history(sess: SessionData) -> None:
    """Back and Forward in the browser: an address that differs from the one this page wrote
    only in ``step`` selects that step (each selection is a history entry)."""
    last, now = sess.link.written, st.query_params.to_dict()
    if last is None or now == last:
        return

    def rest(q: dict) -> dict:
        return {k: v for k, v in q.items() if k != "step"}

    if rest(now) == rest(last):
        sess.selected = url_count("step", now.get("step"))


def status_line(ctx: PageContext, *, here: bool = False) -> None:
    """One line about the run: model, prompt, steps, branch, where it came from.

    ``here``: the page with the prompt and the Step button (Generate)."""
    dec = ctx.decoder
    if dec is None:
        if here:
            st.caption("No run yet: type a prompt above and press **Step** or **Run**.")
        else:
            st.caption("No run yet: open **Generate**, type a prompt and press **Step**.")
        return
    tr = ctx.trace
    bits = [
        f"model **{escape.markdown(tr.model.get('name', '?'))}**",
        f"{len(tr.prompt_ids)} prompt tokens",
        f"**{len(tr.steps)}** steps",
    ]
    bs = runner.branches(ctx.sess)
    if len(bs) > 1:
        bits.append(f"branch {runner.current_branch(ctx.sess)} of {len(bs) - 1}")
    if isinstance(dec, runner.TraceRun) and dec.source:
        bits.append(f"recorded run **{escape.markdown(dec.source)}** (no model run)")
    j = runner.job(ctx.sess)
    if j is not None:
        bits.append("working…")
    elif dec.done:
        bits.append(f"stopped: {dec.stop_reason}")
    st.caption(" · ".join(bits))
    if runner.is_stale(ctx.sess, ctx.settings) and j is None:
        st.info(
            "The prompt, model, seed or cache policy changed: the next **Step** starts a new run. "
            "The views below still show the current run.",
            icon=":material/info:",
        )


def gravity_panel(ctx: PageContext) -> None:
    """The progress of the gravity the what-if waits for (``PageContext._gravity_first``), or
    the error that ended it; nothing once it is at hand."""
    if not ctx.gravity_pending:
        return
    s = work.slot(ctx.sess, GRAVITY)
    if s is not None and s.task is not None and s.task.finished:
        st.rerun()  # it ended before this run could draw it: the page catches up at once
    work.panel(ctx.sess, GRAVITY, stop=False)


def params_changed(ctx: PageContext) -> bool:
    dec = ctx.decoder
    return dec is not None and ctx.params is not None and dec.params != ctx.params


def _model_part(wi: whatif.WhatIf) -> str:
    """What of a what-if ran the model: nothing, or the gravity its settings asked for."""
    return "gravity recomputed with the model" if wi.model_gravity else "no model run"


def recorded_vs_viewing(recorded: PruneParams, viewing: PruneParams) -> str:
    """ "recorded at temperature 0.8, viewing at 1.1": the sliders that differ, both ways."""
    from ui.state import PARAM_FIELDS, spec_of

    names = [n for n in PARAM_FIELDS if getattr(recorded, n) != getattr(viewing, n)]

    def shown(v) -> str:
        return (
            ("on" if v else "off")
            if isinstance(v, bool)
            else f"{v:g}"
            if isinstance(v, float)
            else str(v)
        )

    rec = ", ".join(f"{spec_of(n).label or n} {shown(getattr(recorded, n))}" for n in names)
    view = ", ".join(shown(getattr(viewing, n)) for n in names)
    return f"recorded at {rec}, viewing at {view}"


def whatif_banner(ctx: PageContext) -> None:
    """When the sliders differ from the run's, say so and offer to regenerate from the first
    changed step (the token strip shows the continuation as ghost text)."""
    wi = ctx.wi
    if wi is None or not params_changed(ctx):
        return
    both = recorded_vs_viewing(ctx.decoder.params, ctx.params)  # labels and numbers only
    if wi.first_diff is None:
        text = (
            f"What-if ({both}): the sliders moved after generation. Replaying the {wi.n} recorded steps "
            f"through the core ({1e3 * wi.seconds:.0f} ms, {_model_part(wi)}) changes no choice."
        )
        if wi.n_approximate:
            # the record cannot decide these picks, so "no change" there is an estimate too
            why = next(w for w in wi.why if w is not None)
            text += (
                f" {wi.n_approximate:,} of the {wi.n:,} picks "
                f"{'is an estimate' if wi.n_approximate == 1 else 'are estimates'} (≈): "
                f"{escape.markdown(why)}."
            )
        st.success(text, icon=":material/replay:")
    else:
        k = wi.first_diff
        pick = first_pick(ctx)
        old = escape.markdown(style.step_token(ctx.steps[k]))
        new = escape.markdown(pick.label)
        replayed = f"replayed {wi.n} steps in {1e3 * wi.seconds:.0f} ms, {_model_part(wi)}"
        guess = escape.markdown(display_token(ctx.labels([wi.token_ids[k]])[0]))
        if pick.decoded and pick.token_id == ctx.trace.token_ids[k]:
            what = (
                f"the model's decode below keeps **{old}** at step **{k}**, where the replay "
                f"of the record estimated **{guess}** ({replayed})"
            )
        elif pick.decoded and pick.token_id != wi.token_ids[k]:
            what = (
                f"with these sliders step **{k}** would pick **{new}** instead of **{old}**: "
                f"the model's decode below picks it, where the replay of the record estimated "
                f"**{guess}** ({replayed})"
            )
        elif pick.decoded:
            what = (
                f"with these sliders step **{k}** would pick **{new}** instead of **{old}** "
                f"({replayed}; the model's decode below picks it too)"
            )
        elif pick.why is not None:
            what = (
                f"with these sliders step **{k}** would pick **≈ {new}** instead of "
                f"**{old}** ({replayed}). An estimate: {escape.markdown(pick.why)}; the "
                "model's decode below shows its real pick"
            )
        else:
            what = (
                f"with these sliders step **{k}** would pick **{new}** instead of **{old}** "
                f"({replayed})"
            )
        c1, c2 = st.columns([3, 1], vertical_alignment="center")
        c1.warning(
            f"What-if ({both}): {what}. Views show the replay; steps from the marked one on are "
            "counterfactual.",
            icon=":material/alt_route:",
        )
        c2.button(
            f"Regenerate from step {k}",
            key="regen_from",
            type="primary",
            on_click=_regenerate,
            args=(ctx.sess, ctx.settings, k),
            disabled=runner.job(ctx.sess) is not None,
            help="A new branch from this step with the current sliders, decoded as far as the "
            "run went; the recorded branch is kept.",
        )
    if wi.note:
        st.caption(wi.note)


@dataclass(frozen=True)
class FirstPick:
    """The what-if's pick at its first changed step, as the banner and the ghost text show it.

    ``decoded``: the ghost decode (a real model run) has made it, so it is the truth; else it
    is the replay's pick, an estimate where ``why`` says what the record cannot decide."""

    token_id: int
    label: str
    decoded: bool
    why: str | None


def first_pick(ctx: PageContext) -> FirstPick | None:
    """The pick at ``ctx.first_diff``: the ghost's first token once decoded under the current
    sliders, else the replay's (exact unless ``why``)."""
    wi, k = ctx.wi, ctx.first_diff
    if wi is None or k is None:
        return None
    g = ctx.sess.ghost
    if g is not None and g.at == k and g.params == ctx.params and g.tokens:
        t = int(g.tokens[0])
        return FirstPick(t, display_token(ctx.labels([t])[0]), True, None)
    t = int(wi.token_ids[k])
    why = wi.why[k] if k < len(wi.why) else None
    return FirstPick(t, display_token(ctx.labels([t])[0]), False, why)


def _regenerate(sess: SessionData, settings: Settings, k: int) -> None:
    sess.error = None
    try:
        runner.regenerate_from(sess, settings, k)
    except Exception as exc:  # shown by the header; the run is kept
        sess.error = report(exc, "Regenerate")


def step_selector(ctx: PageContext, *, key: str = "step_sel") -> int | None:
    """A slider over the recorded steps, shared by every page through ``sess.selected``."""
    n = len(ctx.steps)
    if n == 0:
        return None
    if n == 1:  # nothing to choose; the selection still follows the tokens to come
        return 0

    def _moved():
        v = st.session_state[key]
        ctx.sess.selected = None if v == n - 1 else int(v)

    st.session_state[key] = ctx.selected
    st.slider(
        "Selected step",
        0,
        n - 1,
        key=key,
        on_change=_moved,
        help="Every view on every page shows this step. The last step follows new tokens.",
    )
    return ctx.selected


def need_trace(ctx: PageContext) -> bool:
    """Show a hint and return False when there is nothing recorded yet."""
    if ctx.steps:
        return True
    st.info(
        "Nothing generated yet: go to **Generate** and press **Step** or **Play**.",
        icon=":material/arrow_forward:",
    )
    if ctx.lm is not None:
        from ui import nav

        st.page_link(nav.GENERATE, label="Open Generate", icon=":material/play_arrow:")
    return False
