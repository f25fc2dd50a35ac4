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
    PageSpec(GENERATE, "Generate", ":material/play_arrow:", default=True),
    PageSpec("pages/distributions.py", "Distributions", ":material/bar_chart:"),
    PageSpec("pages/thermodynamics.py", "Thermodynamics", ":material/thermostat:"),
    PageSpec("pages/attention.py", "Attention & gravity", ":material/grid_on:"),
    PageSpec("pages/kv_cache.py", "KV cache", ":material/memory:"),
    PageSpec("pages/pipeline.py", "Pipeline", ":material/account_tree:"),
    PageSpec("pages/compare.py", "Compare A/B", ":material/compare_arrows:"),
    PageSpec("pages/report.py", "Report", ":material/summarize:"),
    PageSpec("pages/tour_1_baseline.py", "Tour 1 · Baseline chain", ":material/looks_one:"),
    PageSpec("pages/tour_2_entropy.py", "Tour 2 · Log entropy", ":material/looks_two:"),
    PageSpec("pages/tour_3_distribution.py", "Tour 3 · Its distribution", ":material/looks_3:"),
    PageSpec("pages/tour_4_gravity.py", "Tour 4 · Gravity rerank", ":material/looks_4:"),
    PageSpec("pages/tour_5_ab.py", "Tour 5 · A/B test", ":material/looks_5:"),
    PageSpec("pages/presenter.py", "Presenter mode", ":material/co_present:"),
)


def st_pages():
    """``st.Page`` objects for ``st.navigation``."""
    import streamlit as st

    return [st.Page(p.path, title=p.title, icon=p.icon, default=p.default) for p in PAGES]
