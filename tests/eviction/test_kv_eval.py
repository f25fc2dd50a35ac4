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
    "policy", "budget", "tokens", "ppl", "nll", "top1_agree", "kl", "peak_cache_bytes",
    "mean_cache_len", "evicted_mass", "regret_est", "tokens_per_s", "seconds",
}  # fmt: skip


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


def test_progress_counts_every_forward(rows):
    _, seen = rows
    total = N * len(ev.POLICIES)
    assert [s[0] for s in seen] == list(range(1, total + 1))
    assert {s[1] for s in seen} == {total} and seen[0][2] == "full"


def test_stop_keeps_finished_rows(tiny_lm, ids):
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2 * N + 5  # the reference, one policy, then part of the next

    out = ev.kv_eval(tiny_lm, ids, ["full", "window", "h2o"], (8,), should_stop=should_stop)
    assert [r["policy"] for r in out] == ["full", "window"]


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


def test_cli_json(tiny_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("It was the best of times, it was the worst of times, " * 10)
    argv = ["kv-eval", "--model", str(tiny_dir), "--text", str(text), "--tokens", "24"]
    code = main(
        argv + ["--budgets", "6,0.5", "--policies", "full,streaming,gravity", "--json",
                "--quiet", "--policy-arg", "gravity.beta=1.0", "--policy-arg", "gravity.sinks=2"]
    )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 24 and out["policy_args"]["gravity"] == {"beta": 1.0, "sinks": 2}
    got = [(r["policy"], r["budget"]) for r in out["rows"]]
    assert got == [("full", None), ("streaming", 6), ("gravity", 6), ("streaming", 0.5),
                   ("gravity", 0.5)]  # fmt: skip


def test_cli_table_and_user_errors(tiny_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("A short text. " * 10)
    base = ["kv-eval", "--model", str(tiny_dir), "--text", str(text), "--quiet"]
    assert main(base + ["--tokens", "12", "--budget", "4", "--policies", "full,window"]) == 0
    assert "window" in capsys.readouterr().out
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
