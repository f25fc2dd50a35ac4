"""Bad values for every flag of every subcommand: exit code 2, one line on stderr, no
traceback, no file left behind, no input file changed.

The flags are read from the parser itself, so a new flag without bad values here fails
``test_every_flag_has_bad_values``. Each case runs in-process through ``semviz.cli.main`` on
the tiny model; the base command of each subcommand succeeds, and each case changes one flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from semviz.cli import build_parser, common, main
from semviz.decoding.settings import RUN_SPECS
from semviz.sampling import SPECS

from .conftest import record

# RunSettings' fields by their flag's dest ("steps" is max_new_tokens)
RUN_FLAGS = {(s.flag or "--" + n)[2:].replace("-", "_"): s for n, s in RUN_SPECS.items()}
NOT_UTF8 = b"caf\xe9".decode("utf-8", "surrogateescape")  # a Latin-1 prompt, as argv gives it
HUGE = "9" * 25
INT_GENERIC = [("int: not a number", v) for v in ("x", "1.5", "", "1e3")] + [
    ("int: overflow", HUGE),
    ("int: overflow", "-" + HUGE),
]
FLOAT_GENERIC = [("float: not a number", v) for v in ("x", "")] + [
    ("float: not finite", v) for v in ("nan", "inf", "-inf", "1e400")
]
# values out of a flag's own range (the generic ones above apply to every flag of the type)
OUT_OF_RANGE = {
    "steps": ["0", "-3", "8193"],
    "seed": ["-1", str(2**31), str(2**63)],
    "kv_budget": ["7", "8193"],
    "show": ["-1", "1001"],
    ("kv-eval", "tokens"): ["1", "0"],
    ("bench", "tokens"): ["0", "100001"],
    "prefill": ["0", "12"],
    "threads": ["0"],
    "repeats": ["0"],
    "memory_tokens": ["0", "15", "100000"],
    "step": ["-1", "2"],
    "top_k": ["-1"],
    "min_tokens_to_keep": ["0"],
    "rerank_k": ["0"],
    "controller_sign": ["0", "2"],
    "fallback_ngram": ["0"],
    "fallback_ngram_repeats": ["0"],
    "fallback_collapse_steps": ["0"],
    "temperature": ["-0.5"],
    "top_p": ["0", "1.5"],
    "min_p": ["-0.1", "1.1"],
    "typical_p": ["0"],
    "epsilon": ["1"],
    "eta": ["-0.1"],
    "ema_decay": ["1"],
    "edt_n": ["0", "1"],
    "dynatemp_exponent": ["0"],
    "mirostat_tau": ["0"],
    "mirostat_eta": ["0"],
    "adaptive_t_min": ["0"],
    "free_energy_kappa": ["-1"],
    "target_entropy": ["-1"],
    "controller_gain": ["-1"],
    "edt_theta": ["-1"],
    "dynatemp_range": ["-1"],
    "entropix_logits_gain": ["-1"],
    "entropix_attention_gain": ["-1"],
    "entropix_agreement_gain": ["-1"],
    "fallback_collapse_threshold": ["-1"],
    "fallback_gravity_ratio": ["0"],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_dir, tiny_lm):
    """Inputs the cases point at: a good trace, bad trace files, text files, folders."""
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.sampling import PruneParams

    d = tmp_path_factory.mktemp("in")
    dec = Decoder(
        tiny_lm,
        "A quiet harbour",
        PruneParams(gravity_lambda=0.5, gravity_mass="uniform"),
        DecodeSettings(max_new_tokens=2, seed=1, record_k=16),
    )
    dec.run(2)
    good = dec.trace.save(d / "good.json")
    doc = json.loads(good.read_text())
    (d / "text.txt").write_text("It was the best of times, it was the worst of times. " * 4)
    (d / "short.txt").write_text("Too short.")
    (d / "latin1.txt").write_bytes("Café au lait, s'il vous plaît. ".encode("latin-1") * 8)
    (d / "notjson.json").write_text("{not json")
    (d / "deep.json").write_text("[" * 5000 + "]" * 5000)
    (d / "version.json").write_text(json.dumps({**doc, "version": 1.0}))
    doc["steps"][1]["cand_ids"]["__tensor__"] = "float32"
    (d / "tampered.json").write_text(json.dumps(doc))
    doc = json.loads(good.read_text())
    doc["steps"][0]["token_id"] = 2**40
    (d / "bigid.json").write_text(json.dumps(doc))
    with open(d / "huge.json", "wb") as f:  # sparse: 300 MiB on paper, nothing on disk
        f.truncate(300 << 20)
    (d / "folder").mkdir()
    (d / "existing.json").write_text("keep me")
    (d / "existing.md").write_text("keep me")
    (d / "oldreport").mkdir()
    (d / "oldreport" / "report.html").write_text("keep me")
    (d / "noconfig").mkdir()
    return {"in": d, "tiny": str(tiny_dir), "good": str(good)}


def base_argv(cmd: str, w: dict, out: Path) -> list[str]:
    """A command of each kind that succeeds quickly on the tiny model."""
    tiny = ["--model", w["tiny"]]
    return {
        "trace": [
            "trace",
            "--prompt",
            "Hi",
            "--steps",
            "2",
            "--out",
            str(out / "t.json"),
            "--json",
            *tiny,
        ],
        "report": [
            "report",
            "--prompt",
            "Hi",
            "--steps",
            "2",
            "--out",
            str(out / "rep"),
            "--no-png",
            "--json",
            *tiny,
        ],
        "replay": ["replay", w["good"], "--json", "--gravity-mass", "attention", *tiny],
        "compare": [
            "compare",
            "--a",
            "plain",
            "--b",
            "top_k=5",
            "--prompt",
            "Hi",
            "--steps",
            "2",
            "--json",
            *tiny,
        ],
        "kv-eval": [
            "kv-eval",
            "--text",
            str(w["in"] / "text.txt"),
            "--tokens",
            "12",
            "--budget",
            "4",
            "--policies",
            "full,window",
            "--json",
            "--quiet",
            *tiny,
        ],
        "bench": ["bench", "--tokens", "2", "--repeats", "1", "--no-float32", "--json", *tiny],
    }[cmd]


def bad_values(cmd: str, action: argparse.Action, w: dict) -> list[tuple[str, str]]:
    """(class, value) pairs that must each be refused for this flag of this subcommand."""
    d, dest = w["in"], action.dest
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return [("switch: given a value", "yes")]
    if action.type is common.text_arg:
        out = [("text: not UTF-8", NOT_UTF8)]
        if dest == "prompt":
            out += [("text: empty", ""), ("text: empty", "   ")]
        if dest in ("a", "b", "side"):
            out += [("side: bad spec", v) for v in ("nosuch", "top_p=2", "top_k=x", "=")]
            out += [("indices: outside the model", "gravity_layers=0/99")]
        return out
    own = OUT_OF_RANGE.get((cmd, dest), OUT_OF_RANGE.get(dest, []))
    spec = SPECS.get(dest) or RUN_FLAGS.get(dest)  # flags made from the settings' fields
    kind = spec.kind if spec is not None else None
    if kind == "int":  # the settings' parser reads "1e3" as 1000, as a link or a spec may
        generic = [(c, v) for c, v in INT_GENERIC if v != "1e3"]
        return generic + [("int: out of range", v) for v in own]
    if kind == "float":
        return FLOAT_GENERIC + [("float: out of range", v) for v in own]
    if kind == "bool" or dest == "chat":
        return [("on/off: other", v) for v in ("maybe", "", "2")]
    if kind == "indices":
        return [("indices: not integers", v) for v in ("0,x", "0,,1", HUGE)] + [
            ("indices: outside the model", v) for v in ("99", "-100", "0,4")
        ]
    if getattr(action.type, "__name__", "") == "integer":
        return INT_GENERIC + [("int: out of range", v) for v in own]
    if action.type is float:
        return FLOAT_GENERIC + [("float: out of range", v) for v in own]
    if action.choices is not None:
        return [("choice: unknown", v) for v in ("bogus", "")]
    return _by_dest(cmd, dest, d)


def _by_dest(cmd: str, dest: str, d: Path) -> list[tuple[str, str]]:
    ro = "/proc" if os.geteuid() == 0 else "/"  # a folder even root cannot write in
    traces = [
        ("trace file: " + k, str(v))
        for k, v in [
            ("missing", d / "missing.json"),
            ("a folder", d / "folder"),
            ("a device", "/dev/zero"),
            ("not JSON", d / "notjson.json"),
            ("nested 5,000 deep", d / "deep.json"),
            ("over the size limit", d / "huge.json"),
            ("float version", d / "version.json"),
            ("tampered dtype", d / "tampered.json"),
            ("id past the vocabulary", d / "bigid.json"),
        ]
    ]
    table = {
        ("trace", "out"): [
            ("output file: " + k, str(v))
            for k, v in [
                ("a folder", d / "folder"),
                ("folder missing", d / "nodir" / "t.json"),
                ("read-only folder", f"{ro}/semviz-t.json"),
                ("exists, no --force", d / "existing.json"),
                ("empty", ""),
                ("a device", "/dev/null"),
            ]
        ],
        ("report", "out"): [
            ("output folder: " + k, str(v))
            for k, v in [
                ("a file", d / "existing.json"),
                ("parent missing", d / "nodir" / "rep"),
                ("read-only folder", f"{ro}/semviz-rep"),
                ("holds a report, no --force", d / "oldreport"),
                ("empty", ""),
            ]
        ],
        ("compare", "markdown"): [
            ("output file: " + k, str(v))
            for k, v in [
                ("a folder", d / "folder"),
                ("folder missing", d / "nodir" / "x.md"),
                ("read-only folder", f"{ro}/semviz-x.md"),
                ("exists, no --force", d / "existing.md"),
                ("a device", "/dev/null"),
            ]
        ],
        ("report", "trace"): traces,
        ("replay", "trace"): traces,
        ("kv-eval", "text"): [
            ("text file: " + k, str(v))
            for k, v in [
                ("missing", d / "missing.txt"),
                ("a folder", d / "folder"),
                ("a device", "/dev/zero"),
                ("not UTF-8", d / "latin1.txt"),
                ("fewer tokens than --tokens", d / "short.txt"),
            ]
        ],
        ("kv-eval", "budget"): [
            ("budget: bad", v) for v in ("0", "-1", "x", "1e308", "nan", "1.5", "", ",")
        ],
        ("kv-eval", "budgets"): [("budget: bad", v) for v in ("0,4", "x", "1e308", ",")],
        ("kv-eval", "policies"): [("policy: bad", v) for v in ("nope", "", ",", "full,nope")],
        ("kv-eval", "address"): [
            ("address: bad", v) for v in ("", "nohost", "host:", ":80", "host:99999", "ray://host")
        ],
        ("kv-eval", "policy_arg"): [
            ("policy: bad", v) for v in ("gravity.beta", "x=1", "window.nope=1", "nope.x=1")
        ],
    }
    if (cmd, dest) in table:
        return table[(cmd, dest)]
    if dest == "model":
        return [
            ("model: unknown", v)
            for v in (
                "no-such/model-xyz",
                str(d / "noconfig"),
                str(d / "missing.gguf"),
                "a b c",
                "/dev/zero",
            )
        ]
    if dest == "device":
        return [("device: unknown", v) for v in ("nodevice", "cuda:99")]
    if dest == "preset":
        return [("choice: unknown", v) for v in ("nosuch", "")]
    return []


def flags(cmd: str) -> list[argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[cmd]._actions if not isinstance(a, argparse._HelpAction)]


COMMANDS = ["trace", "report", "replay", "compare", "kv-eval", "bench"]


def with_flag(argv: list[str], action: argparse.Action, value: str) -> list[str]:
    """``argv`` with this flag's value replaced (or the flag added)."""
    if not action.option_strings:  # the positional trace of replay
        return [argv[0], value, *argv[2:]]
    flag = action.option_strings[0]
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == flag or (flag == "--trace" and a == "--prompt"):  # --trace excludes --prompt
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(a)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return [*out, f"{flag}={value}"]
    return [*out, flag, value]


def _snapshot(*folders: Path) -> dict[str, str]:
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.stat().st_size < (1 << 20):
                out[str(p)] = hashlib.sha1(p.read_bytes()).hexdigest()
            else:
                out[str(p)] = "dir" if p.is_dir() else str(p.stat().st_size)
    return out


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_flag_has_bad_values(cmd, world):
    missing = [a.dest for a in flags(cmd) if not bad_values(cmd, a, world)]
    assert not missing, f"{cmd}: flags without bad values in the matrix: {missing}"


_LOADED: dict = {}


def _memo_load(real):
    """``load_model`` that loads each (name, device, dtype) once: many cases load the tiny
    model before their check fails, and the load itself is not what they test."""

    def load(name=None, **kw):
        key = (name, kw.get("device"), str(kw.get("dtype")))
        if key not in _LOADED:
            _LOADED[key] = real(name, **kw)  # failures are raised, never remembered
        return _LOADED[key]

    return load


@pytest.mark.parametrize("cmd", COMMANDS)
def test_bad_values_exit_2_with_one_line_and_leave_nothing(
    cmd, world, tmp_path, capsys, monkeypatch
):
    import semviz.model.load

    monkeypatch.setattr(semviz.model.load, "load_model", _memo_load(semviz.model.load.load_model))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    out.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # a default output path would land here and be seen
    base = base_argv(cmd, world, out)
    before = _snapshot(out, cwd, world["in"])
    bad = []
    for action in flags(cmd):
        for klass, value in bad_values(cmd, action, world):
            argv = with_flag(base, action, value)
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse's own refusals
                rc = exc.code
            err = capsys.readouterr().err
            after = _snapshot(out, cwd, world["in"])
            case = f"{' '.join(argv[:1])} {action.dest}={value!r}"
            if "Traceback" in err or rc == 1:
                record(f"cli {klass}", "traceback")
                bad.append(f"{case}: rc {rc}, {err.strip()[-300:]!r}")
            elif rc != 2:
                record(f"cli {klass}", "accepted")
                bad.append(f"{case}: rc {rc} (accepted), {err.strip()[-200:]!r}")
            elif err.count("\n") != 1 or not err.startswith(f"semviz {cmd}"):
                record(f"cli {klass}", "not one line")
                bad.append(f"{case}: {err!r}")
            elif after != before:
                record(f"cli {klass}", "leftover")
                changed = sorted(
                    k for k in set(after) | set(before) if after.get(k) != before.get(k)
                )
                bad.append(f"{case}: changed {changed}")
            else:
                record(f"cli {klass}", "refused")
            for folder in (out, cwd):  # whatever a wrongly accepted case wrote, for the next
                for p in folder.iterdir():
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            before = _snapshot(out, cwd, world["in"])
    assert not bad, "\n".join(bad)
