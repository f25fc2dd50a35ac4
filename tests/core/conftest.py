import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def _tiny_llama() -> LlamaForCausalLM:
    """A tiny random Llama with a vocabulary of 256 (default init: near-flat logits)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_llama() -> LlamaForCausalLM:
    """A tiny random Llama (vocab 256) for processor-in-generate tests."""
    return _tiny_llama()


@pytest.fixture(scope="session")
def peaked_llama() -> LlamaForCausalLM:
    """The tiny Llama with a larger LM head, so its next-token distributions are peaked
    (entropy about 2 nats rather than ln 256) and every filter cuts something."""
    model = _tiny_llama()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))
    return model
