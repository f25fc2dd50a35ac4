"""The app's Settings are derived from the PruneParams metadata, not copied, and a link with
out-of-range or unreadable values opens with them clamped or dropped, and says so."""

from __future__ import annotations

import dataclasses

from semviz.sampling import PruneParams, field_spec
from ui.state import PARAM_FIELDS, Settings, spec_of

RUN_FIELDS = (
    "model",
    "prompt",
    "chat",
    "preset",
    "kv_policy",
    "kv_budget",
    "seed",
    "run_n",
    "max_new_tokens",
)


def test_settings_are_the_run_fields_plus_every_param_with_a_widget():
    names = [f.name for f in dataclasses.fields(Settings)]
    with_widget = [f.name for f in dataclasses.fields(PruneParams) if field_spec(f.name).app]
    assert names == [*RUN_FIELDS, *with_widget] and list(PARAM_FIELDS) == with_widget
    s = Settings()
    for name in PARAM_FIELDS:
        spec = field_spec(name)
        expected = spec.app_default if spec.default_in_app else getattr(PruneParams(), name)
        assert getattr(s, name) == expected, name
        assert spec_of(name) is spec
    assert s.temperature == 0.8  # the app opens on a slightly cooled chain


def test_prune_params_maps_every_field():
    changed = {}
    for name in PARAM_FIELDS:
        spec = field_spec(name)
        if spec.kind == "bool":
            changed[name] = not getattr(Settings(), name)
        elif spec.kind == "choice":
            changed[name] = spec.choices[-1]
        else:
            changed[name] = type(getattr(Settings(), name))(spec.app[1])  # the widget's maximum
    p = Settings(**changed).prune_params()
    assert {name: getattr(p, name) for name in PARAM_FIELDS} == changed
    assert Settings().with_params(p).prune_params() == p


class _Writes(dict):
    """A session_state stand-in that records which keys were assigned."""

    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.written: list[str] = []

    def __setitem__(self, key, value) -> None:
        self.written.append(key)
        super().__setitem__(key, value)


def test_seeding_the_widgets_writes_only_missing_or_changed_keys():
    """Writing a widget's key makes Streamlit force that value onto the browser's widget, which
    undid slider steps the user took while a run was drawing (arrow keys held down lost steps):
    a key that already holds its value is written only after the app imposed settings."""
    from ui.controls import init_state
    from ui.state import IMPOSED

    s = Settings(temperature=0.55)
    state = _Writes({"s_" + f.name: getattr(s, f.name) for f in dataclasses.fields(Settings)})
    del state["s_top_k"]  # a widget Streamlit dropped (not drawn on the last page)
    state["s_top_p"] = 0.5  # a value the stored settings change (a preset, a clamp)
    state.written.clear()
    s.seed_state(state)
    assert state.written == ["s_top_k", "s_top_p"]
    assert state["s_top_k"] == s.top_k and state["s_top_p"] == s.top_p
    state.written.clear()
    s.seed_state(state, overwrite=True)
    assert len(state.written) == len(dataclasses.fields(Settings))

    imposed = _Writes()
    Settings(top_k=7).impose(imposed)  # e.g. Home opening an example, then Generate's run:
    assert imposed[IMPOSED] is True
    imposed["settings"] = Settings(top_k=7)
    imposed.written.clear()
    with_streamlit_state(imposed, init_state)
    widget_keys = [k for k in imposed.written if k.startswith("s_")]
    assert len(widget_keys) == len(dataclasses.fields(Settings)) and IMPOSED not in imposed
    imposed.written.clear()
    with_streamlit_state(imposed, init_state)  # the run after: nothing to force
    assert [k for k in imposed.written if k.startswith("s_")] == []


def with_streamlit_state(state, fn):
    """Run ``fn`` with ``st.session_state`` replaced by ``state``."""
    from unittest import mock

    import ui.controls

    with mock.patch.object(ui.controls.st, "session_state", state):
        return fn()


def test_query_params_round_trip_and_bad_values_are_noted():
    s = Settings(temperature=0.35, top_k=17, free_energy=True, prompt="A harbour", seed=7)
    assert Settings.from_query_params(s.to_query_params()) == s
    notes: list[str] = []
    got = Settings.from_query_params(
        {
            "temperature": "5",
            "top_k": "-2",
            "top_p": "x",
            "adaptive": "bogus",
            "chat": "off",
            "seed": "3",
            "nonsense": "1",
        },
        notes,
    )
    assert (got.temperature, got.top_k, got.top_p, got.adaptive, got.chat, got.seed) == (
        2.0,
        0,
        1.0,
        "none",
        False,
        3,
    )
    assert notes == [
        "temperature=5 is outside the app's range [0, 2]; using 2.0.",
        "top_k=-2 is outside the app's range [0, 200]; using 0.",
        "Ignored top_p='x': expected a number.",
        "Ignored adaptive='bogus': expected one of ('none', 'target', 'edt', 'dynatemp', "
        "'mirostat', 'entropix').",
    ]


def test_a_link_out_of_range_opens_clamped_with_a_note(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import APP, TIMEOUT, link_notes

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(
        {
            "temperature": "9",
            "top_k": "900",
            "seed": "-1",
            "preset": "nope",
            "free_energy": "on",
            "free_energy_kappa": "50",
        }
    )
    at.run()
    assert not at.exception
    assert at.slider(key="s_temperature").value == 2.0
    assert at.slider(key="s_top_k").value == 200
    assert at.slider(key="s_free_energy_kappa").value == 5.0
    assert at.number_input(key="s_seed").value == 0
    warned = " ".join(link_notes(at))
    assert "temperature=9 is outside the app's range [0, 2]; using 2.0." in warned
    assert "Ignored preset='nope'" in warned
    at.run()  # said once, not on every rerun
    assert not link_notes(at)


def test_a_field_whose_registry_is_still_empty_is_a_choice():
    """The gravity registries fill as their package's modules import. A server whose pages
    import ``semviz.sampling`` while another thread is inside ``semviz.gravity`` declared
    ``gravity_kind`` over an empty registry; it was then a text field, and the sidebar
    crashed ("cannot unpack non-iterable bool object") on the first page that drew it."""
    from semviz.gravity.registry import Registry
    from semviz.sampling.params import setting

    class Part:
        name = "a"

    empty = Registry("toy", Part)
    spec = setting("a", "A toy choice.", choices=empty, app=True).metadata["spec"]
    assert spec.kind == "choice" and spec.choices == ()
    empty.register(Part)
    assert spec.choices == ("a",)
    for name in PARAM_FIELDS:  # every app field has a widget its kind can draw
        s = spec_of(name)
        assert s.kind in ("bool", "choice") or len(s.app) == 3, name
