"""Each PruneParams field is described once (its FieldSpec), and validation, the one value
parser, the CLI flags and the compare specs all follow that description."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from semviz.analysis.compare import parse_side
from semviz.cli import common
from semviz.sampling import (
    PruneParams,
    check_model_shape,
    field_spec,
    parse_bool,
    parse_field,
    parse_scalar,
)

FIELDS = [f.name for f in dataclasses.fields(PruneParams)]


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_described_and_its_default_is_valid(name):
    spec = field_spec(name)
    assert spec.help.strip()
    assert spec.problem(getattr(PruneParams(), name)) is None
    if spec.kind == "choice":
        assert getattr(PruneParams(), name) in spec.choices


def _outside(spec):
    """A value just outside the field's range, or None when it has none."""
    if spec.lo is not None:
        return spec.lo if spec.lo_open else spec.lo - 1
    if spec.hi is not None:
        return spec.hi if spec.hi_open else spec.hi + 1
    return None


BOUNDED = [
    n
    for n in FIELDS
    if field_spec(n).kind in ("int", "float") and _outside(field_spec(n)) is not None
]


@pytest.mark.parametrize("name", BOUNDED)
def test_out_of_range_is_refused_naming_the_field(name):
    spec = field_spec(name)
    bad = int(_outside(spec)) if spec.kind == "int" else float(_outside(spec))
    with pytest.raises(ValueError, match=rf"^PruneParams\.{name}={bad!r}: must be "):
        PruneParams(**{name: bad})
    with pytest.raises(ValueError, match=rf"^{name}="):
        parse_field(name, str(bad))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"top_p": 0.0}, "PruneParams.top_p=0.0: must be in (0, 1]"),
        ({"temperature": -1.0}, "PruneParams.temperature=-1.0: must be >= 0 (0 means greedy)"),
        ({"top_k": 2.5}, "PruneParams.top_k=2.5: must be an int"),
        ({"top_k": True}, "PruneParams.top_k=True: must be an int"),
        ({"free_energy": 1}, "PruneParams.free_energy=1: must be a bool"),
        ({"temperature": "hot"}, "PruneParams.temperature='hot': must be a number"),
        ({"min_p": float("nan")}, "PruneParams.min_p=nan: must be finite"),
        ({"order": "vllm"}, "PruneParams.order='vllm': must be one of ('hf', 'llama.cpp')"),
        ({"controller_sign": 0}, "PruneParams.controller_sign=0: must be one of (-1, 1)"),
        ({"gravity_layers": (1, -1)}, "PruneParams.gravity_layers=(1, -1): indices must be >= 0"),
        ({"gravity_heads": ()}, "PruneParams.gravity_heads=(): must be None or a non-empty"),
        ({"adaptive_t_min": 3.0}, "PruneParams.adaptive_t_min=3.0: must satisfy"),
    ],
)
def test_messages_are_one_sentence_naming_the_field(kw, message):
    with pytest.raises(ValueError) as e:
        PruneParams(**kw)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_ints_become_floats_and_lists_tuples():
    p = PruneParams(temperature=1, gravity_layers=[0, 2])
    assert p.temperature == 1.0 and isinstance(p.temperature, float)
    assert p.gravity_layers == (0, 2) and p == PruneParams.from_dict(p.to_dict())
    with pytest.raises(ValueError, match="unknown keys"):
        p.replace(temprature=0.5)


def test_one_parser_for_every_kind():
    assert [parse_bool(s) for s in ("on", "OFF", "true", "no", "1", "0")] == [
        True,
        False,
        True,
        False,
        True,
        False,
    ]
    assert parse_field("top_k", "7.0") == (7, None)
    assert parse_field("temperature", " 0.5 ") == (0.5, None)
    assert parse_field("gravity_layers", "0/1,2") == ((0, 1, 2), None)
    assert parse_field("gravity_layers", "all") == (None, None)
    assert parse_field("controller_sign", "1") == (1, None)
    assert parse_field("order", "llama.cpp") == ("llama.cpp", None)
    for name, raw, why in [
        ("top_k", "7.5", "expected an integer"),
        ("temperature", "inf", "expected a finite number"),
        ("temperature", "warm", "expected a number"),
        ("free_energy", "maybe", "expected on or off"),
        ("order", "lama.cpp", r"expected one of .* \(did you mean llama.cpp\?\)"),
        ("gravity_layers", "0/x", "expected integers"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}='{raw}': {why}"):
            parse_field(name, raw)
    with pytest.raises(ValueError, match="did you mean top_p"):
        parse_field("top_pp", "0.9")
    assert [parse_scalar(s) for s in ("null", "Yes", "-3", "1e-3", "h2o")] == [
        None,
        True,
        -3,
        1e-3,
        "h2o",
    ]


def test_clamping_says_what_it_did():
    assert parse_field("top_k", "-3", clamp=True) == (
        0,
        "top_k=-3 must be >= 0 (0 means off); using 0.",
    )
    assert parse_field("top_p", "0.5", clamp=True) == (0.5, None)
    # the app clamps to its widget's range, which can be narrower than the valid one
    value, note = parse_field("temperature", "5", clamp=True, app=True)
    assert value == 2.0 and note == "temperature=5 is outside the app's range [0, 2]; using 2.0."
    assert parse_field("temperature", "5", clamp=True) == (5.0, None)
    # a strict bound cannot be reached: refused, not clamped
    with pytest.raises(ValueError, match=r"^top_p='0': must be in \(0, 1\]"):
        parse_field("top_p", "0", clamp=True)
    with pytest.raises(ValueError, match="expected a number"):
        parse_field("top_p", "lots", clamp=True)


def test_layer_and_head_indices_are_checked_against_the_model():
    check_model_shape(
        PruneParams(gravity_layers=(0, 29), gravity_heads=(8,)), n_layers=30, n_heads=9
    )
    check_model_shape(PruneParams(), n_layers=1, n_heads=1)
    with pytest.raises(
        ValueError, match=r"^PruneParams\.gravity_layers=\(0, 30\): the model has 30 layers"
    ):
        check_model_shape(PruneParams(gravity_layers=(0, 30)), n_layers=30, n_heads=9)
    with pytest.raises(ValueError, match=r"^PruneParams\.gravity_heads=\(9,\): .* in 0\.\.8"):
        check_model_shape(PruneParams(gravity_heads=(9,)), n_layers=30, n_heads=9)


def _cli(*argv):
    p = argparse.ArgumentParser()
    common.add_prune_args(p)
    return common.params_from_args(p.parse_args(list(argv)))


def test_cli_has_a_flag_per_field_from_the_metadata(capsys):
    p = argparse.ArgumentParser()
    common.add_prune_args(p)
    dests = {a.dest for a in p._actions}
    assert set(FIELDS) <= dests
    p.print_help()
    assert field_spec("ema_decay").help in " ".join(capsys.readouterr().out.split())
    params = _cli(
        "--top-p", "0.9", "--free-energy", "on", "--gravity-layers", "0,2", "--controller-sign", "1"
    )
    assert params == PruneParams(
        top_p=0.9, free_energy=True, gravity_layers=(0, 2), controller_sign=1
    )
    assert _cli("--preset", "qa", "--top-k", "3").top_k == 3
    for argv in (["--top-p", "abc"], ["--free-energy", "maybe"], ["--order", "vllm"]):
        with pytest.raises(SystemExit) as e:
            _cli(*argv)
        assert e.value.code == 2
    assert "expected a number, got 'abc'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"PruneParams\.top_p=1\.5"):  # range: the core's check
        _cli("--top-p", "1.5")


def test_compare_specs_use_the_same_parser():
    assert parse_side("gravity_layers=0/1,free_energy=yes").params == PruneParams(
        gravity_layers=(0, 1), free_energy=True
    )
    with pytest.raises(ValueError, match="^top_k='7.5': expected an integer"):
        parse_side("top_k=7.5")
