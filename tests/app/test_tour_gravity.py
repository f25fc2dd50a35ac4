"""Tour 4 on the tiny model: its button turns on the gravity the page draws and nothing else,
the gravity the record lacks is recomputed as a task whose progress the page shows, and the
banner says the model ran for it."""

from __future__ import annotations

from semviz.tasks import GravityTask, Turns
from tests.app.conftest import held, run_steps, run_until, settle
from ui import page, runner, tour, work
from ui.state import Settings

TOUR4 = "app_pages/tour_4_gravity.py"


def test_the_button_changes_only_gravity_and_the_page_shows_that_gravity(app, one_lane):
    run_steps(app, 8)
    s = app.session_state["semviz"]
    at = app.switch_page(TOUR4).run()
    assert not at.exception
    before = {k: at.session_state[k] for k in at.session_state if str(k).startswith("s_")}
    with held(one_lane):  # the task waits in line while the page draws
        at.button(key="tour4_apply").click().run()
    assert not at.exception
    # the record lacks this gravity: a task recomputes it, and the page shows its progress
    # and the recorded views meanwhile, until the task's end reruns the page with the what-if
    assert not s.replay_memo["whatif"].model_gravity  # the what-if before the button
    bars = [b.proto.text for b in at.get("progress")]
    assert any(
        t.startswith(
            "Gravity: recomputing pull gravity with the model, since the recorded steps were "
            "decoded with other gravity settings · "
        )
        for t in bars
    ), bars
    run_until(at, lambda: not work.running(s, page.GRAVITY))
    assert not at.exception and work.error(s, page.GRAVITY) is None
    assert [b.proto.text for b in at.get("progress")] == ["Step 4 of 5"]  # the tour's own
    after = {k: at.session_state[k] for k in at.session_state if str(k).startswith("s_")}
    changed = {k[2:] for k in after if after[k] != before.get(k)}
    assert changed - {"preset"} == set(tour.GRAVITY_ON)  # the run's default was contrast, λ 0
    params = Settings.from_state(at.session_state).prune_params()
    assert (params.gravity_kind, params.gravity_mass, params.gravity_mode) == (
        "pull",
        "attention",
        "rerank",
    )
    md = " ".join(m.value for m in at.markdown)
    assert "**Gravity on now:** kind *pull* (attention, cosine), λ = 0.5, over a rerank of " in md
    # a pull has per-token terms: the chart of what pulled the taken token is drawn
    assert any(sh.value.startswith("What pulled ") for sh in at.subheader)
    assert not any("no per-token terms" in i.value for i in at.info)
    wi = s.replay_memo["whatif"]
    assert wi.model_gravity and wi.n == 8
    # gravity alone changes a choice of the tiny model's run, and the caption says it is
    # gravity's doing, since every other slider is the run's own
    assert wi.first_diff is not None
    assert (
        f"The pink line marks step {wi.first_diff}, the first choice gravity changes: every "
        "other slider is the run's own." in [c.value for c in at.caption]
    )
    # the banner says the model ran, for the gravity, not "no model run"
    banners = [m.value for m in (*at.warning, *at.success) if m.value.startswith("What-if (")]
    assert banners and all("gravity recomputed with the model" in b for b in banners), banners

    # a slider moved besides gravity: kept by the buttons, and named by the caption
    at.session_state["s_top_k"] = 7
    at.run()
    wi = s.replay_memo["whatif"]
    assert wi.first_diff is not None
    assert any(
        c.value.startswith(
            f"The pink line marks step {wi.first_diff}, the first choice that "
            "changes. Other sliders differ from the run's too (top_k)"
        )
        for c in at.caption
    )
    at.button(key="tour4_back").click().run()
    assert at.session_state["s_gravity_lambda"] == 0.0 and at.session_state["s_top_k"] == 7
    assert at.session_state["s_gravity_kind"] == "pull"
    at.button(key="tour4_apply").click().run()
    assert at.session_state["s_top_k"] == 7 and at.session_state["s_gravity_lambda"] == 0.5


def test_no_gravity_is_recomputed_while_the_run_decodes_and_it_is_at_its_end(app, one_lane):
    """A gravity slider moved while the run's task decodes: the record grows a token at a
    time, so no gravity task starts (each token would restart it); the run's end does."""
    at = run_steps(app, 4)
    s = at.session_state["semviz"]
    with held(one_lane):
        at.button(key="btn_run").click().run()
        at.session_state["s_gravity_lambda"] = 0.5  # the record has no gravity
        at.run()
        assert not at.exception
        assert runner.job(s) is not None and work.slot(s, page.GRAVITY) is None
    settle(at)
    run_until(at, lambda: not work.running(s, page.GRAVITY))
    assert not at.exception and work.ended(s, page.GRAVITY).result
    wi = s.replay_memo["whatif"]
    assert wi.model_gravity and wi.n == len(s.trace.steps) == 8


def test_gravity_is_recomputed_in_slices_equal_to_the_whole(generated):
    """The task's slices, each going on from the last one's carry, give the gravity of one
    call over the whole run (the EMA mass chains across slices)."""
    from semviz.analysis.replay import recompute_gravity

    s = generated.session_state["semviz"]
    tr, lm = s.decoder.trace, s.decoder.lm
    p = tour.GRAVITY.replace(gravity_mass="ema")
    whole = recompute_gravity(lm.model, tr, p)
    task = GravityTask(lm.model, tr, p, chunk=3)
    while not task.advance(0.0, Turns("test")):
        assert task.progress().done == len(task.result())
    sliced = task.result()
    assert len(sliced) == len(whole) == len(tr.steps)
    for a, b in zip(sliced, whole, strict=True):
        assert a.shape == b.shape and bool((a == b).all())
    assert task.progress().fraction == 1.0 and task.progress().unit == "steps"


def test_a_stopped_task_keeps_what_it_made(generated):
    s = generated.session_state["semviz"]
    tr, lm = s.decoder.trace, s.decoder.lm
    task = GravityTask(lm.model, tr, tour.GRAVITY, chunk=2)
    task.advance(0.0, Turns("test"))
    task.stop()
    assert task.advance(10.0, Turns("test")) and task.stopped
    assert len(task.result()) == 2
