"""Adding a gravity kind or a mass source is one class, registered: it is then a setting of
the decoder, the ``generate()`` processor, replay, the CLI and the app's sidebar, and the three
paths that compute ``G`` agree on it, with no edit elsewhere."""

from __future__ import annotations

import json

import pytest
import torch

from semviz import gravity as gv
from semviz.analysis.replay import recompute_gravity
from semviz.cli import main
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output import charts
from semviz.sampling import PruneParams
from tests.app.conftest import app, run_steps  # noqa: F401 (app: the app on the tiny model)
from tests.gravity.test_generate import PROMPTS, STEPS, _generate

LAM = 2.0


class Echo(gv.GravityKind):
    """A toy kind, so its effect is unmistakable: ``G(w) = 1`` for a token among the last
    ``gravity_contrast_k`` of the context, else 0. It reads only the token ids."""

    name, label = "toy", "echo"

    def potential(self, model, params, step):
        recent = step.ctx.ids.long()[-params.gravity_contrast_k :]  # (k,)
        return torch.isin(step.tokens(), recent).float()  # (V,) or (K,)


class Recency(gv.MassSource):
    """A toy mass source: position ``i`` weighs ``i + 1``, so later tokens pull harder."""

    name, label = "toy", "recency"

    def weigh(self, model, params, ctx, ok):
        return gv.positions_of(ctx).float() + 1.0, None  # (S,)


@pytest.fixture()
def toys():
    gv.register_kind(Echo)
    gv.register_mass(Recency)
    try:
        yield
    finally:
        gv.unregister_kind("toy")
        gv.unregister_mass("toy")
    assert "toy" not in gv.KINDS and "toy" not in gv.MASSES
    with pytest.raises(ValueError, match="gravity_kind"):
        PruneParams(gravity_kind="toy")


KIND = dict(temperature=1.0, gravity_lambda=LAM, gravity_kind="toy", gravity_contrast_k=64)
MASS = dict(temperature=1.0, gravity_lambda=LAM, gravity_kind="pull", gravity_anchor="context")


def _echo(ids: list[int], cand: torch.Tensor, k: int) -> torch.Tensor:
    """The toy kind by hand, after the default n-gram guard (bigrams): (K,)"""
    ngram = {ids[j + 1] for j in range(len(ids) - 1) if ids[j] == ids[-1]}
    return torch.tensor([float(c in ids[-k:] and c not in ngram) for c in cand.tolist()])


def test_the_toy_kind_is_g_in_decoder_generate_and_replay(toys, tiny_lm):
    p = PruneParams(**KIND)
    new, gs = _generate(tiny_lm, p)  # batched, left-padded model.generate()
    ones = 0
    for b, prompt in enumerate(PROMPTS):
        d = Decoder(tiny_lm, prompt, p, DecodeSettings(max_new_tokens=STEPS, chat=True))
        for i in range(STEPS):
            rec = d.step(force_token=int(new[b, i]))
            cand = rec.cand_ids.long()
            expected = _echo(d.ids[: len(d.prompt_ids) + i], cand, 64)
            assert torch.equal(rec.gravity, expected)
            torch.testing.assert_close(gs[i][b][cand], rec.gravity, atol=1e-6, rtol=0)
            ones += int(expected.sum())
        replayed = recompute_gravity(tiny_lm.model, d.trace, p)
        for g, rec in zip(replayed, d.trace.steps, strict=True):
            torch.testing.assert_close(g, rec.gravity, atol=1e-6, rtol=0)
        assert d.trace.settings["params"]["gravity_kind"] == "toy"
    assert ones >= 2  # λ·G moved some candidates: the kind really ran


def test_the_toy_mass_is_g_in_decoder_generate_and_replay(toys, tiny_lm):
    p = PruneParams(**MASS, gravity_mass="toy")
    new, gs = _generate(tiny_lm, p)
    uniform = PruneParams(**MASS, gravity_mass="uniform")
    for b, prompt in enumerate(PROMPTS):
        d = Decoder(tiny_lm, prompt, p, DecodeSettings(max_new_tokens=STEPS, chat=True))
        for i in range(STEPS):
            rec = d.step(force_token=int(new[b, i]))
            torch.testing.assert_close(
                gs[i][b][rec.cand_ids.long()], rec.gravity, atol=1e-6, rtol=0
            )
        replayed = recompute_gravity(tiny_lm.model, d.trace, p)
        other = recompute_gravity(tiny_lm.model, d.trace, uniform)
        for g, u, rec in zip(replayed, other, d.trace.steps, strict=True):
            torch.testing.assert_close(g, rec.gravity, atol=1e-6, rtol=0)
            assert not torch.allclose(g, u, atol=1e-3)  # the toy masses, not uniform ones


def test_the_toy_mass_weighs_by_position(toys):
    m = gv.context_mass("toy", context_ids=torch.tensor([5, 6, 7, 8]))
    torch.testing.assert_close(m, torch.tensor([1.0, 2.0, 3.0, 4.0]) / 10)


def test_the_chain_chart_names_the_kind(toys):
    stages = dict(charts.chain_stages(PruneParams(gravity_lambda=0.5, gravity_kind="toy")))
    assert stages["gravity"] == "s = log P + 0.5·G (echo, full vocabulary)"
    stages = dict(charts.chain_stages(PruneParams(gravity_lambda=1.0)))  # the default kind
    assert stages["gravity"] == "s = log P + 1·G (contrast, last 8 tokens, full vocabulary)"


def test_the_cli_takes_them(toys, tiny_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    argv = [
        "trace",
        "--model",
        str(tiny_dir),
        "--prompt",
        "The sea",
        "--steps",
        "3",
        "--gravity-lambda",
        "2",
        "--gravity-kind",
        "toy",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    params = json.loads(out.read_text())["settings"]["params"]
    assert params["gravity_kind"] == "toy" and params["gravity_lambda"] == 2.0
    assert (
        main(
            [
                *argv[:-4],
                "--gravity-kind",
                "pull",
                "--gravity-mass",
                "toy",
                "--out",
                str(out),
                "--force",
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["settings"]["params"]["gravity_mass"] == "toy"
    capsys.readouterr()
    gv.unregister_kind("toy")
    try:
        with pytest.raises(SystemExit) as e:
            main([*argv[:-2], "--out", str(tmp_path / "u.json")])
        assert e.value.code == 2 and "toy" in capsys.readouterr().err  # gone once unregistered
    finally:
        gv.register_kind(Echo)


def test_the_sidebar_offers_them(toys, app):  # noqa: F811 (the fixture imported above)
    kind = app.selectbox(key="s_gravity_kind")
    assert list(kind.options) == ["pull", "contrast", "toy"]
    kind.set_value("pull").run()
    assert not app.exception
    assert "toy" in app.selectbox(key="s_gravity_mass").options
    app.selectbox(key="s_gravity_kind").set_value("toy").run()
    assert not app.exception
    assert app.query_params["gravity_kind"] == "toy"  # and the link carries it
    run_steps(app, 2)
    app.switch_page("app_pages/attention.py").run()
    assert not app.exception
    said = [i.value for i in app.info]
    assert "Echo gravity is not a sum over the context, so it has no per-token terms." in said
