"""Every forward the app makes, from every page, takes its turn in the model's line.

The shared model's first layer gets a forward pre-hook that counts the forwards made while the
calling thread holds no turn in ``semviz.model.queue.QUEUE``; every page's model work is then
driven once: Step, Run, Play and Stop, a branch, Regenerate, the what-if ghost, Rewind, stepping
on from an example, the prefill scan, kv-eval and Compare. The count must be 0.
"""

from __future__ import annotations

import contextlib
import traceback

from semviz.model.queue import QUEUE
from tests.app.conftest import GENERATE, click_step, run_steps, run_until


@contextlib.contextmanager
def _turns(lm):
    """Count the model's forwards made inside a queue turn (``inside[0]``) and keep the stack
    of each one made outside (``outside``), while the block runs."""
    outside: list[str] = []
    inside = [0]

    def count(module, args) -> None:
        with QUEUE._cond:
            held = QUEUE._held()
        if held is None:
            outside.append("".join(traceback.format_stack(limit=40)))
        else:
            inside[0] += 1

    # the first layer: every forward passes through it, whether or not it runs the LM head
    hook = lm.model.model.layers[0].register_forward_pre_hook(count)
    try:
        yield inside, outside
    finally:
        hook.remove()


def _until_idle(at) -> None:
    """Run the page until the session's tasks (the run, the ghost, kv-eval, Compare) have ended."""
    s = at.session_state["semviz"]
    run_until(at, lambda: not any(slot.running for slot in s.tasks.values()))


def test_every_forward_from_every_page_takes_a_turn(app):
    from ui.model import get_model

    lm = get_model(app.session_state["settings"].model_name())
    with _turns(lm) as (inside, outside):
        click_step(app).run()  # the prefill and the first token
        _until_idle(app)
        run_steps(app, 6)
        app.button(key="btn_play").click().run()
        app.run()
        app.button(key="job_stop").click().run()
        _until_idle(app)
        app.button(key="btn_branch").click().run()  # the selected step's second choice
        _until_idle(app)
        app.slider(key="step_sel").set_value(0).run()
        app.button(key="btn_branch").click().run()  # at step 0: a new prefill
        _until_idle(app)
        app.session_state["s_temperature"] = 0.0  # the what-if and its ghost continuation
        app.run()
        _until_idle(app)
        _until_idle(app)  # the ghost decodes in its task
        if "regen_from" in [b.key for b in app.button]:  # greedy changed a choice
            app.button(key="regen_from").click().run()
            _until_idle(app)
        app.button(key="btn_rewind").click().run()
        app.button(key="btn_reset").click().run()
        _until_idle(app)

        app.switch_page("app_pages/home.py").run()  # an example, then stepping on from it
        app.button(key="home_ex_capital_attention.json").click().run()
        app.switch_page(GENERATE).run()
        app.session_state["s_run_n"] = 2
        app.run()
        app.button(key="btn_run").click().run()
        _until_idle(app)

        app.switch_page("app_pages/pipeline.py").run()
        app.button(key="pipe_measure").click().run()
        app.switch_page("app_pages/kv_cache.py").run()
        app.number_input(key="kve_tokens").set_value(32)
        app.button[[b.label for b in app.button].index("Run kv-eval")].click().run()
        _until_idle(app)
        app.switch_page("app_pages/compare.py").run()
        app.number_input(key="cmp_steps").set_value(4)
        app.button(key="cmp_run").click().run()
        _until_idle(app)
        for page in ("distributions", "thermodynamics", "attention", "lens", "presenter", "report"):
            app.switch_page(f"app_pages/{page}.py").run()
    assert not app.exception, app.exception
    assert inside[0] > 50  # the pages above did run the model
    assert outside == [], "\n\n".join(outside)


def test_a_sweep_from_the_frontier_page_takes_its_turns(app, tmp_path):
    """The sweep runs in the task panel's thread: its forwards wait in line like every other."""
    from tests.frontier.test_page import run_page_sweep
    from ui.model import get_model

    lm = get_model(app.session_state["settings"].model_name())
    with _turns(lm) as (inside, outside):
        app.switch_page("app_pages/frontier.py").run()
        run_page_sweep(
            app, tmp_path / "sweep.parquet", values="0.7", n=1, seeds=1, tokens=4, seconds=300
        )
    assert inside[0] >= 4  # the prompt and the new tokens of each setting
    assert outside == [], "\n\n".join(outside)
