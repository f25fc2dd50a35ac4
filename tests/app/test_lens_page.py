"""Inside the choice: the lens page on the tiny model draws what semviz.analysis.lens computes."""

from __future__ import annotations

import json
import re

from semviz.analysis import lens

PAGE = "app_pages/lens.py"


def _figures(at) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def test_the_page_draws_the_lens_of_the_selected_step(generated):
    at = generated
    at.switch_page(PAGE).run()
    assert not at.exception and not [e.value for e in at.error]
    sess = at.session_state["semviz"]
    steps = sess.trace.steps
    rec = steps[-1]
    lm = sess.decoder.lm
    figs = _figures(at)
    # the layers, the grid, the blocks, the heads, the metrics, the quadrant
    assert len(figs) == 6
    want = lens.lens_step(lm, rec)
    assert figs[0]["data"][0]["y"] == want.chosen_rank.tolist()
    grid = figs[1]["data"][0]
    n_rows = lm.summary()["num_layers"] + 1
    assert len(grid["z"]) == n_rows and all(len(row) == len(steps) for row in grid["z"])
    assert grid["x"] == list(range(len(steps)))
    ba = lens.block_attribution(lm, rec)
    assert [round(v, 5) for v in figs[2]["data"][0]["y"]] == [
        round(float(v), 5) for v in ba.attn[0]
    ]
    assert any("how" in h.value and "rose through the layers" in h.value for h in at.subheader)


def test_the_page_follows_the_selected_step(generated):
    at = generated
    at.session_state["semviz"].selected = 2
    at.switch_page(PAGE).run()
    assert not at.exception
    sess = at.session_state["semviz"]
    want = lens.lens_step(sess.decoder.lm, sess.trace.steps[2])
    figs = _figures(at)
    assert figs[0]["data"][0]["y"] == want.chosen_rank.tolist()
    assert len(figs[1]["data"][0]["z"][0]) == 3  # the grid ends at the selected step
    assert any(h.value.startswith("Step 2:") for h in at.subheader)


def test_the_token_in_the_headings_is_quoted_and_shows_no_markup(generated):
    """A token inside a sentence is quoted ("how “,” rose") and escaped: markup in a
    token's text (here a link and bold) is shown as text, not rendered."""
    at = generated
    rec = at.session_state["semviz"].trace.steps[-1]
    rec.token_text, rec.token_hex = "**[x](http://a.invalid)", None
    at.switch_page(PAGE).run()
    assert not at.exception
    shown = r"“\*\*\[x\]\(http\:\/\/a\.invalid\)”"
    heads = [h.value for h in at.subheader]
    assert f"Step 7: how {shown} rose through the layers" in heads, heads
    assert f"Who wrote {shown}: each block's share of the logit" in heads, heads
    caption = next(c.value for c in at.caption if c.value.startswith("Direct logit attribution"))
    # the chosen token and the runner-up, by the tokenizer's labels, each quoted
    assert re.search(
        r"sum to the logit: “[^”]+” -?\d+\.\d\d \(embedding [+-]\d+\.\d\d\); “", caption
    )


def test_a_run_without_the_lens_says_so_in_one_sentence(generated):
    at = generated
    for rec in at.session_state["semviz"].trace.steps:
        rec.residual = rec.residual_last = rec.head_out = rec.attn_metrics = None
    at.switch_page(PAGE).run()
    assert not at.exception and not [e.value for e in at.error]
    assert [i.value for i in at.info] == [
        "This run did not record the logit lens: generate with the lens on (it is on by "
        "default) to look inside the choice."
    ]
    assert not at.get("plotly_chart")
