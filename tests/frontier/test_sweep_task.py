"""A frontier sweep run as a task: rows as progress, its model work in a turn, Stop keeps the
finished batches."""

from __future__ import annotations

import contextlib

from semviz.analysis.compare import parse_side
from semviz.frontier.sweep import SweepConfig, load_results
from semviz.model.queue import ForwardQueue
from semviz.tasks import FrontierTask, Turns


class StopInSecondBatch(Turns):
    """Turns that press Stop once the sweep is halfway through its second batch."""

    task: FrontierTask

    @contextlib.contextmanager
    def turn(self):
        with super().turn() as t:
            outer = self

            class Watch:
                def let_others(self) -> None:
                    p = outer.task._progress
                    if p is not None and p.rows_done >= 6:  # 4 rows done, 2 of 4 in flight
                        outer.task.stop()
                    t.let_others()

            yield Watch()


def test_a_sweep_task_reports_rows_and_stops_keeping_the_finished_batch(peaked_lm, judge, tmp_path):
    cfg = SweepConfig(
        settings=(parse_side("top_p=0.9"), parse_side("top_p=0.9,gravity_lambda=1")),
        values=(0.7, 1.3),
        n_prompts=2,
        seeds=2,
        new_tokens=4,
        batch_rows=4,
    )
    out = tmp_path / "r.parquet"
    t = FrontierTask(peaked_lm, cfg, out, judge=judge)
    assert t.progress().total is None  # nothing known before the sweep starts
    seen: list = []
    turns = StopInSecondBatch("page", ForwardQueue(poll=0.01), on_wait=seen.append)
    turns.task = t
    assert t.advance(60.0, turns) is True
    assert t.stopped and t.result().stopped and t.result().new_rows == 4
    assert len(load_results(out)) == 4  # the finished batch only
    p = t.progress()
    assert (p.total, p.unit) == (16, "rows") and 4 <= p.done < 16
    assert seen == [None]  # it took one turn in the model's line and held it
