"""The logit lens, direct logit attribution and the attention metrics, on every family.

Each test decodes a few greedy steps with the lens on and checks the record against the
model's own forward: the lens's last row is the model's log-probabilities, the attribution's
terms sum to the logit, and the record survives the trace file.
"""

from __future__ import annotations

import math

import pytest
import torch

from semviz import Decoder, DecodeSettings, PruneParams, Trace, logit_lens
from semviz.analysis import lens
from semviz.model.capture import AttentionSink, attention_metrics, enable_capture, lens_hooks
from semviz.output.trace import ATTENTION_METRICS, TraceError

PROMPT = "The capital of France is"


def _decode(lm, steps: int = 3, **settings) -> Decoder:
    d = Decoder(
        lm,
        PROMPT,
        PruneParams(temperature=0),
        DecodeSettings(chat=False, max_new_tokens=steps, **settings),
    )
    d.eos_ids = set()
    for _ in range(steps):
        d.step()
    return d


@pytest.fixture(scope="module")
def run(family_lm) -> Decoder:
    return _decode(family_lm)


def _reference(lm, ids: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The model's own last-position logits (V,) and hidden states for ``ids``."""
    with torch.inference_mode():
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0, -1].float(), out.hidden_states


def test_last_layer_of_the_lens_is_the_models_distribution(family_lm, run):
    n_layers = family_lm.summary()["num_layers"]
    for rec in run.trace.steps:
        logits, _ = _reference(family_lm, run.ids[: rec.position])
        lp = logit_lens(family_lm, rec)
        assert lp.shape == (n_layers + 1, logits.shape[-1])
        assert lp.dtype == torch.float32
        torch.testing.assert_close(lp[-1], torch.log_softmax(logits, -1), atol=1e-4, rtol=0)


def test_recorded_residual_rows_are_the_models_hidden_states(family_lm, run):
    """Rows 0..L-1 are what transformers reports as hidden states (embedding output, then
    each block's output; its last entry is after the final norm, so it is left out)."""
    rec = run.trace.steps[-1]
    _, hidden = _reference(family_lm, run.ids[: rec.position])
    want = torch.stack([h[0, -1].float() for h in hidden[:-1]])  # (L, d)
    got = rec.residual[:-1].float()
    assert rec.residual.dtype == torch.float16
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_the_capture_holds_a_copy_of_the_last_position_only(family_lm):
    """During a prefill, each residual row and head output the sink holds is its own copy of
    one position: a view would keep that layer's whole (1, T, ...) activation alive until
    the forward ends."""
    ids = torch.tensor([family_lm.tokenizer(PROMPT * 4).input_ids])  # (1, T)
    sink = AttentionSink(lens=True)
    enable_capture(family_lm.model)
    with torch.inference_mode(), lens_hooks(family_lm.model):
        family_lm.model.get_decoder()(input_ids=ids, semviz_sink=sink)
    held = [*sink.residual.values(), *sink.heads.values()]
    assert len(sink.residual) == family_lm.summary()["num_layers"] + 1
    assert len(sink.heads) == family_lm.summary()["num_layers"]
    assert ids.shape[1] > 16
    assert [t.untyped_storage().nbytes() for t in held] == [4 * t.numel() for t in held]


def test_direct_logit_attribution_sums_to_the_logit(family_lm, run):
    for rec in run.trace.steps:
        logits, _ = _reference(family_lm, run.ids[: rec.position])
        ba = lens.block_attribution(family_lm, rec)
        up = lens.runner_up(rec)
        assert ba.token_ids.tolist() == [rec.token_id, up] and up != rec.token_id
        n_layers = rec.residual.shape[0] - 1
        assert ba.attn.shape == ba.mlp.shape == (2, n_layers)
        torch.testing.assert_close(
            torch.from_numpy(ba.logit), logits[[rec.token_id, up]], atol=1e-3, rtol=0
        )
        assert abs(ba.total() - ba.logit).max() < 1e-3
        for layer in (0, n_layers - 1):
            ha = lens.head_attribution(family_lm, rec, layer)
            assert ha.heads.shape == (2, rec.head_out.shape[1])
            assert abs(ha.total() - ba.attn[:, layer]).max() < 1e-3


def test_block_tokens_read_the_same_terms(family_lm, run):
    """The token a block promoted most gets exactly that block's term in the attribution."""
    rec = run.trace.steps[0]
    bt = lens.block_tokens(family_lm, rec, k=4)
    n_layers = rec.residual.shape[0] - 1
    assert bt.names[:3] == ["embedding", "attn 0", "mlp 0"] and len(bt.names) == 1 + 2 * n_layers
    assert bt.promoted.shape == bt.suppressed.shape == (1 + 2 * n_layers, 4)
    assert (bt.promoted_by[:, :-1] >= bt.promoted_by[:, 1:]).all()
    top = int(bt.promoted[2, 0])  # what mlp 0 pushed up most
    ba = lens.block_attribution(family_lm, rec, [top])
    assert ba.mlp[0, 0] == pytest.approx(float(bt.promoted_by[2, 0]), abs=1e-3)


def test_lens_grid_matches_the_steps_and_is_cached(family_lm, run):
    steps = run.trace.steps
    lens.clear_cache()
    grid = lens.lens_grid(family_lm, steps)
    n_rows = steps[0].residual.shape[0]
    assert grid.top_id.shape == grid.top_prob.shape == (n_rows, len(steps))
    assert grid.steps.tolist() == [s.index for s in steps]
    for j, rec in enumerate(steps):
        lp = logit_lens(family_lm, rec)
        assert grid.top_id[:, j].tolist() == lp.argmax(-1).tolist()
        # greedy: the last layer's top token is the one chosen
        assert grid.top_id[-1, j] == rec.token_id and grid.chosen_rank[-1, j] == 1
        assert grid.top_prob[:, j] == pytest.approx(lp.max(-1).values.exp().numpy(), abs=1e-5)
    assert lens.lens_step(family_lm, steps[0]) is lens.lens_step(family_lm, steps[0])
    again = lens.lens_grid(family_lm, steps)
    assert (again.top_id == grid.top_id).all()


def test_a_steps_summary_is_read_from_its_lens_rows(family_lm, run):
    """Every field of ``lens_step`` against the full log-probabilities of ``logit_lens``:
    the entropy (once always 0 by a misplaced clamp) and KL from the last row included."""
    lens.clear_cache()
    for rec in run.trace.steps:
        s = lens.lens_step(family_lm, rec, k=3)
        lp = logit_lens(family_lm, rec).double()
        p = lp.exp()
        top = lp.topk(3, -1)
        assert s.top_ids.tolist() == top.indices.tolist()
        assert s.top_probs == pytest.approx(top.values.exp().numpy(), abs=1e-5)
        chosen = lp[:, rec.token_id]
        assert s.chosen_rank.tolist() == ((lp > chosen[:, None]).sum(-1) + 1).tolist()
        assert s.chosen_prob == pytest.approx(chosen.exp().numpy(), abs=1e-6)
        entropy = -(p * lp).sum(-1)
        assert s.entropy == pytest.approx(entropy.numpy(), abs=1e-3)
        assert (s.entropy > 0).all()
        kl = (p[-1] * (lp[-1] - lp)).sum(-1)
        assert s.kl == pytest.approx(kl.numpy(), abs=1e-3)


def test_lens_survives_the_trace_file(family_lm, run):
    loaded = Trace.from_json(run.trace.to_json())
    for live, back in zip(run.trace.steps, loaded.steps, strict=True):
        assert back == live
        assert back.residual.dtype == torch.float16 and back.residual_last.dtype == torch.float32
        assert torch.equal(logit_lens(family_lm, back), logit_lens(family_lm, live))
    ba = lens.block_attribution(family_lm, loaded.steps[-1])
    assert abs(ba.total() - ba.logit).max() < 1e-3


def test_attention_metrics_are_the_captured_attentions(family_lm, run):
    """The recorded entropy and varentropy are those of the recorded attention rows."""
    rec = run.trace.steps[-1]
    m = rec.attn_metrics
    assert tuple(m) == ATTENTION_METRICS
    p = rec.attention.double()  # (L, H, S), float16 on record
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    ent = -(p * logp).sum(-1)
    torch.testing.assert_close(m["entropy"].double(), ent, atol=5e-3, rtol=0)
    assert (m["varentropy"] >= 0).all() and (m["interaction"] >= 0).all()


def test_lens_off_records_nothing_and_says_so(family_lm):
    d = _decode(family_lm, 1, lens=False)
    rec = d.trace.steps[0]
    assert rec.residual is rec.head_out is rec.attn_metrics is None
    with pytest.raises(lens.LensError, match=r"^step 0 has no lens record: it was decoded"):
        logit_lens(family_lm, rec)


# -- no model needed ------------------------------------------------------------------------


def test_attention_metrics_on_a_hand_made_row():
    """Two heads over three keys: entropy, varentropy, agreement, interaction by hand."""
    a = torch.tensor([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]]).view(1, 1, 2, 3)  # (L, B, H, S)
    m = attention_metrics(a, torch.tensor([[[0.7, 1.3]]]), torch.tensor([[3]]))
    assert m.shape == (4, 1, 1, 2)
    h = 1.5 * math.log(2)  # -(.5 ln .5 + 2 · .25 ln .25)
    v = 0.5 * (math.log(0.5) + h) ** 2 + 2 * 0.25 * (math.log(0.25) + h) ** 2
    assert m[0, 0, 0].tolist() == pytest.approx([h, 0.0], abs=1e-6)
    assert m[1, 0, 0].tolist() == pytest.approx([v, 0.0], abs=1e-6)
    # the mean row is (.75, .125, .125): each head is .25 + .125 + .125 = .5 from it, over 3
    assert m[2, 0, 0].tolist() == pytest.approx([0.5 / 3, 0.5 / 3], abs=1e-6)
    assert m[3, 0, 0].tolist() == pytest.approx([0.7, 1.3])


def test_the_loader_refuses_lens_fields_that_disagree(family_lm, run):
    d = run.trace.to_dict()
    step = d["steps"][0]
    bad = {**d, "steps": [{**step, "residual_last": None}]}
    with pytest.raises(TraceError, match="comes with residual: both or neither"):
        Trace.from_dict(bad)
    v1 = {**d, "version": 1}
    with pytest.raises(TraceError, match="a version 1 trace has no lens fields"):
        Trace.from_dict(v1)


# -- the real model ---------------------------------------------------------------------------


@pytest.mark.real_model
def test_the_capital_rises_from_the_embedding_to_the_top(real_lm):
    """SmolLM2 knows the capital of France: ' Paris' is far down at the embedding, first at
    the last layer, and the direct terms still sum to its logit."""
    d = _decode(real_lm, 1)
    rec = d.trace.steps[0]
    assert rec.token_text == " Paris"
    s = lens.lens_step(real_lm, rec)
    assert s.layers == 31
    assert s.chosen_rank[0] > 100 and s.chosen_rank[-1] == 1
    assert s.chosen_rank[len(s.chosen_rank) // 2] > 100  # still undecided halfway up
    assert s.decided is not None and s.decided >= 25
    assert s.kl[-1] == pytest.approx(0.0, abs=1e-6) and s.kl[0] > 1.0
    ba = lens.block_attribution(real_lm, rec)
    assert abs(ba.total() - ba.logit).max() < 1e-3


def test_rows_fed_together_record_the_lens_they_record_alone(tiny_lm):
    """Decoders fed as rows of one padded forward record each their own residual, head
    outputs and attention metrics, as they do alone."""
    from semviz.decoding.together import feed_together

    prompts = ["The sea", "Once upon a time there was a lighthouse keeper who", "Water boils at"]

    def make() -> list[Decoder]:
        return [
            Decoder(tiny_lm, p, PruneParams(temperature=0.9), DecodeSettings(seed=i, chat=False))
            for i, p in enumerate(prompts)
        ]

    alone, together = make(), make()
    for d in [*alone, *together]:
        d.step()  # the prefill
    for _ in range(3):
        assert feed_together(together) == len(prompts)
        for a, b in zip(alone, together, strict=True):
            a.step()
            b.step()
            ra, rb = a.trace.steps[-1], b.trace.steps[-1]
            assert rb.token_id == ra.token_id
            torch.testing.assert_close(rb.residual_last, ra.residual_last, atol=1e-4, rtol=0)
            torch.testing.assert_close(rb.residual.float(), ra.residual.float(), atol=2e-3, rtol=0)
            torch.testing.assert_close(rb.head_out.float(), ra.head_out.float(), atol=2e-3, rtol=0)
            for name in ATTENTION_METRICS:
                torch.testing.assert_close(
                    rb.attn_metrics[name], ra.attn_metrics[name], atol=1e-4, rtol=1e-4
                )
