"""Generate and Home on the tiny model: the front door, example runs without a model run,
branches that keep the old branch, atomic steps under interrupted reruns, and links that
regenerate the run."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from streamlit.runtime.scriptrunner_utils.exceptions import RerunException, StopException
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData

from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output.style import display_token
from semviz.output.trace import Trace
from tests.app.conftest import (
    APP,
    GENERATE,
    TIMEOUT,
    click_step,
    run_steps,
    settle,
    wait_until,
)
from ui import examples, runner


def errors(at) -> list[str]:
    return [e.value for e in at.error]


def sess(at):
    return at.session_state["semviz"]


def finish_job(at) -> None:
    settle(at)


@pytest.fixture()
def home(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    return at


def test_front_door_offers_three_ways_in(home):
    text = " ".join(m.value for m in home.markdown)
    assert "choose its next token" in text
    labels = [b.label for b in home.button]
    assert "Generate" in labels  # try a prompt
    assert [e.title for e in examples.available()] == labels[1:]  # the example runs
    assert len(labels) >= 4
    box = home.text_area(key="home_prompt")  # empty: the front door paints without settings
    assert box.value == "" and "default" in box.placeholder
    assert not errors(home)


@pytest.mark.parametrize("shared", [False, True])
def test_both_prompt_boxes_stop_at_the_servers_character_limit(tiny_dir, monkeypatch, shared):
    """The browser enforces the box's max_chars: a pasted book never crosses the websocket
    or the address. Shared mode reads 512 tokens, so 16 × 512 characters on Generate; the
    front door, which paints before torch is imported, takes the most any server reads."""
    from streamlit.testing.v1 import AppTest

    from semviz.decoding.decoder import CHARS_PER_TOKEN
    from ui import nav, server

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if shared:
        monkeypatch.setenv("SEMVIZ_SHARED", "1")
    want = 16 * 512 if shared else 16 * nav.PROMPT_BOX_TOKENS
    assert server.prompt_chars() == want and CHARS_PER_TOKEN == 16
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert at.text_area(key="home_prompt").proto.max_chars == nav.PROMPT_BOX_CHARS >= want
    at.switch_page(GENERATE).run()
    assert not at.exception
    assert at.text_area(key="s_prompt").proto.max_chars == want


def test_front_door_prompt_opens_generate_and_decodes(home):
    home.text_area(key="home_prompt").input("A lighthouse at dusk").run()
    home.button(key="home_go").click().run()
    assert not home.exception
    assert home.text_area(key="s_prompt").value == "A lighthouse at dusk"  # on Generate now
    finish_job(home)
    dec = sess(home).decoder
    assert dec.prompt == "A lighthouse at dusk" and dec.n_steps == 32  # Run N, N = 32
    assert home.query_params["prompt"] == "A lighthouse at dusk"
    assert home.query_params["steps"] == "32"


def test_front_door_empty_prompt_decodes_the_default_one(home):
    from ui.state import Settings

    home.button(key="home_go").click().run()
    assert not home.exception and not errors(home)
    finish_job(home)
    assert sess(home).decoder.prompt == Settings().prompt
    assert home.text_area(key="s_prompt").value == Settings().prompt


def test_example_opens_with_no_model_run(home, monkeypatch):
    def no_model_run(*a, **kw):
        raise AssertionError("opening an example ran the model")

    monkeypatch.setattr(Decoder, "_forward", no_model_run)
    home.button(key="home_ex_sea.json").click().run()
    assert not home.exception and not errors(home)
    dec = sess(home).decoder
    assert isinstance(dec, runner.TraceRun)
    recorded = Trace.load(examples.FOLDER / "sea.json")
    assert dec.trace.token_ids == recorded.token_ids
    s = home.session_state["settings"]
    assert (s.prompt, s.temperature, s.seed, s.chat) == (recorded.prompt, 0.8, 0, True)
    assert home.query_params["steps"] == str(len(recorded.steps))
    # the views work from the recording; a slider move replays it, still without the model
    home.switch_page("app_pages/distributions.py").run()
    assert not home.exception and home.get("plotly_chart")
    home.session_state["s_temperature"] = 0.2
    home.run()
    assert not home.exception
    assert sess(home).replay_memo["whatif"].n == len(recorded.steps)


def test_settings_an_example_cannot_replay_say_so_once_and_keep_the_run(home):
    """The examples hold no attention metrics, which entropix's temperature reads: the page
    says so in one sentence, once (the what-if is asked for in several places), and goes on
    drawing the recorded run."""
    home.button(key="home_ex_sea.json").click().run()
    home.switch_page(GENERATE).run()
    recorded = list(sess(home).decoder.trace.token_ids)
    home.selectbox(key="s_adaptive").set_value("entropix").run()
    assert not home.exception
    (said,) = errors(home)
    assert said.startswith("Settings not accepted: Adaptive temperature 'entropix' reads")
    assert "a run recorded with the lens off, or an older trace" in said
    assert sess(home).decoder.trace.token_ids == recorded
    assert home.get("plotly_chart")  # the selected step's charts, from the recording
    home.selectbox(key="s_adaptive").set_value("none").run()
    assert not errors(home)


def test_a_step_decoded_with_entropixs_temperature_writes_out_its_numbers(app):
    app.selectbox(key="s_adaptive").set_value("entropix").run()
    app.session_state["s_entropix_logits_gain"] = 0.02  # inside the clip on the tiny model
    at = run_steps(app, 3)
    rec = sess(at).decoder.trace.steps[-1]
    (cap,) = [c.value for c in at.caption if c.value.startswith("entropix: T = 0.8·(1 + 0.02·")]
    # the formula's value is the step's temperature, as the metric beside it shows it
    assert cap.split(") = ")[1].split(" ")[0] == f"{rec.temperature:.3g}"
    shown = [m.value for m in at.metric if m.label == "temperature"]
    assert shown == [f"{rec.temperature:.2f}"] and rec.temperature != 0.8


def test_stepping_on_from_an_example_refeeds_it_first(home):
    home.button(key="home_ex_capital_attention.json").click().run()
    home.switch_page(GENERATE).run()  # where the browser is now (AppTest reruns Home)
    recorded = sess(home).decoder.trace.token_ids
    home.button(key="btn_run").click().run()
    finish_job(home)
    dec = sess(home).decoder
    assert isinstance(dec, Decoder)
    assert dec.trace.token_ids[: len(recorded)] == recorded
    assert dec.n_steps == len(recorded) + 32


def test_branch_from_an_alternative_keeps_the_old_branch(app):
    at = run_steps(app, 8)
    old_dec = sess(at).decoder
    old = list(old_dec.trace.token_ids)
    sess(at).selected = 3
    at.run()
    box = at.selectbox(key="branch_tok")
    alt = box.options[0]  # as shown: style.display_token
    box.select_index(0).run()
    alt_id = at.selectbox(key="branch_tok").value
    at.button(key="btn_branch").click().run()
    finish_job(at)
    assert not errors(at)
    bs = runner.branches(sess(at))
    assert len(bs) == 2 and bs[0].decoder is old_dec
    new = sess(at).decoder.trace.token_ids
    assert new[:3] == old[:3] and len(new) == 8
    assert new[3] == alt_id
    assert display_token(sess(at).decoder.lm.tokenizer.decode([new[3]])) == alt
    assert old_dec.trace.token_ids == old  # the old branch is untouched
    # switch back: instant, the same decoder and tokens
    at.radio(key="branch_pick").set_value(0).run()
    assert sess(at).decoder is old_dec and sess(at).decoder.trace.token_ids == old
    at.radio(key="branch_pick").set_value(1).run()
    assert sess(at).decoder.trace.token_ids == new


def test_regenerate_from_the_first_changed_step_is_a_new_branch(app):
    at = run_steps(app, 8)
    old = list(sess(at).decoder.trace.token_ids)
    at.session_state["s_temperature"] = 0.0
    at.run()
    wi = sess(at).replay_memo["whatif"]
    # a sampled run on this model has a step greedy decoding picks otherwise: the test
    # checks that step, and fails rather than skips if the fixture ever stops having one
    assert wi.first_diff is not None
    k = wi.first_diff
    at.button(key="regen_from").click().run()
    finish_job(at)
    dec = sess(at).decoder
    assert dec.trace.token_ids[:k] == old[:k] and dec.trace.token_ids[k] == wi.token_ids[k]
    assert len(runner.branches(sess(at))) == 2
    assert runner.branches(sess(at))[0].decoder.trace.token_ids == old


def test_stop_keeps_what_was_made_and_says_stopped(app):
    at = app
    at.session_state["s_run_n"] = 400
    at.run()
    at.button(key="btn_run").click().run()
    wait_until(lambda: sess(at).job.made >= 1)
    at.run()
    made = sess(at).decoder.n_steps
    assert sess(at).job is not None and 1 <= made < 400
    at.button(key="job_stop").click().run()
    assert sess(at).job is None
    kept = sess(at).decoder.n_steps  # the task also decodes between the page's runs
    assert made <= kept < 400
    assert f"Run 400: stopped after {kept} tokens; they are kept." in [i.value for i in at.info]
    time.sleep(0.5)
    assert sess(at).decoder.n_steps == kept  # stopped means stopped: nothing decodes on
    click_step(at).run()  # the page is usable
    assert sess(at).decoder.n_steps == kept + 1


def reference_tokens(lm, settings, n: int) -> list[int]:
    d = Decoder(
        lm,
        settings.prompt,
        settings.prune_params(),
        DecodeSettings(seed=settings.seed, chat=settings.chat),
    )
    d.run(n)
    return d.trace.token_ids


@pytest.mark.parametrize(
    "exc", [StopException(), RerunException(RerunData())], ids=["stop", "rerun"]
)
@pytest.mark.parametrize("where", ["_after_forward", "_record"])
def test_a_rerun_inside_a_step_leaves_the_run_consistent(app, tiny_lm, monkeypatch, exc, where):
    """Streamlit stops a script at its next yield point; here that lands inside a step."""
    at = app
    for _ in range(3):  # the first click's prefill is a task; the next clicks step in the page
        click_step(at).run()
    orig = getattr(Decoder, where)
    calls = {"n": 0}

    def interrupted(self, *a, **kw):
        out = orig(self, *a, **kw)
        calls["n"] += 1
        if calls["n"] == 1:
            raise exc
        return out

    monkeypatch.setattr(Decoder, where, interrupted)
    click_step(at).run()  # this step is interrupted halfway
    assert calls["n"] >= 1
    at.run()  # the next rerun draws the page again
    assert not at.exception and not errors(at)
    n = sess(at).decoder.n_steps
    assert n in (3, 4)  # the interrupted step left nothing behind (a rerun may redo it)
    for _ in range(6 - n):
        click_step(at).run()
    assert not at.exception and not errors(at)
    ref = reference_tokens(tiny_lm, at.session_state["settings"], 6)
    assert sess(at).decoder.trace.token_ids == ref


def test_a_click_during_a_step_waits_for_it(app, monkeypatch):
    """Two runs of one session at once: the second waits for the first's step, then runs."""
    import threading

    at = app
    click_step(at).run()
    s = sess(at)
    settings = at.session_state["settings"]
    entered, release = threading.Event(), threading.Event()
    orig = Decoder._record

    def slow(self, *a, **kw):
        entered.set()
        release.wait(5)
        return orig(self, *a, **kw)

    monkeypatch.setattr(Decoder, "_record", slow)
    t = threading.Thread(target=runner.step, args=(s, settings, 1))
    t.start()
    assert entered.wait(5)
    order = []
    u = threading.Thread(target=lambda: (runner.step(s, settings, 1), order.append("second")))
    u.start()
    u.join(0.3)
    assert u.is_alive() and not order  # queued behind the step in progress
    release.set()
    t.join(5)
    u.join(5)
    assert order == ["second"] and s.decoder.n_steps == 3
    with runner.exclusive(s):  # a click that cannot get the lock in time is refused
        v = []
        w = threading.Thread(target=lambda: v.append(_busy(s, settings)))
        w.start()
        w.join(5)
    assert v == ["Still working on the previous action: this click was not applied."]


def _busy(s, settings) -> str:
    try:
        with runner.exclusive(s, wait=0.05):
            return "ran"
    except runner.Busy as exc:
        return str(exc)


def test_link_with_steps_regenerates_the_run(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    a = AppTest.from_file(APP, default_timeout=TIMEOUT)
    a.run()
    a.session_state["s_seed"] = 3
    a.session_state["s_temperature"] = 0.9
    run_steps(a, 7)
    sess(a).selected = 4
    a.switch_page("app_pages/distributions.py").run()
    link = dict(a.query_params)
    assert link["steps"] == "7" and link["step"] == "4" and link["seed"] == "3"
    tokens = sess(a).decoder.trace.token_ids

    b = AppTest.from_file(APP, default_timeout=TIMEOUT)
    b.query_params.update(link)
    b.run()  # Home hands a link over to Generate, which regenerates the run
    assert not b.exception and not errors(b)
    finish_job(b)
    assert sess(b).decoder.trace.token_ids == tokens
    assert sess(b).selected_step() == 4
    assert dict(b.query_params) == link
    assert torch.equal(
        sess(b).decoder.trace.steps[4].cand_logits, sess(a).decoder.trace.steps[4].cand_logits
    )


def test_generate_page_has_the_prompt_and_no_sidebar_prompt(app):
    assert app.text_area(key="s_prompt").value
    assert not [t for t in app.sidebar.text_area if t.key == "s_prompt"]
    assert GENERATE.endswith("generate.py")


@pytest.mark.parametrize("source", ["live", "example"])
def test_whatif_ghost_text_is_the_real_continuation(app, tiny_lm, source):
    """After a slider move the ghost text is what the model decodes from the first changed
    step with the new sliders, not the replay's per-step picks on the recorded context."""
    at = app
    if source == "example":
        at.switch_page("app_pages/home.py").run()
        at.button(key="home_ex_sea.json").click().run()
        at.switch_page(GENERATE).run()  # where the browser is now (AppTest reruns Home)
    else:
        run_steps(at, 10)
    s = sess(at)
    n = s.decoder.n_steps
    at.slider(key="s_temperature").set_value(0.0).run()
    wi = s.replay_memo["whatif"]
    # a sampled run on this model has a step greedy decoding picks otherwise: the test
    # checks that step, and fails rather than skips if the fixture ever stops having one
    assert wi.first_diff is not None
    k = wi.first_diff
    g = s.ghost
    assert g.at == k
    wait_until(lambda: g.complete)  # its task decodes in its own thread
    assert g.error is None
    if source == "example":  # no model yet: a fresh decoder re-feeds the k recorded tokens
        assert g.task.build is not None and g.task.made == k + len(g.tokens)
    else:  # a fork of the live run, rewound to k: nothing re-fed
        assert g.task.build is None and g.task.made == len(g.tokens)
    assert g.trace.token_ids[:k] == s.decoder.trace.token_ids[:k]
    # the reference: the run's own tokens up to k, then greedy decoding
    settings = at.session_state["settings"]
    ref = Decoder(
        tiny_lm,
        settings.prompt,
        s.decoder.params,
        DecodeSettings(seed=settings.seed, chat=settings.chat),
    )
    for t in s.decoder.trace.token_ids[:k]:
        ref.step(force_token=t)
    ref.params = settings.prune_params()
    ref.run(min(runner.GHOST_TOKENS, n - k))
    assert g.tokens == ref.trace.token_ids[k:]
    if source == "live":  # (the example was recorded by the real model, not the tiny one)
        assert g.tokens[0] == wi.token_ids[k]  # the replay's first changed pick, for real
    # Regenerate takes the ghost over as the new branch, without decoding it again
    ghost = list(g.tokens)
    at.button(key="regen_from").click().run()
    assert sess(at).decoder is g.task.decoder
    finish_job(at)
    assert sess(at).decoder.n_steps == n
    assert sess(at).decoder.trace.token_ids[k : k + len(ghost)] == ghost


def test_step_then_run_follows_the_new_tokens(app):
    """The first step alone is the latest step, not a selection: the tokens that follow it
    are shown as they come, as after any other step."""
    click_step(app).run()
    finish_job(app)
    assert sess(app).decoder.n_steps == 1 and sess(app).selected is None
    app.session_state["s_run_n"] = 3
    app.run()
    app.button(key="btn_run").click().run()
    finish_job(app)
    assert sess(app).decoder.n_steps == 4
    assert sess(app).selected_step() == 3 and app.slider(key="step_sel").value == 3


def test_a_first_step_draws_its_token_in_the_clicks_own_run(app, monkeypatch):
    """The first Step's task (prefill and a token) is waited for by the click, so the run that
    follows the click draws the token, not the panel's next tick (0.3 s more in a browser)."""
    monkeypatch.setattr(runner, "STEP_WAIT", 60.0)  # the task's end decides, not the machine
    click_step(app)
    app.run()  # this one run, not settled
    dec = sess(app).decoder
    assert sess(app).job is None and dec is not None and dec.n_steps == 1
    assert any("1 token generated · ready" in c.value for c in app.caption), [
        c.value for c in app.caption
    ]


def test_a_short_branch_is_drawn_whole_by_the_clicks_own_run(app, monkeypatch):
    """A branch's click waits for its task like a first Step's: the run that follows the
    click draws the branch's every token and no task, not the panel's next ticks."""
    at = run_steps(app, 8)
    sess(at).selected = 3
    at.run()
    at.selectbox(key="branch_tok").select_index(0).run()
    monkeypatch.setattr(runner, "STEP_WAIT", 60.0)  # the task's end decides, not the machine
    at.button(key="btn_branch").click().run()  # this one run, not settled
    assert sess(at).job is None and len(runner.branches(sess(at))) == 2
    assert sess(at).decoder.n_steps == 8
    assert any("8 tokens generated · ready" in c.value for c in at.caption), [
        c.value for c in at.caption
    ]


def test_a_click_after_the_first_steps_task_ended_steps_on_from_its_run(app, monkeypatch):
    """The first Step's task (prefill and a token) ends in its thread; a second click whose
    callback comes before any page run has kept that end steps on from the run the task
    made, rather than starting a new one (a browser's fast clicks lost tokens that way)."""
    from semviz.tasks import DecodeTask

    go, unit = threading.Event(), DecodeTask.unit
    monkeypatch.setattr(DecodeTask, "unit", lambda self, turns: go.wait(30) and unit(self, turns))
    click_step(app)
    app.run()  # the click starts the task, which waits for ``go``; the page does not wait
    task = sess(app).job
    go.set()
    wait_until(lambda: task.finished)  # ended, not yet kept: no page run since
    assert sess(app).decoder is None
    click_step(app).run()  # the callback runs before the page's refresh
    dec = sess(app).decoder
    assert dec.n_steps == 2 and dec is task.decoder


def test_a_link_carries_its_branch_and_its_what_if(tiny_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    a = AppTest.from_file(APP, default_timeout=TIMEOUT)
    a.run()
    a.session_state["s_seed"] = 5
    run_steps(a, 8)
    run = list(sess(a).decoder.trace.token_ids)
    other = next(t for t in range(3, 200) if t != run[3])
    runner.branch_from(sess(a), a.session_state["settings"], 3, other)
    finish_job(a)
    branch = list(sess(a).decoder.trace.token_ids)
    assert branch[:3] == run[:3] and branch[3] == other and len(branch) == 8
    a.slider(key="s_temperature").set_value(1.1).run()  # a what-if on the branch
    link = dict(a.query_params)
    assert link["steps"] == "8" and link["temperature"] == "1.1"
    assert link["rec.temperature"] == "0.8"
    assert link["take"] == ".".join(map(str, [3, *branch[3:]]))

    b = AppTest.from_file(APP, default_timeout=TIMEOUT)
    b.query_params.update(link)
    b.run()
    assert not b.exception and not errors(b)
    finish_job(b)
    dec = sess(b).decoder
    assert dec.trace.token_ids == branch
    assert dec.params.temperature == 0.8 and b.session_state["settings"].temperature == 1.1
    b.switch_page(GENERATE).run()
    banner = [w.value for w in [*b.warning, *b.success] if w.value.startswith("What-if")]
    assert banner and banner[0].startswith("What-if (recorded at Temperature 0.8, viewing at 1.1)")
    # a link with a take it cannot use says so and reproduces the run without it
    c = AppTest.from_file(APP, default_timeout=TIMEOUT)
    c.query_params.update({**link, "take": "3.-1"})
    c.run()
    finish_job(c)
    assert sess(c).decoder.trace.token_ids == run


def test_a_reload_during_a_run_links_the_whole_run(app):
    app.session_state["s_run_n"] = 500
    app.run()
    app.button(key="btn_run").click().run()  # the first tick: prefill and some tokens
    j = sess(app).job
    assert j is not None and j.made < 500 and app.query_params["steps"] == "500"
    runner.stop(sess(app))


def test_a_reload_during_play_links_the_run_to_its_length(app):
    """Play runs to the run's length (max new tokens), so that is what its link asks for; a
    pause leaves the link at the tokens made."""
    app.session_state["s_max_new_tokens"] = 300
    app.run()
    app.button(key="btn_play").click().run()
    j = sess(app).job
    assert j is not None and j.kind == "play" and j.made < 300
    assert app.query_params["steps"] == "300"
    wait_until(lambda: j.made >= 1)  # the prefill runs in the task too
    runner.stop(sess(app))
    app.run()
    assert app.query_params["steps"] == str(sess(app).decoder.n_steps)


def test_a_links_run_keys_are_read_back_or_refused_with_a_note():
    from semviz.sampling import PruneParams
    from ui.state import Settings, read_run_query, run_query

    view = Settings(temperature=1.1, top_k=40)
    rec = Settings(temperature=0.8, top_k=40).prune_params()
    qp = run_query(rec, view.prune_params(), (3, [7, 9]))
    assert qp == {"rec.temperature": "0.8", "take": "3.7.9"}
    notes: list[str] = []
    assert read_run_query(qp, view, 100, notes) == (rec, {3: 7, 4: 9}) and notes == []
    bad = {"rec.temperature": "-2", "rec.nonsense": "1", "take": "3.7.100"}
    params, takes = read_run_query(bad, view, 100, notes)
    assert takes == {} and isinstance(params, PruneParams)
    assert params.temperature == 0.0  # clamped to the slider's range, as a link's values are
    assert notes[0] == "Ignored rec.nonsense: not a slider."
    assert notes[-1].startswith("Ignored take: expected a step and the token ids")
