"""Trace JSON round trip, DataFrame view, and clear errors for corrupt or foreign files."""

from __future__ import annotations

import json

import pytest

from semviz.decoding import Decoder, DecodeSettings
from semviz.sampling import PruneParams
from semviz.trace import FORMAT_VERSION, Trace, TraceError


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
    from semviz.replay import replay

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
