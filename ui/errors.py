"""User-facing errors: one clear sentence on the page, the full traceback in the server's log.

A user error (a bad prompt, an unknown model, a trace that cannot be read, a value out of
range) is the user's to fix: its sentence says what, and the log gets one line. Anything else
is a bug: the page still shows one sentence, and the log gets the traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import streamlit as st

from semviz.decoding.decoder import PromptError
from semviz.model.load import ModelLoadError
from semviz.output.trace import TraceError

log = logging.getLogger("semviz.app")

USER_ERRORS = (ModelLoadError, PromptError, TraceError, ValueError)


def message(exc: BaseException, where: str | None = None) -> str:
    """One line for the user, by kind of error."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, ModelLoadError):
        return f"Model not loaded: {text}"
    if isinstance(exc, PromptError):
        return f"Prompt not accepted: {text}"
    if isinstance(exc, TraceError):
        return f"Trace not read: {text}"
    if isinstance(exc, ValueError):
        return f"Settings not accepted: {text}"
    return f"Something went wrong{' in ' + where if where else ''}: {text}"


def report(exc: BaseException, where: str | None = None) -> str:
    """Log ``exc`` (a traceback unless it is a user error) and return the user's sentence."""
    said = message(exc, where)
    if isinstance(exc, USER_ERRORS):
        log.info("%s (%s)", said, where or "the app")
    else:
        log.error("%s", said, exc_info=exc)
    return said


@contextlib.contextmanager
def guard(where: str | None = None, *, show: bool = True) -> Iterator[list[str]]:
    """Catch errors inside the block and show the sentence with ``st.error`` (``show``).

    Yields a list that receives the sentence, so callers can tell the block failed.
    """
    box: list[str] = []
    try:
        yield box
    except Exception as exc:  # a bug shows as one line too; its traceback goes to the log
        box.append(report(exc, where))
    if box and show:
        st.error(box[0], icon="⚠️")
