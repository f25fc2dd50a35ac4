"""semviz: watch, and steer, a real language model choosing its next token.

Run with ``make run`` (``streamlit run app.py``). Pages are listed in ``ui/nav.py``; the root
URL opens the front door (Home), which imports nothing heavy and paints at once while torch
and transformers are imported here in the background, once per server process. Every other
page starts with ``ui.page.context(...)``, which draws the shared sidebar (kept across pages).
Set ``SEMVIZ_MODEL`` to a model folder to open with another default model.
"""

import importlib
import sys
import threading

import streamlit as st
from streamlit.runtime.scriptrunner import RerunException

from ui import nav
from ui.locks import page_lock

WARM = "semviz-warm-imports"
if "ui.runner" not in sys.modules and not any(t.name == WARM for t in threading.enumerate()):
    # an import in another thread holds the module's import lock: a page that needs it
    # meanwhile waits for this import instead of starting a second one
    threading.Thread(
        target=importlib.import_module, args=("ui.runner",), name=WARM, daemon=True
    ).start()

st.set_page_config(page_title="semviz", page_icon=":material/travel_explore:", layout="wide")
page = st.navigation(nav.st_pages(), expanded=True)
nav.start_run(st.session_state, page.url_path)
# a job decodes in the background between the page's runs (ui.runner): hold the session's
# lock while the page draws, so no step lands in the middle of a drawing
try:
    with page_lock(st.session_state.get("semviz")):
        page.run()
except RerunException:  # st.rerun / st.switch_page: another run follows at once, so the
    nav.keep_link_notes(st.session_state)  # link's notes shown in this one stay for it
    raise
