"""User-facing errors: one clear message, never a traceback, and the session's work kept."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import streamlit as st

from semviz.decoding.decoder import PromptError
from semviz.model.load import ModelLoadError
from semviz.output.trace import TraceError

USER_ERRORS = (ModelLoadError, PromptError, TraceError, ValueError)


def message(exc: BaseException) -> str:
    """One line for the user, by kind of error."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, ModelLoadError):
        return f"Model not loaded: {text}"
    if isinstance(exc, PromptError):
        return f"Prompt not accepted: {text}"
    if isinstance(exc, TraceError):
        return f"Trace not read: {text}"
    return f"Settings not accepted: {text}"


@contextlib.contextmanager
def guard(where: str | None = None, *, show: bool = True) -> Iterator[list[str]]:
    """Catch user errors inside the block and show them with ``st.error``.

    Yields a list that receives the message, so callers can tell the block failed.
    Anything else (a real bug) is still shown as one line, not a traceback.
    """
    box: list[str] = []
    try:
        yield box
    except USER_ERRORS as exc:
        box.append(message(exc))
    except Exception as exc:  # a bug still shows as one line, never a traceback
        box.append(f"Something went wrong{' in ' + where if where else ''}: {exc}")
    if box and show:
        st.error(box[0], icon="⚠️")
