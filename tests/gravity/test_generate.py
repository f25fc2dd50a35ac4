"""Gravity inside a batched, left-padded model.generate() equals the decoder's, row by row."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from semviz import processors as sp
from semviz.decoding.decoder import Decoder, DecodeSettings, encode_prompt
from semviz.sampling import PruneParams

PROMPTS = (
    "Write a story about a beekeeper.",
    "Describe a night market in a mountain town, full of lanterns, smoke and music.",
)
STEPS = 4


class _Spy(LogitsProcessor):
    """Keeps what the gravity processor computed at each step."""

    def __init__(self, proc: sp.NarrativeGravityLogitsProcessor) -> None:
        self.proc, self.g = proc, []

    def __call__(self, input_ids, scores):
        self.g.append(self.proc.last_gravity.clone())
        return scores


def _generate(lm, params):
    tok = lm.tokenizer
    encs = [encode_prompt(lm, p, chat=True) for p in PROMPTS]
    n = max(map(len, encs))
    ids = torch.tensor([[tok.pad_token_id] * (n - len(e)) + e for e in encs])  # left padding
    mask = torch.tensor([[0] * (n - len(e)) + [1] * len(e) for e in encs])
    with sp.capture_attention(lm.model) as sink, sp.capture_hidden(lm.model) as hs:
        proc = sp.NarrativeGravityLogitsProcessor.from_params(
            lm, params, attention_sink=sink, hidden_sink=hs
        )
        spy = _Spy(proc)
        torch.manual_seed(0)
        out = lm.model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            logits_processor=LogitsProcessorList([proc, spy]),
            pad_token_id=tok.pad_token_id,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
        )
    return out[:, n:], spy.g


@pytest.mark.parametrize(
    "kind, mass, space, tol",
    [
        ("pull", "idf", "embedding", 1e-6),  # nothing from the forward: exact
        ("pull", "uniform", "embedding", 1e-6),
        ("pull", "attention", "embedding", 1e-3),  # padded batch attention: float noise only
        ("pull", "ema", "embedding", 1e-3),
        ("pull", "info", "hidden", 1e-3),  # the info prior's own forward stays out of the sink
        ("contrast", "info", "embedding", 1e-3),  # the default: a batched short forward
    ],
)
def test_each_row_equals_the_decoder(tiny_lm, kind, mass, space, tol):
    p = PruneParams(
        temperature=1.0,
        gravity_lambda=1.0,
        gravity_kind=kind,
        gravity_mass=mass,
        gravity_space=space,
    )
    new, gs = _generate(tiny_lm, p)
    assert len(gs) == STEPS
    for b, prompt in enumerate(PROMPTS):
        d = Decoder(tiny_lm, prompt, p, DecodeSettings(max_new_tokens=STEPS, chat=True))
        for i in range(STEPS):
            rec = d.step(force_token=int(new[b, i]))
            got = gs[i][b][rec.cand_ids.long()]
            torch.testing.assert_close(got, rec.gravity, atol=tol, rtol=0)


def test_a_new_generate_starts_fresh_rows(tiny_lm):
    """Row state (padding, roles, EMA) belongs to one generate call."""
    p = PruneParams(temperature=1.0, gravity_lambda=1.0, gravity_kind="pull", gravity_mass="idf")
    proc = sp.NarrativeGravityLogitsProcessor.from_params(tiny_lm, p)
    a = torch.tensor([encode_prompt(tiny_lm, PROMPTS[0])])
    b = torch.tensor([encode_prompt(tiny_lm, PROMPTS[1])])
    ga = proc.gravity(a)
    proc.gravity(b)
    torch.testing.assert_close(proc.gravity(a), ga, atol=0, rtol=0)
    assert proc._rows[0].pad == 0 and proc._rows[0].roles.numel() == a.shape[1]
