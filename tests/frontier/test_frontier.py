"""The sweep: prompt set, statistics on known cases, Parquet resume, and the CLI end to end."""

from __future__ import annotations

import doctest
import json
import math

import numpy as np
import pandas as pd
import pytest

import semviz.frontier.sweep
from semviz.analysis.compare import parse_side
from semviz.frontier.sweep import (
    SweepConfig,
    load_prompts,
    load_results,
    matched_gap,
    per_prompt,
    run_sweep,
    summarize,
)
from tests.frontier import synth

# -- the prompt set ---------------------------------------------------------------------------


def test_prompt_set_has_two_balanced_halves_of_five_kinds():
    every = load_prompts(split=None)
    assert len(every) >= 200
    assert len({p.id for p in every}) == len(every)
    assert len({p.text for p in every}) == len(every)
    kinds = ["story", "explanation", "question", "dialogue", "code"]
    for split in ("dev", "test"):
        half = load_prompts(split=split)
        assert len(half) == len(every) // 2
        assert [p.kind for p in half] == kinds * (len(half) // 5)  # kinds in turn
        assert all(p.id.startswith(f"{split}-{p.kind}-") for p in half)
    assert not {p.text for p in load_prompts(split="dev")} & {p.text for p in load_prompts()}


def test_a_bad_prompt_file_names_the_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "kind": "story", "split": "test", "text": "x"}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_prompts(f)
    g = tmp_path / "q.jsonl"
    g.write_text('{"id": "a", "kind": "story", "split": "test", "text": "x"}\n')
    with pytest.raises(ValueError, match="1 test prompts, fewer than the 5"):
        load_prompts(g, n=5)


# -- matched diversity and the bootstrap ------------------------------------------------------


def test_matched_gap_of_parallel_lines_is_their_offset():
    assert matched_gap([0.8, 0.9], [0.5, 0.4], [0.85, 0.95], [0.55, 0.45]) == pytest.approx(0.1)


def test_matched_gap_of_crossing_lines_is_zero_and_without_overlap_nan():
    assert matched_gap([0, 1], [0, 1], [0, 1], [1, 0]) == pytest.approx(0.0)
    assert math.isnan(matched_gap([0.1, 0.2], [1, 1], [0.5, 0.6], [1, 1]))
    assert math.isnan(matched_gap([0.5], [1], [0.4, 0.6], [1, 1]))  # one point has no range


def test_matched_gap_reads_points_in_x_order():
    # the same curve given in another order is the same curve
    assert matched_gap([0.9, 0.8], [0.4, 0.5], [0.8, 0.9], [0.6, 0.5]) == pytest.approx(0.1)


def test_a_constant_lift_at_the_same_diversity_dominates_with_a_zero_width_ci():
    coh = [0.2, 0.5, 0.9, 0.4]
    d2 = {0.7: [0.80, 0.82, 0.84, 0.86], 1.3: [0.90, 0.92, 0.94, 0.96]}
    df = synth.rows(
        {
            "A": {v: ([c - 0.1 * (v > 1) for c in coh], d2[v]) for v in d2},
            "B": {v: ([c + 0.1 - 0.1 * (v > 1) for c in coh], d2[v]) for v in d2},
        }
    )
    s = summarize(df, n_boot=200)
    d = s.dominance[0]
    assert (d.a, d.b) == ("A", "B")
    assert d.gap == pytest.approx(0.1)
    assert d.lo == pytest.approx(0.1) and d.hi == pytest.approx(0.1)
    assert d.verdict == (
        "B dominates A: at matched distinct-2 (word bigrams) 0.830–0.930, B scores 0.100 more "
        "coherence (95% CI 0.100 to 0.100)"
    )
    assert (d.x_lo, d.x_hi) == pytest.approx((0.83, 0.93))


def test_no_lift_gives_no_verdict_and_the_ci_straddles_zero():
    rng = np.random.default_rng(0)
    d2 = [0.8 + 0.01 * i for i in range(12)]
    noise = rng.normal(0, 0.2, 12)
    df = synth.rows(
        {
            "A": {0.7: ([0.5] * 12, d2), 1.3: ([0.4] * 12, [x + 0.1 for x in d2])},
            "B": {0.7: (list(0.5 + noise), d2), 1.3: (list(0.4 - noise), [x + 0.1 for x in d2])},
        }
    )
    d = summarize(df, n_boot=500).dominance[0]
    assert d.lo < 0 < d.hi
    assert d.verdict.startswith("neither B nor A dominates")


def test_point_ci_of_two_prompts_spans_their_values():
    # two prompts scoring 0 and 1: bootstrap means are 0, 0.5 or 1, each end with p = 1/4
    df = synth.rows({"A": {1.0: ([0.0, 1.0], [0.9, 0.9])}})
    p = summarize(df, n_boot=1000).points.iloc[0]
    assert p["coherence"] == pytest.approx(0.5)
    assert (p["coherence_lo"], p["coherence_hi"]) == (0.0, 1.0)
    assert p["distinct_2_lo"] == p["distinct_2_hi"] == pytest.approx(0.9)
    assert p["cross_sim"] == pytest.approx(0.0)  # seeds' embeddings are orthogonal


def test_per_prompt_skips_undefined_scores_and_counts_short_texts():
    df = synth.rows({"A": {1.0: ([0.3], [0.9])}})
    df.loc[0, ["repetition", "n_words", "distinct_2"]] = [np.nan, 2.0, np.nan]
    df.loc[1, "repetition"] = 0.25
    pp = per_prompt(df).iloc[0]
    assert pp["repetition"] == pytest.approx(0.25)  # the short text is left out
    assert pp["distinct_2"] == pytest.approx(0.9)
    assert pp["short"] == pytest.approx(0.5)


def test_summaries_refuse_what_they_cannot_compare():
    df = synth.rows({"A": {1.0: ([0.3], [0.9])}})
    with pytest.raises(ValueError, match="x must be one of"):
        summarize(df, x="entropy")
    two = df.assign(knob=["temperature", "top_p"])
    with pytest.raises(ValueError, match="several knobs"):
        summarize(two)


def test_frontier_figure_has_one_curve_per_setting_with_ci_bars():
    df = synth.rows({"A": {0.7: ([0.5, 0.6], [0.8, 0.9])}, "B": {0.7: ([0.4, 0.5], [0.9, 1.0])}})
    fig = semviz.frontier.sweep.frontier_figure(summarize(df, n_boot=50))
    assert [t.name for t in fig.data] == ["A", "B"]
    assert fig.data[0].error_y.array is not None


def test_frontier_docstring_examples():
    result = doctest.testmod(semviz.frontier.sweep, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# -- the sweep on a tiny model -----------------------------------------------------------------


def _cfg(**kw):
    base = dict(
        settings=(parse_side("top_p=0.9"), parse_side("top_p=0.9,gravity_lambda=1")),
        values=(0.7, 1.3),
        n_prompts=2,
        seeds=2,
        new_tokens=4,
        batch_rows=4,
    )
    base.update(kw)
    return SweepConfig(**base)


def test_config_validates_every_point_before_any_work():
    with pytest.raises(ValueError, match="temperature=-1"):
        _cfg(values=(1.0, -1.0))
    with pytest.raises(ValueError, match="knob"):
        _cfg(knob="top_k")
    with pytest.raises(ValueError, match="seeds must be at least 1"):
        _cfg(seeds=0)
    assert _cfg(knob="lambda").knob == "gravity_lambda"
    with pytest.raises(ValueError, match="'entropix' reads each step's attention"):
        _cfg(settings=(parse_side("plain"), parse_side("adaptive=entropix")))


def test_a_stopped_sweep_resumes_and_ends_like_an_uninterrupted_one(peaked_lm, judge, tmp_path):
    cfg = _cfg()
    out = tmp_path / "r.parquet"
    seen = []

    def stop_in_second_batch():  # half of the second batch of 4 rows made
        return any(p.rows_done >= 6 for p in seen)

    first = run_sweep(
        peaked_lm, cfg, out, judge=judge, on_progress=seen.append, should_stop=stop_in_second_batch
    )
    assert first.stopped and first.new_rows == 4
    assert len(load_results(out)) == 4  # the finished batch only
    second = run_sweep(peaked_lm, cfg, out, judge=judge)
    assert not second.stopped and (second.new_rows, second.skipped_rows) == (12, 4)
    third = run_sweep(peaked_lm, cfg, out, judge=judge)
    assert (third.new_rows, third.skipped_rows) == (0, 16)

    fresh = run_sweep(peaked_lm, cfg, tmp_path / "fresh.parquet", judge=judge).frame
    key = ["spec", "value", "prompt_id", "seed"]
    a = third.frame.sort_values(key).reset_index(drop=True)
    b = fresh.sort_values(key).reset_index(drop=True)
    assert a["text"].tolist() == b["text"].tolist()
    assert np.allclose(a["coherence"], b["coherence"], atol=1e-6)
    assert len(a) == 16 and a["value"].nunique() == 2 and a["seed"].nunique() == 2


def test_rows_record_every_score(peaked_lm, judge, tmp_path):
    cfg = _cfg(settings=(parse_side("plain"),), values=(1.0,), seeds=1)
    df = run_sweep(peaked_lm, cfg, tmp_path / "r.parquet", judge=judge).frame
    assert len(df) == 2
    for col in ("text", "coherence", "distinct_1", "distinct_2", "repetition", "nll", "ppl", "emb"):
        assert col in df.columns
    r = df.iloc[0]
    assert r["ppl"] == pytest.approx(math.exp(r["nll"]))
    assert -1.0 <= r["coherence"] <= 1.0
    assert r["judge"] == "all-MiniLM-L6-v2" and r["model"] == peaked_lm.name


def test_cli_end_to_end_and_summary_only(peaked_dir, tmp_path, capsys):
    from semviz.cli import main

    out = tmp_path / "r.parquet"
    args = [
        "frontier",
        "--model",
        str(peaked_dir),
        "--prompts",
        "2",
        "--seeds",
        "2",
        "--tokens",
        "4",
        "--values",
        "0.7,1.3",
        "--out",
        str(out),
        "--boot",
        "50",
    ]
    assert main([*args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["rows"] == 16 and got["new_rows"] == 16 and len(got["points"]) == 4
    assert got["dominance"][0]["a"] == "top_p=0.95"
    assert 0 <= got["cost"]["judge_share"] < 1
    assert main([*args, "--summary", "--markdown", str(tmp_path / "t.md")]) == 0
    text = capsys.readouterr().out
    assert "| `top_p=0.95,gravity_lambda=0.5` | 1.3 |" in text
    assert "coherence" in (tmp_path / "t.md").read_text()


def test_frontier_has_help_with_json(capsys):
    from semviz.cli import main

    with pytest.raises(SystemExit) as e:
        main(["frontier", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "python -m semviz frontier" in out and "--json" in out and "--summary" in out


def test_a_results_file_over_its_limit_is_refused_before_it_is_read(tmp_path):
    import pandas as pd

    from semviz.output.files import FileError

    out = tmp_path / "r.parquet"
    pd.DataFrame({"value": [0.5] * 100}).to_parquet(out)
    size = out.stat().st_size
    assert len(load_results(out, max_bytes=size)) == 100
    with pytest.raises(FileError, match=r"r\.parquet is larger than the .* limit for this file"):
        load_results(out, max_bytes=size - 1)
    out.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="r.parquet is not a readable results file"):
        load_results(out)


# -- every diversity axis, the headline axis and the agreement sentence ------------------------


def _pair(coh_b_shift: float, d2_b: dict | None = None):
    d2 = {0.7: [0.80, 0.82, 0.84, 0.86], 1.3: [0.90, 0.92, 0.94, 0.96]}
    coh = [0.6, 0.5, 0.7, 0.4]
    return synth.rows(
        {
            "A": {v: ([c - 0.2 * (v > 1) for c in coh], d2[v]) for v in d2},
            "B": {v: ([c + coh_b_shift - 0.2 * (v > 1) for c in coh], (d2_b or d2)[v]) for v in d2},
        }
    )


def test_dominance_is_computed_on_every_axis_and_the_verdict_names_the_agreement():
    s = summarize(_pair(-0.1), n_boot=100)
    assert set(s.by_axis) == set(semviz.frontier.sweep.X_AXES)
    # synth rows: distinct-1 = distinct-2 and identical seeds' texts up to the seed word
    assert s.by_axis["distinct_2"][0].winner == "a"
    assert s.by_axis["distinct_1"][0].winner == "a"
    assert s.by_axis["distinct_2"][0].gap == pytest.approx(-0.1)
    assert len(s.agreement) == 1
    assert s.agreement[0].startswith("On no diversity axis does B beat A: A dominates on ")
    d = s.to_dict()
    assert set(d["axes"]) == set(semviz.frontier.sweep.X_AXES) and d["agreement"] == s.agreement


def test_agreement_sentences_for_each_case():
    from semviz.frontier.sweep import Dominance, agreement

    def d(x, lo, hi):
        gap = math.nan if lo is None else (lo + hi) / 2
        return Dominance("A", "B", x, gap, lo or math.nan, hi or math.nan, 0.1, 0.9, 10)

    assert agreement([d("distinct_2", 0.1, 0.2), d("dissimilarity", 0.05, 0.3)]) == (
        "On every diversity axis B dominates A."
    )
    assert agreement([d("distinct_2", -0.2, -0.1)]) == "On every diversity axis A dominates B."
    assert agreement([d("distinct_2", 0.1, 0.2), d("dissimilarity", -0.2, -0.1)]) == (
        "The diversity axes disagree: B dominates A on distinct-2 (word bigrams), A dominates "
        "B on 1 − cross-seed similarity."
    )
    assert agreement([d("distinct_2", -0.1, 0.2), d("bleu_diversity", None, None)]) == (
        "On no diversity axis does either of A and B dominate: neither dominates on distinct-2 "
        "(word bigrams); the curves share no range on 1 − self-BLEU between seeds."
    )
    with pytest.raises(ValueError, match="doms"):
        agreement([])


def test_the_headline_axis_is_the_one_spanning_most_point_cis():
    from semviz.frontier.sweep import axis_resolution, best_axis

    pts = pd.DataFrame(
        {
            "spec": ["a", "a", "b", "b"],
            "wide": [0.1, 0.9, 0.2, 0.8],
            "wide_lo": [0.0, 0.8, 0.1, 0.7],
            "wide_hi": [0.2, 1.0, 0.3, 0.9],
            "flat": [0.97, 0.99, 0.98, 0.99],
            "flat_lo": [0.9, 0.9, 0.9, 0.9],
            "flat_hi": [1.0] * 4,
            "apart": [0.1, 0.2, 0.5, 0.6],
            "apart_lo": [0.0, 0.1, 0.4, 0.5],
            "apart_hi": [0.2, 0.3, 0.6, 0.7],
        }
    )
    assert axis_resolution(pts, "wide") == pytest.approx((0.8 - 0.2) / 0.2)
    assert axis_resolution(pts, "flat") == pytest.approx((0.99 - 0.98) / 0.1)
    assert axis_resolution(pts, "apart") == 0.0  # no common range: no matched comparison
    real = summarize(_pair(0.0), n_boot=100)
    assert real.x == best_axis(real.points)
    assert real.resolution[real.x] == max(real.resolution.values())


def test_unscored_rows_are_left_out_and_a_file_of_them_says_how_to_score():
    df = _pair(0.1)
    scored = summarize(df, n_boot=50)
    extra = df.iloc[:4].assign(coherence=np.nan, emb=None, value=2.0)
    assert summarize(pd.concat([df, extra]), n_boot=50).points.equals(scored.points)
    with pytest.raises(ValueError, match="--score"):
        summarize(df.assign(coherence=np.nan), n_boot=50)


def test_a_sweep_without_the_judge_scored_later_equals_one_judged_as_it_went(
    peaked_lm, judge, tmp_path
):
    from semviz.frontier.sweep import score_results

    cfg = _cfg(values=(1.0,))
    a = run_sweep(peaked_lm, cfg, tmp_path / "a.parquet", judge=judge).frame
    path = tmp_path / "b.parquet"
    b = run_sweep(peaked_lm, cfg, path, score=False).frame
    assert len(b) == 8 and b["coherence"].isna().all() and b["emb"].isna().all()
    assert b["text"].tolist() == a["text"].tolist()
    assert score_results(path, judge) == 8
    assert score_results(path, judge) == 0  # nothing left to score
    b = load_results(path)
    assert np.allclose(b["coherence"], a["coherence"], atol=1e-3)
    emb = lambda df: np.stack([np.frombuffer(e, dtype=np.float16) for e in df["emb"]])  # noqa: E731
    assert np.allclose(emb(a), emb(b), atol=2e-3)
    assert (b["judge"] == "all-MiniLM-L6-v2").all()
