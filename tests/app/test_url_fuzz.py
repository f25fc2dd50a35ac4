"""Any link opens any page without an exception: every URL key, any value.

Hypothesis writes query strings over every key a link can carry (every ``Settings`` field,
``step`` and ``steps``) with values out of range, of the wrong type, huge, empty or in any
script, and opens each on a page of its choosing, on a single-user server and on a shared one.
Every page must render without an exception or a caught bug, every setting must end up in
its widget's range (and a shared server's limits), and every value the app could not take as
given must be named in a note.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from semviz.decoding.settings import KV_POLICIES
from tests.app.conftest import click_step, link_notes, settle
from ui import nav, work
from ui.state import COUNT, Settings, spec_of

pytestmark = pytest.mark.filterwarnings("ignore")

PAGES = [p.path for p in nav.PAGES]
KEYS = [f.name for f in dataclasses.fields(Settings)] + ["step", "steps"]
ISSUE = {"temperature": "5", "top_k": "-5", "top_p": "0", "gravity_lambda": "50"}
WORST = {  # one bad value for every key at once
    "model": "/dev/zero",
    "prompt": "ع" * 3000,
    "chat": "maybe",
    "preset": "🙂",
    "kv_policy": "rm -rf",
    "kv_budget": "-3",
    "seed": "1e400",
    "run_n": "0",
    "max_new_tokens": "99999999999999999999999",
    "temperature": "nan",
    "top_k": "inf",
    "top_p": "-0",
    "min_p": "",
    "typical_p": "0x10",
    "gravity_lambda": "-1e308",
    "gravity_mode": "",
    "gravity_mass": "\x00",
    "gravity_sim": "DOT",
    "gravity_space": "hidden\n",
    "free_energy": "2",
    "free_energy_kappa": "50",
    "adaptive": "mirostat",
    "target_entropy": "1_000",
    "fallback": "yes please",
    "step": "-1",
    "steps": "9" * 5000,
}
SHARED_ENV = {"SEMVIZ_SHARED": "1", "SEMVIZ_MAX_STEPS": "64"}

odd = hs.sampled_from(
    [
        "-5",
        "0",
        "-1",
        "-0",
        "1",
        "1e400",
        "-1e400",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "",
        " ",
        "1e308",
        "99999999999999999999999",
        "9" * 5000,
        "0x10",
        "1_000",
        "３",
        "🙂",
        "Ω",
        "\x00",
        "true",
        "on",
        "none",
        "all",
        "0.0000001",
        "1,2,-3",
        "//",
        "/",
        "~",
        "..",
        "default",
        "window",
        "story",
        "hidden",
        "rerank",
        "target",
        "<script>alert(1)</script>",
        "%00",
        "'; --",
    ]
)
values = hs.one_of(
    odd,
    hs.integers(-(10**30), 10**30).map(str),
    hs.floats(allow_nan=True, allow_infinity=True).map(repr),
    hs.text(max_size=40),
    hs.text(hs.characters(codec="utf-8"), min_size=500, max_size=2000),
)
links = hs.dictionaries(hs.sampled_from(KEYS), values, min_size=1, max_size=8)


@contextlib.contextmanager
def server_env(tiny_dir, shared: bool):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEMVIZ_MODEL", str(tiny_dir))
        mp.setenv("HF_HUB_OFFLINE", "1")
        for k in ("SEMVIZ_SHARED", "SEMVIZ_MODELS", "SEMVIZ_MAX_STEPS"):
            mp.delenv(k, raising=False)
        if shared:
            for k, v in SHARED_ENV.items():
                mp.setenv(k, v)
        yield


def open_link(page: str, query: dict[str, str]):
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import APP, TIMEOUT

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(query)
    at.switch_page(page)
    at.run()
    return at


def taken_as_given(key: str, raw: str, final) -> bool:
    """Whether the link's ``raw`` value for ``key`` is what the app now holds."""
    if key in ("step", "steps"):
        try:
            return COUNT.coerce(raw) >= 0
        except ValueError:
            return False
    try:
        value = spec_of(key).coerce(raw)
    except ValueError:
        return False
    return value == final


def check(at, page: str, query: dict[str, str], *, shared: bool) -> None:
    """No exception, no caught bug, every setting in range, every change noted."""
    assert not at.exception, (page, query, [e.value for e in at.exception])
    bugs = [e.value for e in at.error if "Something went wrong" in e.value]
    assert not bugs, (page, query, bugs)
    s = at.session_state["settings"]
    cap = SHARED_ENV["SEMVIZ_MAX_STEPS"] if shared else None
    for f in dataclasses.fields(Settings):
        spec, v = spec_of(f.name), getattr(s, f.name)
        if isinstance(spec.app, tuple):
            lo, hi, _ = spec.app
            if cap is not None and f.name in ("run_n", "max_new_tokens"):
                hi = int(cap)
            assert lo <= v <= hi and math.isfinite(v), (f.name, v, query)
        elif spec.kind == "choice":
            assert v in spec.choices, (f.name, v)
    assert s.kv_policy in KV_POLICIES
    if shared:
        from ui.server import config

        assert config().allows(s.model), s.model
    notes = " ".join(link_notes(at))
    for key, raw in query.items():
        final = getattr(s, key, None)
        if not taken_as_given(key, raw, final):
            assert f"{key}=" in notes, (key, raw, final, notes)


@pytest.mark.parametrize("page", PAGES)
def test_the_issue_values_open_every_page_clamped_with_notes(tiny_dir, page):
    with server_env(tiny_dir, shared=False):
        at = open_link(page, ISSUE)
        check(at, page, ISSUE, shared=False)
        s = at.session_state["settings"]
        assert (s.temperature, s.top_k, s.top_p, s.gravity_lambda) == (2.0, 0, 0.01, 3.0)
        at.run()  # and it stays fine on the next run, and after moving to another page
        at.switch_page(nav.GENERATE).run()
        assert not at.exception


@pytest.mark.parametrize("shared", [False, True], ids=["single", "shared"])
@pytest.mark.parametrize("page", PAGES)
def test_every_key_bad_at_once(tiny_dir, page, shared):
    with server_env(tiny_dir, shared):
        at = open_link(page, WORST)
        check(at, page, WORST, shared=shared)
        if page == nav.GENERATE:  # the clamped settings also run, once model and prompt are fixed
            if not shared:
                errors = [e.value for e in at.error]
                assert any("'/dev/zero'" in e for e in errors), errors
                at.session_state["s_model"] = ""
            at.session_state["s_prompt"] = "A short prompt"
            at.run()
            click_step(at).run()
            assert not at.exception
            assert not at.error, [e.value for e in at.error]
            assert at.session_state["semviz"].decoder.n_steps == 1


@pytest.mark.parametrize("shared", [False, True], ids=["single", "shared"])
@pytest.mark.parametrize("page", PAGES)
def test_a_link_whose_run_ends_at_once_still_shows_its_notes(tiny_dir, page, shared):
    """``steps=1`` ends its job in the first run, which then reruns the page (and a link opened
    at Home is handed to Generate): the notes must survive that rerun, then go."""
    query = {"model": "-5", "chat": "-5", "steps": "1"}
    with server_env(tiny_dir, shared):
        at = open_link(page, query)
        check(at, page, query, shared=shared)
        if page == nav.HOME:  # Home handed the link to Generate, where the browser now is
            at.switch_page(nav.GENERATE)
        settle(at)  # the run's task ends in its thread; the run after it shows the end
        at.run()
        assert not link_notes(at), link_notes(at)


def test_a_linked_run_keeps_its_notes_on_screen_until_it_has_ended(tiny_dir):
    """A link whose run takes several ticks: its notes stay while the run is reproduced and
    in the run that shows it ended, and go with the run after that."""
    query = {"chat": "-5", "steps": "400", "max_new_tokens": "512"}
    with server_env(tiny_dir, shared=False):
        at = open_link(nav.GENERATE, query)
        runs_while_playing = 0
        while at.session_state["semviz"].job is not None:
            assert "chat=" in " ".join(link_notes(at))
            runs_while_playing += 1
            # at the browser's pace: runs back to back hold the GIL nearly all the time and
            # starve the task's thread (this test took 39 s that way, 6 s at this pace)
            time.sleep(work.TICK_EVERY)
            at.run()
        assert runs_while_playing >= 1, "the linked run ended in one tick: make it longer"
        if working(at):  # it ended in its thread after that run: the next run shows the end
            assert "chat=" in " ".join(link_notes(at))
            at.run()
        assert not working(at) and " generated · " in " ".join(c.value for c in at.caption)
        assert "chat=" in " ".join(link_notes(at))
        at.run()
        assert not link_notes(at), link_notes(at)


def working(at) -> bool:
    """Did this run draw the page with its task still running?"""
    return any("working…" in c.value for c in at.caption)


def test_link_notes_come_back_only_for_the_run_that_showed_them():
    state = {nav.LINK_NOTES: ["Ignored chat='-5': expected on or off."]}
    nav.start_run(state, "generate")
    assert nav.take_link_notes(state) == ["Ignored chat='-5': expected on or off."]
    nav.keep_link_notes(state)  # that run ended in st.rerun: the next one shows them again
    nav.start_run(state, "generate")
    assert nav.take_link_notes(state) == ["Ignored chat='-5': expected on or off."]
    # that run finished; a later one reruns before drawing a sidebar (a button on Home)
    nav.start_run(state, "")
    nav.keep_link_notes(state)
    nav.start_run(state, "generate")
    assert nav.take_link_notes(state) == []


@pytest.mark.parametrize("shared", [False, True], ids=["single", "shared"])
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(page=hs.sampled_from(PAGES), query=links)
def test_fuzzed_links_never_raise(tiny_dir, shared, page, query):
    with server_env(tiny_dir, shared):
        check(open_link(page, query), page, query, shared=shared)
