"""What one step's gravity reads: the tokens so far, their roles, what the forward saw.

A :class:`GravityContext` is built by each caller from what it holds (the decoder from its
cache and its hidden states, the ``generate`` processor from ``input_ids`` and its sinks,
replay from a recorded step through :func:`trace_context`), and every gravity kind reads
only it, so the three compute the same ``G``.

The roles of the prompt's positions come from :func:`prompt_roles`: special and chat-template
tokens are ``TEMPLATE``, the system prompt ``SYSTEM``, the user's text ``USER``; positions
after the prompt are ``GENERATED``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "GENERATED",
    "SYSTEM",
    "TEMPLATE",
    "USER",
    "GravityContext",
    "model_special_ids",
    "positions_of",
    "prompt_roles",
    "trace_context",
]

# roles of the prompt's positions (prompt_roles); positions after the prompt are generated
TEMPLATE, SYSTEM, USER, GENERATED = 0, 1, 2, 3

_MARKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PH = "\x00semviz\x00"


def _chat_markers(tokenizer: Any) -> tuple[list[int], list[int]] | None:
    """Token ids of the chat template's user header and of what follows the user's text.

    Found by rendering the template around a placeholder with two different system
    prompts: the longest common tail before the placeholder is the user header (the
    system's text differs, the markup after it does not). None without a usable template.
    """
    try:
        hit = _MARKERS.get(tokenizer)
    except TypeError:
        hit = None
    if hit is not None:
        return hit or None
    found: tuple = ()
    try:
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "system", "content": s}, {"role": "user", "content": _PH}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for s in ("A", "B")
        ]
        (pre_a, post), (pre_b, _) = (t.split(_PH, 1) for t in texts)
        n = 0
        while n < min(len(pre_a), len(pre_b)) and pre_a[-1 - n] == pre_b[-1 - n]:
            n += 1
        header = pre_a[len(pre_a) - n :]
        enc = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in (header, post)]
        if enc[0] and enc[1]:
            found = (list(enc[0]), list(enc[1]))
    except Exception:  # no template, or one that refuses a system turn: plain prompts only
        found = ()
    try:
        _MARKERS[tokenizer] = found
    except TypeError:
        pass
    return found or None


def _find(seq: list[int], sub: list[int], start: int = 0, last: bool = False) -> int:
    hits = [i for i in range(start, len(seq) - len(sub) + 1) if seq[i : i + len(sub)] == sub]
    return (hits[-1] if last else hits[0]) if hits else -1


def prompt_roles(
    tokenizer: Any | None, ids: Sequence[int] | Tensor, special_ids: Sequence[int] = ()
) -> Tensor:
    """The role of each prompt position: ``TEMPLATE``, ``SYSTEM`` or ``USER``. ``(N,)`` int8

    Special tokens are ``TEMPLATE``. When ``ids`` hold a chat-template rendering, the user's
    last turn (between the template's user header and what follows the user's text) is
    ``USER``, the rest of the markup ``TEMPLATE``, and any other text before it (the system
    prompt) ``SYSTEM``. Otherwise every non-special token is ``USER``. Without a tokenizer
    only ``special_ids`` are recognised.

    Examples
    --------
    >>> prompt_roles(None, [1, 5, 6, 2], special_ids=[1, 2]).tolist()
    [0, 2, 2, 0]
    """
    seq = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    special = set(special_ids)
    if tokenizer is not None:
        special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    roles = [TEMPLATE if i in special else USER for i in seq]
    markers = _chat_markers(tokenizer) if tokenizer is not None else None
    if markers is not None:
        head, foot = markers
        h = _find(seq, head, last=True)
        if h >= 0:
            start = h + len(head)
            f = _find(seq, foot, start)
            end = f if f >= 0 else len(seq)
            for j in range(len(seq)):
                if not start <= j < end:
                    roles[j] = SYSTEM if j < h and roles[j] != TEMPLATE else TEMPLATE
    return torch.tensor(roles, dtype=torch.int8)


def model_special_ids(model: Any) -> list[int]:
    """bos/eos/pad ids from a model's configs (what is known without a tokenizer)."""
    out: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = getattr(cfg, name, None) if cfg is not None else None
            for i in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(i, int):
                    out.add(i)
    return sorted(out)


@dataclass
class GravityContext:
    """What one step's gravity reads. Positions are absolute: 0 is the first prompt token.

    Attributes
    ----------
    ids : (T,) every token so far, prompt then generated; the last one was just fed.
    positions : (S,) sorted positions the step's query read (the KV cache after eviction);
        None means all ``T``.
    roles : (P,) :func:`prompt_roles` of the prompt; positions ``>= P`` are generated.
        None: the first ``n_prompt`` positions are all ``USER``.
    n_prompt : the prompt length when ``roles`` is None (None: every position is prompt).
    attention : (L, H, S) last-query attention on ``positions``, for mass attention / ema.
    hidden : (T, d) final normed hidden states by position, for the hidden spaces.
    ema : what the mass source carried out of the previous step: for mass ``ema`` the
        attention EMA by position (T',); None at the first step.
    """

    ids: Tensor
    positions: Tensor | None = None
    roles: Tensor | None = None
    n_prompt: int | None = None
    attention: Tensor | None = None
    hidden: Tensor | None = None
    ema: Tensor | None = None


def positions_of(ctx: GravityContext) -> Tensor:
    """The positions ``ctx``'s step read, ``(S,)`` long: its ``positions``, else all ``T``."""
    if ctx.positions is None:
        return torch.arange(int(ctx.ids.numel()))
    return ctx.positions.long().flatten()


def trace_context(
    trace: Any, i: int, *, hidden: Tensor | None = None, ema: Tensor | None = None
) -> GravityContext:
    """The :class:`GravityContext` of step ``i`` of a recorded trace (``semviz.output.trace.Trace``)."""
    rec = trace.steps[i]
    ids = torch.tensor(trace.prompt_ids + [s.token_id for s in trace.steps[:i]], dtype=torch.long)
    roles = (getattr(trace, "extra", None) or {}).get("prompt_roles")
    att = rec.attention.float() if rec.attention is not None else None
    pos = rec.cache_positions.long() if rec.cache_positions is not None else None
    return GravityContext(
        ids=ids,
        positions=pos,
        roles=None if roles is None else torch.as_tensor(roles, dtype=torch.int8),
        n_prompt=len(trace.prompt_ids),
        attention=att,
        hidden=None if hidden is None else hidden[: ids.numel()],
        ema=ema,
    )
