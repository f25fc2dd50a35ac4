"""The frontier study: its arms, its commands, and one small run without the judge."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from semviz.frontier import study
from semviz.frontier.sweep import spec_of


def test_every_arm_is_a_valid_sweep_of_the_test_half():
    cfgs = study.configs(n_prompts=2)
    assert [c.settings[0].label for c in cfgs] == [a.name for a in study.ARMS]
    assert all(c.split == "test" and c.seeds == 4 and c.new_tokens == 128 for c in cfgs)
    specs = [spec_of(c.settings[0]) for c in cfgs]
    assert len(set(specs)) == len(specs)  # no two arms write the same rows
    assert specs[0] == "{}"  # plain sampling: shared by both questions
    first = cfgs[[a.name for a in study.ARMS].index("first gravity λ0.5")].settings[0].params
    assert (first.gravity_kind, first.gravity_mass, first.gravity_lambda) == (
        "pull",
        "attention",
        0.5,
    )


def test_commands_score_each_question_over_the_temperatures_all_its_arms_have():
    cmds = study.commands("out/study", prompts=2, seeds=2, tokens=8)
    assert cmds["gravity"] == (
        'python -m semviz frontier --score --out out/study/study.parquet --a "plain" '
        f'--b "gravity_lambda=0.5" --side "{study.FIRST}" --values 0.7,1,1.3,1.6 '
        "--tokens 8 --prompts 2 --seeds 2"
    )
    assert '--b "min_p=0.1" --side "top_p=0.9"' in cmds["min_p"]
    assert "--values 0.7,1,1.3,1.6,2 " in cmds["min_p"]


def test_a_small_study_writes_unscored_rows_and_its_costs(peaked_dir, tmp_path, capsys):
    out = tmp_path / "study"
    argv = ["--out", str(out), "--model", str(peaked_dir), "--device", "cpu"]
    argv += ["--prompts", "1", "--seeds", "2", "--tokens", "3", "--arms", "0,1"]
    assert study.main(argv) == 0
    df = pd.read_parquet(out / study.RESULTS)
    assert len(df) == 2 * 5 * 2  # 2 arms × 5 temperatures × 1 prompt × 2 seeds
    assert df["coherence"].isna().all() and df["emb"].isna().all()
    assert set(df["setting"]) == {"plain", "min-p 0.1"}
    assert (df["n_tokens"] <= 3).all()
    meta = json.loads((out / "study.json").read_text())
    assert [a["arm"] for a in meta["arms"]] == ["plain", "min-p 0.1"]
    assert meta["arms"][0]["new_rows"] == 10 and meta["device"] == "cpu"
    assert "--score" in capsys.readouterr().out
    # a second run resumes: nothing new to make
    assert study.main(argv) == 0
    assert len(pd.read_parquet(out / study.RESULTS)) == len(df)
    assert json.loads((out / "study.json").read_text())["arms"][0]["new_rows"] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gravity_arms_run_on_cuda(peaked_dir, tmp_path):
    """Both gravity arms on a GPU: their per-row work meets the model's tensors there."""
    out = tmp_path / "study"
    argv = ["--out", str(out), "--model", str(peaked_dir), "--device", "cuda"]
    argv += ["--prompts", "2", "--seeds", "2", "--tokens", "4", "--arms", "3,6"]
    assert study.main(argv) == 0
    meta = json.loads((out / "study.json").read_text())
    assert [a.get("error") for a in meta["arms"]] == [None, None]
    df = pd.read_parquet(out / study.RESULTS)
    assert len(df) == 2 * 4 * 2 * 2  # 2 arms × 4 temperatures × 2 prompts × 2 seeds
    assert (df["n_tokens"] > 0).all()
