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
    from semviz.output.trace import Trace

    t = Trace.load(out)
    assert len(t.steps) == 4 and t.text == summary["text"]
    assert all(s.residual is not None and s.head_out is not None for s in t.steps)
    assert t.steps[0].residual.shape == (3, 64)  # the embedding and two blocks of width 64


def test_bench_times_one_forward_three_ways(tiny_dir, capsys):
    """The split of a forward's time: plain, with the capture, with capture and lens."""
    args = ["--model", str(tiny_dir), "--tokens", "3", "--repeats", "1", "--no-float32"]
    assert main(["bench", *args, "--json"]) == 0
    f = json.loads(capsys.readouterr().out)["speed"]["forward_ms"]
    assert sorted(f) == ["capture", "lens", "plain"] and all(v > 0 for v in f.values())
    assert main(["bench", *args]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("  one forward: plain ") and line.endswith("x), interleaved")


def test_trace_lens_off_writes_no_lens_fields(tiny_dir, tmp_path):
    out = tmp_path / "t.json"
    args = ["--model", str(tiny_dir), "--prompt", "Hi", "--steps", "2", "--lens", "off"]
    r = run_cli("trace", *args, "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    from semviz.output.trace import LENS_FIELDS, Trace

    steps = Trace.load(out).steps
    assert all(getattr(s, f) is None for s in steps for f in LENS_FIELDS)


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


def _err(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return rc, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["trace", "--prompt", "hi", "--seed", str(2**70)], "argument --seed: expected an integer"),
        (["trace", "--prompt", "hi", "--top-k", str(2**70)], "argument --top-k: expected an integer"),
        (["trace", "--prompt", "hi", "--gravity-heads", "-100"], "PruneParams.gravity_heads=(-100,): indices must be >= 0"),
        (["trace", "--prompt", "hi", "--gravity-layers", "99"], "gravity_layers=(99,): the model has 2 layers"),
        (["kv-eval", "--budget", "1e308"], "--budget 1e308: budget must be at most"),
        (["kv-eval", "--prefill", "0"], "argument --prefill: expected an integer from 1"),
        (["kv-eval", "--prefill", "12", "--tokens", "12"], "--prefill 12 must be fewer than --tokens"),
        (["bench", "--prompt", ""], "--prompt is empty"),
        (["bench", "--memory", "--memory-tokens", "0"], "argument --memory-tokens: expected an"),
        (["report", "--trace", "x.json", "--out", "r", "--top-p", "0.5"], "--top-p applies with --prompt"),
    ],
)  # fmt: skip
def test_bad_values_name_their_flag(argv, message, tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.json").write_text("{}")
    if argv[0] != "report":
        argv = [*argv, "--model", str(tiny_dir)]
    rc, err = _err(argv, capsys)
    assert rc == 2 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_outputs_are_checked_before_decoding_and_replaced_only_with_force(
    tiny_dir, tmp_path, capsys
):
    out = tmp_path / "t.json"
    out.write_text("mine")
    argv = ["trace", "--model", str(tiny_dir), "--prompt", "Hi", "--steps", "2", "--json"]
    rc, err = _err([*argv, "--out", str(out)], capsys)
    assert rc == 2 and "t.json already exists: pass --force to replace it" in err
    assert out.read_text() == "mine"
    for bad, why in [(tmp_path, "it is a folder"), (tmp_path / "no" / "t.json", "does not exist")]:
        rc, err = _err([*argv, "--out", str(bad)], capsys)
        assert rc == 2 and why in err
    assert main([*argv, "--out", str(out), "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    from semviz.output.trace import Trace

    assert len(Trace.load(out).steps) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no temp file left


def test_a_bug_is_one_line_naming_it(monkeypatch, capsys):
    import semviz.cli.replay as replay_cli

    def broken(args):
        raise RuntimeError("something inside\nspanning lines")

    monkeypatch.setattr(replay_cli, "run", broken)
    rc, err = _err(["replay", "x.json"], capsys)
    assert rc == 1 and err.startswith("semviz replay: internal error, a bug in semviz")
    assert "something inside\\nspanning lines" in err and "SEMVIZ_DEBUG=1" in err


def test_out_of_memory_names_what_to_give_less_of(monkeypatch, capsys):
    import semviz.cli.replay as replay_cli

    def big(args):
        raise MemoryError

    monkeypatch.setattr(replay_cli, "run", big)
    rc, err = _err(["replay", "x.json"], capsys)
    assert (rc, err) == (
        2,
        "semviz replay: out of memory; the trace is too large to replay "
        "in this machine's memory; try a shorter run.\n",
    )


def test_a_prompt_that_is_not_utf8_is_refused(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "semviz", "trace", "--prompt", b"caf\xe9", "--out", "t.json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr == "semviz trace: argument --prompt: is not valid UTF-8 text\n"
    assert list(tmp_path.iterdir()) == []


def test_replay_marks_the_steps_it_cannot_decide(tiny_lm, tmp_path, capsys):
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.sampling import PruneParams

    # 16 candidates of a near-flat tiny model and no full logits: a hot replay's draws land
    # in the tail
    dec = Decoder(
        tiny_lm,
        "Hello there",
        PruneParams(temperature=0.8),
        DecodeSettings(max_new_tokens=8, record_k=16, capture=False, full_logits=False),
    )
    dec.run(8)
    path = tmp_path / "t.json"
    dec.trace.save(path)
    assert main(["replay", str(path), "--temperature", "0.8", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["approximate_steps"] == 0 and not any("approximate" in r for r in same["rows"])
    assert main(["replay", str(path), "--temperature", "2.0", "--json"]) == 0
    hot = json.loads(capsys.readouterr().out)
    marked = [r for r in hot["rows"] if r.get("approximate")]
    assert hot["approximate_steps"] == len(marked) > 0
    assert all(r["why"].startswith("the ") for r in marked)
    assert main(["replay", str(path), "--temperature", "2.0"]) == 0
    text = capsys.readouterr().out
    assert f"{len(marked)} approximate (~)" in text
    # the same run recording every logit (the default): the live chain decides every pick
    dec = Decoder(
        tiny_lm,
        "Hello there",
        PruneParams(temperature=0.8),
        DecodeSettings(max_new_tokens=8, record_k=16, capture=False),
    )
    dec.run(8)
    dec.trace.save(path)
    assert main(["replay", str(path), "--temperature", "2.0", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["approximate_steps"] == 0 and not any(r.get("approximate") for r in full["rows"])


@pytest.mark.real_model
def test_a_trace_naming_the_default_model_with_another_vocabulary_is_refused(
    tiny_lm, tmp_path, capsys
):
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.model.load import DEFAULT_MODEL
    from semviz.sampling import PruneParams

    dec = Decoder(tiny_lm, "Hello", PruneParams(), DecodeSettings(max_new_tokens=2, capture=False))
    dec.run(2)
    dec.trace.model.update(name=DEFAULT_MODEL, vocab_size=50_000)
    for rec in dec.trace.steps:  # the tail summaries would count the vocabulary too
        rec.tail = None
    path = tmp_path / "t.json"
    dec.trace.save(path)
    rc, err = _err(["replay", str(path), "--temperature", "1.3"], capsys)
    assert rc == 2 and err == (
        f"semviz replay: the trace names {DEFAULT_MODEL}, whose vocabulary has 49,152 tokens, "
        "but records 50,000: pass --model with the model the trace was made with\n"
    )


def _trace_argv(tiny_dir, out, *extra: str) -> list[str]:
    return [
        "trace",
        "--model",
        str(tiny_dir),
        "--prompt",
        "Hello there",
        "--out",
        str(out),
        "--steps",
        "6",
        "--record-k",
        "64",
        *extra,
    ]


def test_trace_size_is_estimated_from_above(tiny_lm, tiny_dir, tmp_path, capsys):
    from semviz.cli.trace import estimate_bytes
    from semviz.decoding.decoder import encode_prompt

    out = tmp_path / "t.json"
    assert main(_trace_argv(tiny_dir, out, "--json")) == 0
    n_prompt = len(encode_prompt(tiny_lm, "Hello there"))
    est = estimate_bytes(tiny_lm.summary(), n_prompt, 6, 64, True, lens=True, full=True)
    size = out.stat().st_size
    assert size <= est <= 3 * size
    assert estimate_bytes(tiny_lm.summary(), n_prompt, 6, 64, True, lens=True) < est
    assert estimate_bytes(tiny_lm.summary(), n_prompt, 6, 64, False, full=True) < est


def test_trace_leaves_attention_out_before_a_file_replay_cannot_read(
    tiny_dir, tmp_path, capsys, monkeypatch
):
    from semviz.cli.trace import estimate_bytes
    from semviz.decoding.decoder import encode_prompt
    from semviz.model.load import load_model
    from semviz.output import trace as trace_mod

    lm = load_model(str(tiny_dir))
    n = len(encode_prompt(lm, "Hello there"))
    full = estimate_bytes(lm.summary(), n, 8, 16, False, full=True)
    # under with the full logits alone, over with attention and the lens as well: those go
    monkeypatch.setattr(trace_mod, "MAX_BYTES", full + 1)
    out = tmp_path / "t.json"
    assert main(_trace_argv(tiny_dir, out, "--steps", "8", "--record-k", "16", "--json")) == 0
    err = capsys.readouterr().err
    assert "semviz trace: attention and the lens left out: with them the trace would be" in err
    t = trace_mod.Trace.load(out)
    assert len(t.steps) == 8 and all(s.attention is None for s in t.steps)
    assert all(s.full_logits is not None and s.residual is None for s in t.steps)
    # over with the full logits too: every optional part goes
    monkeypatch.setattr(trace_mod, "MAX_BYTES", 70_000)
    argv = _trace_argv(tiny_dir, out, "--steps", "8", "--record-k", "16", "--json", "--force")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "semviz trace: attention, the lens and the full logits left out: with them" in err
    t = trace_mod.Trace.load(out)
    assert all(s.attention is None and s.full_logits is None for s in t.steps)
    monkeypatch.setattr(trace_mod, "MAX_BYTES", 30_000)
    rc, err = _err(_trace_argv(tiny_dir, tmp_path / "u.json", "--steps", "8", "--force"), capsys)
    assert rc == 2 and "MiB a trace may be: ask for fewer --steps or a smaller --record-k" in err
    assert not (tmp_path / "u.json").exists()


def test_ctrl_c_keeps_the_tokens_made_so_far(tiny_dir, tmp_path, capsys, monkeypatch):
    from semviz.decoding.decoder import Decoder
    from semviz.output.trace import Trace

    real = Decoder.step

    def step(self, *a, **kw):
        if len(self.trace.steps) == 3:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(Decoder, "step", step)
    out = tmp_path / "t.json"
    assert main(_trace_argv(tiny_dir, out)) == 130
    assert "stopped; the 3 tokens made so far are in" in capsys.readouterr().err
    t = Trace.load(out)
    assert len(t.steps) == 3 and t.stop_reason == "interrupted"
