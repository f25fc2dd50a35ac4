"""The app's long work: one ``semviz.tasks.Task`` per session and name, run by one runner and
shown by one panel. Generate's run, play and branches, the what-if ghost and the gravity a
what-if recomputes, kv-eval, Compare, a frontier sweep, a report build and the prefill scan all
run this way.

How it runs, in a few rules:

- A task runs in a thread of its own (:func:`start`), which is the only writer of what it
  makes; every model call it makes waits for its turn in the model's line. A page never
  changes a running task's work: it draws the copy the task keeps after each unit
  (``Task.latest``), so a page never waits for the model and takes no lock to draw it. (A
  click may wait a moment for a task that ends at once, so that its run draws the end:
  :func:`wait`.)
- :func:`panel` draws the progress (phase, how far, the time left, the place in the line),
  Stop, and the page's view of the work, in one fragment that reruns every ``tick_every()``
  seconds while the task runs (a tick that finds the task within a tick of its end waits for
  it: :func:`finish_soon`); when the task ends the whole page reruns once. What a task made
  stays when it ends, as an :class:`Ended` (its result, how far it got, whether Stop or an
  error ended it), which the page reads with :func:`result` and :func:`ended`; the task itself
  is let go. A page that must act on each unit (the run keeps its decoder) passes
  ``on_tick(task, error)``, which each rerun calls.
- Stop asks the task to end after the unit in progress and waits for that unit; the task
  keeps what it made.
- A task whose page stops ticking (a closed tab) pauses between two units after
  ``ORPHAN_SECONDS``; the page's next tick (the tab again) resumes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import streamlit as st

from semviz.tasks import Progress, Task, Turns
from ui import server
from ui.errors import report

TICK_EVERY = 0.5  # seconds between two reruns of the panel while a task runs
ORPHAN_SECONDS = 5.0  # a task pauses after this long without a rerun of its panel
STOP_WAIT = 10.0  # Stop waits this long at most for the unit in progress
THREAD = "semviz-task"

Keep = Callable[[Task, "str | None"], None]  # on_tick(task, error)


@dataclass(frozen=True)
class Ended:
    """What a page keeps of a task once it has ended: its label, its result, how far it got,
    and whether Stop or an error ended it. The task is let go, and with it what it held to do
    the work (a batch's caches, a reference's tables)."""

    label: str
    result: object
    progress: Progress
    stopped: bool
    failed: bool


@dataclass
class Slot:
    """A session's task of one name (None once it has ended and been let go), what the page
    keeps of it after each rerun of the panel, and the error that ended it."""

    task: Task | None
    on_tick: Keep | None = None
    error: str | None = None
    owner: str = ""  # the session, whose place in the model's line the task takes
    seen: float = field(default_factory=time.monotonic)  # the panel's last rerun
    place: object = None  # where the task waits in the model's line (None: not waiting)
    thread: threading.Thread | None = None
    drawn: bool = False  # running when a page run last refreshed it (``refresh``)
    ended: Ended | None = None  # what the last task made, once its end has been kept

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.finished


def slot(sess, name: str) -> Slot | None:
    return sess.tasks.get(name)


def task(sess, name: str) -> Task | None:
    """The session's running ``name`` task (None when there is none)."""
    s = slot(sess, name)
    return s.task if s is not None and s.running else None


def ended(sess, name: str) -> Ended | None:
    """What the session's last ``name`` task made, once it has ended and the page has kept its
    end (None while one runs, or before any)."""
    s = slot(sess, name)
    return None if s is None or s.task is not None else s.ended


def result(sess, name: str) -> object:
    """What the session's ``name`` task has made: the running one's copy after its last unit,
    else the last one's result (None before any)."""
    s = slot(sess, name)
    if s is None:
        return None
    if s.task is not None:
        return s.task.latest
    return None if s.ended is None else s.ended.result


def error(sess, name: str) -> str | None:
    """The sentence for the error that ended the session's last ``name`` task, or that kept
    one from starting (:func:`fail`)."""
    s = slot(sess, name)
    return None if s is None else s.error


def fail(sess, name: str, message: str) -> None:
    """A ``name`` task could not start: its panel shows ``message``, and what the last one
    made stays."""
    s = sess.tasks.setdefault(name, Slot(None))
    s.error = message


def keep_ended(sess, name: str) -> None:
    """If the session's ``name`` task has ended, its end is kept now: a click's callback,
    which runs before the page's refresh, then acts on what the task made. (A page's drawing
    keeps ends only at its refresh and in its panel, so one run never draws both.)"""
    s = slot(sess, name)
    if s is not None and s.task is not None and s.task.finished:
        _kept(s)


def wait(sess, name: str, seconds: float) -> None:
    """Wait up to ``seconds`` for the session's ``name`` task to end, and keep its end if it
    did. From a click's callback: a task that ends within a moment (a first Step's prefill
    and token) is then drawn by the run that follows the click, not a tick later."""
    s = slot(sess, name)
    if s is not None and s.thread is not None:
        s.thread.join(seconds)
    keep_ended(sess, name)


def running(sess, name: str) -> bool:
    return task(sess, name) is not None


def start(sess, name: str, t: Task, on_tick: Keep | None = None) -> None:
    """Make ``t`` the session's ``name`` task (a running one of that name is stopped first,
    keeping its work) and start its thread."""
    stop(sess, name)
    sess.tasks[name] = s = Slot(t, on_tick, owner=server.owner())
    _run(s)
    _kept(s)


def _run(s: Slot) -> None:
    t = s.task
    turns = server.turns(
        s.owner,
        waiting=lambda place: setattr(s, "place", place),
        should_stop=lambda: t.stopping,
    )
    s.thread = threading.Thread(target=_work, args=(s, turns), name=THREAD, daemon=True)
    s.thread.start()


def _work(s: Slot, turns: Turns) -> None:
    t = s.task
    try:
        while not t.finished and time.monotonic() - s.seen < ORPHAN_SECONDS:
            t.advance(0.0, turns)  # one unit
    except Exception as exc:  # one sentence on the page; what the task made stays
        s.error = report(exc, t.label)
        t.stopped = t.finished = True


def stop(sess, name: str) -> None:
    """Stop the session's ``name`` task after the unit in progress (waiting for it); it
    keeps what it made (one that has ended and not been kept yet is kept now)."""
    keep_ended(sess, name)
    s = slot(sess, name)
    if s is None or not s.running:
        return
    s.task.stop()
    th = s.thread
    if th is not None and th.is_alive() and th is not threading.current_thread():
        th.join(STOP_WAIT)
    if not s.task.finished and (th is None or not th.is_alive()):  # paused: end it here
        s.task.advance(0.0, server.turns(s.owner))  # a stopped task ends before any unit
    _kept(s)


def _kept(s: Slot) -> None:
    """The page copies what it keeps; an ended task is let go."""
    t = s.task
    if t is None:
        return
    done = t.finished  # read first: the task may end while the page copies
    if s.on_tick is not None:
        s.on_tick(t, s.error)
    if done:
        failed = s.error is not None
        s.task, s.ended = (
            None,
            Ended(t.label, t.latest, t.progress(), t.stopped and not failed, failed),
        )


def tick(s: Slot) -> None:
    """One rerun of the panel: the task is still watched (a paused one resumes), and the
    page copies what it made."""
    s.seen = time.monotonic()
    if s.running and (s.thread is None or not s.thread.is_alive()):
        _run(s)
    _kept(s)


def refresh(sess, names: Sequence[str]) -> None:
    """What a page run starts with: each of the session's ``names`` tasks is ticked, so the
    page draws what they made by now (and the end of one that has ended)."""
    for n in names:
        s = slot(sess, n)
        if s is not None and s.task is not None:
            tick(s)
        if s is not None:
            s.drawn = s.running


def busy_threads() -> int:
    """How many tasks are working on this server now."""
    return sum(t.name == THREAD and t.is_alive() for t in threading.enumerate())


def tick_every() -> float:
    """Seconds between two reruns of a panel: ``TICK_EVERY``, and longer while many tasks run
    on this server (a class playing at once), since each page's redraw costs the CPU that the
    model needs; the tasks go on between the reruns."""
    return TICK_EVERY * max(1.0, busy_threads() / 2)


def progress_text(s: Slot) -> str:
    p = s.task.progress()
    if p.unit == "%":
        done = f"{p.done}%"
    elif p.total:
        done = f"{p.done:,} of {p.total:,} {p.unit}"
    else:
        done = f"{p.done:,} {p.unit}"
    eta = p.eta()
    left = (
        ""
        if eta is None or eta < 0.5
        else (f" · about {eta:.0f} s left" if eta < 120 else f" · about {eta / 60:.0f} min left")
    )
    place = s.place
    line = (
        f" · in the model's line, {server.turns_before(place)}"
        if place is not None and place.waited >= server.SHOW_WAIT_AFTER
        else ""
    )
    return f"{s.task.label}: {p.phase} · {done}{left}{line}"


def stop_button(sess, name: str, where=st, label: str = "Stop", **kw) -> None:
    """Stop for the session's ``name`` task, to draw outside the panel: a button that every
    rerun of the panel re-sent could be swapped for its new copy between a press and its
    release, and the press would be lost."""
    where.button(
        label,
        key=f"{name}_stop",
        on_click=stop,
        args=(sess, name),
        help="Stop after the unit of work in progress; everything made so far is kept.",
        **kw,
    )


def panel(
    sess,
    names: str | Sequence[str],
    draw: Callable[[], None] | None = None,
    *,
    stop: bool = True,
) -> None:
    """The progress of the session's ``names`` tasks (the first one's, with its error and,
    unless ``stop`` is False, Stop), then ``draw()`` (the page's view of what they made), in
    one fragment that reruns itself while any of them runs."""
    names = (names,) if isinstance(names, str) else tuple(names)
    ticking = any(running(sess, n) for n in names)
    if ticking and stop and running(sess, names[0]):
        stop_button(sess, names[0])
    every = tick_every()

    @st.fragment(run_every=every if ticking else None)
    def _panel() -> None:
        if sess.rerun_app and _in_fragment_run():
            sess.rerun_app = False
            st.rerun()  # a click inside the fragment that the whole page follows
        if ticking and _in_fragment_run():
            if not every / 1.5 < tick_every() < every * 1.5:
                st.rerun()  # a fragment's pace is set by a full run: follow the load now
            finish_soon(sess, names, every)
        drawn = [s for s in (slot(sess, n) for n in names) if s is not None and s.drawn]
        refresh(sess, names)
        if drawn and not any(s.running for s in drawn):
            # ended since this page run (or the last tick) began: the whole page catches up
            # once, without the timer, so the run that shows the end draws it everywhere
            st.rerun()
        s = slot(sess, names[0])
        if s is not None and s.running:
            st.progress(s.task.progress().fraction, text=progress_text(s))
        if s is not None and s.error:
            st.error(s.error, icon="⚠️")
        if draw is not None:
            draw()

    _panel()


def finish_soon(sess, names: Sequence[str], within: float) -> None:
    """Wait for each of the session's ``names`` tasks that its pace says will end within
    ``within`` seconds (and that is not waiting in the model's line): the tick that finds it
    then draws its end, not the tick after it, and its thread has the CPU meanwhile."""
    for n in names:
        s = slot(sess, n)
        if s is None or not s.running or s.thread is None or s.place is not None:
            continue
        eta = s.task.progress().eta()
        if eta is not None and eta < within:
            wait(sess, n, min(within, 1.5 * eta + 0.05))


def _in_fragment_run() -> bool:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    c = get_script_run_ctx()
    return bool(c is not None and c.fragment_ids_this_run)
