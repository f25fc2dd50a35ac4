r"""Text from a trace or a model shown as text, never as markup.

Token texts, prompts and model names come from files anyone can write. Streamlit renders
markdown (links, images that the viewer's browser fetches, LaTeX, colour directives) and
Plotly renders a subset of HTML in tick labels, hover labels and text marks (``<b>``,
``<a href>``, ``<br>``). These two functions make such text show literally; HTML pages use
:func:`html.escape`.

Examples
--------
>>> print(markdown("**bold** ![img](http://x.io/a.png)"))
\*\*bold\*\* \!\[img\]\(http\:\/\/x\.io\/a\.png\)
>>> plotly("<b>a</b> & b")
'&lt;b&gt;a&lt;/b&gt; &amp; b'
"""

from __future__ import annotations

import string

__all__ = ["markdown", "plotly"]

# every ASCII punctuation character may be backslash-escaped in CommonMark, and each of them
# starts some construct in CommonMark, GFM or Streamlit's extensions (``:red[…]``, ``$…$``)
_MD = str.maketrans({c: "\\" + c for c in string.punctuation} | {"\n": "↵", "\r": "↵"})
_PLOTLY = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def markdown(text: object) -> str:
    """``text`` for a markdown string (``st.markdown``, ``st.caption``, …), shown literally.

    Every ASCII punctuation character is backslash-escaped, and line breaks are shown as
    ``↵`` so the text cannot start a heading, a list or a block of its own.
    """
    return str(text).translate(_MD)


def plotly(text: object) -> str:
    """``text`` for a Plotly label (ticks, hover, text marks), shown literally.

    Plotly parses a subset of HTML in these and decodes ``&lt;``, ``&gt;`` and ``&amp;`` in
    the text between tags, so those three characters become entities.
    """
    return str(text).translate(_PLOTLY)
