"""The session's decoder work: build, step, rewind, branch and long jobs, one at a time.

Every change to a session's decoder goes through here, under the session's lock. A decoder
step or rewind is itself atomic (``Decoder.transaction``): a Streamlit rerun that lands inside
it leaves the decoder as it was. The lock makes sure two script threads of one session (a
rerun requested while the previous run is still inside a step) never interleave: the second
click waits for the step in progress (up to ``WAIT_SECONDS``) and then runs, in order; if the
wait is longer it is refused with a message. Clicks that would start work while a long job
runs are refused with a message (press Stop first).

Long work (Run N, Play, Regenerate, a branch, reproducing a linked run, continuing an example)
is a ``Job``: the page's fragment calls :func:`tick` every half second (longer while many
jobs run), so the page stays usable and shows the progress. The first tick builds the decoder
if needed and decodes for about ``TICK_SECONDS``; then a background thread of the job decodes,
a token at a time under the session's lock, while the page is not drawing
(``ui.locks.page_lock``), and later ticks only hand it the current settings and draw. The
run's pace is then the model's, not that of the page's round trips, and a page never waits in
the model's line to draw (where the server shares forwards, ``SEMVIZ_BATCH_SESSIONS=1``, every
playing session has a token waiting whenever a forward starts, so their forwards go as one
batch). The thread stops when the job ends or the page stops ticking (a closed tab) for
``ORPHAN_SECONDS``; the job's place in the model's line shows in its progress.
Stop ends a job between two steps and keeps what it made.

Branches: clicking an alternative token (or regenerating from a step) forks the current
decoder (``Decoder.fork``: the cache tensors are shared, nothing is re-fed) and switches to
the fork; the old branch stays in ``branches(sess)`` and switching back is instant. With a KV
eviction policy the fork is re-fed token by token instead (one forward per kept step), since
the policy's state depends on every step's attention.

Nothing here touches the shared model beyond reading it: every session's ``Decoder`` owns
its cache and seeded generator, so sessions stepping at once never see each other. Model work
takes its turn in the server's one queue (``server.model_turn``; decode steps through
``server.step``, which can share a forward between sessions), a token at a time, within the
server's limits. A failed build (empty prompt, unknown model, prompt too long) raises a
user error and leaves the session's current run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from semviz.decoding.decoder import Decoder, DecodeSettings, encode_prompt, token_hex
from semviz.output import escape
from semviz.output.style import display_token, piece_text, step_token
from semviz.output.trace import Trace
from semviz.sampling import PruneParams
from ui import kv, server
from ui.errors import report
from ui.locks import WAIT_SECONDS, session_lock
from ui.model import get_model
from ui.state import SessionData, Settings

TICK_SECONDS = 0.35  # decode time per job tick; Stop waits at most this long
ORPHAN_SECONDS = 5.0  # a job's background decoding stops after this long without a tick
MAX_BRANCHES = 8  # branches kept per run (each holds its own KV cache)
GHOST_TOKENS = 24  # what-if continuation decoded for the ghost text


class Busy(RuntimeError):
    """The session is busy with other decoder work; the message is one sentence."""


# -- the session's lock --------------------------------------------------------------------------


@contextlib.contextmanager
def exclusive(sess: SessionData, wait: float = WAIT_SECONDS) -> Iterator[None]:
    """Hold the session's decoder lock; ``Busy`` if another action keeps it for ``wait`` s."""
    lk = session_lock(sess)
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
    with exclusive(sess):
        _stop_job(sess)
        _set_root(sess, TraceRun(trace, source, settings.model_name()), settings.run_key())


# -- building and stepping -------------------------------------------------------------------------


def build_decoder(settings: Settings, params: PruneParams | None = None) -> Decoder:
    """A fresh decoder for ``settings`` (prefill included). Raises user errors."""
    lm = get_model(settings.model_name())
    policy = kv.make_policy(settings.kv_policy, settings.kv_budget)
    steps = server.config().cap_steps(settings.max_new_tokens)
    dec_settings = DecodeSettings(seed=int(settings.seed), max_new_tokens=steps, chat=settings.chat)
    ids = server.check_prompt(encode_prompt(lm, settings.prompt, settings.chat))
    params = settings.prune_params() if params is None else params
    with server.model_turn():
        return Decoder(lm, settings.prompt, params, dec_settings, eviction=policy, prompt_ids=ids)


def prefill_message(settings: Settings) -> str:
    """What the prefill is about to do, for the spinner ("Prefilling 46 tokens…")."""
    try:
        lm = get_model(settings.model_name())
        n = len(encode_prompt(lm, settings.prompt, settings.chat))
    except Exception:  # the build itself reports the error
        return "Prefilling the prompt…"
    return f"Prefilling {n:,} prompt tokens…"


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

    An example shown without a model is re-fed here in one go; the pages use a job instead
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
    if job(sess) is not None:
        raise Busy("A run is in progress: press Stop first.")
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
    with exclusive(sess):
        dec = build_decoder(settings)
        _stop_job(sess)
        _set_root(sess, dec, settings.run_key())


def rewind(sess: SessionData, settings: Settings, k: int) -> None:
    """Keep the first ``k`` steps; the next step continues with the current sliders."""
    if job(sess) is not None:
        raise Busy("A run is in progress: press Stop first.")
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


def _set_root(sess: SessionData, dec: Any, run_key: tuple) -> None:
    sess.decoder, sess.run_key = dec, run_key
    sess.selected = None
    sess.branches, sess.branch = [Branch(dec, None, 0, "the run")], 0
    sess.replay_memo.pop("whatif", None)
    sess.ghost = None


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
    if job(sess) is not None:
        raise Busy("A run is in progress: press Stop first.")
    with exclusive(sess):
        bs = branches(sess)
        if not 0 <= i < len(bs):
            raise ValueError(f"There is no branch {i}.")
        sess.branch = i
        sess.decoder = bs[i].decoder
        sess.selected = bs[i].at if bs[i].at < bs[i].decoder.n_steps else None
        sess.replay_memo.pop("whatif", None)
        sess.ghost = None


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
    sess.ghost = None


def _fork_at(sess: SessionData, settings: Settings, k: int) -> tuple[Any, list[int], bool]:
    """The decoder of a new branch at step ``k``: (decoder, tokens to re-feed, build first).

    Without eviction: a fork of the current decoder rewound to ``k`` (the cache is cropped,
    nothing is re-fed). With eviction, or from an example: the first ``k`` steps shown as a
    recorded run until the job has built a fresh decoder (prefill) and re-fed them, one
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
    """Take ``token_id`` at step ``k`` instead and decode on to the old length (a job)."""
    if job(sess) is not None:
        raise Busy("A run is in progress: press Stop first.")
    with exclusive(sess):
        cur = sess.decoder
        if cur is None or not 0 <= k < cur.n_steps:
            raise ValueError(f"There is no step {k} to branch from.")
        old = cur.trace.steps[k]
        if int(token_id) == old.token_id:
            raise ValueError(f"Step {k} already took that token.")
        n_old, base_params = cur.n_steps, cur.params
        dec, forced, build = _fork_at(sess, settings, k)
        label = _label(cur, token_id)
        was = step_token(old)
        _add_branch(sess, dec, k, f"{display_token(label)} at step {k} (was {was})")
        sess.selected = k
        shown = escape.markdown(display_token(label))  # the label is shown as markdown
        _start(
            sess,
            Job(
                "branch",
                f"Branching at step {k} with {shown}",
                forced=[*forced, int(token_id)],
                recorded=len(forced),
                sample=max(0, n_old - k - 1),
                build=build,
                params=base_params,
                select=k,
            ),
        )


def regenerate_from(sess: SessionData, settings: Settings, k: int, n: int | None = None) -> None:
    """A new branch: rewind to step ``k`` with the current sliders and decode ``n`` steps
    (default: as many as there were), streamed as a job. The old branch is kept; a ghost
    continuation already decoded for these sliders is taken over, not decoded again."""
    if job(sess) is not None:
        raise Busy("A run is in progress: press Stop first.")
    with exclusive(sess):
        cur = sess.decoder
        if cur is None:
            return
        total = cur.n_steps
        k = max(0, min(int(k), total))
        n = max(1, total - k) if n is None else int(n)
        g = sess.ghost
        if (
            g is not None
            and g.at == k
            and g.params == settings.prune_params()
            and g.decoder is not None
            and not g.forced
        ):
            dec, forced, build = g.decoder, [], False
        else:
            dec, forced, build = _fork_at(sess, settings, k)
        made = dec.n_steps - k if not build else 0
        _add_branch(sess, dec, k, f"regenerated from step {k}")
        sess.selected = k
        _start(
            sess,
            Job(
                "regenerate",
                f"Regenerating from step {k}",
                forced=forced,
                recorded=len(forced),
                sample=max(0, n - made),
                build=build,
                params=cur.params,
                select=k,
            ),
        )


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


# -- jobs ------------------------------------------------------------------------------------------


@dataclass
class Job:
    """Decoder work that takes longer than a click: re-feed ``forced`` tokens, then sample
    ``sample`` more (None: until stopped or done)."""

    kind: str  # step, run, play, regenerate, branch, reproduce, continue
    label: str
    forced: list[int] = field(default_factory=list)
    recorded: int = 0  # how many of ``forced`` are recorded tokens (decoded with ``params``)
    sample: int | None = 0
    build: bool = False  # build a new decoder (prefill) first
    params: PruneParams | None = None  # for the re-fed tokens (default: the current sliders)
    select: int | None = None  # step to select when the job ends
    made: int = 0
    sampled: int = 0
    seconds: float = 0.0  # decode time so far, for the estimate
    total: int | None = None
    target: int | None = None  # the run's length once the job is done (Play: the run's cap)
    takes: dict[int, int] = field(default_factory=dict)  # step -> token taken, not sampled
    sample_params: PruneParams | None = None  # for the sampled tokens (default: the sliders)
    started: float = field(default_factory=time.perf_counter)
    # background decoding between ticks: the latest tick's settings and time, its thread,
    # and the error that ended it (raised by the next tick)
    settings: Any = None
    seen: float = 0.0
    worker: threading.Thread | None = None
    error: BaseException | None = None
    place: Any = None  # where its next token waits in the model's line (None: not waiting)

    def __post_init__(self) -> None:
        if self.total is None and self.sample is not None:
            self.total = len(self.forced) + self.sample

    def eta(self) -> float | None:
        """Seconds left at the pace so far (None before the first token or when open-ended)."""
        if self.total is None or self.made == 0:
            return None
        return (self.total - self.made) * self.seconds / self.made

    def progress(self) -> str:
        phase = "re-feeding the recorded tokens" if self.forced else "decoding"
        p = self.place
        if p is not None and p.waited >= server.SHOW_WAIT_AFTER:
            phase += f"; in the model's line, {server.turns_before(p)}"
        if self.total is None:
            return f"{self.label}: {self.made} tokens ({phase})"
        eta = self.eta()
        left = f" · about {eta:.0f} s left" if eta is not None and eta >= 0.5 else ""
        return f"{self.label}: {self.made} / {self.total} tokens ({phase}){left}"

    def wait_at(self, place: Any) -> None:
        """Keep where the job's next token waits in the model's line (None: it has its turn)."""
        self.place = place


def job(sess: SessionData) -> Job | None:
    return sess.job


def _start(sess: SessionData, j: Job) -> None:
    if j.total is not None:  # a fresh decoder starts at step 0; a fork at its own length
        j.target = j.total + (0 if j.build or sess.decoder is None else sess.decoder.n_steps)
    sess.job = j


def add_step(sess: SessionData, n: int = 1) -> bool:
    """``n`` more tokens for a running Step job (True), so Steps clicked while the first
    click's prefill runs are queued, not lost; False when no Step job runs."""
    with exclusive(sess):
        j = job(sess)
        if j is None or j.kind != "step" or j.total is None:
            return False
        j.sample, j.total, j.target = j.sample + n, j.total + n, (j.target or 0) + n
        return True


def _stop_job(sess: SessionData) -> Job | None:
    j, sess.job = sess.job, None
    return j


def start(
    sess: SessionData,
    settings: Settings,
    kind: str,
    n: int | None,
    *,
    takes: dict[int, int] | None = None,
    sample_params: PruneParams | None = None,
) -> None:
    """Start Step (``n`` 1: a first Step, whose prefill is a job) / Run ``n`` / Play (``n``
    None) / reproduce ``n`` steps of a link, as a job.

    Builds the decoder first when needed (its prefill is the job's first tick), and re-feeds
    an example's recorded tokens before sampling new ones. A link's run takes ``takes``
    (step -> token: a branch's tokens) where it would sample, and samples with
    ``sample_params`` (the settings it was recorded at) instead of the sliders.
    """
    if job(sess) is not None:
        raise Busy("A run is in progress: press Stop first.")
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
        params = sess.decoder.params if forced else None
        j = Job(
            kind,
            label,
            forced=forced,
            recorded=len(forced),
            sample=n,
            build=build,
            params=params or sample_params,
            takes=dict(takes or {}),
            sample_params=sample_params,
        )
        if kind == "play":  # Play ends at the run's length: a reload during it goes on to there
            j.target = (
                server.config().cap_steps(settings.max_new_tokens)
                if build
                else sess.decoder.settings.max_new_tokens
            )
        _start(sess, j)


def stop(sess: SessionData) -> str | None:
    """Stop the job between two steps; what it made is kept. Returns what to tell the user."""
    with exclusive(sess):
        j = _stop_job(sess)
    if j is None:
        return None
    return f"{j.label}: stopped after {j.made} tokens; they are kept."


def tick(
    sess: SessionData,
    settings: Settings,
    seconds: float = TICK_SECONDS,
    *,
    status: Callable[[str], contextlib.AbstractContextManager] | None = None,
) -> bool:
    """Advance the job for about ``seconds`` (at least one token) until its background
    thread decodes; True once it has ended.

    Once that thread decodes, a tick only hands it the current settings and keeps it alive:
    the page then draws without waiting for the model, whose line may be long on a shared
    server (a tick that waited there held the page for seconds, and the browser redrew its
    place in line every quarter second).

    ``status(message)`` wraps the prefill (the page shows a spinner with the message).
    Errors end the job and propagate; the decoder keeps every completed step.
    """
    j = job(sess)
    if j is None:
        return True
    j.settings, j.seen = settings, time.monotonic()
    if j.error is None and j.worker is not None and j.worker.is_alive():
        return False
    with exclusive(sess):
        if j.error is not None:  # the background decoding failed: the job ends with it
            _stop_job(sess)
            raise j.error
        if j.build:
            wrap = status(prefill_message(settings)) if status else contextlib.nullcontext()
            t0 = time.perf_counter()
            built: list[Decoder] = []
            try:
                with wrap:
                    built.append(build_decoder(settings, j.params))
            except Exception:  # a user error (empty prompt, unknown model): the job ends
                _stop_job(sess)
                raise
            finally:
                # a rerun (a click) can end the script at the spinner: the job goes on, with
                # the decoder if it was built, else the next tick builds it
                if built:
                    _install(sess, j, built[0], settings)
            j.seconds += time.perf_counter() - t0
            seconds = max(0.0, seconds - (time.perf_counter() - t0))  # and the first token
        if _advance(sess, settings, j, seconds):
            return True
    if j.worker is None or not j.worker.is_alive():
        j.worker = threading.Thread(
            target=_background, args=(sess, j), name="semviz-job", daemon=True
        )
        j.worker.start()
    return False


def _install(sess: SessionData, j: Job, dec: Decoder, settings: Settings) -> None:
    """The decoder a job has built becomes the run (or, for a branch, the branch's)."""
    j.build = False
    if j.kind in ("branch", "regenerate"):  # the fresh decoder replaces the placeholder
        bs = branches(sess)
        bs[current_branch(sess)].decoder = dec
        sess.decoder = dec
    else:
        _set_root(sess, dec, settings.run_key())
        sess.job = j


def background_jobs() -> int:
    """How many jobs are decoding in the background on this server now."""
    return sum(t.name == "semviz-job" and t.is_alive() for t in threading.enumerate())


def _background(sess: SessionData, j: Job) -> None:
    """Decode ``j`` a token at a time while it is the session's job and the page ticks.

    Each token holds the session's lock, which a page holds while it draws
    (``ui.locks.page_lock``), so a page never sees a step half made; between two tokens the lock
    is let go, and a click or a page waiting for it goes first.
    """
    lk = session_lock(sess)
    dec = sess.decoder
    while job(sess) is j and time.monotonic() - j.seen < ORPHAN_SECONDS:
        with _turn_then_lock(sess, j, lk) as held:
            if not held:
                continue
            try:
                if job(sess) is not j or sess.decoder is not dec:
                    return
                if _advance(sess, j.settings, j, 0.0):  # one token
                    return
            except Exception as exc:  # the next tick ends the job and shows it
                j.error = exc
                return
            finally:
                lk.release()
        time.sleep(0.002)  # a thread waiting for the lock gets it now


@contextlib.contextmanager
def _turn_then_lock(sess: SessionData, j: Job, lk: threading.RLock) -> Iterator[bool]:
    """For one background token: wait in the model's line first and only then take the
    session's lock (yields whether it got it; the caller releases it).

    Waiting in line while holding the lock would keep the page from drawing for as long as
    the line is (seconds on a shared server). The page holds the lock only to draw, so once
    the turn is held the lock comes soon; if it does not come at once and others wait for the
    model, they go first. Where sessions share forwards the turn is taken inside the step, as
    one batch, so there the lock is taken first.
    """
    if server.config().batch_sessions:
        yield lk.acquire(timeout=0.5)
        return
    with server.model_turn(j.wait_at) as turn:
        deadline = time.monotonic() + 0.5
        while not lk.acquire(timeout=0.02):
            if time.monotonic() > deadline or job(sess) is not j:
                yield False
                return
            turn.let_others()
        yield True


def _advance(sess: SessionData, settings: Settings, j: Job, seconds: float) -> bool:
    dec = sess.decoder
    t0 = time.perf_counter()
    ended = _decode_for(dec, j, settings.prune_params(), t0 + seconds)
    j.seconds += time.perf_counter() - t0
    if not ended:
        return False
    _stop_job(sess)
    sess.selected = j.select if j.select is not None and j.select < dec.n_steps else None
    if dec.done and j.kind not in ("step", "play", "run"):
        sess.notice = f"{j.label}: done ({dec.n_steps} steps, stopped: {dec.stop_reason})."
    return True


def _decode_for(dec: Any, j: Job, params: PruneParams, until: float) -> bool:
    """Step ``j`` until the clock reaches ``until`` (False) or the job has ended (True).

    Each token takes its own place in the server's line (``server.step``), so a waiting
    session goes between two tokens, and sessions stepping at once share forwards.
    """
    while True:
        if j.forced:
            # recorded tokens are re-fed with the settings they were made with; a branch's
            # new token is taken under the current sliders
            recorded = j.params is not None and j.made < j.recorded
            dec.params = j.params if recorded else params
            rec = server.step(dec, force_token=j.forced[0], waiting=j.wait_at)
            if rec is not None:
                j.forced.pop(0)
        elif j.sample is None or j.sampled < j.sample:
            dec.params = params if j.sample_params is None else j.sample_params
            rec = server.step(dec, force_token=j.takes.get(dec.n_steps), waiting=j.wait_at)
            if rec is not None:
                j.sampled += 1
        else:
            rec = None
        if rec is None:
            return True
        j.made += 1
        if dec.done or (not j.forced and j.sample is not None and j.sampled >= j.sample):
            return True  # that was the last token: the job ends now, not at the next call
        if time.perf_counter() >= until:
            return False


# -- what-if ghost text ---------------------------------------------------------------------------


@dataclass
class Ghost:
    """The real continuation under the current sliders from the first changed step ``at``,
    decoded for up to ``target`` tokens and shown as ghost text.

    From a live run it is a fork rewound to ``at`` (nothing re-fed). From an example (no
    model yet) or under a KV eviction policy, a fresh decoder first re-feeds the ``at``
    recorded tokens (``forced``) with the run's own settings (``base``).
    """

    at: int
    params: PruneParams
    key: tuple
    decoder: Any
    target: int
    forced: list[int] = field(default_factory=list)
    base: PruneParams | None = None
    settings: Settings | None = None
    error: str | None = None  # why it could not be decoded (no model, bad settings)

    @property
    def tokens(self) -> list[int]:
        if self.decoder is None or self.forced:
            return []
        return self.decoder.trace.token_ids[self.at :]

    @property
    def complete(self) -> bool:
        if self.error is not None:
            return True
        if self.decoder is None or self.forced:
            return False
        return self.decoder.done or len(self.tokens) >= self.target


def ghost(
    sess: SessionData, settings: Settings, params: PruneParams, at: int | None
) -> Ghost | None:
    """The session's ghost continuation for the what-if first changed at step ``at`` (made
    afresh when the sliders or the run changed); None when there is nothing to show."""
    dec = sess.decoder
    if at is None or dec is None or at > dec.n_steps:
        sess.ghost = None
        return None
    key = (id(dec), id(dec.trace), dec.n_steps, at, params)
    g = sess.ghost
    if g is not None and g.key == key:
        return g
    target = min(GHOST_TOKENS, max(1, dec.n_steps - at))
    if isinstance(dec, TraceRun) or dec.eviction is not None:
        g = Ghost(
            at,
            params,
            key,
            None,
            target,
            forced=list(dec.trace.token_ids[:at]),
            base=dec.params,
            settings=settings,
        )
    else:
        with exclusive(sess):
            f = dec.fork()
            _rewind_in_turn(f, at, params)
        g = Ghost(at, params, key, f, target)
    sess.ghost = g
    return g


def ghost_tick(sess: SessionData, seconds: float = TICK_SECONDS) -> bool:
    """Decode more of the ghost continuation; True once it is complete."""
    g = sess.ghost
    if g is None or g.complete:
        return True
    with exclusive(sess):
        t0 = time.perf_counter()
        try:
            _ghost_steps(g, t0, seconds)
        except Exception as exc:  # the ghost says why; the run itself is not touched
            g.error = report(exc, "the what-if continuation")
    return g.complete


def _ghost_steps(g: Ghost, t0: float, seconds: float) -> None:
    if g.decoder is None:
        g.decoder = build_decoder(g.settings, g.base)
    while not g.complete and time.perf_counter() - t0 < seconds:
        if g.forced:
            g.decoder.params = g.base
            if server.step(g.decoder, force_token=g.forced[0]) is None:
                break
            g.forced.pop(0)
        else:
            g.decoder.params = g.params
            if server.step(g.decoder) is None:
                break
