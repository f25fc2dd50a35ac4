"""The sweep on Ray: the same rows as in this process, resumable after a stop, and no Ray
imported (or started) without workers. A local 2-worker Ray on the peaked tiny model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from semviz.analysis.compare import parse_side
from semviz.frontier.executor import Executor, ModelSpec
from semviz.frontier.sweep import SweepConfig, load_results, run_sweep, sweep_task

KEY = ["spec", "value", "prompt_id", "seed"]


def _cfg():
    return SweepConfig(
        settings=(parse_side("min_p=0.1"), parse_side("top_p=0.9,gravity_lambda=0.5")),
        values=(0.7, 1.3),
        n_prompts=2,
        seeds=2,
        new_tokens=4,
        batch_rows=2,
    )


def _rows(df):
    df = df.sort_values(KEY).reset_index(drop=True)
    return df[[*KEY, "text", "n_tokens", "stop"]], df["nll"].to_numpy()


@pytest.fixture(scope="module")
def ray_pool(peaked_dir):
    ray = pytest.importorskip("ray")
    yield ModelSpec(str(peaked_dir), device="cpu", dtype="float32", threads=1)
    ray.shutdown()


def test_a_ray_sweep_stopped_midway_resumes_to_the_rows_of_one_in_this_process(
    peaked_lm, ray_pool, tmp_path
):
    import ray

    cfg = _cfg()
    here = run_sweep(peaked_lm, cfg, tmp_path / "here.parquet", score=False).frame
    assert len(here) == 16

    path = tmp_path / "ray.parquet"
    seen = []
    ex = Executor(sweep_task(cfg, score=False), model=ray_pool, workers=2)
    with ex:
        first = run_sweep(
            None,
            cfg,
            path,
            score=False,
            executor=ex,
            on_progress=seen.append,
            should_stop=lambda: any(p.rows_done >= 4 for p in seen),
        )
        assert ray.is_initialized() and len(ex._pool.actors) == 2
    assert not ray.is_initialized()  # the Ray this executor started is shut down
    assert first.stopped and 4 <= first.new_rows < 16
    assert len(load_results(path)) == first.new_rows  # finished batches only, whole ones
    assert first.new_rows % cfg.batch_rows == 0

    second = run_sweep(peaked_lm, cfg, path, score=False)  # resumed here: the same rows
    assert not second.stopped
    assert (second.new_rows, second.skipped_rows) == (16 - first.new_rows, first.new_rows)

    a, nll_a = _rows(here)
    b, nll_b = _rows(load_results(path))
    assert a.equals(b)  # the same tokens, row for row
    assert nll_b == pytest.approx(nll_a, abs=1e-5)


def test_a_sweep_without_workers_neither_imports_nor_starts_ray(peaked_dir, tmp_path):
    code = f"""
import sys
from semviz.analysis.compare import parse_side
from semviz.frontier.executor import Executor, ModelSpec
from semviz.frontier.sweep import SweepConfig, run_sweep, sweep_task
cfg = SweepConfig(settings=(parse_side("plain"),), values=(1.0,), n_prompts=1, seeds=1,
                  new_tokens=2)
spec = ModelSpec({str(peaked_dir)!r}, device="cpu", dtype="float32")
with Executor(sweep_task(cfg, score=False), model=spec) as ex:
    res = run_sweep(None, cfg, {str(tmp_path / "r.parquet")!r}, score=False, executor=ex)
assert res.new_rows == 1, res
print("ray" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        Executor(sweep_task(_cfg(), score=False), workers=0)


def test_a_kv_eval_grid_on_ray_has_the_rows_of_one_run_here(peaked_lm, ray_pool):
    from semviz.frontier.kvgrid import KVGridTask, kv_grid

    tok = peaked_lm.tokenizer
    texts = {
        name: tok(t * 6, add_special_tokens=False)["input_ids"][:16]
        for name, t in [("a", "It was the best of times, "), ("b", "The quick brown fox. ")]
    }
    args = (texts, ["full", "window", "h2o"], [6, 10])
    here, _ = kv_grid(*args, lm=peaked_lm)
    with Executor(KVGridTask(), model=ray_pool, workers=2) as ex:
        there, stopped = kv_grid(*args, executor=ex)
    assert not stopped
    timed = {"tokens_per_s", "seconds"}
    strip = lambda rows: [{k: v for k, v in r.items() if k not in timed} for r in rows]  # noqa: E731
    assert [(r["text"], r["policy"], r["budget"]) for r in there] == [
        (r["text"], r["policy"], r["budget"]) for r in here
    ]
    for a, b in zip(strip(here), strip(there), strict=True):
        assert b == {
            # rows made in another process with another thread count: equal to rounding
            k: pytest.approx(v, rel=1e-6, abs=1e-6) if isinstance(v, float) else v
            for k, v in a.items()
        }


def test_the_frontier_page_hands_its_sweep_to_ray_workers(
    peaked_dir, peaked_lm, tmp_path, monkeypatch
):
    """The page's sweep form with "Ray workers" 1: the batches run on a local Ray worker that
    loads the sidebar's model, and the rows are the ones a sweep in this process makes."""
    pytest.importorskip("ray")
    import ray
    from streamlit.testing.v1 import AppTest

    from tests.frontier.test_page import APP, PAGE, run_page_sweep

    monkeypatch.setenv("SEMVIZ_MODEL", str(peaked_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page(PAGE).run()
    out = tmp_path / "ray.parquet"
    ended = run_page_sweep(
        at, out, a="min_p=0.1", b="top_p=0.9", values="0.7", n=2, seeds=1, tokens=4, workers=1
    )
    res = ended.result
    assert (res.new_rows, res.skipped_rows, res.workers, res.path) == (4, 0, 1, str(out))
    assert [m.value for m in at.success] == [
        f"Sweep finished on 1 Ray worker: 4 new rows, 0 already there, in `{out}`."
    ]
    assert not ray.is_initialized()  # the Ray the sweep started is shut down
    cfg = SweepConfig(  # the form's defaults
        settings=(parse_side("min_p=0.1"), parse_side("top_p=0.9")),
        values=(0.7,),
        n_prompts=2,
        seeds=1,
        new_tokens=4,
        chat=True,
        split="dev",
    )
    here = run_sweep(peaked_lm, cfg, tmp_path / "here.parquet", score=False).frame
    a, _ = _rows(here)
    b, _ = _rows(load_results(out))
    assert a.equals(b)
    assert load_results(out)["coherence"].notna().all()  # judged, as the page's sweeps are
