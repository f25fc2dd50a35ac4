"""The shared sidebar: every setting of ``ui.state.Settings`` as a keyed widget.

Every page draws it through ``ui.page.context``. Widgets are created with ``key`` only (never
``value=``); their values are also kept in one ``Settings`` at ``st.session_state["settings"]``
and written back into the widget keys before drawing, so a page switch keeps them. The
sampling widgets are drawn from the ``PruneParams`` metadata (kind, label, range, help,
section), so a field added there with a widget shows up here by itself.
"""

from __future__ import annotations

import streamlit as st

from semviz.model.load import DEFAULT_MODEL
from semviz.sampling.presets import PRESETS
from ui import nav, server, sessions
from ui.errors import log
from ui.state import (
    IMPOSED,
    KEY_PREFIX,
    PARAM_FIELDS,
    Settings,
    default_model_name,
    session,
    spec_of,
    url_count,
)

K = KEY_PREFIX


STORE = "settings"  # the last Settings, kept outside any widget
SEEDED_ON = "settings_seeded_on"  # the page whose run last wrote the widget keys
NOTES = nav.LINK_NOTES  # what reading the link changed, shown until a run ends
LINK_ICON = ":material/link:"  # marks a note about the opening link


def init_state() -> Settings:
    """Bring the widget keys up to date and return the current ``Settings``.

    The first time: URL query parameters over the defaults, within this server's limits
    (``ui.server``). Afterwards: the widgets' values where Streamlit still holds them, else the
    stored ``Settings`` (Streamlit drops the state of widgets that were not drawn in a run,
    e.g. on a page switch), so settings survive.
    """
    state = st.session_state
    stored = state.get(STORE)
    if stored is None:
        notes: list[str] = []
        try:
            stored = read_link(st.query_params, notes)
        except Exception as exc:  # a malformed URL must not stop the app
            log.info("A link's settings could not be read: %r", exc)
            stored, notes = Settings(), ["The link's settings could not be read; using defaults."]
        state[NOTES] = notes
    current = server.limit_settings(Settings.from_state(_Layered(state, stored)))
    # every key is forced after the app chose settings and on a page's first run (the browser
    # then holds values from before, for widgets Streamlit dropped on the other page); else
    # only missing and changed keys, so slider moves made while a run draws are not undone
    page_now = state.get(nav.PAGE_NOW)
    force = bool(state.pop(IMPOSED, False)) or state.get(SEEDED_ON) != page_now
    current.seed_state(state, overwrite=force)
    state[SEEDED_ON] = page_now
    state[STORE] = current
    return current


def read_link(qp, notes: list[str]) -> Settings:
    """The settings a link carries, each value it could not use replaced and noted: numbers
    clamped to the widgets' ranges, unknown choices dropped, the server's limits applied;
    ``step`` and ``steps`` (read by the pages) checked the same way."""
    s = Settings.from_query_params(qp, notes)
    for name in ("step", "steps"):
        url_count(name, qp.get(name), notes)
    return server.limit_settings(s, notes, asked=set(qp.keys()))


class _Layered:
    """Widget keys from session_state where present, else the stored Settings' fields."""

    def __init__(self, state, stored: Settings) -> None:
        self.state, self.stored = state, stored

    def __contains__(self, key: str) -> bool:
        return key in self.state or hasattr(self.stored, key[len(K) :])

    def __getitem__(self, key: str):
        if key in self.state:
            return self.state[key]
        return getattr(self.stored, key[len(K) :])


def apply_preset() -> None:
    """on_change of the preset box: copy the preset's parameters into the sliders."""
    name = st.session_state.get(K + "preset", "custom")
    if name not in PRESETS:
        return
    current = Settings.from_state(st.session_state)
    s = current.with_params(PRESETS[name].params)
    s.impose(st.session_state)


def settings() -> Settings:
    """The current ``Settings`` (the link's on a session's first run, its notes shown under
    the page's title), for a page that draws no sidebar.

    A server whose configuration cannot be used stops here, on every page, with one sentence.
    """
    _server_config()
    return _begin()


def _server_config() -> server.ServerConfig:
    try:
        return server.config()
    except server.ConfigError as exc:
        st.error(f"This server is not set up right: {exc}", icon="⚠️")
        st.stop()


def _begin() -> Settings:
    sessions.touch(session(st.session_state))
    current = init_state()
    # under the page's title, not in the sidebar, whose page list pushes them below the fold
    for note in nav.take_link_notes(st.session_state):
        st.warning(note, icon=LINK_ICON)
    return current


def sidebar() -> Settings:
    """Draw the shared controls and return the current ``Settings``.

    A server whose configuration cannot be used stops here, on every page, with one sentence.
    """
    cfg = _server_config()
    _begin()
    sb = st.sidebar
    if cfg.shared:
        sb.caption(server.queue_caption())
    with sb.expander("Model & prompt", expanded=True):
        _model_widget(cfg)
        st.toggle(spec_of("chat").label, key=K + "chat", help=spec_of("chat").help)
        preset = spec_of("preset")
        st.selectbox(
            preset.label,
            preset.choices,
            key=K + "preset",
            on_change=apply_preset,
            format_func=lambda n: n if n == "custom" else f"{n} — {PRESETS[n].why[:40]}…",
            help=preset.help,
        )
    groups = list(dict.fromkeys(spec_of(name).group for name in PARAM_FIELDS))
    for i, group in enumerate(groups):
        with sb.expander(group, expanded=i == 0):
            for name in PARAM_FIELDS:
                if spec_of(name).group == group:
                    _param_widget(name)
    with sb.expander("KV cache & run", expanded=False):
        st.selectbox(spec_of("kv_policy").label, spec_of("kv_policy").choices, key=K + "kv_policy")
        _number("kv_budget")
        c1, c2 = st.columns(2)
        _number("seed", c1)
        _number("run_n", c2)
        _number("max_new_tokens")
    current = server.limit_settings(Settings.from_state(st.session_state))
    st.session_state[STORE] = current
    return current


def _model_widget(cfg: server.ServerConfig) -> None:
    """A free model box; on a shared server a choice among its models, or just the name."""
    model = spec_of("model")
    default = default_model_name() or DEFAULT_MODEL
    if not cfg.shared:
        st.text_input(
            model.label, key=K + "model", placeholder=f"default: {default}", help=model.help
        )
    elif len(cfg.models) > 1:
        others = [m for m in cfg.models if m != cfg.default_model]
        st.selectbox(
            model.label,
            ["", *others],
            key=K + "model",
            format_func=lambda m: server.model_label(m or default),
            help="The models this server runs.",
        )
    else:
        st.caption(f"Model: **{server.model_label(default)}** (the one this server runs)")


def _param_widget(name: str) -> None:
    """The widget of one sampling field, from its metadata (hidden unless ``shown_if``)."""
    spec = spec_of(name)
    if spec.shown_if is not None:
        other, value = spec.shown_if
        if st.session_state.get(K + other) != value:
            return
    if spec.kind == "bool":
        st.toggle(spec.label, key=K + name, help=spec.help)
    elif spec.kind == "choice":
        st.selectbox(spec.label, spec.choices, key=K + name, help=spec.help)
    else:
        lo, hi, step = spec.app
        st.slider(spec.label, lo, hi, step=step, key=K + name, help=spec.help)


def _number(name: str, where=st) -> None:
    spec = spec_of(name)
    lo, hi, step = spec.app
    if name in ("run_n", "max_new_tokens"):
        hi = server.config().cap_steps(hi)
    where.number_input(spec.label, lo, hi, step=step, key=K + name, help=spec.help)
