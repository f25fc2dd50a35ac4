"""Long work as tasks: slices, progress, Stop that keeps the work, turns in the model's line,
and a run's recipe that reproduces it token for token."""

from __future__ import annotations

import threading
import time

import pytest

from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.model.queue import ForwardQueue
from semviz.sampling import PruneParams
from semviz.tasks import DecodeTask, Edit, Progress, Recipe, Task, Turns


class Count(Task):
    """n units, each holding a turn in the line."""

    label = "Counting"

    def __init__(self, n: int, pause: float = 0.0) -> None:
        super().__init__()
        self.n, self.pause, self.done = n, pause, 0

    def unit(self, turns: Turns) -> bool:
        with turns.turn():
            time.sleep(self.pause)
            self.done += 1
        return self.done < self.n

    def progress(self) -> Progress:
        return Progress(self.done, self.n, "counting", unit="units", seconds=self.seconds)

    def result(self) -> int:
        return self.done


def test_advance_does_at_least_one_unit_and_reports_progress():
    t = Count(4)
    assert t.advance(0.0, Turns("a", ForwardQueue(poll=0.01))) is False
    p = t.progress()
    assert (p.done, p.total, p.phase, p.unit) == (1, 4, "counting", "units")
    assert p.fraction == 0.25 and p.eta() is not None
    assert t.advance(60.0, Turns("a", ForwardQueue(poll=0.01))) is True
    assert (t.result(), t.finished, t.stopped) == (4, True, False)
    assert Progress(0, None).eta() is None and Progress(0, None).fraction == 0.0


def test_stop_ends_after_the_unit_in_progress_and_keeps_the_work():
    t = Count(1000, pause=0.005)
    q = ForwardQueue(poll=0.01)
    out: list[bool] = []
    th = threading.Thread(target=lambda: out.append(t.advance(60.0, Turns("a", q))))
    th.start()
    while t.done < 3:
        time.sleep(0.002)
    t.stop()
    th.join(5)
    assert out == [True] and t.stopped and t.finished
    kept = t.result()
    assert 3 <= kept < 1000
    assert t.advance(60.0, Turns("a", q)) is True and t.result() == kept  # no more work


def test_every_unit_waits_its_turn_and_stop_leaves_the_line():
    q = ForwardQueue(poll=0.01)
    release, held = threading.Event(), threading.Event()

    def hold() -> None:
        with q.turn("other"):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    places: list = []
    t = Count(5)
    out: list[bool] = []
    turns = Turns("me", q, should_stop=lambda: t.stopping, on_wait=places.append)
    th = threading.Thread(target=lambda: out.append(t.advance(60.0, turns)))
    th.start()
    deadline = time.monotonic() + 5
    while not places and time.monotonic() < deadline:
        time.sleep(0.005)
    assert places and places[0].ahead == 1  # behind the holder, and told so
    assert t.done == 0  # no unit ran outside a turn
    t.stop()
    th.join(5)
    assert out == [True] and t.stopped and t.done == 0
    assert q.place("me") is None  # it left the line
    release.set()
    holder.join(5)


def test_a_new_task_needs_one_method():
    class Nothing(Task):
        pass

    with pytest.raises(NotImplementedError):
        Nothing().advance(1.0, Turns("a", ForwardQueue(poll=0.01)))


# -- the recipe --------------------------------------------------------------------------------


def test_recipe_edits_settings_and_tokens_by_step():
    base = PruneParams(temperature=0.8)
    hot = PruneParams(temperature=1.3, top_p=0.5)
    r = Recipe(base).edit(3, token=7).edit(5, params=hot)
    assert r.edits == (Edit(3, None, 7), Edit(5, hot, None))
    assert [r.params_at(n) for n in (0, 4, 5, 9)] == [base, base, hot, hot]
    assert [r.token_at(n) for n in (2, 3, 4)] == [None, 7, None]
    assert r.cut(4).edits == (Edit(3, None, 7),)
    assert r.edit(2, params=base) == Recipe(base)  # no change: cut, nothing added
    text = r.to_text(PruneParams())
    assert text == ("temperature:0.8", "3@t7;5@temperature:1.3,top_p:0.5")
    assert Recipe.from_text(PruneParams(), *text) == r


@pytest.mark.parametrize(
    ("base", "edits", "error"),
    [
        ("temperature", "", "'temperature': expected field:value"),
        ("", "x@t1", "'x@t1': expected step@changes"),
        ("", "4@t1;2@t3", "'2@t3': edits must come in order of their steps"),
    ],
)
def test_recipe_text_that_cannot_be_read_names_the_part(base, edits, error):
    with pytest.raises(ValueError, match=error):
        Recipe.from_text(PruneParams(), base, edits)


# -- decoding ----------------------------------------------------------------------------------

PROMPT = "The capital of France is"


def _decoder(lm, params: PruneParams, seed: int = 3) -> Decoder:
    return Decoder(lm, PROMPT, params, DecodeSettings(seed=seed, max_new_tokens=40))


def test_decode_task_builds_in_a_turn_and_equals_the_decoder(tiny_lm):
    p = PruneParams(temperature=1.2)
    ref = _decoder(tiny_lm, p)
    for _ in range(8):
        ref.step()
    q = ForwardQueue(poll=0.01)
    turns_taken = []
    real_turn = q.turn

    def counted(owner, **kw):
        turns_taken.append(owner)
        return real_turn(owner, **kw)

    q.turn = counted
    t = DecodeTask(build=lambda: _decoder(tiny_lm, p), sample=8, params=p, label="Run 8")
    assert t.progress().phase == "prefill"
    while not t.advance(0.0, Turns("me", q)):
        pass
    assert t.decoder.trace.token_ids == ref.trace.token_ids
    assert (t.made, t.progress().done, t.progress().total) == (8, 8, 8)
    # the prefill and seven forwards; the first token's logits came with the prefill
    assert len(turns_taken) == 8 and set(turns_taken) == {"me"}


def test_a_run_under_changing_sliders_and_a_hand_picked_token_is_reproduced(tiny_lm):
    cold, hot = PruneParams(temperature=0.7), PruneParams(temperature=1.5)
    q = ForwardQueue(poll=0.01)
    t = DecodeTask(build=lambda: _decoder(tiny_lm, cold), sample=None, params=cold)  # Play
    for _ in range(4):  # the prefill, then a token a slice
        t.advance(0.0, Turns("a", q))
    t.params = hot  # the sliders move while it plays
    for _ in range(3):
        t.advance(0.0, Turns("a", q))
    assert t.decoder.n_steps == 6 and not t.finished
    picked = t.decoder.trace.token_ids[4] + 1
    r = t.recipe.edit(4, token=picked)  # branch at step 4
    base = t.decoder

    def fork():  # a branch: the cache forked and cropped, nothing re-fed
        f = base.fork()
        f.rewind(4, r.params_at(4))
        return f

    t2 = DecodeTask(build=fork, recipe=r, sample=5)
    t2.advance(60.0, Turns("a", q))
    assert t.recipe == Recipe(cold).edit(3, params=hot)
    assert t2.decoder.trace.token_ids[4] == picked

    # the link: the recipe alone, from a fresh prefill, gives the same tokens
    link = Recipe.from_text(PruneParams(), *t2.recipe.to_text(PruneParams()))
    assert link == t2.recipe
    again = DecodeTask(build=lambda: _decoder(tiny_lm, link.params_at(0)), recipe=link, sample=9)
    again.advance(60.0, Turns("b", q))
    assert again.decoder.trace.token_ids == t2.decoder.trace.token_ids


def test_refeed_takes_the_recorded_tokens_first(tiny_lm):
    p = PruneParams(temperature=1.1)
    ref = _decoder(tiny_lm, p)
    for _ in range(6):
        ref.step()
    recorded = ref.trace.token_ids[:4]
    t = DecodeTask(build=lambda: _decoder(tiny_lm, p, seed=99), refeed=recorded, sample=0)
    t.advance(0.0, Turns("a", ForwardQueue(poll=0.01)))
    t.advance(0.0, Turns("a", ForwardQueue(poll=0.01)))
    assert t.progress().phase == "re-feeding the recorded tokens"
    t.advance(60.0, Turns("a", ForwardQueue(poll=0.01)))
    assert t.decoder.trace.token_ids == recorded and t.made == 4


def test_a_decode_task_needs_a_decoder_or_a_build():
    with pytest.raises(ValueError, match="needs a decoder or a way to build one"):
        DecodeTask()


# -- the pages' long work ------------------------------------------------------------------------


def _to_the_end(task: Task, owner: str = "page") -> Task:
    turns = Turns(owner, ForwardQueue(poll=0.01))
    while not task.advance(0.0, turns):  # a slice at a time, as the app's worker runs it
        pass
    return task


def test_compare_task_equals_the_comparison_run_at_once(tiny_lm):
    from semviz.analysis import compare
    from semviz.tasks import CompareTask

    sides = [compare.parse_side("top_p=0.9"), compare.parse_side("temperature=1.4")]
    ref = compare.start(tiny_lm, PROMPT, sides, steps=6, seed=2)
    compare.advance(ref)
    t = CompareTask(tiny_lm, PROMPT, sides, steps=6, seed=2)
    assert t.progress().phase == "reading the prompt" and t.result() is None
    _to_the_end(t)
    got = t.result()
    assert [tr.token_ids for tr in got.traces] == [tr.token_ids for tr in ref.traces]
    assert not got.stopped and t.cmp.decoders == []  # the caches went with the end
    p = t.progress()
    assert (p.done, p.total) == (12, 12)


def test_a_stopped_compare_keeps_its_tokens_and_says_so(tiny_lm):
    from semviz.analysis import compare
    from semviz.tasks import CompareTask

    sides = [compare.parse_side("top_p=0.9"), compare.parse_side("top_p=0.5")]
    t = CompareTask(tiny_lm, PROMPT, sides, steps=30, seed=2)
    turns = Turns("page", ForwardQueue(poll=0.01))
    for _ in range(4):  # the prompt, then three tokens a side
        t.advance(0.0, turns)
    kept = t.result()
    t.stop()
    assert t.advance(60.0, turns) is True and t.stopped
    got = t.result()
    assert got.stopped and [len(tr.steps) for tr in got.traces] == [3, 3]
    assert [tr.token_ids for tr in got.traces] == [tr.token_ids for tr in kept.traces]
    assert t.cmp.decoders == []


def test_kv_eval_task_rows_equal_kv_eval(tiny_lm):
    from semviz.eviction import KVEval, kv_eval
    from semviz.tasks import KVEvalTask

    ids = list(range(40, 72))
    ref = kv_eval(tiny_lm, ids, ["full", "window", "h2o"], (8,))
    t = _to_the_end(KVEvalTask(KVEval(tiny_lm, ids, ["full", "window", "h2o"], (8,))))
    timing = ("tokens_per_s", "seconds")
    strip = [{k: v for k, v in r.items() if k not in timing} for r in t.result()]
    assert strip == [{k: v for k, v in r.items() if k not in timing} for r in ref]
    assert (t.progress().done, t.progress().total) == (32, 32)


def test_prefill_scan_task_measures_each_length(tiny_lm):
    from semviz.tasks import PrefillScanTask

    t = PrefillScanTask(tiny_lm, [4, 16, 8], repeats=1)
    t.advance(0.0, Turns("page", ForwardQueue(poll=0.01)))
    assert t.result()[0] == [4] and t.progress().done == 1
    _to_the_end(t)
    n, s = t.result()
    assert n == [4, 16, 8] and len(s) == 3 and all(x > 0 for x in s)


def test_report_task_writes_the_bundle_and_stops_between_views(tiny_lm, tmp_path):
    from semviz.tasks import ReportTask

    dec = _decoder(tiny_lm, PruneParams())
    dec.run(4)
    t = _to_the_end(ReportTask(dec.trace, tmp_path / "r", tokenizer=tiny_lm.tokenizer, png=False))
    rep = t.result()
    assert rep.html.exists() and not rep.stopped and t.progress().done == 100
    s = ReportTask(dec.trace, tmp_path / "s", tokenizer=tiny_lm.tokenizer, png=False)
    s.stop()  # before it starts: nothing runs
    assert s.advance(60.0, Turns("page", ForwardQueue(poll=0.01))) and s.result() is None


def _report_folders() -> set:
    import tempfile
    from pathlib import Path

    return set(Path(tempfile.gettempdir()).glob("semviz-report-*"))


def test_a_report_task_with_no_folder_keeps_a_zip_of_the_bundle_and_leaves_no_folder(tiny_lm):
    import io
    import zipfile

    from semviz.tasks import ReportTask

    dec = _decoder(tiny_lm, PruneParams())
    dec.run(4)
    before = _report_folders()
    t = _to_the_end(ReportTask(dec.trace, tokenizer=tiny_lm.tokenizer, png=False))
    made = t.result()
    assert made.complete and made.pngs == 0 and not t.stopped
    with zipfile.ZipFile(io.BytesIO(made.zip)) as z:
        names = set(z.namelist())
        kept = z.read("trace.json")
    assert {"report.html", "report.json", "trace.json", "trace.parquet"} <= names
    assert kept == dec.trace.to_json().encode()
    assert _report_folders() == before


def test_a_report_task_that_fails_keeps_what_it_wrote_and_raises(tiny_lm, monkeypatch):
    import io
    import zipfile

    from semviz.output import report
    from semviz.tasks import ReportTask

    def half(trace, out, **kw):  # writes one file, then fails as a missing browser would
        (out / "report.html").write_text("<html></html>")
        raise RuntimeError("no browser for the PNGs")

    monkeypatch.setattr(report, "build", half)
    dec = _decoder(tiny_lm, PruneParams())
    dec.run(2)
    before = _report_folders()
    t = ReportTask(dec.trace, tokenizer=tiny_lm.tokenizer, png=True)
    with pytest.raises(RuntimeError, match="no browser"):
        t.advance(60.0, Turns("page", ForwardQueue(poll=0.01)))
    made = t.result()
    assert not made.complete and made.pngs == 0
    with zipfile.ZipFile(io.BytesIO(made.zip)) as z:
        assert z.namelist() == ["report.html"]
    assert _report_folders() == before
