"""Shared fixtures: tiny random models of several families with the real tokenizer, and the
real default model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class Family:
    """One tiny model family: config and model class names in transformers, config arguments,
    and the std of its random weights."""

    config: str
    model: str
    kwargs: dict
    std: float = 0.2


FAMILIES = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", TINY),
    # q/k/v projections carry biases (always, in Qwen2) and the LM head is its own matrix
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", {**TINY, "tie_word_embeddings": False}),
    # embeddings scaled by sqrt(d), RMSNorm as (1 + w), GeLU MLP, one KV head (multi-query)
    "gemma": Family(
        "GemmaConfig", "GemmaForCausalLM", {**TINY, "num_key_value_heads": 1, "head_dim": 16}
    ),
    # learned absolute positions added at the input (no RoPE), Conv1D projections, LayerNorm
    "gpt2": Family(
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(
            n_embd=64, n_inner=128, n_layer=2, n_head=4, n_positions=512, tie_word_embeddings=True
        ),
    ),
    # a sliding-window layer (8 tokens, so prompts reach past it) then a global one, each with
    # its own RoPE base; q/k norms; scale 1/sqrt(query_pre_attn_scalar = 256), not 1/sqrt(16).
    # From std 0.1 up the post-sublayer norms make the greedy output one token over and over.
    "gemma3": Family(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            **TINY,
            "head_dim": 16,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        std=0.05,
    ),
}

# families semviz refuses to load (see semviz.model.load.unsupported_reason)
REFUSED = {
    # attention and output logits soft-capped
    "gemma2": Family("Gemma2Config", "Gemma2ForCausalLM", {**TINY, "head_dim": 16}),
}


def save_tiny(
    family: str,
    out: Path,
    tokenizer_dir: Path,
    *,
    std: float | None = None,
    init_norms: bool = False,
    seed: int = 1234,
) -> Path:
    """Build a tiny random ``family`` model, save it with the real tokenizer to ``out``.

    Weights are drawn at ``std`` (default: the family's), larger than the default init so
    attention is not flat; norm weights keep their default unless ``init_norms`` (a
    LayerNorm scale drawn near 0 flattens the output: GPT-2 then repeats one token).
    """
    import transformers
    from transformers import AutoTokenizer

    fam = FAMILIES.get(family) or REFUSED[family]
    std = fam.std if std is None else std
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = getattr(transformers, fam.config)(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **fam.kwargs,
    )
    model = getattr(transformers, fam.model)(cfg).eval()
    norms = set()
    if not init_norms:
        norms = {
            id(p)
            for m in model.modules()
            if "norm" in type(m).__name__.lower()
            for p in m.parameters(recurse=False)
        }
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if id(p) not in norms:
                p.normal_(0.0, std, generator=gen)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tokenizer_dir():
    """The converted default model's folder (tokenizer + config), converting it once if needed."""
    from semviz.model.load import ensure_default_converted

    return ensure_default_converted()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tokenizer_dir):
    """A saved tiny random Llama (2 layers, 4 heads, 2 KV heads) with the real tokenizer."""
    # every parameter, norms included, at std 0.08: the init the tests were first written for
    out = tmp_path_factory.mktemp("tiny-llama")
    return save_tiny("llama", out, tokenizer_dir, std=0.08, init_norms=True)


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
