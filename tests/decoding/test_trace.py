"""Trace JSON round trip, DataFrame view, and clear errors for corrupt or foreign files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output.trace import FORMAT_VERSION, Trace, TraceError
from semviz.sampling import PruneParams


@pytest.fixture(scope="module")
def trace(tiny_lm):
    p = PruneParams(temperature=0.9, top_p=0.95, gravity_lambda=0.5, gravity_mass="uniform")
    d = Decoder(tiny_lm, "A quiet harbour at dawn", p, DecodeSettings(max_new_tokens=6, seed=4))
    d.run(6)
    return d.trace


def test_json_round_trip_gives_equal_records(trace, tmp_path):
    path = trace.save(tmp_path / "t.json")
    back = Trace.load(path)
    assert back == trace
    assert len(back.steps) == 6
    for a, b in zip(back.steps, trace.steps, strict=True):
        assert a == b
        assert a.attention.dtype == b.attention.dtype and a.gravity is not None
    assert back.settings["params"]["gravity_lambda"] == 0.5
    assert back.model["num_layers"] == 2
    assert json.loads(path.read_text())["version"] == FORMAT_VERSION


def test_a_record_with_every_raw_logit_makes_its_tail_summary_on_demand(tiny_lm, trace, tmp_path):
    # the summary follows from the full logits, so a step records it only where it cannot
    # be made later: without them, or with full-mode gravity (its G over the tail)
    p = PruneParams(temperature=0.9, top_p=0.95)
    runs = {}
    for full in (True, False):
        s = DecodeSettings(max_new_tokens=6, seed=4, full_logits=full)
        runs[full] = Decoder(tiny_lm, "A quiet harbour at dawn", p, s)
        runs[full].run(6)
    from semviz.analysis.replay import _tail_count

    lazy, eager = runs[True].trace, runs[False].trace
    back = Trace.load(lazy.save(tmp_path / "t.json"))
    for a, b, c in zip(lazy.steps, eager.steps, back.steps, strict=True):
        assert a.token_id == b.token_id and a.full_logits is not None and b.full_logits is None
        assert a.tail is None and b.tail is not None and b.tail_summary() is b.tail
        assert _tail_count(a, None) == _tail_count(b, None) == int(b.tail["counts"].sum()) > 0
        for made in (a.tail_summary(), c.tail_summary()):
            assert made.keys() == b.tail.keys()
            for k, v in b.tail.items():
                assert torch.equal(made[k], v) if isinstance(v, torch.Tensor) else made[k] == v
    assert back == lazy  # the summary made on demand is not a field of the record
    assert all(r.full_logits is not None and "g_lo" in r.tail for r in trace.steps)


def test_records_differ_when_a_value_differs(trace):
    other = Trace.from_json(trace.to_json())
    other.steps[2].cand_logits[0] += 1e-3
    assert other.steps[2] != trace.steps[2] and other != trace


def test_dataframe_has_one_row_per_step(trace):
    df = trace.to_dataframe()
    assert list(df["step"]) == list(range(6))
    assert list(df["token_id"]) == trace.token_ids
    assert {"entropy", "varentropy", "n_kept", "cache_bytes", "prob"} <= set(df.columns)
    assert (df["prob"] > 0).all()


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ('{"hello": 1}', "not a semviz trace"),
        ("[1, 2, 3]", "not a semviz trace"),
        ('{"format": "semviz-trace", "version": 99}', "version 99 is not supported"),
        ('{"format": "semviz-trace", "version": 1, "settings": {}}', "missing its 'model'"),
    ],
)
def test_corrupt_or_foreign_files_get_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        Trace.load(path)


def test_truncated_and_tampered_traces_fail_whole(trace, tmp_path):
    text = trace.to_json()
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace.load(path)
    d = json.loads(text)
    d["steps"][3]["cand_logits"]["shape"] = [7]
    with pytest.raises(TraceError, match="shape"):
        Trace.from_dict(d)
    d = json.loads(text)
    del d["steps"][1]["token_id"]
    with pytest.raises(TraceError, match="missing token_id"):
        Trace.from_dict(d)


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        Trace.load(tmp_path / "nope.json")


@pytest.mark.parametrize(
    "params",
    [
        PruneParams(temperature=1.0),  # wide: the final set reaches far past the record
        PruneParams(temperature=0.8),
        PruneParams(temperature=0.7, top_k=40),
    ],
)
def test_replay_with_the_recorded_settings_reproduces_every_pick(tiny_lm, params):
    from semviz.analysis.replay import replay

    d = Decoder(
        tiny_lm,
        "A quiet harbour at dawn",
        params,
        DecodeSettings(max_new_tokens=24, seed=11, record_k=64),
    )
    d.run(24)
    r = replay(d.trace, params)
    assert r.token_ids == d.trace.token_ids
    assert r.first_diff is None
    # the raw entropy is the full vocabulary's, as recorded, not the 64 candidates' lower bound
    # (every view that shows a step's entropy under the sliders reads it from here)
    assert all(s.cand_ids.numel() < tiny_lm.model.config.vocab_size for s in d.trace.steps)
    assert [x.entropy_raw for x in r.results] == [s.entropy for s in d.trace.steps]
    assert [x.varentropy_raw for x in r.results] == [s.varentropy for s in d.trace.steps]


# -- the strict schema -------------------------------------------------------------------------


def _doc(trace) -> dict:
    return json.loads(trace.to_json())


@pytest.mark.parametrize("version", [1.0, True, "1", None, [1]])
def test_only_the_integer_format_version_is_read(trace, version):
    d = _doc(trace)
    d["version"] = version
    with pytest.raises(TraceError, match="^version: the format version must be an integer"):
        Trace.from_dict(d)


def _set(d: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for k in parents:
        d = d[int(k)] if k.isdigit() else d[k]
    d[int(last) if last.isdigit() else last] = value


def _tensor(values, dtype: str) -> dict:
    from semviz.output.trace import encode_tensor

    return encode_tensor(torch.from_numpy(np.asarray(values, dtype=dtype)))


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("steps.3.cand_ids", "float32", r"^steps\[3\]\.cand_ids: expected an int32 tensor, got a float32"),
        ("steps.2.chosen_rank", 5, r"^steps\[2\]\.chosen_rank: 5 does not point at token_id"),
        ("steps.0.token_id", 49152, r"^steps\[0\]\.token_id: 49152 is out of range \[0, 49151\]"),
        ("steps.0.token_id", 2**40, r"^steps\[0\]\.token_id: 1099511627776 is out of range"),
        ("steps.1.u", 1.5, r"^steps\[1\]\.u: 1\.5 is out of range \[0, 1\]"),
        ("steps.1.entropy", "high", r"^steps\[1\]\.entropy: expected a number, got a string"),
        ("steps.1.n_kept", 2.0, r"^steps\[1\]\.n_kept: expected an integer, got a number"),
        ("steps.4.cand_logits", "short", r"^steps\[4\]\.cand_logits: expected shape \(\d+,\), got \(3,\)"),
        ("steps.5.attention", "shape", r"^steps\[5\]\.attention: expected shape \(2, 4, \d+\)"),
        ("steps.2.cache_len", 0, r"^steps\[2\]\.cache_len: is 0, but cache_positions has"),
        ("steps.2.index", 7, r"^steps\[2\]\.index: is 7, but the step is number 2"),
        ("steps.2.token_text", "\ud800", r"^steps\[2\]\.token_text: text holds a lone surrogate"),
        ("prompt_ids.0", -1, r"^prompt_ids\[0\]: -1 is out of range"),
        ("prompt_tokens", [], r"^prompt_tokens: has 0 entries for \d+ prompt_ids"),
        ("model.vocab_size", "big", r"^model\.vocab_size: expected an integer, got a string"),
        ("settings.params.top_p", 2.0, r"^settings\.params\.top_p: must be in \(0, 1\], got 2\.0"),
        ("settings.params.gravity_lambda", None, r"^settings\.params\.gravity_lambda: must be a number, got None"),
        ("settings.params.gravity_layers", [5], r"^settings\.params: PruneParams\.gravity_layers=\(5,\): the model has 2 layers"),
        ("settings.seed", 2**70, r"^settings\.seed: \d+ is out of range"),
        ("steps.1.waterfall.0.name", 3, r"^steps\[1\]\.waterfall\[0\]\.name: expected a string"),
        ("steps.1.stage_probs.final", "nan", r"^steps\[1\]\.stage_probs\.final: probabilities must be in \[0, 1\], found nan"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named_in_one_sentence(trace, path, value, message):
    d = _doc(trace)
    step = d["steps"][int(path.split(".")[1])] if path.startswith("steps") else None
    if value == "float32":
        value = _tensor([0.0, 1.0, 2.0], "float32")
    elif value == "short":
        value = _tensor([1.0, 0.5, 0.0], "float32")
    elif value == "shape":
        value = _tensor([[[0.5]]], "float16")
    elif value == "nan":
        k = step["cand_ids"]["shape"][0]
        value = _tensor([float("nan")] * k, "float16")
    _set(d, path, value)
    with pytest.raises(TraceError, match=message) as e:
        Trace.from_dict(d)
    assert "\n" not in str(e.value)


def test_ids_are_checked_against_the_callers_vocabulary(trace):
    text = trace.to_json()
    assert Trace.from_json(text, vocab_size=49152) == trace
    top = max(max(trace.prompt_ids), *(int(s.cand_ids.max()) for s in trace.steps))
    with pytest.raises(TraceError, match=r"out of range \[0, "):
        Trace.from_json(text, vocab_size=top)


def test_nesting_size_and_bare_nan_are_refused(trace, tmp_path):
    d = _doc(trace)
    d["extra"] = "@deep@"
    deep = json.dumps(d).replace('"@deep@"', "[" * 20 + "]" * 20)
    with pytest.raises(TraceError, match="^extra: the JSON is nested deeper than 16 levels"):
        Trace.from_json(deep)
    with pytest.raises(TraceError, match="nested deeper than 16 levels"):
        Trace.from_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TraceError, match="larger than the"):
        Trace.from_json(trace.to_json(), max_bytes=1000)
    with pytest.raises(TraceError, match="bare NaN"):
        Trace.from_json(trace.to_json().replace('"u": ', '"u": NaN, "x": ', 1))
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: the read stops at the limit, long before the end
        f.truncate(64 << 20)
    with pytest.raises(TraceError, match=r"larger than the 1 MiB limit"):
        Trace.load(big, max_bytes=1 << 20)


def test_devices_and_folders_are_not_read(tmp_path):
    with pytest.raises(TraceError, match="not a regular file"):
        Trace.load("/dev/zero")
    with pytest.raises(TraceError, match="is a folder"):
        Trace.load(tmp_path)


def test_save_is_atomic_and_leaves_no_temp_file(trace, tmp_path):
    (tmp_path / "t.json").mkdir()
    with pytest.raises(OSError):
        trace.save(tmp_path / "t.json")  # a folder is in the way
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    path = trace.save(tmp_path / "u.json")
    assert Trace.load(path) == trace and sorted(p.name for p in tmp_path.iterdir()) == [
        "t.json",
        "u.json",
    ]


def test_markup_in_a_trace_is_shown_as_text(trace):
    from unittest import mock

    from semviz.output import charts, escape, report

    t = Trace.from_json(trace.to_json())
    t.steps[-1].token_text = "<b>bold</b>"
    t.model["name"] = "![x](http://example.invalid/x.png) <img src=x>"
    with mock.patch("plotly.offline.get_plotlyjs", return_value=""):
        page = report.report_html(t, [])
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<img src=x>" not in page and "&lt;img src=x&gt;" in page
    fig = charts.distribution_figure(["<b>bold</b>", "a&b"], {"raw": np.array([0.6, 0.4])})
    assert fig.data[0].x == ("1. &lt;b&gt;bold&lt;/b&gt;", "2. a&amp;b")
    hover = charts.entropy_figure(charts.step_frame(t), PruneParams()).data[0].customdata
    assert list(hover[-1]) == [len(t.steps) - 1, "&lt;b&gt;bold&lt;/b&gt;"]
    shown = escape.markdown(t.model["name"])
    assert shown.startswith(r"\!\[x\]\(http\:\/\/") and "<" not in shown.replace(r"\<", "")


def test_an_lse_below_the_top_logit_is_refused(trace):
    """Found by the fuzz suite: lse -710 made chosen_prob overflow in math.exp."""
    doc = json.loads(trace.to_json())
    doc["steps"][1]["lse"] = -710
    with pytest.raises(TraceError, match=r"^steps\[1\]\.lse: -710(\.0)? is below the top"):
        Trace.from_json(json.dumps(doc))


def _harbour(tiny_lm) -> Decoder:
    """The run the replay-memo tests grow."""
    return Decoder(
        tiny_lm,
        "A quiet harbour at dawn",
        PruneParams(temperature=0.9),
        DecodeSettings(max_new_tokens=40, seed=3),
    )


def _counting_reprunes(monkeypatch, tiny_lm, fn):
    """``fn()`` and how many steps it re-pruned (a re-prune over every logit, which decides
    an open pick, is not counted)."""
    from semviz.analysis import replay as rp

    pruned = []
    prune = rp.sampling.prune
    V = tiny_lm.model.config.vocab_size

    def counted(logits, *a, **k):
        pruned.extend([1] if logits.numel() != V else [])
        return prune(logits, *a, **k)

    monkeypatch.setattr(rp.sampling, "prune", counted)
    try:
        return fn(), pruned
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize(
    "params",
    [
        PruneParams(temperature=0.7, top_k=40),  # not the run's own: picks can change
        PruneParams(adaptive="mirostat", mirostat_tau=3.0),  # mu goes from step to step
        PruneParams(adaptive="target", target_entropy=1.5),  # the controller's temperature
        PruneParams(fallback=True, fallback_ngram=2),  # reads the token history
    ],
)
def test_a_growing_run_carries_its_replay_on_and_equals_a_full_replay(tiny_lm, params, monkeypatch):
    from semviz.analysis import replay as rp

    d = _harbour(tiny_lm)
    store: dict = {}
    d.run(5)
    first = rp.cached(store, d.trace, params)
    d.run(7)
    grown, pruned = _counting_reprunes(
        monkeypatch, tiny_lm, lambda: rp.cached(store, d.trace, params)
    )
    assert len(pruned) == 7  # only the new steps were re-pruned
    assert first.n == 5 and len(first.results) == 5  # the earlier replay is left as it was
    assert grown is not first and grown.n == 12
    full = rp.replay(d.trace, params)
    assert grown.token_ids == full.token_ids and grown.chosen == full.chosen
    assert grown.first_diff == full.first_diff
    for a, b in zip(grown.results, full.results, strict=True):
        assert a.n_kept == b.n_kept and a.temperature == b.temperature
        assert torch.equal(a.index_probs["final"], b.index_probs["final"])
    d.rewind(3)  # cut back and grown again: the steps below are new, so it replays afresh
    d.run(10)
    again = rp.cached(store, d.trace, params)
    assert again.n == 13 and again.token_ids == rp.replay(d.trace, params).token_ids


def test_a_copy_of_a_growing_run_carries_its_replay_on(tiny_lm, monkeypatch):
    """A page draws the copy of the trace that a decoding task keeps after each token, a new
    object each time: the stored replay is found again, and carried on over the new steps."""
    import copy

    from semviz.analysis import replay as rp

    d = _harbour(tiny_lm)

    def view():  # as ``DecodeTask.result`` copies it
        tr = copy.copy(d.trace)
        tr.steps = list(tr.steps)
        return tr

    params = PruneParams(temperature=1.3, top_k=20)
    store: dict = {}
    d.run(5)
    first = rp.cached(store, view(), params)
    assert rp.cached(store, view(), params) is first  # another copy of the same steps
    d.run(4)
    grown, pruned = _counting_reprunes(
        monkeypatch, tiny_lm, lambda: rp.cached(store, view(), params)
    )
    assert len(pruned) == 4 and grown.n == 9  # only the new steps were re-pruned
    full = rp.replay(d.trace, params)
    assert grown.token_ids == full.token_ids and grown.chosen == full.chosen


def _hostile(trace, n: int, depth: int = 3) -> str:
    """A valid-looking trace whose first step's ``extra`` holds ``n`` small nested lists."""
    d = _doc(trace)
    d["steps"][0]["extra"] = {"x": "@many@"}
    item = "[" * depth + "1" + "]" * depth
    return json.dumps(d).replace('"@many@"', "[" + ",".join([item] * n) + "]")


def test_a_trace_of_many_small_elements_is_refused_before_parsing(trace, tmp_path):
    import tracemalloc

    from semviz.output import trace as trace_mod

    path = tmp_path / "many.json"
    path.write_text(_hostile(trace, 600_000, depth=3))  # ~1.8 million elements, ~6 MB
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with pytest.raises(TraceError) as e:
            Trace.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value).startswith("many.json: the trace holds about 2,4")
    assert str(e.value).endswith("JSON elements, more than the 1,000,000 a trace may have")
    assert peak < 3 * size  # the file's bytes, never the objects a parse would make
    # under the element limit, a step's free-form field is still bounded
    with pytest.raises(TraceError, match=r"^steps\[0\]\.extra: holds more than 10,000 values"):
        Trace.from_json(_hostile(trace, 20_000, depth=1))
    assert trace_mod.READ_BUDGET == 3 * trace_mod.MAX_BYTES + 200 * trace_mod.MAX_ELEMENTS


def test_a_parse_costs_at_most_200_bytes_an_element(trace):
    import tracemalloc

    text = _hostile(trace, 60_000, depth=3)  # 240,000 elements: parsed, then refused
    n = sum(text.count(c) for c in ",[{")
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="holds more than 10,000 values"):
            Trace.from_json(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the objects a parse makes, per element, as READ_BUDGET allows them
    assert peak < len(text) + 200 * n
