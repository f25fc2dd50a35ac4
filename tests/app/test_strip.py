"""The token strip's payload: hover cards kept between draws equal cards made afresh."""

from __future__ import annotations

from types import SimpleNamespace

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
    dec = Decoder(tiny_lm, "A quiet harbour at dawn", PruneParams(temperature=0.9),
                  DecodeSettings(max_new_tokens=40, seed=5))  # fmt: skip
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
    dec = Decoder(tiny_lm, "Hello <b>there</b>", PruneParams(),
                  DecodeSettings(max_new_tokens=4, seed=1, chat=True))  # fmt: skip
    dec.run(1)
    raw = "".join(dec.trace.prompt_tokens)
    assert "<|im_start|>user\nHello <b>there</b><|im_end|>" in raw  # what the model was given
    shown = strip.payload(ctx_of(dec, {}))["prompt"]
    assert "⟨im_start⟩user\nHello <b>there</b>⟨im_end⟩" in shown
    assert "<|" not in shown and shown.count("⟨im_start⟩") == raw.count("<|im_start|>")
