"""The token strip's payload: hover cards kept between draws equal cards made afresh."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from semviz.analysis.replay import replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams
from ui import strip


class Ctx(SimpleNamespace):
    """What ``strip.payload`` reads of a page's context, over a live decoder."""

    @property
    def trace(self):
        return self.dec.trace

    @property
    def steps(self):
        return self.dec.trace.steps

    def labels(self, ids):
        return [self.dec.lm.tokenizer.decode([int(i)]) for i in ids]

    def result(self, i):
        return None if self.wi is None or i >= len(self.wi.results) else self.wi.results[i]


def ctx_of(dec, store: dict, wi=None) -> Ctx:
    first = None if wi is None else wi.first_diff
    sess = SimpleNamespace(strip_cards=store, selected=None)
    return Ctx(dec=dec, sess=sess, wi=wi, first_diff=first, selected=None)


def test_cards_kept_between_draws_equal_cards_made_afresh(tiny_lm):
    dec = Decoder(
        tiny_lm,
        "A quiet harbour at dawn",
        PruneParams(temperature=0.9),
        DecodeSettings(max_new_tokens=40, seed=5),
    )
    dec.run(6)
    store: dict = {}
    a = strip.payload(ctx_of(dec, store))
    b = strip.payload(ctx_of(dec, store))
    assert a == b and all(a["alts"][k] is b["alts"][k] for k in a["alts"])  # reused
    dec.run(4)  # the run plays on: the new steps get cards, the old ones are kept
    grown = strip.payload(ctx_of(dec, store))
    assert grown == strip.payload(ctx_of(dec, {})) and len(grown["alts"]) == 10
    assert grown["alts"]["0"] is a["alts"]["0"]

    wi = replay(dec.trace, PruneParams(top_k=1))  # the sliders moved: a what-if column
    assert wi.first_diff is not None
    moved = strip.payload(ctx_of(dec, store, wi))
    assert moved == strip.payload(ctx_of(dec, {}, wi))
    assert moved["alts"]["0"]["stages"][-1] == "what-if"
    back = strip.payload(ctx_of(dec, store))  # and back to the run's own settings
    assert back == grown and "what-if" not in back["alts"]["0"]["stages"]

    dec.rewind(3)
    dec.run(2)  # cut back and grown again: steps 3 and 4 are new records
    again = strip.payload(ctx_of(dec, store))
    assert again == strip.payload(ctx_of(dec, {})) and len(store) == 5


def test_the_prompt_shows_the_chat_templates_markers_as_tokens(tiny_lm):
    dec = Decoder(
        tiny_lm,
        "Hello <b>there</b>",
        PruneParams(),
        DecodeSettings(max_new_tokens=4, seed=1, chat=True),
    )
    dec.run(1)
    raw = "".join(dec.trace.prompt_tokens)
    assert "<|im_start|>user\nHello <b>there</b><|im_end|>" in raw  # what the model was given
    shown = "".join(text for _, text in strip.payload(ctx_of(dec, {}))["prompt"])
    assert "⟨im_start⟩user\nHello <b>there</b>⟨im_end⟩" in shown
    assert "<|" not in shown and shown.count("⟨im_start⟩") == raw.count("<|im_start|>")


def test_links_are_the_heaviest_keys_of_the_mean_over_layers_and_heads():
    # two layers, two heads, four keys at positions 0, 2, 5, 7 (a cache that dropped 1, 3, 4, 6)
    att = torch.tensor(
        [
            [[0.1, 0.2, 0.3, 0.4], [0.3, 0.2, 0.1, 0.4]],
            [[0.5, 0.0, 0.1, 0.4], [0.3, 0.0, 0.3, 0.4]],
        ],
        dtype=torch.float16,
    )
    rec = SimpleNamespace(attention=att, cache_positions=torch.tensor([0, 2, 5, 7]))
    # means over layers and heads: 0.3, 0.1, 0.2, 0.4
    got = strip.links(rec, k=3)
    assert [p for p, _ in got] == [7, 0, 5]
    assert [round(w, 3) for _, w in got] == [0.4, 0.3, 0.2]
    assert strip.links(SimpleNamespace(attention=None, cache_positions=None)) == []


def test_links_of_one_layer_and_head_or_of_a_choice():
    att = torch.tensor(
        [
            [[0.1, 0.2, 0.3, 0.4], [0.3, 0.2, 0.1, 0.4]],
            [[0.5, 0.0, 0.1, 0.4], [0.3, 0.0, 0.3, 0.4]],
        ],
        dtype=torch.float16,
    )
    rec = SimpleNamespace(attention=att, cache_positions=torch.tensor([0, 2, 5, 7]))
    # layer 1, head 0 alone: 0.5, 0.0, 0.1, 0.4
    got = strip.links(rec, k=2, layers=[1], heads=[0])
    assert [(p, round(w, 3)) for p, w in got] == [(0, 0.5), (7, 0.4)]
    # layer 0, the mean over its heads: 0.2, 0.2, 0.2, 0.4
    assert strip.links(rec, k=1, layers=[0]) == [(7, pytest.approx(0.4, abs=1e-3))]
    # head 1, the mean over layers: 0.3, 0.1, 0.2, 0.4; an index past the record is ignored
    got = strip.links(rec, k=4, heads=[1, 9])
    assert [p for p, _ in got] == [7, 0, 5, 2]
    assert strip.links(rec, k=3, layers=[9]) == strip.links(rec, k=3)
    assert strip.read_label() == "the mean over layers and heads"
    assert strip.read_label([3], [2]) == "layer 3, head 2"
    assert strip.read_label([4, 1]) == "layers 1, 4, the mean over heads"
    assert strip.read_label(heads=[0]) == "head 0, the mean over layers"


def test_the_payload_lights_by_the_chosen_layer_and_head(tiny_lm):
    dec = Decoder(
        tiny_lm, "A quiet harbour at dawn", PruneParams(), DecodeSettings(max_new_tokens=8, seed=3)
    )
    dec.run(4)
    store: dict = {}
    mean = strip.payload(ctx_of(dec, store))
    one = strip.payload(ctx_of(dec, store), layers=[1], heads=[0])
    assert one["hints"][-1][0] == "hover: the tokens it read, by attention (layer 1, head 0)"
    for rule, s in zip(one["attn_css"].split("\n"), dec.trace.steps, strict=True):
        want = strip.links(s, layers=[1], heads=[0])
        top = want[0][1]
        decls = ";".join(f"--a{p}:{w / top:.3f}" for p, w in want)
        assert rule == f".semviz-strip:has(.p{s.position}:hover){{{decls}}}"
    assert one["attn_css"] != mean["attn_css"]
    # the cards, kept between draws, still hold the mean: drawing it again gives the same
    assert strip.payload(ctx_of(dec, store))["attn_css"] == mean["attn_css"]


def test_attention_css_lights_each_read_token_by_its_weight_over_the_heaviest():
    read = [
        (12, [(7, 0.4), (0, 0.3), (5, 0.1), (3, 0.0)]),
        (13, []),  # a step without attention: no rule
        (14, [(12, 0.25)]),
    ]
    assert strip.attention_css(read) == (
        ".semviz-strip:has(.p12:hover){--a7:1.000;--a0:0.750;--a5:0.250}\n"
        ".semviz-strip:has(.p14:hover){--a12:1.000}"
    )
    assert strip.attention_css([]) == ""


def test_the_payload_carries_a_rule_per_token_bounded_by_the_links(tiny_lm):
    dec = Decoder(
        tiny_lm, "A quiet harbour at dawn", PruneParams(), DecodeSettings(max_new_tokens=8, seed=3)
    )
    dec.run(5)
    d = strip.payload(ctx_of(dec, {}))
    rules = d["attn_css"].split("\n")
    steps = dec.trace.steps
    assert [t[3] for t in d["tokens"]] == [s.position for s in steps]
    assert [p for p, _ in d["prompt"]] == list(range(len(dec.trace.prompt_tokens)))
    assert len(rules) == len(steps) and all(t[4] for t in d["tokens"])
    assert d["hints"][-1][0] == "hover: the tokens it read, by attention"
    for rule, s in zip(rules, steps, strict=True):
        want = strip.links(s)
        top = want[0][1]
        decls = ";".join(f"--a{p}:{w / top:.3f}" for p, w in want)
        assert rule == f".semviz-strip:has(.p{s.position}:hover){{{decls}}}"
        assert len(want) == min(strip.LINKS, s.cache_positions.numel())


def test_a_card_names_each_filter_stage_and_what_it_removed(tiny_lm):
    dec = Decoder(
        tiny_lm,
        "A quiet harbour at dawn",
        PruneParams(top_k=20, top_p=0.5),
        DecodeSettings(max_new_tokens=4, seed=5),
    )
    dec.run(2)
    card = strip.payload(ctx_of(dec, {}))["alts"]["0"]
    w = dec.trace.steps[0].waterfall
    assert [x["name"] for x in w] == ["top_k", "top_p"]
    assert card["filters"] == (
        f"top_k → {w[0]['n_kept']:,} left, −{100 * w[0]['mass_removed']:.1f}% · "
        f"top_p → {w[1]['n_kept']:,} left, −{100 * w[1]['mass_removed']:.1f}%"
    )
    assert w[0]["n_kept"] == 20 and w[1]["n_kept"] <= 20
    # under a what-if, the card's filters are the replay's
    wi = replay(dec.trace, PruneParams(top_k=3))
    moved = strip.payload(ctx_of(dec, {}, wi))["alts"]["0"]
    assert moved["filters"].startswith("top_k → 3 left, −")
    plain = Decoder(
        tiny_lm, "A quiet harbour at dawn", PruneParams(), DecodeSettings(max_new_tokens=2, seed=5)
    )
    plain.run(1)
    assert strip.payload(ctx_of(plain, {}))["alts"]["0"]["filters"] == "no filter on"


def test_a_piece_of_a_character_shows_its_bytes_not_the_replacement_character(tiny_lm):
    # "☀☆" is six byte-level tokens, none a character alone; the strip, the ghost lane and
    # every label show each as its byte, as the tables and the CLI do
    from semviz.output import style
    from ui.page import token_texts

    tok = tiny_lm.tokenizer
    ids = tok("☀☆", add_special_tokens=False)["input_ids"]
    pieces = ["<E2>", "<98>", "<80>", "<E2>", "<98>", "<86>"]
    assert [tok.decode([i]) for i in ids] == ["\ufffd"] * 6  # what a decode alone gives
    dec = Decoder(tiny_lm, "Sun: ☀☆", PruneParams(), DecodeSettings(max_new_tokens=8, seed=1))
    for i in ids:
        dec.step(force_token=i)
    payload = strip.payload(ctx_of(dec, {}))
    assert [t[1] for t in payload["tokens"]] == pieces
    prompt = "".join(text for _, text in payload["prompt"])
    assert "Sun:·" not in prompt and "Sun: " + "".join(pieces) in prompt
    assert "\ufffd" not in prompt
    assert token_texts(tok, tuple(ids)) == pieces
    assert [style.piece_text(s.token_text, s.token_hex) for s in dec.trace.steps] == pieces
    assert dec.trace.text == "☀☆"  # the run's text joins the bytes into characters
    # Presenter's text before a step: a character cut at the step shows its bytes so far
    before = [style.piece_text("", dec.trace.bytes_upto(n)) for n in (0, 2, 3, 6)]
    assert before == ["", "<E2 98>", "☀", "☀☆"]
