import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="session")
def tiny_llama() -> LlamaForCausalLM:
    """A tiny random Llama (vocab 256) for processor-in-generate tests."""
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
def peaked_llama() -> LlamaForCausalLM:
    """A tiny random Llama (vocab 256) whose next-token distributions are peaked (entropy
    about 2 nats rather than ln 256), so every filter cuts something inside generate."""
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
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))
    return model
