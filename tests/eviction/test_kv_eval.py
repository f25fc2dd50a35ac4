"""The teacher-forced evaluation and the ``kv-eval`` command, on the tiny model."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from semviz import eviction as ev
from semviz.cli import main

N = 40
COLUMNS = {
    "policy",
    "budget",
    "tokens",
    "ppl",
    "nll",
    "top1_agree",
    "kl",
    "peak_cache_bytes",
    "mean_cache_len",
    "evicted_mass",
    "regret_est",
    "tokens_per_s",
    "seconds",
}


@pytest.fixture(scope="module")
def ids(tiny_lm):
    text = "Mr. Bennet was so odd a mixture of quick parts, sarcastic humour, reserve. " * 6
    return tiny_lm.tokenizer(text, add_special_tokens=False)["input_ids"][:N]


@pytest.fixture(scope="module")
def rows(tiny_lm, ids):
    seen = []
    out = ev.kv_eval(
        tiny_lm, ids, list(ev.POLICIES), budgets=(8,), on_progress=lambda *a: seen.append(a)
    )
    return out, seen


def test_one_row_per_policy_with_every_metric(rows):
    out, _ = rows
    assert [r["policy"] for r in out] == list(ev.POLICIES)
    for r in out:
        assert set(r) == COLUMNS and r["tokens"] == N - 1
        assert math.isfinite(r["ppl"]) and r["kl"] >= 0 and 0 <= r["top1_agree"] <= 1
    assert pd.DataFrame(out).shape == (len(ev.POLICIES), len(COLUMNS))


def test_full_row_is_the_reference(rows):
    full = rows[0][0]
    assert full["budget"] is None and full["kl"] == 0 and full["top1_agree"] == 1
    assert full["mean_cache_len"] > 8


def test_evicting_policies_hold_less(rows):
    out, _ = rows
    full = out[0]
    for r in out[1:]:
        assert r["peak_cache_bytes"] < full["peak_cache_bytes"]
        assert r["mean_cache_len"] <= 8 + 1e-9
        assert r["kl"] > 0  # the tiny model's attention is wide: eviction shows up


def test_progress_counts_every_token(rows):
    _, seen = rows
    # the reference prefill first, then one batched forward per token for every policy
    assert seen[0] == (0, N, "full cache (reference)")
    assert [s[0] for s in seen[1:]] == list(range(1, N + 1))
    assert {s[1] for s in seen} == {N}
    assert seen[1][2] == "window, streaming, h2o, tova, ema, gravity @ 8"


def test_batched_rows_equal_unbatched_rows(tiny_lm, ids, rows):
    out, _ = rows
    alone = ev.kv_eval(tiny_lm, ids, list(ev.POLICIES), budgets=(8,), batch_size=1)
    assert [r["policy"] for r in alone] == [r["policy"] for r in out]
    for got, want in zip(out, alone, strict=True):
        for key in ("tokens", "peak_cache_bytes", "mean_cache_len"):
            assert got[key] == want[key], (got["policy"], key)
        for key in ("ppl", "nll", "top1_agree", "kl", "evicted_mass", "regret_est"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (got["policy"], key)


def test_full_row_comes_from_one_prefill(tiny_lm, ids, rows):
    """The reference row equals a full cache fed one token at a time."""
    full = rows[0][0]
    one_by_one = ev.kv_eval(tiny_lm, ids, [ev.make_policy("full")], budgets=())[0]
    for key in ("tokens", "peak_cache_bytes", "mean_cache_len", "top1_agree"):
        assert full[key] == one_by_one[key], key
    assert full["ppl"] == pytest.approx(one_by_one["ppl"], rel=1e-5)
    assert one_by_one["kl"] == pytest.approx(0.0, abs=1e-6)


def test_stop_keeps_partial_rows(tiny_lm, ids):
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 10  # the reference, then 10 tokens

    out = ev.kv_eval(tiny_lm, ids, ["full", "window", "h2o"], (8,), should_stop=should_stop)
    assert [r["policy"] for r in out] == ["full", "window", "h2o"]
    assert out[0]["tokens"] == N - 1  # the reference is one prefill: always whole
    assert [r["tokens"] for r in out[1:]] == [10, 10]
    run = ev.KVEval(tiny_lm, ids, ["window"], (8,))
    for _ in range(4):
        run.step()
    assert (run.done, run.total, run.finished) == (3, N, False)
    assert [r["tokens"] for r in run.rows()] == [3]


def test_budget_sweep_and_ready_policies(tiny_lm, ids):
    out = ev.kv_eval(
        tiny_lm,
        ids[:20],
        ["window", ev.make_policy("tova", budget=(6, 10))],
        budgets=(4, 0.5),
    )
    assert [(r["policy"], r["budget"]) for r in out] == [
        ("window", 4),
        ("window", 0.5),
        ("tova", (6, 10)),
    ]
    assert out[0]["mean_cache_len"] <= 4


def test_validation(tiny_lm):
    with pytest.raises(ValueError, match="ids"):
        ev.kv_eval(tiny_lm, [1], ["window"])
    with pytest.raises(ValueError, match="batch_size"):
        ev.kv_eval(tiny_lm, [1, 2], ["window"], batch_size=0)
    with pytest.raises(ValueError, match="policy must be one of"):
        ev.kv_eval(tiny_lm, [1, 2], ["nope"])


def test_teacher_forced_ids(tiny_lm):
    text = "It was the best of times, it was the worst of times."
    ids = ev.teacher_forced_ids(tiny_lm, text, 5)
    assert ids == tiny_lm.tokenizer(text, add_special_tokens=False)["input_ids"][:5]
    assert ev.teacher_forced_ids(tiny_lm, [7, 8, 9], 7, repeat=True) == [7, 8, 9, 7, 8, 9, 7]
    for args, kw, word in [
        ((text, 500), {}, "fewer than the 500"),
        (([7, 8], 5), {}, "fewer than"),
        (([], 5), {"repeat": True}, "no text"),
        ((text, 1), {}, "at least 2"),
        ((text, 10**6), {}, "at most"),
    ]:
        with pytest.raises(ValueError, match=word):
            ev.teacher_forced_ids(tiny_lm, *args, **kw)


def test_parse_budgets():
    assert ev.parse_budgets("64, 128 0.25") == [64, 128, 0.25]
    for text, word in [("", "at least one"), ("8, lots", "number"), ("0", "budget")]:
        with pytest.raises(ValueError, match=word):
            ev.parse_budgets(text)


def test_cli_json(tiny_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("It was the best of times, it was the worst of times, " * 10)
    argv = ["kv-eval", "--model", str(tiny_dir), "--text", str(text), "--tokens", "24"]
    code = main(
        argv
        + [
            "--budgets",
            "6,0.5",
            "--policies",
            "full,streaming,gravity",
            "--json",
            "--quiet",
            "--policy-arg",
            "gravity.beta=1.0",
            "--policy-arg",
            "gravity.sinks=2",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 24 and out["policy_args"]["gravity"] == {"beta": 1.0, "sinks": 2}
    got = [(r["policy"], r["budget"]) for r in out["rows"]]
    assert got == [
        ("full", None),
        ("streaming", 6),
        ("gravity", 6),
        ("streaming", 0.5),
        ("gravity", 0.5),
    ]


def test_cli_table_and_user_errors(tiny_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("A short text. " * 10)
    base = ["kv-eval", "--model", str(tiny_dir), "--text", str(text), "--quiet"]
    assert main(base + ["--tokens", "12", "--budget", "4", "--policies", "full,window"]) == 0
    assert "window" in capsys.readouterr().out
    assert main(base + ["--tokens", "12", "--budget", "6"]) == 0  # --policies all
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in table[3:]] == list(ev.POLICIES)
    for extra, word in [
        (["--tokens", "100000"], "tokens"),
        (["--policies", "nope"], "--policies"),
        (["--budget", "0"], "budget"),
        (["--policy-arg", "gravity.beta"], "--policy-arg"),
        (["--policy-arg", "gravity.nope=1", "--tokens", "12"], "policy-arg"),
    ]:
        assert main(base + extra) == 2
        assert word in capsys.readouterr().err
    assert main(["kv-eval", "--text", str(tmp_path / "missing.txt")]) == 2


def test_repeats_run_once_and_rows_are_capped(tiny_lm, ids):
    out = ev.kv_eval(tiny_lm, ids[:12], ["window", "window", "full"], budgets=(4, 4, 0.5, 4))
    assert [(r["policy"], r["budget"]) for r in out] == [
        ("full", None),
        ("window", 4),
        ("window", 0.5),
    ]
    with pytest.raises(ValueError, match=r"^kv-eval runs at most 64 rows .* asks for 130"):
        ev.kv_eval(tiny_lm, ids[:12], ["window", "h2o"], budgets=range(2, 67))


def test_memory_is_estimated_before_the_run(tiny_lm, ids, monkeypatch):
    from semviz.eviction import harness

    per_row = harness.row_bytes(tiny_lm, 12, 1)
    v = tiny_lm.model.config.vocab_size
    from semviz.model.forward import kv_bytes_per_token

    assert per_row == 12 * kv_bytes_per_token(tiny_lm.summary()) + 2 * v * 4
    # a budget of two rows: three rows run in two batches, with the same numbers
    monkeypatch.setattr(harness, "MEMORY_BUDGET", 2 * per_row)
    run = harness.KVEval(tiny_lm, ids[:12], ["window", "h2o", "tova"], budgets=(4,))
    assert [len(g) for g in run.groups] == [2, 1]
    monkeypatch.setattr(harness, "MEMORY_BUDGET", per_row - 1)
    with pytest.raises(ValueError, match=r"^kv-eval of 12 tokens \(prefill 1\) needs about"):
        harness.KVEval(tiny_lm, ids[:12], ["window"], budgets=(4,))


def test_a_vanishing_fraction_is_refused():
    for text in ("1e-300", "0.00001", "0"):
        with pytest.raises(ValueError, match=r"a fraction in \[0.0001, 1\)"):
            ev.parse_budgets(text)
    assert ev.parse_budgets("0.0001") == [0.0001]
