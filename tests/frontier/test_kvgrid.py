"""kv-eval grids on the executor: the rows of one kv-eval call per text, and the CLI."""

from __future__ import annotations

import doctest
import json

import pytest

import semviz.frontier.kvgrid
from semviz.cli import main
from semviz.eviction import kv_eval, teacher_forced_ids
from semviz.frontier.kvgrid import kv_grid

TIMED = {"tokens_per_s", "seconds"}
TEXTS = {
    "a.txt": "It was the best of times, it was the worst of times, " * 6,
    "b.txt": "The quick brown fox jumps over the lazy dog. " * 6,
}


def _ids(lm, n=20):
    out = {}
    for name, t in TEXTS.items():
        ids = lm.tokenizer(t, add_special_tokens=False)["input_ids"]
        out[name] = teacher_forced_ids(lm, ids, n)
    return out


def _same(rows):
    """The rows without timings; floats to 1e-6 (a shard's batch holds other rows than the
    whole grid's, which moves the last bits of a batched forward)."""
    return [
        {
            k: pytest.approx(v, rel=1e-3, abs=1e-6) if isinstance(v, float) else v
            for k, v in r.items()
            if k not in TIMED
        }
        for r in rows
    ]


def test_a_grid_has_the_rows_of_one_kv_eval_per_text(tiny_lm):
    texts = _ids(tiny_lm)
    policies, budgets = ["full", "window", "h2o"], [6, 0.5]
    rows, stopped = kv_grid(texts, policies, budgets, lm=tiny_lm)
    assert not stopped
    want = []
    for name, ids in texts.items():
        want += [{"text": name, **r} for r in kv_eval(tiny_lm, ids, policies, budgets)]
    key = lambda r: (r["text"], r["policy"], json.dumps(r["budget"]))  # noqa: E731
    assert sorted(map(key, rows)) == sorted(map(key, want))
    assert [{k: v for k, v in r.items() if k not in TIMED} for r in sorted(rows, key=key)] == (
        _same(sorted(want, key=key))
    )
    assert sum(r["policy"] == "full" for r in rows) == 2  # one reference row per text


def test_a_stopped_grid_keeps_whole_shards_only(tiny_lm):
    texts = _ids(tiny_lm)
    seen = []
    rows, stopped = kv_grid(
        texts,
        ["full", "window"],
        [6, 8],
        lm=tiny_lm,
        on_progress=lambda d, t, label: seen.append(label),
        should_stop=lambda: "a.txt · budget 8" in seen,
    )
    assert stopped
    assert [(r["text"], r["policy"], r["budget"]) for r in rows] == [
        ("a.txt", "full", None),
        ("a.txt", "window", 6),
    ]


def test_kv_eval_cli_takes_several_texts(tiny_dir, tmp_path, capsys):
    argv = [
        "kv-eval",
        "--model",
        str(tiny_dir),
        "--tokens",
        "16",
        "--budgets",
        "6",
        "--policies",
        "full,window",
        "--quiet",
    ]
    for name, t in TEXTS.items():
        (tmp_path / name).write_text(t)
        argv += ["--text", str(tmp_path / name)]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["texts"] == {"a.txt": 16, "b.txt": 16}
    got = [(r["text"], r["policy"], r["budget"]) for r in out["rows"]]
    assert got == [
        ("a.txt", "full", None),
        ("a.txt", "window", 6),
        ("b.txt", "full", None),
        ("b.txt", "window", 6),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "a.txt · 16 tokens" in table and "b.txt · 16 tokens" in table
    same = ["kv-eval", "--text", str(tmp_path / "a.txt"), "--text", str(tmp_path / "a.txt")]
    assert main(same) == 2
    assert "same file name" in capsys.readouterr().err


def test_kvgrid_docstring_examples():
    assert doctest.testmod(semviz.frontier.kvgrid).failed == 0


def test_a_grid_needs_a_model_or_an_executor():
    with pytest.raises(ValueError, match="give lm"):
        kv_grid({"a": [1, 2]}, ["full"], [4])
