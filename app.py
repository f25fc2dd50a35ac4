"""semviz: watch, and steer, a real language model choosing its next token.

Run with ``make run`` (``streamlit run app.py``). Pages are listed in ``ui/nav.py``; the root
URL opens the front door (Home), which imports nothing heavy and paints at once while torch
and transformers are imported here in the background, once per server process. Every other
page starts with ``ui.page.context(...)``, which draws the shared sidebar (kept across pages).
Set ``SEMVIZ_MODEL`` to a model folder to open with another default model.
"""

import gc
import importlib
import sys
import threading

import streamlit as st
from streamlit.runtime.scriptrunner import RerunException

from ui import nav

WARM = "semviz-warm-imports"
# what every page but Home needs: torch and transformers (ui.runner), plotly (semviz.output.charts)
HEAVY = ("ui.runner", "semviz.output.charts", "ui.views")


def _warm_imports() -> None:
    """Import the heavy modules once per process, then move every object alive now (about
    400,000, nearly all the modules' functions, classes and constants) out of the cyclic
    garbage collector's reach with ``gc.freeze``.

    A full collection over these objects took about 0.2 s with the GIL held, stalling every
    session's decoding; Streamlit's collection after every run is off (``.streamlit/
    config.toml``), and Python's own full collections now skip them. Frozen objects are still
    freed by reference counting, only never as part of a cycle; the models load later, so a
    model dropped from the cache stays collectable. ``benchmarks/bench_gc.py`` times one
    collection both ways, ``benchmarks/bench_load.py`` the throughput of a class."""
    for name in HEAVY:
        importlib.import_module(name)
    gc.freeze()
    # the upload endpoint's own limit, before any page has run (ui.page keeps it current)
    importlib.import_module("ui.server").apply_upload_limit()


if "ui.runner" not in sys.modules and not any(t.name == WARM for t in threading.enumerate()):
    # an import in another thread holds the module's import lock: a page that needs it
    # meanwhile waits for this import instead of starting a second one
    threading.Thread(target=_warm_imports, name=WARM, daemon=True).start()

st.set_page_config(page_title="semviz", page_icon=":material/travel_explore:", layout="wide")
# in the header, so the sidebar holds only the settings and its sliders are on the first screen
page = st.navigation(nav.st_pages(), position="top")
nav.start_run(st.session_state, page.url_path)
# every page's charts: on a phone, Plotly's modebar would sit over the charts' titles
st.html(
    "<style>@media (max-width: 640px) {.js-plotly-plot .modebar-container {display: none;}}</style>"
)
try:
    page.run()
except RerunException:  # st.rerun / st.switch_page: another run follows at once, so the
    nav.keep_link_notes(st.session_state)  # link's notes shown in this one stay for it
    raise
