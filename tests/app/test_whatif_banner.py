"""The what-if banner on the tiny model: an exact replayed pick is stated, an estimate is
marked "≈" with its reason, and once the ghost decode has made the step's token the banner
names the model's pick."""

from __future__ import annotations

from semviz.output import escape
from semviz.output.style import display_token
from tests.app.conftest import run_steps, wait_until
from ui import runner


def sess(at):
    return at.session_state["semviz"]


def banner(at) -> str:
    texts = [w.value for w in at.warning if w.value.startswith("What-if")]
    assert len(texts) == 1, [w.value for w in at.warning]
    return texts[0]


def label(at, t: int) -> str:
    s = sess(at)
    return escape.markdown(display_token(s.decoder.lm.tokenizer.decode([int(t)])))


def test_banner_states_an_exact_pick_marks_an_estimate_and_follows_the_decode(app, monkeypatch):
    run_steps(app, 10)
    s = sess(app)
    old = escape.markdown(display_token(s.decoder.trace.steps[0].token_text))
    # a run recorded without every raw logit (as the shipped examples are): at T 2.0 replay
    # keeps every pick, but each draw may land outside the record's 1,024 candidates (the
    # tiny model is near flat), so "no change" is itself an estimate
    steps = s.decoder.trace.steps
    full = [rec.full_logits for rec in steps]
    for rec in steps:  # the record then keeps the tail's summary, made from them
        rec.tail, rec.full_logits = rec.tail_summary(), None
    assert all(isinstance(rec.tail, dict) for rec in steps)
    app.slider(key="s_temperature").set_value(2.0).run()
    hot = s.replay_memo["whatif"]
    assert hot.first_diff is None and hot.approximate == [True] * 10
    assert [m.value for m in app.success if m.value.startswith("What-if")] == [
        "What-if (recorded at Temperature 0.8, viewing at 2): the sliders moved after generation. Replaying the 10 recorded steps "
        f"through the core ({1e3 * hot.seconds:.0f} ms, no model run) changes no choice. "
        "10 of the 10 picks are estimates (≈): the draw may land in the tail the record does "
        "not hold."
    ]
    # the run as the app records it, every logit kept: the same replay decides every pick
    for rec, f in zip(steps, full, strict=True):
        rec.full_logits = f
    s.replay_memo.clear()
    app.run()
    hot = s.replay_memo["whatif"]
    assert not any(hot.approximate) and hot.n == 10
    assert not any(m.value.startswith("What-if") and "estimate" in m.value for m in app.success)
    # the ghost decode is held back until the banner has been read without its answer
    start_ghost = runner.ghost
    monkeypatch.setattr(runner, "ghost", lambda sess, *a: runner.ghost_stop(sess))
    app.slider(key="s_temperature").set_value(0.0).run()  # greedy
    assert s.ghost is None
    wi = s.replay_memo["whatif"]
    # greedy, the tiny model's run changes step 0, and the record decides that pick; the
    # test fails rather than skips if the fixture stops giving such a step
    assert wi.first_diff == 0 and not wi.approximate[0]
    new = label(app, wi.token_ids[0])
    assert banner(app) == (
        f"What-if (recorded at Temperature 0.8, viewing at 0): with these sliders step **0** would pick **{new}** instead of **{old}** "
        f"(replayed 10 steps in {1e3 * wi.seconds:.0f} ms, no model run). Views show the "
        "replay; steps from the marked one on are counterfactual."
    )

    # the same step as the library marks it when the draw may fall outside the record
    why = "the draw may land in the tail the record does not hold"
    wi.approximate[0], wi.why[0] = True, why
    app.run()
    assert s.replay_memo["whatif"] is wi
    assert banner(app) == (
        f"What-if (recorded at Temperature 0.8, viewing at 0): with these sliders step **0** would pick **≈ {new}** instead of "
        f"**{old}** (replayed 10 steps in {1e3 * wi.seconds:.0f} ms, no model run). An "
        f"estimate: {why}; the model's decode below shows its real pick. Views show the "
        "replay; steps from the marked one on are counterfactual."
    )

    # once the ghost decode has made step 0, its token is the truth the banner names
    monkeypatch.setattr(runner, "ghost", start_ghost)
    app.run()  # the page starts the ghost; its task decodes in its own thread
    wait_until(lambda: s.ghost is not None and s.ghost.complete)
    real = s.ghost.tokens[0]
    assert real == wi.token_ids[0]  # the tiny model's decode agrees with the replay here
    app.run()
    assert banner(app) == (
        f"What-if (recorded at Temperature 0.8, viewing at 0): with these sliders step **0** would pick **{new}** instead of **{old}** "
        f"(replayed 10 steps in {1e3 * wi.seconds:.0f} ms, no model run; the model's "
        "decode below picks it too). Views show the replay; steps from the marked one on "
        "are counterfactual."
    )
    # a replay estimate the decode contradicts: the banner gives the decode's token
    guess = next(t for t in range(5, 50) if t != real)
    wi.token_ids[0] = guess
    app.run()
    assert banner(app) == (
        f"What-if (recorded at Temperature 0.8, viewing at 0): with these sliders step **0** would pick **{new}** instead of **{old}**: "
        f"the model's decode below picks it, where the replay of the record estimated "
        f"**{label(app, guess)}** (replayed 10 steps in {1e3 * wi.seconds:.0f} ms, no model "
        "run). Views show the replay; steps from the marked one on are counterfactual."
    )
    assert not app.exception
