"""The sessions of this server: when each was last active, and closing the runs of idle ones.

A run holds its decoder's KV cache, hidden states and recorded steps (about 0.2 MB a token with
the default model). Streamlit keeps a closed tab's session for ``server.disconnectedSessionTTL``
seconds (120 by default), and frees it only when a later session disconnects. So the app
drops runs itself: every page run calls :func:`touch`, every model turn is :func:`busy`, and a
background sweep (:func:`sweep`) closes the run of a session idle for ``idle_minutes`` or closed
for ``closed_seconds`` (``ui.server``): its decoder, what-if caches and page results go, its
settings stay, and it is told why when it comes back. Nothing is dropped during a model turn.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SWEEP_EVERY = 5.0  # seconds between sweeps (at most; less when the limits are shorter)


@dataclass
class _Entry:
    ref: Any  # weakref to the session's SessionData
    last_active: float
    busy: int = 0
    closed_since: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_entries: dict[str, _Entry] = {}
_registry_lock = threading.Lock()
_sweeper: threading.Thread | None = None


def _session_id() -> str | None:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return None if ctx is None else ctx.session_id


def touch(sess: Any, session_id: str | None = None) -> None:
    """Note that this session is active now (call it on every page run)."""
    sid = session_id or _session_id()
    if sid is None:
        return
    with _registry_lock:
        entry = _entries.get(sid)
        if entry is None or entry.ref() is not sess:
            entry = _entries[sid] = _Entry(weakref.ref(sess), time.monotonic())
    with entry.lock:  # a sweep in progress finishes first: the page sees a whole run or none
        entry.last_active = time.monotonic()
        entry.closed_since = None
    _start_sweeper()


@contextlib.contextmanager
def busy(session_id: str) -> Iterator[None]:
    """Mark the session as working (a model turn): a sweep leaves it alone meanwhile."""
    with _registry_lock:
        entry = _entries.get(session_id)
    if entry is None:
        yield
        return
    with entry.lock:
        entry.busy += 1
        entry.last_active = time.monotonic()
    try:
        yield
    finally:
        with entry.lock:
            entry.busy -= 1
            entry.last_active = time.monotonic()


KEPT = ("lock", "link", "notice")  # what a dropped run leaves of a session (settings aside)
UNSEEN = ("selected", "error")  # reset too, but not worth a notice


def drop_run(sess: Any, why: str) -> bool:
    """Free what the session's run and pages hold (a ``ui.state.SessionData``); keep its
    settings, its lock and what its link asked for. True if there was anything."""
    for slot in list(getattr(sess, "tasks", {}).values()):
        if slot.task is not None:
            slot.task.stop()  # its thread ends after the unit in progress; nothing is kept
    fresh = type(sess)()
    had = False
    for f in dataclasses.fields(sess):
        if f.name in KEPT:
            continue
        old, new = getattr(sess, f.name), getattr(fresh, f.name)
        had = had or (f.name not in UNSEEN and old != new)
        if isinstance(old, dict):  # a page's fragment may still hold it: reset it in place
            old.clear()
            old.update(new)
        else:
            setattr(sess, f.name, new)
    if had:
        sess.notice = why
    return had


def _connected(session_id: str) -> bool:
    from streamlit import runtime

    if not runtime.exists():  # AppTest, bare mode: no browser to lose
        return True
    return runtime.get_instance().is_active_session(session_id)


@dataclass(frozen=True)
class Swept:
    """What one sweep did: runs closed for idleness, for a closed tab, sessions forgotten."""

    idle: int = 0
    closed: int = 0
    forgotten: int = 0


def sweep(now: float | None = None) -> Swept:
    """Close the runs of idle and closed sessions (see the module's docstring)."""
    from ui.server import config

    cfg = config()
    now = time.monotonic() if now is None else now
    idle_s = None if cfg.idle_minutes is None else 60.0 * cfg.idle_minutes
    idle = closed = forgotten = 0
    with _registry_lock:
        items = list(_entries.items())
    for sid, entry in items:
        sess = entry.ref()
        if sess is None:
            with _registry_lock:
                _entries.pop(sid, None)
            forgotten += 1
            continue
        with entry.lock:
            if entry.busy:
                continue
            if entry.closed_since is None and not _connected(sid):
                entry.closed_since = now
            shut = entry.closed_since is not None and cfg.closed_seconds is not None
            if shut and now - entry.closed_since >= cfg.closed_seconds:
                closed += drop_run(sess, "This tab was closed, so its run was dropped.")
            elif idle_s is not None and now - entry.last_active >= idle_s:
                closed_for = f"{cfg.idle_minutes:g} idle minutes"
                idle += drop_run(
                    sess,
                    f"Your run was closed after {closed_for} to free memory for others on this "
                    "server; your settings are kept: press Step to start again.",
                )
    if idle or closed:
        release_memory()
    return Swept(idle, closed, forgotten)


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system (glibc's ``malloc_trim``):
    without it the freed caches stay in the process's resident memory."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _start_sweeper() -> None:
    global _sweeper
    from ui.server import config

    cfg = config()
    if cfg.idle_minutes is None and cfg.closed_seconds is None:
        return
    with _registry_lock:
        if _sweeper is not None and _sweeper.is_alive():
            return
        _sweeper = threading.Thread(target=_sweep_forever, name="semviz-sweeper", daemon=True)
        _sweeper.start()


def _sweep_forever() -> None:
    from ui.server import config

    while True:
        cfg = config()
        limits = [SWEEP_EVERY]
        if cfg.closed_seconds is not None:
            limits.append(cfg.closed_seconds / 2)
        time.sleep(max(0.5, min(limits)))
        with contextlib.suppress(Exception):  # a sweep must never end the thread
            sweep()
