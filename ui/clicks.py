"""A button that counts its clicks in the browser, so that no click is lost.

``st.button`` sends a click as a trigger, and Streamlit merges the triggers of one button that
arrive while the script runs into one: ten Step clicks 0.2 s apart gave 8 tokens. This button
keeps the number of clicks made in this session as its value instead. A rerun carries the
latest count, the page compares it with the clicks it has already acted on, and acts on the
difference, so clicks that arrive together are counted, not merged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

CSS = """
.semviz-clicks { font-family: var(--st-font, sans-serif); font-size: 1rem; line-height: 1.6;
  min-height: 2.5rem; padding: .25rem .75rem; border-radius: var(--st-base-radius, .5rem);
  border: 1px solid var(--st-primary-color, #ff4b4b); cursor: pointer;
  background: var(--st-primary-color, #ff4b4b); white-space: nowrap;
  color: var(--st-background-color, #fff); }  /* the page's colour reads on the slate */
.semviz-clicks:hover { filter: brightness(.92); }
.semviz-clicks:focus-visible { outline: 2px solid var(--st-primary-color, #ff4b4b);
  outline-offset: 2px; }
.semviz-clicks:disabled { cursor: not-allowed; opacity: .45; filter: none; }
"""

JS = """
export default function (component) {
  const { data, setStateValue, parentElement } = component;
  let b = parentElement.querySelector("button.semviz-clicks");
  if (!b) {
    b = document.createElement("button");
    b.className = "semviz-clicks";
    b.type = "button";
    b.addEventListener("click", () => {
      const s = b.__s;
      if (b.disabled) return;
      s.n += 1;
      s.set("clicks", s.n);
    });
    parentElement.appendChild(b);
  }
  // the count goes on from the clicks the page has acted on (a remount starts there too)
  const s = b.__s || (b.__s = { n: 0 });
  s.n = Math.max(s.n, data.count);
  s.set = setStateValue;
  b.textContent = data.label;
  b.title = data.help || "";
  b.setAttribute("aria-label", data.label);
  b.disabled = !!data.disabled;
}
"""

_COMPONENT: Any = None


def _component():
    global _COMPONENT
    if _COMPONENT is None:
        _COMPONENT = st.components.v2.component(
            "semviz_counted_button", css=CSS, js=JS, isolate_styles=False
        )
    return _COMPONENT


def counted_button(
    label: str,
    *,
    key: str,
    acted: int,
    on_clicks: Callable[[int], None],
    disabled: bool = False,
    help: str = "",
    where: Any = st,
) -> None:
    """A primary button whose clicks are counted: ``on_clicks(total)`` runs (as a callback,
    before the page is drawn) when the count of clicks made in this session changes. The
    caller acts on ``total`` minus the clicks it has acted on, which it keeps and passes back
    as ``acted`` (the count a remounted button goes on from)."""

    def _changed() -> None:
        state = st.session_state.get(key)
        total = state.get("clicks") if isinstance(state, dict) else getattr(state, "clicks", 0)
        on_clicks(int(total or 0))

    data = {"label": label, "count": int(acted), "disabled": bool(disabled), "help": help}
    with where:
        _component()(
            key=key,
            data=data,
            default={"clicks": int(acted)},
            width="content",
            on_clicks_change=_changed,
        )
