"""``python -m semviz``: help for every subcommand, user errors exit 2 with one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from semviz.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "semviz", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("cmd", ["trace", "replay", "kv-eval", "bench", "report", "compare"])
def test_every_subcommand_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert cmd in capsys.readouterr().out


def test_trace_writes_a_trace_and_prints_json(tiny_dir, tmp_path):
    out = tmp_path / "t.json"
    r = run_cli(
        "trace",
        "--model",
        str(tiny_dir),
        "--prompt",
        "Hello there",
        "--steps",
        "4",
        "--out",
        str(out),
        "--json",
        "--temperature",
        "0",
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["steps"] == 4 and summary["out"] == str(out)
    from semviz.trace import Trace

    t = Trace.load(out)
    assert len(t.steps) == 4 and t.text == summary["text"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "  "], "The prompt is empty"),
        (["--prompt", "hi", "--model", "no-such/model-xyz"], "Could not load model"),
        (["--prompt", "word " * 600], "reads at most 512"),
        (["--prompt", "hi", "--top-p", "1.5"], "top_p"),
    ],
)
def test_user_errors_exit_2_with_one_line(tiny_dir, tmp_path, args, message):
    if "--model" not in args:
        args = [*args, "--model", str(tiny_dir)]
    r = run_cli("trace", *args, "--out", str(tmp_path / "t.json"))
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("semviz")]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr
