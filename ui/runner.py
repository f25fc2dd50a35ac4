"""The session's run: build, step, rewind, branch, and the long work that decodes it.

Long work on the run (Step while the prefill runs, Run N, Play, Regenerate, a branch,
reproducing a linked run, continuing an example) is a :class:`RunTask`, a
``semviz.tasks.DecodeTask`` run by ``ui.work`` as the session's ``run`` task: its thread is
the only writer of the run's decoder while it runs, and the pages draw the copy of the trace
it keeps after each token (``SessionData.view``). So a page never waits for the model, and
no lock guards the run while a page draws. What changes the run from a click (a single Step,
Rewind, Reset, switching branches, starting a task) runs in the page's own thread, under the
session's lock (:func:`exclusive`), and is refused with a message while a task runs (press
Stop first); Step clicks made while a Step task runs are added to it, not lost. A Step or a
branch click then waits up to ``STEP_WAIT`` for its task, so that short work (a first token,
a branch of a few tokens) is drawn by the click's own run rather than a tick later.

Branches: clicking an alternative token (or regenerating from a step) forks the current
decoder (``Decoder.fork``: the cache tensors are shared, nothing is re-fed) and switches to
the fork; the old branch stays in ``branches(sess)`` and switching back is instant. With a KV
eviction policy the fork is re-fed token by token instead (one forward per kept step), since
the policy's state depends on every step's attention.

The what-if ghost (the real continuation under moved sliders) is the session's ``ghost``
task, decoding a fork of its own.

Nothing here touches the shared model beyond reading it: every session's ``Decoder`` owns
its cache and seeded generator, so sessions stepping at once never see each other. Model work
takes its turn in the server's one queue (``server.model_turn``; decode steps through
``server.step``, which can share a forward between sessions). A failed build (empty prompt,
unknown model, prompt too long) raises a user error when the task is started and leaves the
session's current run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from semviz.decoding.decoder import Decoder, DecodeSettings, encode_prompt, token_hex
from semviz.eviction import make_policy
from semviz.output import escape
from semviz.output.style import display_token, piece_text, step_token
from semviz.output.trace import Trace
from semviz.sampling import PruneParams
from semviz.tasks import DecodeTask, Edit, Recipe
from ui import server, work
from ui.model import get_model
from ui.state import SessionData, Settings

WAIT_SECONDS = 10.0  # how long a click waits for the change in progress
STEP_WAIT = 1.0  # how long a Step or branch click waits for its task (a longer one: panel)
MAX_BRANCHES = 8  # branches kept per run (each holds its own KV cache)
GHOST_TOKENS = 24  # what-if continuation decoded for the ghost text
RUN, GHOST = "run", "ghost"  # the session's tasks in ``ui.work``


class Busy(RuntimeError):
    """The session is busy with other decoder work; the message is one sentence."""


# -- the session's lock, for the changes a click makes ---------------------------------------------


@contextlib.contextmanager
def exclusive(sess: SessionData, wait: float = WAIT_SECONDS) -> Iterator[None]:
    """Hold the session's lock for a change to its run; ``Busy`` if another action keeps it
    for ``wait`` s."""
    lk = sess.lock
    if not lk.acquire(timeout=wait):
        raise Busy("Still working on the previous action: this click was not applied.")
    try:
        yield
    finally:
        lk.release()


# -- a recorded run without a model ---------------------------------------------------------------


class TraceRun:
    """A saved trace shown as the session's run, without a model: what an example opens as.

    It has the read-only face of a ``Decoder`` (``trace``, ``params``, ``n_steps``, ``done``,
    ``stop_reason``, ``lm``, ``hidden``). ``lm`` loads the shared model only when a view asks
    for it (gravity recomputed for other settings); stepping on from it is a job that re-feeds
    the recorded tokens first (see :func:`start`).
    """

    eviction = None
    hidden = None

    def __init__(self, trace: Trace, source: str = "", model_name: str = "") -> None:
        self.trace = trace
        self.source = source
        self.model_name = model_name
        self.params = PruneParams.from_dict(dict(trace.settings.get("params", {})))
        s = trace.settings
        self.settings = DecodeSettings(seed=int(s.get("seed", 0)), chat=s.get("chat"))
        self.prompt = trace.prompt
        self.prompt_ids = list(trace.prompt_ids)

    @property
    def n_steps(self) -> int:
        return len(self.trace.steps)

    @property
    def done(self) -> bool:  # a recorded run that hit its step limit can go on
        return self.trace.stop_reason == "eos"

    @property
    def stop_reason(self) -> str | None:
        return self.trace.stop_reason if self.done else None

    @property
    def lm(self):
        return get_model(self.model_name)


def settings_for_trace(trace: Trace, base: Settings) -> Settings:
    """``base`` with the prompt, chat template, seed and sliders the trace was made with."""
    from dataclasses import replace

    p = PruneParams.from_dict(dict(trace.settings.get("params", {})))
    chat = trace.settings.get("chat")
    return replace(
        base.with_params(p),
        prompt=trace.prompt,
        chat=base.chat if chat is None else bool(chat),
        seed=int(trace.settings.get("seed", 0)),
        preset="custom",
    )


def open_trace(sess: SessionData, settings: Settings, trace: Trace, source: str) -> None:
    """Show ``trace`` as the session's run (no model run); ``settings`` are the trace's own."""
    stop(sess, quiet=True)
    with exclusive(sess):
        _set_root(sess, TraceRun(trace, source, settings.model_name()), settings.run_key())


# -- building and stepping -------------------------------------------------------------------------


def builder(settings: Settings, params: PruneParams | None = None) -> Callable[[], Decoder]:
    """What builds a fresh decoder for ``settings`` (its prefill runs the model, so call it in
    a model turn). The prompt, model and cache policy are checked now: user errors raise
    here, before any task starts."""
    lm = get_model(settings.model_name())
    policy = (
        None
        if settings.kv_policy == "none"
        else make_policy(settings.kv_policy, budget=int(settings.kv_budget))
    )
    steps = server.config().cap_steps(settings.max_new_tokens)
    dec_settings = DecodeSettings(seed=int(settings.seed), max_new_tokens=steps, chat=settings.chat)
    ids = server.check_prompt(encode_prompt(lm, settings.prompt, settings.chat))
    params = settings.prune_params() if params is None else params
    return lambda: Decoder(
        lm, settings.prompt, params, dec_settings, eviction=policy, prompt_ids=ids
    )


def build_decoder(settings: Settings, params: PruneParams | None = None) -> Decoder:
    """A fresh decoder for ``settings`` (prefill included). Raises user errors."""
    make = builder(settings, params)
    with server.model_turn():
        return make()


def needs_build(sess: SessionData, settings: Settings) -> bool:
    """True when the next step must build a decoder (no run, a new prompt/seed/model, or an
    example shown without a model)."""
    return (
        sess.decoder is None
        or sess.run_key != settings.run_key()
        or isinstance(sess.decoder, TraceRun)
    )


def is_stale(sess: SessionData, settings: Settings) -> bool:
    """True when the next step would start a new run (prompt, model, seed… changed)."""
    return sess.decoder is not None and sess.run_key != settings.run_key()


def ensure_decoder(sess: SessionData, settings: Settings) -> Decoder:
    """The session's decoder, rebuilt when the prompt, model, seed or cache policy changed.

    An example shown without a model is re-fed here in one go; the pages use a task instead
    (:func:`start`) so that the re-feed shows its progress.
    """
    with exclusive(sess):
        if needs_build(sess, settings):
            forced = _example_tokens(sess, settings)
            dec = build_decoder(settings, _forced_params(sess, forced))  # raises first
            with server.model_turn() as turn:
                for t in forced:
                    dec.step(force_token=t)
                    turn.let_others()
            _set_root(sess, dec, settings.run_key())
        return sess.decoder


def step(sess: SessionData, settings: Settings, n: int = 1) -> int:
    """Decode up to ``n`` tokens with the current sliders; returns how many were made."""
    _refuse_while_running(sess)
    dec = ensure_decoder(sess, settings)
    with exclusive(sess):
        dec.params = settings.prune_params()
        made = 0
        while made < n and server.step(dec) is not None:  # shares forwards with other sessions
            made += 1
        sess.selected = None
    return made


def reset(sess: SessionData, settings: Settings) -> None:
    """Start over: a new decoder from the current settings (prefill only)."""
    make = builder(settings)  # a user error leaves the run and its task as they are
    stop(sess, quiet=True)
    with exclusive(sess):
        with server.model_turn():
            dec = make()
        _set_root(sess, dec, settings.run_key())


def rewind(sess: SessionData, settings: Settings, k: int) -> None:
    """Keep the first ``k`` steps; the next step continues with the current sliders."""
    _refuse_while_running(sess)
    with exclusive(sess):
        dec = sess.decoder
        if dec is None:
            return
        if isinstance(dec, TraceRun):
            tr = dec.trace
            cut = Trace(**{**vars(tr), "steps": tr.steps[: int(k)], "stop_reason": None})
            dec.trace = cut
        else:
            with server.model_turn():  # with eviction, rewinding re-feeds the kept steps
                dec.rewind(int(k), settings.prune_params())
        sess.selected = None
        sess.replay_memo.pop("whatif", None)
        ghost_stop(sess)


def _set_root(sess: SessionData, dec: Any, run_key: tuple) -> None:
    sess.decoder, sess.run_key = dec, run_key
    sess.selected = None
    sess.branches, sess.branch = [Branch(dec, None, 0, "the run")], 0
    sess.replay_memo.pop("whatif", None)
    ghost_stop(sess)


def _example_tokens(sess: SessionData, settings: Settings) -> list[int]:
    """The recorded tokens to re-feed when an example (no model) is continued."""
    dec = sess.decoder
    if isinstance(dec, TraceRun) and sess.run_key == settings.run_key():
        return list(dec.trace.token_ids)
    return []


def _forced_params(sess: SessionData, forced: list[int]) -> PruneParams | None:
    return sess.decoder.params if forced else None


# -- branches --------------------------------------------------------------------------------------


@dataclass
class Branch:
    """One line of the run: its decoder, the branch it left and at which step."""

    decoder: Any
    parent: int | None
    at: int
    note: str


def branches(sess: SessionData) -> list[Branch]:
    """The session's branches (the first is the run itself); kept in step with ``decoder``."""
    bs, i = sess.branches, sess.branch
    if not bs or i >= len(bs) or bs[i].decoder is not sess.decoder:
        bs = [Branch(sess.decoder, None, 0, "the run")] if sess.decoder is not None else []
        sess.branches, sess.branch = bs, 0
    return bs


def current_branch(sess: SessionData) -> int:
    branches(sess)
    return sess.branch


def switch_branch(sess: SessionData, i: int) -> None:
    """Show branch ``i``; instant (its decoder and cache were kept)."""
    _refuse_while_running(sess)
    with exclusive(sess):
        bs = branches(sess)
        if not 0 <= i < len(bs):
            raise ValueError(f"There is no branch {i}.")
        sess.branch = i
        sess.decoder = bs[i].decoder
        sess.selected = bs[i].at if bs[i].at < bs[i].decoder.n_steps else None
        sess.replay_memo.pop("whatif", None)
        ghost_stop(sess)


def _add_branch(sess: SessionData, dec: Any, at: int, note: str) -> None:
    bs = branches(sess)
    parent = current_branch(sess)
    bs.append(Branch(dec, parent, at, note))
    while len(bs) > MAX_BRANCHES:  # drop the oldest branch that is not the run itself
        del bs[1]
        for b in bs:
            b.parent = None if b.parent is None else max(0, b.parent - 1)
        sess.notice = f"Only the last {MAX_BRANCHES} branches are kept; the oldest was dropped."
    sess.branch = len(bs) - 1
    sess.decoder = dec
    sess.replay_memo.pop("whatif", None)
    ghost_stop(sess)


def _fork_at(sess: SessionData, settings: Settings, k: int) -> tuple[Any, list[int], bool]:
    """The decoder of a new branch at step ``k``: (decoder, tokens to re-feed, build first).

    Without eviction: a fork of the current decoder rewound to ``k`` (the cache is cropped,
    nothing is re-fed). With eviction, or from an example: the first ``k`` steps shown as a
    recorded run until the task has built a fresh decoder (prefill) and re-fed them, one
    forward per token (the eviction policy's state depends on every step).
    """
    cur = sess.decoder
    if isinstance(cur, TraceRun) or cur.eviction is not None:
        tr = cur.trace
        kept = Trace(**{**vars(tr), "steps": tr.steps[:k], "stop_reason": None})
        return TraceRun(kept, "", settings.model_name()), list(tr.token_ids[:k]), True
    dec = cur.fork()
    _rewind_in_turn(dec, k, settings.prune_params())
    return dec, [], False


def _rewind_in_turn(dec: Decoder, k: int, params: PruneParams) -> None:
    """``dec.rewind(k, params)``, in a model turn when that runs the model (back to the
    prompt: a new prefill); cropping the cache to a later step runs none."""
    if k > 0 and dec.eviction is None:
        dec.rewind(k, params)
        return
    with server.model_turn():
        dec.rewind(k, params)


def branch_from(sess: SessionData, settings: Settings, k: int, token_id: int) -> None:
    """Take ``token_id`` at step ``k`` instead and decode on to the old length (a task)."""
    _refuse_while_running(sess)
    with exclusive(sess):
        cur = sess.decoder
        if cur is None or not 0 <= k < cur.n_steps:
            raise ValueError(f"There is no step {k} to branch from.")
        old = cur.trace.steps[k]
        if int(token_id) == old.token_id:
            raise ValueError(f"Step {k} already took that token.")
        n_old, base = cur.n_steps, cur.params
        make = builder(settings, base) if _refed(cur) else None  # user errors first
        dec, forced, build = _fork_at(sess, settings, k)
        label = _label(cur, token_id)
        _add_branch(sess, dec, k, f"{display_token(label)} at step {k} (was {step_token(old)})")
        sess.selected = k
        shown = escape.markdown(display_token(label))  # the label is shown as markdown
        _begin(
            sess,
            RunTask(
                "branch",
                decoder=None if build else dec,
                build=make,
                recipe=Recipe(base, (Edit(k, token=int(token_id)),)),
                refeed=forced,
                sample=n_old - k,
                params=settings.prune_params(),
                label=f"Branching at step {k} with {shown}",
                select=k,
            ),
        )
    work.wait(sess, RUN, STEP_WAIT)  # a short branch is drawn whole by the click's own run


def regenerate_from(sess: SessionData, settings: Settings, k: int, n: int | None = None) -> None:
    """A new branch: rewind to step ``k`` with the current sliders and decode ``n`` steps
    (default: as many as there were), as a task. The old branch is kept; a ghost
    continuation already decoded for these sliders is taken over, not decoded again."""
    _refuse_while_running(sess)
    with exclusive(sess):
        cur = sess.decoder
        if cur is None:
            return
        total = cur.n_steps
        k = max(0, min(int(k), total))
        n = max(1, total - k) if n is None else int(n)
        params = settings.prune_params()
        g = sess.ghost
        if g is not None and g.at == k and g.params == params and g.taken_over():
            dec, forced, build, make = g.task.decoder, [], False, None
        else:
            make = builder(settings, cur.params) if _refed(cur) else None
            dec, forced, build = _fork_at(sess, settings, k)
        made = dec.n_steps - k if not build else 0
        _add_branch(sess, dec, k, f"regenerated from step {k}")
        sess.selected = k
        _begin(
            sess,
            RunTask(
                "regenerate",
                decoder=None if build else dec,
                build=make,
                recipe=Recipe(cur.params),
                refeed=forced,
                sample=max(0, n - made),
                params=params,
                label=f"Regenerating from step {k}",
                select=k,
            ),
        )


def _refed(dec: Any) -> bool:
    """A branch of ``dec`` is a fresh decoder that re-feeds the steps before it."""
    return isinstance(dec, TraceRun) or dec.eviction is not None


def branch_tokens(sess: SessionData) -> tuple[int, list[int]] | None:
    """The branch on show as a link carries it: the first step where its tokens leave the
    run's (the steps before it are the seed's, as the run's are) and its tokens from there;
    None for the run itself."""
    bs = branches(sess)
    if sess.branch == 0 or len(bs) < 2:
        return None
    mine, root = sess.decoder.trace.token_ids, bs[0].decoder.trace.token_ids
    k = next((i for i, (a, b) in enumerate(zip(mine, root, strict=False)) if a != b), None)
    if k is None:  # a prefix of the run, or the run and more: nothing to take
        return None
    return k, list(mine[k:])


def _label(dec: Any, token_id: int) -> str:
    try:
        tok = dec.lm.tokenizer
        return piece_text(tok.decode([int(token_id)]), token_hex(tok, int(token_id)))
    except Exception:
        return str(token_id)


# -- the run's task --------------------------------------------------------------------------------


class RunTask(DecodeTask):
    """A ``DecodeTask`` as Generate runs it.

    ``kind``: step, run, play, reproduce, branch or regenerate. ``select``: the step to select
    when it ends. ``target``: the run's length once it is done, for a link written while it
    runs (a reload reproduces all it will make). ``live``: new tokens follow the sliders as
    they move (not for a link, which follows the settings it was recorded at).
    ``run_key``: the settings a decoder it builds is for.
    """

    def __init__(
        self,
        kind: str,
        *,
        select: int | None = None,
        target: int | None = None,
        live: bool = True,
        run_key: tuple | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.kind, self.select, self.target, self.live = kind, select, target, live
        self.run_key = run_key
        self.installed = self.decoder is not None  # the session shows its decoder
        self.quiet = False  # stopped by Reset or a new run: nothing to tell

    def extend(self, n: int) -> bool:
        if not super().extend(n):
            return False
        self.target = None if self.target is None else self.target + int(n)
        return True


def job(sess: SessionData) -> RunTask | None:
    """The session's running task on its run (None when there is none)."""
    return work.task(sess, RUN)


def _refuse_while_running(sess: SessionData) -> None:
    """A click's change to the run waits for no task: it is refused while one runs, and
    acts on the run an ended one made (kept here, as the click's callback comes before the
    page's refresh)."""
    work.keep_ended(sess, RUN)
    if job(sess) is not None:
        raise Busy("A run is in progress: press Stop first.")


def start(
    sess: SessionData,
    settings: Settings,
    kind: str,
    n: int | None,
    *,
    takes: dict[int, int] | None = None,
    sample_params: PruneParams | None = None,
) -> None:
    """Start Step (``n`` 1: a first Step, whose prefill is a task) / Run ``n`` / Play (``n``
    None) / reproduce ``n`` steps of a link, as a task.

    Builds the decoder first when needed (its prefill is the task's first unit), and re-feeds
    an example's recorded tokens before sampling new ones. A link's run takes ``takes``
    (step -> token: a branch's tokens) where it would sample, and samples with
    ``sample_params`` (the settings it was recorded at) instead of the sliders.
    """
    _refuse_while_running(sess)
    with exclusive(sess):
        build = needs_build(sess, settings)
        forced = _example_tokens(sess, settings) if build else []
        if not build and sess.decoder.done:
            raise ValueError(
                f"The run has stopped ({sess.decoder.stop_reason}): press Reset to start over."
            )
        labels = {
            "step": "Step",
            "run": f"Run {n}",
            "play": "Playing",
            "reproduce": "Reproducing the linked run",
        }
        label = labels.get(kind, kind)
        if forced:
            label = f"Continuing the example ({len(forced)} recorded tokens first)"
        sliders = settings.prune_params()
        base = sess.decoder.params if forced else (sample_params or sliders)
        make = builder(settings, base) if build else None  # user errors raise here
        edits = tuple(Edit(k, token=t) for k, t in sorted((takes or {}).items()))
        if kind == "play":  # Play ends at the run's length: a reload during it goes on to there
            cap = sess.decoder.settings.max_new_tokens if not build else None
            target = cap or server.config().cap_steps(settings.max_new_tokens)
        else:
            target = n + len(forced) + (0 if build else sess.decoder.n_steps)
        live = sample_params is None
        t = RunTask(
            kind,
            decoder=None if build else sess.decoder,
            build=make,
            recipe=Recipe(base, edits),
            refeed=forced,
            sample=n,
            params=sliders if live else None,
            label=label,
            target=target,
            live=live,
            run_key=settings.run_key(),
        )
        _begin(sess, t)
    if kind == "step":  # the first token is on screen with the click's own run
        work.wait(sess, RUN, STEP_WAIT)


def _begin(sess: SessionData, t: RunTask) -> None:
    ghost_stop(sess)
    work.start(sess, RUN, t, on_tick=lambda task, error: _keep(sess, task, error))


def _keep(sess: SessionData, t: RunTask, error: str | None) -> None:
    """After each rerun of the panel: the decoder the task built becomes the run (or the
    branch's), the pages draw the task's latest copy of the trace, and its end is told."""
    if not t.installed and t.decoder is not None:
        t.installed = True
        if t.kind in ("branch", "regenerate"):  # the fresh decoder replaces the placeholder
            branches(sess)[current_branch(sess)].decoder = t.decoder
            sess.decoder = t.decoder
        else:
            _set_root(sess, t.decoder, t.run_key)
    sess.view = t.latest if not t.finished and t.installed else None
    if not t.finished:
        return
    dec = t.decoder
    if error is not None:
        sess.error = error
        work.slot(sess, RUN).error = None  # shown once, by the page's header
    if dec is None:
        return
    sess.selected = t.select if t.select is not None and t.select < dec.n_steps else None
    if t.stopped and not t.quiet:
        sess.notice = f"{t.label}: stopped after {t.made} tokens; they are kept."
    elif dec.done and t.kind not in ("step", "play", "run") and not t.stopped:
        sess.notice = f"{t.label}: done ({dec.n_steps} steps, stopped: {dec.stop_reason})."


def follow(sess: SessionData, params: PruneParams | None) -> None:
    """The sliders as they are now, for the tokens a running task decodes next."""
    t = job(sess)
    if t is not None and t.live and params is not None:
        t.params = params


def add_step(sess: SessionData, n: int = 1) -> bool:
    """``n`` more tokens for a running Step task (True), so Steps clicked while the first
    click's prefill runs are queued, not lost; False when no Step task runs (one that has
    just taken its last token is waited for, so the click steps on from it)."""
    work.keep_ended(sess, RUN)
    s = work.slot(sess, RUN)
    t = job(sess)
    if t is None or t.kind != "step":
        return False
    if t.extend(n):
        return True
    if s.thread is not None:
        s.thread.join(WAIT_SECONDS)
    work.tick(s)  # its end is kept: the run is the one it made
    return False


def stop(sess: SessionData, *, quiet: bool = False) -> None:
    """Stop the run's task between two tokens; what it made is kept (and told, unless
    ``quiet``: Reset or a new run follows)."""
    t = job(sess)
    if t is not None:
        t.quiet = quiet
        work.stop(sess, RUN)


# -- what-if ghost text ---------------------------------------------------------------------------


@dataclass
class Ghost:
    """The real continuation under the current sliders from the first changed step ``at``,
    decoded for up to ``target`` tokens and shown as ghost text; the session's ``ghost``
    task decodes it.

    From a live run it is a fork rewound to ``at`` (nothing re-fed). From an example (no
    model yet) or under a KV eviction policy, a fresh decoder first re-feeds the ``at``
    recorded tokens with the run's own settings.
    """

    at: int
    params: PruneParams
    key: tuple
    task: DecodeTask | None
    target: int
    error: str | None = None  # why it could not be decoded (no model, bad settings)

    @property
    def trace(self) -> Trace | None:
        """The continuation's trace so far (a copy)."""
        return None if self.task is None else self.task.latest

    @property
    def refeeding(self) -> bool:
        t = self.task
        return t is not None and (t.decoder is None or bool(t.refeed))

    @property
    def tokens(self) -> list[int]:
        tr = self.trace
        if tr is None or self.refeeding:
            return []
        return tr.token_ids[self.at :]

    @property
    def complete(self) -> bool:
        return self.error is not None or self.task is None or self.task.finished

    def taken_over(self) -> bool:
        """Its decoder can become a branch: decoded from a fork, and done."""
        t = self.task
        return t is not None and t.finished and not self.refeeding and self.error is None


def ghost(
    sess: SessionData, settings: Settings, params: PruneParams, at: int | None
) -> Ghost | None:
    """The session's ghost continuation for the what-if first changed at step ``at`` (started
    afresh when the sliders or the run changed); None when there is nothing to show."""
    dec = sess.decoder
    if at is None or dec is None or at > dec.n_steps:
        ghost_stop(sess)
        return None
    key = (id(dec), id(dec.trace), dec.n_steps, at, params)
    g = sess.ghost
    if g is not None and g.key == key:
        return g
    ghost_stop(sess)
    target = min(GHOST_TOKENS, max(1, dec.n_steps - at))
    g = sess.ghost = Ghost(at, params, key, None, target)
    try:
        if _refed(dec):
            t = DecodeTask(
                build=builder(settings, dec.params),
                recipe=Recipe(dec.params),
                refeed=list(dec.trace.token_ids[:at]),
                sample=target,
                params=params,
                label="the what-if continuation",
            )
        else:
            with exclusive(sess):
                f = dec.fork()
                _rewind_in_turn(f, at, params)
            t = DecodeTask(f, Recipe(params), sample=target, label="the what-if continuation")
    except Exception as exc:  # the ghost says why; the run itself is not touched
        from ui.errors import report

        g.error = report(exc, "the what-if continuation")
        return g
    g.task = t
    work.start(sess, GHOST, t, on_tick=lambda task, error: _ghost_kept(g, error))
    return g


def _ghost_kept(g: Ghost, error: str | None) -> None:
    if error is not None:
        g.error = error


def ghost_stop(sess: SessionData) -> None:
    """The what-if continuation goes (its task stops, quietly): a new run, or no what-if."""
    work.stop(sess, GHOST)
    sess.ghost = None
