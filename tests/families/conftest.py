"""One tiny random model per family, each saved with the real tokenizer and loaded through
``semviz.load_model``: tests that take ``family_lm`` run once per family."""

from __future__ import annotations

import pytest

from tests.conftest import FAMILIES, save_tiny

# what sets the families apart, for the tests that expect a refusal
ROPE = ("llama", "qwen2", "gemma", "gemma3")  # rotary position embeddings
REROTATABLE = ("llama", "qwen2", "gemma")  # one set of RoPE frequencies over every dimension
SLIDING = {"gemma3": 8}  # sliding-window layers and their window


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def family_dir(family, tmp_path_factory, tokenizer_dir):
    """The family's tiny model, saved with the real tokenizer."""
    return save_tiny(family, tmp_path_factory.mktemp(f"tiny-{family}"), tokenizer_dir)


@pytest.fixture(scope="session")
def family_lm(family_dir):
    """The family's model through ``semviz.load_model`` (local-directory path), float32."""
    import semviz

    return semviz.load_model(str(family_dir), dtype="float32", device="cpu")
