"""A page's long work: one ``semviz.tasks.Task`` per session and name, advanced by one panel.

How it runs, in a few rules:

- A task advances only inside :func:`panel`'s fragment, in its own session's script thread,
  for ``TICK_SECONDS`` a rerun; every model call it makes waits for its turn in the model's
  line (``server.turns()``). Nothing else advances it, so it needs no lock.
- A task whose one unit is long (a whole sweep) is started ``background``: one thread of
  this module advances it to the end, and the panel only reads its progress. That thread is
  the only one that changes the task; Stop asks it to end, and it ends at its next poll.
- Stop asks the task to end after the unit in progress; it keeps what it made.
- After each advance ``on_tick(task, error)`` copies what the page keeps (its result so far,
  its state); a task that has ended is then let go, with what it held (caches, a model's
  working memory), and the page shows what it copied.
- A closed tab reruns nothing, so its task stops advancing; the session sweeper then drops
  ``SessionData.tasks`` with the rest of the run.

A page starts a task from a button's callback (:func:`start`), and calls :func:`panel` where
its progress, Stop and results go.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from semviz.tasks import Task
from ui import server
from ui.errors import report

TICK_SECONDS = 0.4  # work per rerun of the panel
TICK_EVERY = 0.5  # seconds between two reruns while the task runs


Keep = Callable[[Task, "str | None"], None]  # on_tick(task, error)


@dataclass
class Slot:
    """A session's task of one name (None once it has ended and been let go), what the page
    keeps of it after each advance, and the error that ended it."""

    task: Task | None
    on_tick: Keep | None = None
    error: str | None = None
    background: bool = False  # advanced to the end by a thread of its own (see ``start``)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.finished


def slot(sess, name: str) -> Slot | None:
    return sess.tasks.get(name)


def running(sess, name: str) -> bool:
    s = slot(sess, name)
    return s is not None and s.running


def start(
    sess, name: str, task: Task, on_tick: Keep | None = None, *, background: bool = False
) -> None:
    """Make ``task`` the session's ``name`` task (a running one of that name is stopped
    first, keeping its work); the panel advances it from its next rerun, or with
    ``background`` a thread advances it to the end."""
    if running(sess, name):
        stop(sess, name)
    sess.tasks[name] = s = Slot(task, on_tick, background=background)
    _kept(s)
    if background:
        turns = server.turns()  # the session's place in the line, taken in its own thread
        threading.Thread(target=_to_the_end, args=(s, task, turns), daemon=True).start()


def _to_the_end(s: Slot, task: Task, turns) -> None:
    try:
        task.advance(math.inf, turns)
    except Exception as exc:  # one sentence on the page; what the task made stays
        s.error = report(exc, task.label)
        task.stopped = True
    finally:
        task.finished = True


def stop(sess, name: str) -> None:
    """Stop the session's ``name`` task: it ends without another unit and keeps its work (a
    background task at its next poll of the stop request)."""
    s = slot(sess, name)
    if s is None or not s.running:
        return
    s.task.stop()
    if s.background:
        return
    s.task.advance(0.0, server.turns())  # a stopped task ends before any unit
    _kept(s)


def _kept(s: Slot) -> None:
    """The page copies what it keeps; an ended task is let go."""
    task = s.task
    if task is None:
        return
    done = task.finished  # read first: a background task may end while the page copies
    if s.on_tick is not None:
        s.on_tick(task, s.error)
    if done:
        s.task = None


def _advance(s: Slot) -> None:
    try:
        s.task.advance(TICK_SECONDS, server.turns())
    except Exception as exc:  # one sentence on the page; what the task made stays
        s.error = report(exc, s.task.label)
        s.task.stop()
        s.task.finished = s.task.stopped = True
    _kept(s)


def _progress_text(s: Slot) -> str:
    p = s.task.progress()
    done = f"{p.done:,} of {p.total:,} {p.unit}" if p.total else f"{p.done:,} {p.unit}"
    eta = p.eta()
    left = (
        ""
        if eta is None
        else (f" · about {eta:.0f} s left" if eta < 120 else f" · about {eta / 60:.0f} min left")
    )
    return f"{s.task.label}: {p.phase} · {done}{left}"


def panel(sess, name: str, draw: Callable[[], None]) -> None:
    """The task's progress (its phase, how far, the time left) and Stop while it runs, then
    ``draw()`` (the page's view of what it kept), in one fragment that reruns itself while the
    task runs; when the task ends, the whole page reruns once, so its forms are enabled again."""
    ticking = running(sess, name)

    @st.fragment(run_every=TICK_EVERY if ticking else None)
    def _panel() -> None:
        s = slot(sess, name)
        if s is not None and s.task is not None and s.background:
            _kept(s)  # its thread advances it: copy what it made so far
        elif s is not None and s.running:
            _advance(s)
        if ticking and not running(sess, name):
            st.rerun()  # ended or stopped: redraw once, without the timer
        if s is not None and s.running:
            st.progress(s.task.progress().fraction, text=_progress_text(s))
            st.button("Stop", key=f"{name}_stop", on_click=stop, args=(sess, name))
        if s is not None and s.error:
            st.error(s.error, icon="⚠️")
        draw()

    _panel()
