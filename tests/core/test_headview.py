"""The head view's HTML: one line per kept link, toggles per head, long contexts summarised,
token text escaped."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

from semviz.output.headview import head_view_html


def _svgs(html: str) -> list[str]:
    """Each head's image of lines, decoded."""
    uris = re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)
    return [base64.b64decode(u).decode() for u in uris]


def test_links_toggles_and_weights():
    att = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    html = head_view_html(att, ["The", " sea", " is"], query=" blue", layer=3, top_k=2)
    assert html.count('type="checkbox"') == 2
    svgs = _svgs(html)
    assert [s.count("<line ") for s in svgs] == [2, 2]  # 2 heads × their 2 strongest links
    # opacity is the weight over the largest shown (0.8)
    ops = sorted(float(x) for s in svgs for x in re.findall(r'stroke-opacity="([0-9.]+)"', s))
    assert ops == pytest.approx([0.125, 0.25, 0.875, 1.0], abs=1e-3)
    assert "#hv-h1:not(:checked) ~ .hv-box .hv-h1" in html and 'class="hv-h1"' in html
    assert "layer 3" in html.lower() and "·blue" in html
    assert "positions no head" not in html  # every position is linked by one head or another


def test_a_long_context_keeps_the_top_links_and_summarises_the_rest():
    rng = np.random.default_rng(0)
    att = rng.random((9, 1000))
    att /= att.sum(1, keepdims=True)
    html = head_view_html(att, [f"t{i}" for i in range(1000)], query="q", layer=0, top_k=5)
    assert sum(s.count("<line ") for s in _svgs(html)) == 45
    shown = html.count('title="position ')
    assert shown <= 45 and f"{1000 - shown} of 1000 positions no head" in html


def test_token_text_is_escaped_and_bad_shapes_refused():
    html = head_view_html(np.ones((1, 1)), ["<script>x</script>"], query="<b>", layer=0)
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>" not in html
    with pytest.raises(ValueError, match=r"attention must be \(H, S\) with S = len\(labels\) = 2"):
        head_view_html(np.ones((1, 3)), ["a", "b"], query="q", layer=0)
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        head_view_html(np.ones((1, 2)), ["a", "b"], query="q", layer=0, top_k=0)
