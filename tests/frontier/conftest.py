"""Fixtures: a tiny Llama whose next-token distributions are as peaked as a real LM's, the judge.

The shared tiny model has random weights, so its next-token distribution is almost uniform
over 49,152 tokens (entropy ≈ 10.8 nats): every pick is a near-tie and any rounding moves it.
A copy with the final norm at 1 and the embedding scaled by 2.5 has an entropy near 3 nats,
like a real model's, so exact-token comparisons test the batching logic, not float noise.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def peaked_dir(tiny_dir, tmp_path_factory):
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(1.0)
        model.model.embed_tokens.weight.mul_(2.5)  # tied: scales the logits too
    out = tmp_path_factory.mktemp("peaked-llama")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def peaked_lm(peaked_dir):
    import semviz

    return semviz.load_model(str(peaked_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def judge():
    from semviz.analysis.judge import load_judge

    return load_judge()
