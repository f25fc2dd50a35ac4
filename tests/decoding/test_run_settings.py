"""Run settings (model, chat, seed, steps, KV policy and budget) are declared once in
``RunSettings``: the CLI's flags derive from it, and the app's ranges agree with it."""

from __future__ import annotations

import json

import pytest

from semviz.cli import build_parser, main
from semviz.decoding.settings import KV_POLICIES, RUN_SPECS, SEED_MAX, RunSettings
from semviz.eviction import POLICIES

SUBCOMMANDS = {  # each subcommand's run flags, and the arguments it needs besides them
    "trace": (
        ("--steps", "--seed", "--kv-policy", "--kv-budget", "--chat", "--model"),
        ["--prompt", "x"],
    ),
    "report": (
        ("--steps", "--seed", "--kv-policy", "--kv-budget", "--chat", "--model"),
        ["--prompt", "x", "--out", "r"],
    ),
    "compare": (("--steps", "--seed", "--chat", "--model"), []),
}


def _parse(cmd: str, *argv: str):
    return build_parser().parse_args([cmd, *SUBCOMMANDS[cmd][1], *argv])


def test_the_declaration_validates_and_names_the_field():
    assert RunSettings().chat is None and RunSettings(chat=False).chat is False
    for bad, field in (
        (dict(seed=-1), "seed"),
        (dict(seed=SEED_MAX + 1), "seed"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(kv_policy="lru"), "kv_policy"),
        (dict(kv_budget=4), "kv_budget"),
    ):
        with pytest.raises(ValueError, match=f"RunSettings.{field}="):
            RunSettings(**bad)
    assert KV_POLICIES == ("none", *POLICIES)
    run = RunSettings(kv_policy="window", kv_budget=16, seed=3, max_new_tokens=5, chat=True)
    d = run.decode_settings(record_k=8)
    assert (d.seed, d.max_new_tokens, d.chat, d.record_k) == (3, 5, True, 8)
    assert run.eviction().name == "window" and run.eviction() is not run.eviction()
    assert run.key() != run.replace(kv_budget=32).key()
    assert RunSettings().key() == RunSettings(kv_budget=32).key()  # no policy: no budget


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_every_subcommand_takes_the_declared_ranges(cmd, capsys):
    flags = SUBCOMMANDS[cmd][0]
    a = _parse(cmd, "--seed", str(SEED_MAX), "--steps", "8192", "--chat", "off")
    assert (a.seed, a.steps, a.chat) == (SEED_MAX, 8192, False)
    run = _parse(cmd)
    assert run.seed == 0 and run.chat is None
    bad = [
        ("--seed", str(SEED_MAX + 1)),
        ("--seed", "-1"),
        ("--steps", "8193"),
        ("--steps", "0"),
        ("--chat", "maybe"),
    ]
    if "--kv-policy" in flags:
        a = _parse(cmd, "--kv-policy", "h2o", "--kv-budget", "8")
        assert (a.kv_policy, a.kv_budget) == ("h2o", 8)
        bad += [("--kv-policy", "lru"), ("--kv-budget", "7")]
    for flag, value in bad:
        with pytest.raises(SystemExit) as e:
            _parse(cmd, flag, value)
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"argument {flag}:" in err and err.count("\n") == 1, err


def test_a_seed_past_32_bits_is_refused_with_the_seed_s_range():
    """One seed range everywhere, in the message too: a seed too large for 32 bits names
    [0, 2^31 - 1], not the bounds of every 32-bit setting (which would admit a negative)."""
    for raw in (str(SEED_MAX + 1), "99999999999999999999", "1e12"):
        with pytest.raises(ValueError) as e:
            RUN_SPECS["seed"].coerce(raw)
        assert str(e.value) == "expected an integer in [0, 2147483647]", raw
    with pytest.raises(ValueError, match="^expected an integer$"):
        RUN_SPECS["seed"].coerce("seven")


def test_the_app_s_run_controls_are_the_cli_s_declaration():
    """The app's run controls (``ui.state.Settings``) are ``RunSettings``' fields, spec for
    spec, so the sidebar, the URL and the CLI accept the same values; only the chat template
    differs, a toggle in the app where the CLI also has "auto"."""
    import dataclasses

    from ui.state import Settings

    app = {f.name: f.metadata["spec"] for f in Settings.__dataclass_fields__.values()}
    for name in ("model", "seed", "max_new_tokens", "kv_policy", "kv_budget"):
        assert app[name] == RUN_SPECS[name], name
    assert dataclasses.replace(app["chat"], optional=RUN_SPECS["chat"].optional) == (
        dataclasses.replace(RUN_SPECS["chat"], note="", help=app["chat"].help)
    )
    assert not app["chat"].optional and RUN_SPECS["chat"].optional
    assert RUN_SPECS["seed"].hi == SEED_MAX == 2**31 - 1
    assert app["kv_policy"].choices == KV_POLICIES
    assert Settings().chat is RUN_SPECS["chat"].app_default is True
    assert Settings().max_new_tokens == RUN_SPECS["max_new_tokens"].app_default == 512


def test_trace_runs_with_a_kv_policy(tiny_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    argv = [
        "trace",
        "--model",
        str(tiny_dir),
        "--prompt",
        "The sea at night",
        "--steps",
        "3",
        "--seed",
        str(SEED_MAX),
        "--kv-policy",
        "window",
        "--kv-budget",
        "8",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    tr = json.loads(out.read_text())
    assert tr["settings"]["seed"] == SEED_MAX and tr["settings"]["max_new_tokens"] == 3
    assert tr["settings"]["eviction"]["policy"] == "window"
    assert len(tr["steps"]) == 3
