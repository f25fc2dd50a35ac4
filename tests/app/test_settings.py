"""The app's Settings are derived from the PruneParams metadata, not copied, and a link with
out-of-range or unreadable values opens with them clamped or dropped, and says so."""

from __future__ import annotations

import dataclasses

from semviz.sampling import PruneParams, field_spec
from ui.state import PARAM_FIELDS, Settings, spec_of

RUN_FIELDS = ("model", "prompt", "chat", "preset", "kv_policy", "kv_budget", "seed", "run_n",
              "max_new_tokens")  # fmt: skip


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


def test_query_params_round_trip_and_bad_values_are_noted():
    s = Settings(temperature=0.35, top_k=17, free_energy=True, prompt="A harbour", seed=7)
    assert Settings.from_query_params(s.to_query_params()) == s
    notes: list[str] = []
    got = Settings.from_query_params(
        {"temperature": "5", "top_k": "-2", "top_p": "x", "adaptive": "bogus", "chat": "off",
         "seed": "3", "nonsense": "1"},
        notes,
    )  # fmt: skip
    assert (got.temperature, got.top_k, got.top_p, got.adaptive, got.chat, got.seed) == (
        2.0, 0, 1.0, "none", False, 3,
    )  # fmt: skip
    assert notes == [
        "temperature=5 is outside the app's range [0, 2]; using 2.0.",
        "top_k=-2 is outside the app's range [0, 200]; using 0.",
        "Ignored top_p='x': expected a number.",
        "Ignored adaptive='bogus': expected one of ('none', 'target', 'edt', 'dynatemp', "
        "'mirostat').",
    ]


def test_a_link_out_of_range_opens_clamped_with_a_note(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import APP, TIMEOUT

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(
        {"temperature": "9", "top_k": "900", "seed": "-1", "preset": "nope", "free_energy": "on",
         "free_energy_kappa": "50"}
    )  # fmt: skip
    at.run()
    assert not at.exception
    assert at.slider(key="s_temperature").value == 2.0
    assert at.slider(key="s_top_k").value == 200
    assert at.slider(key="s_free_energy_kappa").value == 5.0
    assert at.number_input(key="s_seed").value == 0
    warned = " ".join(w.value for w in at.sidebar.warning)
    assert "temperature=9 is outside the app's range [0, 2]; using 2.0." in warned
    assert "Ignored preset='nope'" in warned
    at.run()  # said once, not on every rerun
    assert not at.sidebar.warning
