"""The page list. Adding a page: write ``app_pages/<name>.py`` and add one ``PageSpec`` here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageSpec:
    path: str
    title: str
    icon: str
    default: bool = False


GENERATE = "app_pages/generate.py"

PAGES: tuple[PageSpec, ...] = (
    PageSpec(GENERATE, "Generate", ":material/play_arrow:", default=True),
    PageSpec("app_pages/distributions.py", "Distributions", ":material/bar_chart:"),
    PageSpec("app_pages/thermodynamics.py", "Thermodynamics", ":material/thermostat:"),
    PageSpec("app_pages/attention.py", "Attention & gravity", ":material/grid_on:"),
    PageSpec("app_pages/kv_cache.py", "KV cache", ":material/memory:"),
    PageSpec("app_pages/pipeline.py", "Pipeline", ":material/account_tree:"),
    PageSpec("app_pages/compare.py", "Compare A/B", ":material/compare_arrows:"),
    PageSpec("app_pages/frontier.py", "Does it help?", ":material/insights:"),
    PageSpec("app_pages/report.py", "Report", ":material/summarize:"),
    PageSpec("app_pages/tour_1_baseline.py", "Tour 1 · Baseline chain", ":material/looks_one:"),
    PageSpec("app_pages/tour_2_entropy.py", "Tour 2 · Log entropy", ":material/looks_two:"),
    PageSpec("app_pages/tour_3_distribution.py", "Tour 3 · Its distribution", ":material/looks_3:"),
    PageSpec("app_pages/tour_4_gravity.py", "Tour 4 · Gravity rerank", ":material/looks_4:"),
    PageSpec("app_pages/tour_5_ab.py", "Tour 5 · A/B test", ":material/looks_5:"),
    PageSpec("app_pages/presenter.py", "Presenter mode", ":material/co_present:"),
)


def st_pages():
    """``st.Page`` objects for ``st.navigation``."""
    import streamlit as st

    return [st.Page(p.path, title=p.title, icon=p.icon, default=p.default) for p in PAGES]
