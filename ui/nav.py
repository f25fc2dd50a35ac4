"""The page list. Adding a page: write ``app_pages/<name>.py`` and add one ``PageSpec`` here.

Pages are grouped into sections (``section``) in the navigation bar at the top: the "Start"
pages are plain links, each other section a menu. The sidebar thus holds only the settings.
The first page, Home, is the front door the root URL opens. Also here: the few session keys that ``app.py`` itself keeps
per run (it imports nothing heavy).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PageSpec:
    path: str
    title: str
    icon: str
    default: bool = False
    section: str = "Views"


HOME = "app_pages/home.py"
GENERATE = "app_pages/generate.py"
TOUR = "app_pages/tour_1_baseline.py"
START = "Start"  # the section whose pages are always in sight

# session_state keys of what reading the opening link changed (clamped or ignored values): the
# sidebar takes the notes from LINK_NOTES to show them once, keeping them in SHOWN_NOTES; a run
# that asks for another at once (a linked run that ends, Home handing a link to Generate) puts
# them back (``keep_link_notes``), so the run the user sees shows them.
LINK_NOTES = "settings_notes"
SHOWN_NOTES = "settings_notes_shown"

# the front door's prompt box takes at most this many characters: the most any server reads
# (16 a token, ``semviz.decoding.decoder.CHARS_PER_TOKEN``, of ``PROMPT_BOX_TOKENS``); it is
# here because the front door paints before torch is imported, which the server's own
# setting (``ui.server.prompt_chars``, Generate's box) needs
PROMPT_BOX_TOKENS = 32768
PROMPT_BOX_CHARS = 16 * PROMPT_BOX_TOKENS
PAGE_NOW = "page_now"  # session_state key: the url path of the page this run draws


def start_run(state, page_path: str) -> None:
    """What app.py records at the start of every full run: the page it draws, and no notes
    shown yet (so a rerun before the sidebar is drawn brings back no older notes)."""
    state[PAGE_NOW] = page_path
    state[SHOWN_NOTES] = []


def take_link_notes(state) -> list[str]:
    """The link's notes to show in this run (then gone, unless ``keep_link_notes``)."""
    notes = state.pop(LINK_NOTES, None) or []
    state[SHOWN_NOTES] = notes
    return notes


def keep_link_notes(state) -> None:
    """This run is cut short by a rerun: the notes it showed are shown again by the next."""
    if state.get(SHOWN_NOTES):
        state[LINK_NOTES] = state.pop(SHOWN_NOTES)


PAGES: tuple[PageSpec, ...] = (
    PageSpec(HOME, "Home", ":material/home:", default=True, section=START),
    PageSpec(GENERATE, "Generate", ":material/play_arrow:", section=START),
    PageSpec("app_pages/distributions.py", "Distributions", ":material/bar_chart:"),
    PageSpec("app_pages/thermodynamics.py", "Thermodynamics", ":material/thermostat:"),
    PageSpec("app_pages/attention.py", "Attention & gravity", ":material/grid_on:"),
    PageSpec("app_pages/lens.py", "Inside the choice", ":material/layers:"),
    PageSpec("app_pages/kv_cache.py", "KV cache", ":material/memory:"),
    PageSpec("app_pages/pipeline.py", "Pipeline", ":material/account_tree:"),
    PageSpec("app_pages/compare.py", "Compare A/B", ":material/compare_arrows:", section="Share"),
    PageSpec("app_pages/frontier.py", "Does it help?", ":material/insights:", section="Share"),
    PageSpec("app_pages/report.py", "Report", ":material/summarize:", section="Share"),
    PageSpec("app_pages/presenter.py", "Presenter mode", ":material/co_present:", section="Share"),
    PageSpec(TOUR, "Tour 1 · Baseline chain", ":material/looks_one:", section="Tour"),
    PageSpec("app_pages/tour_2_entropy.py", "Tour 2 · Log entropy", ":material/looks_two:", section="Tour"),
    PageSpec("app_pages/tour_3_distribution.py", "Tour 3 · Its distribution", ":material/looks_3:", section="Tour"),
    PageSpec("app_pages/tour_4_gravity.py", "Tour 4 · Gravity rerank", ":material/looks_4:", section="Tour"),
    PageSpec("app_pages/tour_5_ab.py", "Tour 5 · A/B test", ":material/looks_5:", section="Tour"),
)  # fmt: skip


def st_pages() -> dict[str, list]:
    """``st.Page`` objects by section, for ``st.navigation``."""
    import streamlit as st

    out: dict[str, list] = {}
    for p in PAGES:
        page = st.Page(p.path, title=p.title, icon=p.icon, default=p.default)
        # the top bar shows a section named "" as plain links before the menus
        out.setdefault("" if p.section == START else p.section, []).append(page)
    return out
