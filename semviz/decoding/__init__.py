"""The decoder: prefill, then one recorded token per ``step()`` (``decoder``); several
decoders as rows of one batch (``together``).
"""

from semviz.decoding.decoder import (
    RECORD_K,
    Decoder,
    DecodeSettings,
    PromptError,
    encode_prompt,
    top_candidates,
)
from semviz.decoding.together import feed_together, step_together

__all__ = [
    "RECORD_K",
    "DecodeSettings",
    "Decoder",
    "PromptError",
    "encode_prompt",
    "feed_together",
    "step_together",
    "top_candidates",
]
