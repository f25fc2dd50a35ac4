"""The default gravity on the real model does not lock the text into loops (seed §7.4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semviz.analysis.metrics import repetition_rate, words
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams

pytestmark = pytest.mark.real_model

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts" / "prompts.jsonl"
NEW_TOKENS = 48


def _shipped(n: int = 3) -> list[str]:
    """The first ``n`` story prompts of the shipped prompt set's dev half."""
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    return [r["text"] for r in rows if r["split"] == "dev" and r["kind"] == "story"][:n]


def test_information_mass_ignores_stopwords_and_punctuation(real_lm):
    from semviz.gravity import information_mass

    info = information_mass(real_lm.model)
    tok = real_lm.tokenizer

    def mass(text: str) -> float:
        (i,) = tok(text, add_special_tokens=False)["input_ids"]
        return float(info[i])

    assert [mass(w) for w in (" the", " a", " of", " and", ",", ".")] == [0.0] * 6
    assert min(mass(w) for w in (" bee", " lighthouse", " violin", " village")) > 1.0


@pytest.mark.parametrize("lam", [0.5, 1.0])
def test_default_gravity_keeps_repetition_low(real_lm, lam):
    """λ 1 with the default mass at T 0.7, fallback off: repeated word 4-grams under 5%."""
    params = PruneParams(temperature=0.7, top_p=0.95, gravity_lambda=lam)
    assert not params.fallback
    reps = total = 0
    for i, prompt in enumerate(_shipped()):
        d = Decoder(real_lm, prompt, params, DecodeSettings(seed=i, max_new_tokens=NEW_TOKENS))
        d.run(NEW_TOKENS)
        w = words(d.trace.text)
        grams = max(len(w) - 3, 0)
        if grams:
            reps += round(repetition_rate(w, 4) * grams)
            total += grams
    assert total > 60  # the three texts are real prose, not a stub
    assert reps / total < 0.05, f"{reps}/{total} repeated 4-grams at λ={lam}"
