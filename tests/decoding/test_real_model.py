"""On the real default model: the decoder is generate(), token for token, logit for logit."""

from __future__ import annotations

import pytest
import torch

import semviz
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams

pytestmark = pytest.mark.real_model

PROMPT = "Explain in two sentences why the sky is blue."


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_decoder_equals_generate(real_lm_f32, real_lm_bf16, dtype):
    lm = real_lm_f32 if dtype == "float32" else real_lm_bf16
    d = Decoder(lm, PROMPT, PruneParams(temperature=0.0), DecodeSettings(max_new_tokens=32))
    d.eos_ids = set()  # compare all 32 tokens, like min_new_tokens below
    d.run(32)
    ids = torch.tensor([d.prompt_ids])
    with torch.inference_mode():
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=32,
            min_new_tokens=32,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=lm.tokenizer.pad_token_id,
        )
    assert d.trace.token_ids == out.sequences[0, ids.shape[1] :].tolist()
    for rec, scores in zip(d.trace.steps, out.logits, strict=True):
        ref = scores[0].float()[rec.cand_ids.long()]
        assert torch.allclose(rec.cand_logits, ref, atol=1e-4, rtol=0)


def test_default_model_facts(real_lm):
    s = real_lm.summary()
    assert (s["num_layers"], s["num_heads"], s["num_kv_heads"]) == (30, 9, 3)
    assert (s["hidden_size"], s["vocab_size"]) == (576, 49152)
    assert real_lm.is_chat and real_lm.model.config._attn_implementation == "semviz_sdpa"


def test_unknown_names_get_one_sentence(tmp_path):
    for name, msg in [
        ("no-such-org/no-such-model", "Could not load model 'no-such-org/no-such-model'"),
        (str(tmp_path / "x.gguf"), "no such .gguf file"),
        (str(tmp_path), "has no config.json"),
        ("not a model!", "not a local directory, a .gguf file or a valid Hugging Face id"),
    ]:
        with pytest.raises(semviz.ModelLoadError) as e:
            semviz.load_model(name)
        text = str(e.value)
        assert msg in text and "\n" not in text


def test_trust_remote_code_is_off_by_default(monkeypatch, tmp_path):
    seen = {}
    import transformers

    def fake(path, **kw):
        seen.update(kw)
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(semviz.ModelLoadError):
        semviz.load_model(str(tmp_path))
    assert seen["trust_remote_code"] is False


@pytest.mark.parametrize(
    "params",
    [
        PruneParams(temperature=0.8),
        PruneParams(temperature=0.9, top_p=0.95, min_p=0.01),
        PruneParams(
            temperature=1.0,
            top_p=0.9,
            gravity_lambda=0.5,
            gravity_mass="idf",
            gravity_mode="rerank",
        ),
    ],
)
def test_replay_at_the_recorded_settings_changes_nothing(real_lm, params):
    from semviz.analysis.replay import replay

    d = Decoder(
        lm := real_lm,
        "Write one sentence about the sea.",
        params,
        DecodeSettings(max_new_tokens=48, seed=3),
    )
    d.run(48)
    r = replay(d.trace, params, model=lm.model)
    assert r.token_ids == d.trace.token_ids and r.first_diff is None
