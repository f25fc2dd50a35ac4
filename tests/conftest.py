"""Shared fixtures: a tiny random Llama with the real tokenizer, and the real default model."""

from __future__ import annotations

import pytest
import torch

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="session")
def tokenizer_dir():
    """The converted default model's folder (tokenizer + config), converting it once if needed."""
    from semviz.model import ensure_default_converted

    return ensure_default_converted()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tokenizer_dir):
    """A saved tiny random Llama (2 layers, 4 heads, 2 KV heads) with the real tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **TINY,
    )
    gen = torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the default init, so attention is not flat
        for p in model.parameters():
            p.normal_(0.0, 0.08, generator=gen)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_lm(tiny_dir):
    """The tiny model loaded through ``semviz.load_model`` (local-directory path), float32."""
    import semviz

    return semviz.load_model(str(tiny_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def real_lm():
    """The real default model (SmolLM2-135M-Instruct), in its default dtype (float32 on CPU)."""
    import semviz

    return semviz.load_model(device="cpu")


@pytest.fixture(scope="session")
def real_lm_f32():
    """The real default model in float32, for exact comparisons with transformers."""
    import semviz

    return semviz.load_model(device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def real_lm_bf16():
    """The real default model in bfloat16."""
    import semviz

    return semviz.load_model(device="cpu", dtype="bfloat16")
