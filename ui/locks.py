"""The session's lock: one per browser session, held for every change to its run and while a
page draws. Light on purpose (no torch, no Streamlit): ``app.py`` takes it around every page
before the front door has imported anything heavy."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

WAIT_SECONDS = 10.0  # how long a click or a page waits for the step in progress


def session_lock(sess: Any) -> threading.RLock:
    """``sess``'s lock (a ``ui.state.SessionData``, which makes it with the session)."""
    return sess.lock


@contextlib.contextmanager
def page_lock(sess: Any, wait: float = WAIT_SECONDS) -> Iterator[None]:
    """Hold the session's lock while a page draws, so a job's background decoding never
    changes the run in the middle of a drawing. If a step keeps it longer than ``wait``, the
    page is drawn anyway. ``sess`` None (no session data yet): nothing to hold."""
    if sess is None:
        yield
        return
    lk = session_lock(sess)
    held = lk.acquire(timeout=wait)
    try:
        yield
    finally:
        if held:
            lk.release()
