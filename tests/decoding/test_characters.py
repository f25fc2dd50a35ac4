"""Every character shown: a trace's text is the tokenizer's decode of its ids, and a token
that is a piece of a character shows as its bytes, on the real default model's tokenizer."""

from __future__ import annotations

import json
import re

import pytest

from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output import report, style
from semviz.output.trace import Trace
from semviz.sampling import PruneParams

pytestmark = pytest.mark.real_model

PROMPTS = [
    "日本の首都はどこですか？日本語で答えてください。",  # a Japanese reply
    "Say café 😀 日本語 naïve",
    "Écris une phrase sur la mer, avec des accents : é, è, à, ç.",
]


@pytest.fixture(scope="module")
def traces(real_lm, tmp_path_factory):
    out = []
    for prompt in PROMPTS:
        dec = Decoder(
            real_lm,
            prompt,
            PruneParams(temperature=0.0),
            DecodeSettings(max_new_tokens=24, capture=False),
        )
        dec.run(24)
        path = tmp_path_factory.mktemp("t") / "t.json"
        dec.trace.save(path)
        out.append((Trace.load(path), dec))
    return out


def test_text_is_the_tokenizers_decode_of_the_ids(traces, real_lm):
    tok = real_lm.tokenizer
    pieces = 0
    for t, dec in traces:
        assert t.text == tok.decode(t.token_ids)
        assert t.prompt_text == tok.decode(dec.prompt_ids)
        assert "\ufffd" not in t.prompt_text + t.text[:-1]  # the run may stop mid-character
        for s in t.steps:
            shown = style.step_token(s)
            assert "\ufffd" not in shown
            if s.token_hex is not None:
                pieces += 1
                assert "<" in shown and shown == style.display_token("", s.token_hex)
    assert pieces > 0  # the Japanese reply and the emoji are split over tokens


def test_a_piece_of_a_character_shows_as_its_bytes(real_lm):
    tok = real_lm.tokenizer
    ids = tok("Say café 😀 日本語 naïve")["input_ids"]
    from semviz.decoding.decoder import token_hex

    shown = [style.display_token(tok.decode([i]), token_hex(tok, i)) for i in ids]
    assert shown == [
        "Say",
        "·café",
        "·<F0 9F 98>",
        "<80>",
        "·<E6>",
        "<97>",
        "<A5>",
        "本",
        "<E8>",
        "<AA>",
        "<9E>",
        "·na",
        "ïve",
    ]


def test_report_html_and_cli_show_no_replacement_character(traces, real_lm, tmp_path, capsys):
    from semviz.cli import main

    for n, (t, _) in enumerate(traces):
        rep = report.build(t, tmp_path / f"r{n}", tokenizer=real_lm.tokenizer, png=False)
        html = (tmp_path / f"r{n}" / "report.html").read_text(encoding="utf-8")
        text = "".join(re.findall(r'<span class="(?:tok|prompt)"[^>]*>([^<]*)</span>', html))
        assert len(text) > 40 and "\ufffd" not in text, rep
        assert t.text[:8] in text
        path = tmp_path / f"t{n}.json"
        t.save(path)
        assert main(["replay", str(path), "--temperature", "1.0", "--json"]) == 0
        out = capsys.readouterr().out
        rows = json.loads(out)["rows"]
        assert all("\ufffd" not in r["recorded_token"] + r["token"] for r in rows)
