"""The page list. Adding a page: write ``pages/<name>.py`` and add one ``PageSpec`` here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageSpec:
    path: str
    title: str
    icon: str
    default: bool = False


GENERATE = "pages/generate.py"

PAGES: tuple[PageSpec, ...] = (
    PageSpec(GENERATE, "Generate", "▶️", default=True),
    PageSpec("pages/distributions.py", "Distributions", "📊"),
    PageSpec("pages/thermodynamics.py", "Thermodynamics", "🌡️"),
    PageSpec("pages/attention.py", "Attention & gravity", "🧲"),
    PageSpec("pages/kv_cache.py", "KV cache", "🗄️"),
    PageSpec("pages/pipeline.py", "Pipeline", "🛠️"),
)


def st_pages():
    """``st.Page`` objects for ``st.navigation``."""
    import streamlit as st

    return [st.Page(p.path, title=p.title, icon=p.icon, default=p.default) for p in PAGES]
