"""How semviz draws things: one colour per concept, the colour scales, and visible tokens.

Every chart (:mod:`semviz.output.charts`, :mod:`semviz.analysis.compare`), the report's CSS and the app's CSS
take their colours from here; no other module writes a colour literal.

The palette
-----------
- raw / reference, grey: the raw stage, the logits box, formula and fit lines, unchanged
  ranks, "took the top token".
- gravity, purple: the gravity stage and box, gravity eviction.
- temperature, blue: the temperature stage and box, effective T, greedy, the target-entropy
  and mirostat bands.
- final / kept, green: the final stage, kept-set size, the sample box, promoted ranks,
  context that pulled the token, cached positions.
- cut, red: mass removed, filter boxes, demoted ranks, context that pushed the token away,
  evicted positions, the safety fallback.
- entropy, cyan (its line and bands); varentropy, olive; free energy, brown.
- took a lower-ranked token, orange: nothing else is orange.
- what-if, pink: the first step a what-if changes, the first divergence of two sides.
- focus, yellow: a highlighter band on the selected step and on the token taken (never an
  outline, so it reads in both themes).
- prefill / decode, amber / dark teal: Pipeline timing only.
- sides A, B, ..., indigo, teal, ...: Compare and Tour 5 only.
- eviction rules, one colour per policy: KV cache only.
- the app's widgets, slate: no meaning, and not Streamlit's red (red means cut here).

Rules. A concept keeps its colour on every page. Where concepts meet on one page, each
colour has one meaning; families never drawn together (sides, eviction rules, prefill /
decode) may reuse a hue of another family. Marks (bars, lines, points) use mid-luminance
colours that read on white and on near-black; text, grids and backgrounds are left to the
theme (Streamlit's light or dark in the app, :data:`EXPORT_TEMPLATE` in reports).

Scales: probability ``Blues``, entropy ``Teal``, attention ``Viridis`` over log10 of the
mass (see :func:`semviz.output.charts.attention_heatmap`), kept vs evicted the two-colour
:data:`KV_SCALE`.

Examples
--------
>>> STAGE["gravity"], SIDES[0]
('#9467bd', '#3f51b5')
>>> display_token(" the\\n<|im_end|>")
'·the↵⟨im_end⟩'
>>> rgba(CUT, 0.5)
'rgba(214,39,40,0.5)'
"""

from __future__ import annotations

import re

__all__ = [
    "ACTION",
    "ATTENTION_SCALE",
    "CACHE",
    "CHROME",
    "CUT",
    "DECODE",
    "ENTROPY",
    "ENTROPY_SCALE",
    "EXPORT_TEMPLATE",
    "FOCUS",
    "FOCUS_ALPHA",
    "FREE_ENERGY",
    "KEPT",
    "KV_EVICTED",
    "KV_KEPT",
    "KV_SCALE",
    "LOWER_RANKED",
    "POLICY",
    "PREFILL",
    "PROBABILITY_SCALE",
    "REFERENCE",
    "SIDES",
    "STAGE",
    "VARENTROPY",
    "WHATIF",
    "app_css",
    "chip_background",
    "count",
    "display_token",
    "step_token",
    "token_md",
    "policy_color",
    "report_css",
    "rgba",
    "shade",
    "side_color",
]

# -- concepts ----------------------------------------------------------------------------------

STAGE = {
    "raw": "#8c8c8c",
    "gravity": "#9467bd",
    "temperature": "#1f77b4",
    "final": "#2ca02c",
}
REFERENCE = STAGE["raw"]  # unchanged, reference lines, nothing decided
KEPT = STAGE["final"]  # kept, promoted, pulled toward, cached
CUT = "#d62728"  # removed, demoted, pushed away, evicted, fallback fired
ENTROPY = "#17becf"
VARENTROPY = "#bcbd22"
FREE_ENERGY = "#9c755f"
LOWER_RANKED = "#ff7f0e"
WHATIF = "#e377c2"
FOCUS = "#ffd54f"
FOCUS_ALPHA = 0.45  # the highlighter band's opacity over a chart
PREFILL = "#ca8a04"
DECODE = "#0f766e"
CACHE = "#546e7a"  # measured cache bytes
# Streamlit's widgets (sliders, toggles, primary buttons) in a neutral slate rather than its
# default red, which here means "cut"; .streamlit/config.toml repeats these (a test checks)
CHROME = {"light": "#37474f", "dark": "#b0bec5"}

ACTION = {
    "took the top token": REFERENCE,
    "took a lower-ranked token": LOWER_RANKED,
    "greedy": STAGE["temperature"],  # temperature 0
    "safety fallback": CUT,
}
SIDES = ("#3f51b5", "#009688", "#8e24aa", "#6d4c41", "#c0ca33", "#5c6bc0")
POLICY = {
    "full": REFERENCE,
    "none": REFERENCE,
    "window": "#0f766e",
    "streaming": "#ca8a04",
    "h2o": "#3f51b5",
    "tova": "#8c564b",
    "ema": "#bcbd22",
    "gravity": STAGE["gravity"],
}

# -- scales ------------------------------------------------------------------------------------

PROBABILITY_SCALE = "Blues"
ENTROPY_SCALE = "Teal"
ATTENTION_SCALE = "Viridis"
# evicted → kept: orange and blue (Okabe-Ito), told apart under every common colour-vision
# deficiency, unlike the red/green pair of CUT and KEPT
KV_EVICTED = "#e69f00"
KV_KEPT = "#0072b2"
KV_SCALE = [[0.0, "rgba(230,159,0,0.6)"], [1.0, "rgba(0,114,178,0.9)"]]  # KV_EVICTED → KV_KEPT
EXPORT_TEMPLATE = "plotly_white"  # reports are light pages; the app follows the viewer


def rgba(color: str, alpha: float) -> str:
    """``#rrggbb`` with an opacity, as CSS/Plotly ``rgba(…)``."""
    h = color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha:g})"


def side_color(i: int) -> str:
    """Colour of side ``i`` (0 = A) of a comparison."""
    return SIDES[i % len(SIDES)]


def policy_color(name: str, i: int = 0) -> str:
    """Colour of an eviction rule; unknown names take the sides' colours in turn."""
    return POLICY.get(name, SIDES[i % len(SIDES)])


def shade(value: float, scale: str = PROBABILITY_SCALE, *, lo: float = 0.0) -> str:
    """The colour of ``value`` in [0, 1] on a Plotly sequential scale, as ``rgb(…)``.

    ``lo`` starts the scale part-way, so 0 is a tint rather than white.
    """
    import plotly.colors as pc

    v = min(max(float(value), 0.0), 1.0)
    return pc.sample_colorscale(scale, [lo + (1.0 - lo) * v])[0]


def chip_background(k: int) -> str:
    """A translucent background for the ``k``-th token chip: neighbours differ in hue, and the
    text keeps the theme's colour on a light or a dark page."""
    return f"hsla({(k * 47) % 360},70%,60%,0.22)"


# -- tokens ------------------------------------------------------------------------------------

_SPECIAL = re.compile(r"<\|([^<>|\s]{1,40})\|>")
_NAMED = {"<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>"}
_GLYPHS = {" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍", "\u00a0": "⍽"}


def count(n: int, noun: str) -> str:
    """``n`` and its noun, singular for one, with thousands separators.

    >>> count(1, "token"), count(1200, "candidate")
    ('1 token', '1,200 candidates')
    """
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def mark_specials(text: str) -> str:
    """A token's text with its special tokens in ⟨ ⟩ and everything else as it is.

    >>> mark_specials("<|im_start|>user"), mark_specials("</s>"), mark_specials("a <b>")
    ('⟨im_start⟩user', '⟨s⟩', 'a <b>')
    """
    if text in _NAMED:
        return "⟨" + text.strip("</>") + "⟩"
    return _SPECIAL.sub(lambda m: "⟨" + m.group(1) + "⟩", text)


def display_token(text: str, raw: str | bytes | None = None) -> str:
    """A token as a reader can see it: whitespace as glyphs, special tokens in ⟨ ⟩.

    Spaces become ``·``, newlines ``↵``, tabs ``⇥``; ``<|im_start|>`` becomes ``⟨im_start⟩``;
    other control and format characters are escaped (``\\x0c``), since a raw one makes an
    exported SVG, and so the PNG, invalid. The empty token is ``∅``. ``raw`` is the token's
    bytes (or their hex, as a record keeps them) when they are not UTF-8 alone, a piece of a
    character: each run of bytes that is no character shows as its bytes, ``<E6 97>``.

    >>> display_token("\ufffd", "20e697")
    '·<E6 97>'
    """
    if raw is not None:
        return "".join(display_token(t) if c else _byte_run(t) for t, c in _pieces(raw)) or "∅"
    if text == "":
        return "∅"
    out = []
    for c in mark_specials(text):
        g = _GLYPHS.get(c)
        if g is not None:
            out.append(g)
        elif c.isprintable():
            out.append(c)
        else:
            out.append(repr(c)[1:-1])
    return "".join(out)


def piece_text(text: str, raw: str | bytes | None = None) -> str:
    """A token's text for views that show text as it is (the token strip, labels): ``text``
    itself, or, for a piece of a character (``raw``, its bytes or their hex), its characters
    with each run of bytes that is no character as ``<E2 98>`` in place of ``\ufffd``.

    >>> piece_text("\ufffd", "20e697")
    ' <E6 97>'
    """
    if raw is None:
        return text
    return "".join(t if c else _byte_run(t) for t, c in _pieces(raw))


def _pieces(raw: str | bytes) -> list[tuple[str, bool]]:
    """A token's bytes split into runs: (text, True) that decode as UTF-8, and (bytes as
    ``surrogateescape`` leaves them, False) that do not."""
    b = bytes.fromhex(raw) if isinstance(raw, str) else bytes(raw)
    parts = re.split(r"([\udc80-\udcff]+)", b.decode("utf-8", "surrogateescape"))
    return [(p, i % 2 == 0) for i, p in enumerate(parts) if p]


def _byte_run(part: str) -> str:
    """Undecodable bytes (as ``surrogateescape`` left them) shown as ``<E6 97>``."""
    return "<" + " ".join(f"{ord(c) - 0xDC00:02X}" for c in part) + ">"


def step_token(rec) -> str:
    """A recorded step's token for per-token views (:func:`display_token` of its text,
    its bytes where it is a piece of a character)."""
    return display_token(rec.token_text, getattr(rec, "token_hex", None))


def token_md(shown: str) -> str:
    """A token as shown (:func:`display_token`) inside a sentence of markdown: escaped, so
    that no markup in it renders, and between quotes, so that a punctuation token reads as
    a token ("how “,” rose", not "how , rose").

    >>> print(token_md("**"))
    “\\*\\*”
    """
    from semviz.output import escape

    return f"“{escape.markdown(shown)}”"


# -- CSS ---------------------------------------------------------------------------------------


def app_css() -> str:
    """The app's own classes. Text keeps the theme's colour; tints are translucent, so the
    same rules read on Streamlit's light and dark themes."""
    return f"""
.semviz-muted {{opacity: .72;}}
.semviz-box {{border: 1px solid rgba(128,128,128,.4); border-radius: 8px; padding: 10px 12px;}}
.semviz-focus {{background: {rgba(FOCUS, 0.85)}; color: #111; border-radius: 4px;
  padding: 0 3px;}}
.semviz-chip {{display: inline-block; margin: 2px; padding: 1px 5px; border-radius: 4px;
  font-family: ui-monospace, monospace; font-size: 13px;}}
.semviz-chip sub {{opacity: .65;}}
.semviz-state {{display: inline-block; border-radius: 4px; padding: 1px 8px; font-weight: 600;}}
.semviz-state-recorded {{background: {rgba(REFERENCE, 0.25)};}}
.semviz-state-whatif {{background: {rgba(WHATIF, 0.3)};}}
"""


def report_css() -> str:
    """The report page's stylesheet (a light page, like its exported charts)."""
    ink, muted, rule = "#222", "#666", "#e6e6e6"
    return f"""
body{{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1080px;
padding:16px 24px;color:{ink}}}
h1{{font-size:1.5rem;margin:.2em 0}}h2{{font-size:1.15rem;margin:1.6em 0 .3em}}
.caption{{color:{muted};font-size:.85rem;margin:.2em 0 .6em}}
table{{border-collapse:collapse;font-size:.85rem}}td,th{{border-bottom:1px solid {rule};
padding:2px 10px;text-align:left;vertical-align:top}}
.text{{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-word;
border:1px solid {rule};border-radius:6px;padding:8px;line-height:1.9}}
.prompt{{color:{muted}}}.tok{{border-radius:3px;padding:0 1px}}
.chart{{width:100%;border:1px solid {rule};border-radius:6px}}
.grid{{display:grid;grid-template-columns:1fr 1fr;gap:16px}}
.state{{display:inline-block;border-radius:4px;padding:1px 8px;font-weight:600}}
.state-recorded{{background:{rgba(REFERENCE, 0.25)}}}.state-whatif{{background:{rgba(WHATIF, 0.3)}}}
"""
