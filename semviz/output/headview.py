"""A BertViz-style head view of one layer: lines from the step's query (the last token fed,
whose output chose the next one) to the context tokens it read, one colour per head, each head shown or hidden by its own toggle.

Self-contained HTML (one SVG image of lines per head, the tokens as text, a little CSS, no
script): the toggles are checkboxes whose state the CSS reads, so the view works in the app, in a report and in a saved file
alike. Long contexts keep each head's ``top_k`` strongest links; the positions no head links
to are summarised in one line with the mass they took.

Examples
--------
>>> import numpy as np
>>> att = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])  # (H, S): 2 heads over 3 tokens
>>> html = head_view_html(att, ["The", " sea", " is"], query=" blue", layer=3)
>>> html.count("<img "), html.count('type="checkbox"')
(2, 2)
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape

import numpy as np
import plotly.colors as pc

from semviz.output.style import display_token

__all__ = ["HEAD_COLORS", "head_view_html"]

HEAD_COLORS = pc.qualitative.D3 + pc.qualitative.Set2  # one per head, distinct up to 18
ROW = 18  # px per context token
WIDTH = 520


def _label(text: str, n: int = 18) -> str:
    s = display_token(text)
    return escape(s if len(s) <= n else s[: n - 1] + "…")


def head_view_html(
    attention: np.ndarray,
    labels: Sequence[str],
    *,
    query: str,
    layer: int,
    top_k: int = 24,
    key: str = "hv",
) -> str:
    """The head view of one layer for one step.

    Parameters
    ----------
    attention : (H, S) the last query's attention of each head over the S cached positions
    labels : (S,) the text of each cached position
    query : the query's own token (the last one fed)
    layer : the layer shown (for the title)
    top_k : the strongest links kept per head
    key : a prefix that makes the element ids unique on a page

    Returns
    -------
    One ``<div>``: head toggles, then the query on the left and the linked context tokens on
    the right, joined by each head's lines; a line's opacity is its weight over the largest
    shown, and a token's tooltip gives every head's weight on it.
    """
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != len(labels):
        raise ValueError(
            f"attention must be (H, S) with S = len(labels) = {len(labels)}, got {a.shape}"
        )
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    H, S = a.shape
    k = min(top_k, S)
    top = np.argsort(-a, axis=1, kind="stable")[:, :k]  # (H, k)
    shown = sorted({int(j) for j in top.ravel()})
    row_of = {j: r for r, j in enumerate(shown)}
    hidden = S - len(shown)
    peak = float(a[np.arange(H)[:, None], top].max()) if S else 1.0
    height = max(len(shown), 1) * ROW + 16
    qy = height / 2
    x0, x1 = 130, WIDTH - 150
    css = [
        f"#{key} .hv-box{{position:relative;width:{WIDTH}px;height:{height}px}}",
        f"#{key} .hv-box img{{position:absolute;left:0;top:0}}",
        f"#{key} .hv-tok{{position:absolute;font:12px sans-serif;line-height:{ROW}px;"
        "white-space:nowrap}",
        f"#{key} label{{margin-right:10px;font:12px sans-serif;cursor:pointer}}",
    ]
    toggles, layers = [], []
    for h in range(H):
        color = HEAD_COLORS[h % len(HEAD_COLORS)]
        hid = f"{key}-h{h}"
        css.append(f"#{hid}:not(:checked) ~ .hv-box .hv-h{h}{{display:none}}")
        toggles.append(
            f'<input type="checkbox" id="{hid}" checked style="accent-color:{color}">'
            f'<label for="{hid}" style="color:{color}">head {h}</label>'
        )
        lines = "".join(
            f'<line x1="{x0}" y1="{qy:.1f}" x2="{x1}" y2="{8 + row_of[int(j)] * ROW + ROW / 2:.1f}" '
            f'stroke="{color}" stroke-width="2" '
            f'stroke-opacity="{float(a[h, j]) / peak if peak else 0:.3f}"/>'
            for j in top[h]
        )
        svg = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}">'
            f"{lines}</svg>"
        )
        # each head's lines are an image of their own: the page's HTML sanitiser keeps images
        # but drops inline SVG, and an image per head is what a toggle shows or hides
        uri = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")
        layers.append(f'<img class="hv-h{h}" src="{uri}" alt="head {h}">')
    toks = [
        f'<span class="hv-tok" style="left:{x1 + 6}px;top:{8 + r * ROW}px" title="position '
        f"{j}: "
        + ", ".join(f"head {h} {a[h, j]:.4f}" for h in range(H))
        + f'">{j} {_label(labels[j])}</span>'
        for r, j in enumerate(shown)
    ]
    query_tok = (
        f'<span class="hv-tok" style="right:{WIDTH - x0 + 6}px;top:{qy - ROW / 2:.1f}px;'
        f'font-weight:bold">{_label(query)}</span>'
    )
    rest = ""
    if hidden:
        mass = 1.0 - a[:, shown].sum(1)  # (H,) what each head put on the positions not shown
        rest = (
            f'<p style="font:12px sans-serif;opacity:.75">{hidden} of {S} positions no head '
            f"ranks in its top {k}: they take {mass.mean():.1%} of a head's attention on "
            f"average (at most {mass.max():.1%}).</p>"
        )
    box = (
        f'<div class="hv-box" role="img" aria-label="layer {layer}: what {_label(query)} read">'
        + "".join(layers)
        + query_tok
        + "".join(toks)
        + "</div>"
    )
    return (
        f'<div id="{key}"><style>{"".join(css)}</style>'
        f'<p style="font:13px sans-serif">Layer {layer}: what {_label(query)} read, '
        f"each head's {k} strongest links</p>" + "".join(toggles) + box + rest + "</div>"
    )
