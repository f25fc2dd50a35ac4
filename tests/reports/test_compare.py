"""Metrics and A/B comparison on the tiny model: side syntax, metrics, interleaving, stop, CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from semviz.analysis import metrics
from semviz.analysis.compare import (
    DIFF_BG,
    Side,
    advance,
    compare,
    comparison_figure,
    diff_html,
    first_divergence,
    markdown_table,
    mean_rows,
    parse_side,
    text_diff,
)
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams
from semviz.sampling.presets import PRESETS

PROMPT = "The sea was calm and"


# -- side syntax -----------------------------------------------------------------------------


def test_parse_side_forms():
    assert parse_side("plain").params == PruneParams()
    assert parse_side("story").params == PRESETS["story"].params
    s = parse_side("top_p=0.9, gravity-lambda=0.5")
    assert s.params == PruneParams(top_p=0.9, gravity_lambda=0.5)
    assert s.changes() == {"top_p": 0.9, "gravity_lambda": 0.5}
    s = parse_side("story,temperature=0.7")
    assert s.params == PRESETS["story"].params.replace(temperature=0.7)
    s = parse_side("preset=qa,free_energy=on,gravity_layers=0/1,top_k=5")
    assert s.params.free_energy is True and s.params.gravity_layers == (0, 1)
    assert s.params.top_k == 5 and s.params.gravity_lambda == PRESETS["qa"].params.gravity_lambda
    assert parse_side("top_k=3", label="A").label == "A"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "empty"),
        ("nosuch", "unknown preset"),
        ("top_pp=0.9", "top_p"),
        ("top_p=high", "top_p"),
        ("top_p=1.5", "top_p"),
        ("free_energy=maybe", "free_energy"),
        ("top_k=3,story", "first part"),
        ("adaptive=bogus", "adaptive"),
    ],
)
def test_parse_side_errors_name_the_part(spec, needle):
    with pytest.raises(ValueError, match=needle):
        parse_side(spec)


# -- metrics ---------------------------------------------------------------------------------


def test_distinct_and_repetition():
    assert metrics.distinct_n([1, 1, 1, 1], 1) == 0.25
    assert metrics.distinct_n([1, 2, 3], 2) == 1.0
    assert math.isnan(metrics.distinct_n([1], 2))
    assert metrics.repetition_rate([5, 6, 7, 8, 5, 6, 7, 8, 5], n=4) == pytest.approx(2 / 6)
    assert metrics.repetition_rate(list(range(20))) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        metrics.distinct_n([1, 2], 0)


def test_first_divergence_and_diff():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    ops = text_diff(["a", " b", " c"], ["a", " x", " c"])
    assert ("replace", " b", " x") in ops
    left, right = diff_html(["a", "<b>"], ["a", "c"])
    assert "&lt;b&gt;" in left and ">c<" in right
    # each side's changed text is tinted in that side's own line colour
    assert f"background:{DIFF_BG[0]}" in left and f"background:{DIFF_BG[1]}" in right


def test_run_metrics_on_a_run(tiny_lm):
    d = Decoder(tiny_lm, PROMPT, PruneParams(top_k=5), DecodeSettings(seed=1, max_new_tokens=6))
    d.run(6)
    m = metrics.run_metrics(d.trace)
    assert m.steps == 6
    assert 0 < m.distinct_1 <= 1 and 0 < m.distinct_2 <= 1
    assert 0 <= m.repetition_rate <= 1
    assert m.mean_gravity is None  # gravity off
    assert m.mean_kept == 5
    assert 0 < m.pruning_ratio < 1  # top-5 of a near-flat distribution cuts most of it
    assert m.tokens_per_s > 0
    greedy = Decoder(tiny_lm, PROMPT, PruneParams(temperature=0), DecodeSettings(max_new_tokens=3))
    greedy.run(3)
    for rec in greedy.trace.steps:
        assert metrics.pruned_mass(rec) == pytest.approx(1 - rec.chosen_prob, abs=1e-3)
    plain = Decoder(tiny_lm, PROMPT, PruneParams(), DecodeSettings(max_new_tokens=2))
    plain.run(2)
    assert metrics.run_metrics(plain.trace).pruning_ratio == pytest.approx(0.0, abs=1e-6)


# -- comparison ------------------------------------------------------------------------------


def test_interleaved_sides_equal_separate_runs(tiny_lm):
    a, b = parse_side("top_p=0.9"), parse_side("top_p=0.9,gravity_lambda=2.0")
    cmp = compare(tiny_lm, PROMPT, [a, b], steps=4, seed=3)
    assert not cmp.stopped and cmp.steps == 4
    # both sides ran as rows of one forward, and equal their own decoders' runs
    assert cmp.decoders[0]._rows is not None and cmp.decoders[0]._rows is cmp.decoders[1]._rows
    for side, tr in zip(cmp.sides, cmp.traces, strict=True):
        alone = Decoder(tiny_lm, PROMPT, side.params, DecodeSettings(seed=3, max_new_tokens=4))
        alone.run(4)
        assert tr.token_ids == alone.trace.token_ids
        for got, want in zip(tr.steps, alone.trace.steps, strict=True):
            assert torch.equal(got.cand_ids, want.cand_ids)
            torch.testing.assert_close(got.cand_logits, want.cand_logits, atol=1e-5, rtol=0)
            assert got.cache_bytes == want.cache_bytes
    fd = cmp.first_divergence()
    assert fd == first_divergence(cmp.traces[0].token_ids, cmp.traces[1].token_ids)
    d = cmp.to_dict()
    assert d["first_divergence"] == fd and len(d["sides"]) == 2
    assert d["sides"][1]["metrics"]["mean_gravity"] is not None
    json.dumps(d)  # plain JSON
    fig = comparison_figure(cmp)
    names = {t.name for t in fig.data}
    assert names == {a.label, b.label}
    assert len(fig.data) == 4  # entropy and kept set per side
    df = cmp.frame()
    assert set(df["side"]) == {a.label, b.label} and len(df) == 8


def test_kept_set_axis_reads_in_whole_tokens_by_decade(tiny_lm):
    # plain keeps the whole vocabulary at every step: a flat line at 49,152 on a log axis
    cmp = compare(tiny_lm, PROMPT, [parse_side("plain"), parse_side("top_k=5")], steps=3)
    assert {s.n_kept for s in cmp.traces[0].steps} == {len(tiny_lm.tokenizer)}
    y = comparison_figure(cmp).layout.yaxis2
    assert y.type == "log" and y.tickformat == ",d"
    assert list(y.tickvals) == [1, 10, 100, 1_000, 10_000, 100_000]  # decades, no 2s and 5s
    assert y.range[0] < 0 < math.log10(len(tiny_lm.tokenizer)) < y.range[1] < 5
    small = comparison_figure(compare(tiny_lm, PROMPT, [parse_side("top_k=3")], steps=2))
    assert small.layout.yaxis2.type == "linear" and small.layout.yaxis2.dtick == 1
    # the metrics as a table shows them: a dash for gravity off, never None
    table = cmp.metrics_table(["A", "B"])
    assert list(table.columns) == ["A", "B", "means"]
    assert table.loc["mean max gravity"].tolist() == ["–", "–", "z-score, blank when off"]
    assert table.loc["mean kept set", "A"] == f"{len(tiny_lm.tokenizer):,}.0"  # 49,152.0
    assert table.loc["mean kept set", "B"] == "5.0" and table.loc["tokens", "A"] == "3"


def test_same_settings_never_diverge(tiny_lm):
    s = parse_side("top_k=20")
    cmp = compare(tiny_lm, PROMPT, [s, Side("again", s.params)], steps=3, seed=0)
    assert cmp.first_divergence() is None
    assert cmp.traces[0].token_ids == cmp.traces[1].token_ids


def test_stop_keeps_what_was_made(tiny_lm):
    calls = {"n": 0}

    def should_stop():
        calls["n"] += 1
        return calls["n"] > 3

    made = []
    cmp = compare(
        tiny_lm,
        PROMPT,
        [parse_side("plain"), parse_side("top_k=3")],
        steps=20,
        should_stop=should_stop,
        on_step=lambda i, rec: made.append(i),
    )
    assert cmp.stopped and not cmp.finished
    assert [len(t.steps) for t in cmp.traces] == [3, 3]
    assert made == [0, 1] * 3
    # advancing the same comparison picks up where the stop left off
    answers = iter([False, False, True])
    assert advance(cmp, should_stop=lambda: next(answers)) == 2
    assert [len(t.steps) for t in cmp.traces] == [5, 5]
    assert advance(cmp, seconds=0.0) == 1  # a time budget: at least one token
    assert advance(cmp) == 14 and cmp.finished and cmp.steps == 20


def test_markdown_table():
    rows = mean_rows(
        [[metrics.RunMetrics(4, 1.0, 1.0, 0.0, 2.0, None, 0.5, 3.0, 10.0)]] * 2, ["top_p=0.9"]
    )
    assert rows[0]["steps"] == 8 and rows[0]["mean_entropy"] == 2.0
    md = markdown_table(rows)
    assert md.splitlines()[0].startswith("| side | tokens | distinct-1")
    assert "| `top_p=0.9` | 8 | 1.000 | 1.000 | 0.000 | 2.000 | – | 0.500 | 3.0 | 10.0 |" in md
    wide = mean_rows([[metrics.RunMetrics(4, 1.0, 1.0, 0.0, 2.0, None, 0.0, 49152.0, 1.5)]], ["p"])
    assert "| 0.000 | 49,152.0 | 1.5 |" in markdown_table(wide)  # no 49152.0 to count digits in


# -- CLI -------------------------------------------------------------------------------------


def test_cli_compare_json_and_markdown(tiny_dir, tmp_path, capsys, monkeypatch):
    from semviz.cli import main

    md = tmp_path / "table.md"
    argv = [
        "compare",
        "--model",
        str(tiny_dir),
        "--a",
        "top_p=0.9",
        "--b",
        "top_p=0.9,gravity_lambda=0.5",
        "--prompt",
        PROMPT,
        "--prompt",
        "Hello there",
        "--steps",
        "4",
        "--json",
        "--markdown",
        str(md),
    ]
    monkeypatch.setattr("sys.argv", ["semviz", *argv])
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["label"] for s in out["sides"]] == ["top_p=0.9", "top_p=0.9,gravity_lambda=0.5"]
    assert len(out["runs"]) == 2 and all("first_divergence" in r for r in out["runs"])
    assert out["mean"][0]["steps"] == 8
    assert out["mean"][1]["mean_gravity"] is not None
    text = md.read_text()
    assert "python -m semviz compare --model" in text and "--markdown" in text
    assert "| `top_p=0.9,gravity_lambda=0.5` |" in text


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "--prompt", "x"],
        ["compare", "--a", "nosuch", "--b", "story", "--prompt", "x"],
        ["compare", "--a", "story", "--b", "story", "--prompt", "x"],
        ["compare", "--a", "story", "--b", "qa"],
        ["compare", "--a", "story", "--b", "qa", "--prompt", "  "],
    ],
)
def test_cli_compare_user_errors(argv, capsys):
    from semviz.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("semviz compare: ") and err.count("\n") == 1
