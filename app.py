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

from ui import nav

WARM = "semviz-warm-imports"
if "ui.runner" not in sys.modules and not any(t.name == WARM for t in threading.enumerate()):
    # an import in another thread holds the module's import lock: a page that needs it
    # meanwhile waits for this import instead of starting a second one
    threading.Thread(
        target=importlib.import_module, args=("ui.runner",), name=WARM, daemon=True
    ).start()

st.set_page_config(page_title="semviz", page_icon=":material/travel_explore:", layout="wide")
page = st.navigation(nav.st_pages(), expanded=True)
# A playing job decodes in the background between the page's runs (ui.runner); the page holds
# the session's lock while it draws so that no step lands in the middle of a drawing. Read here
# without importing ui.runner, which the front door must not wait for; the lock exists once a
# job has run (ui.runner.page_lock is the same rule for a fragment's runs).
sess = st.session_state.get("semviz")
lock = getattr(sess, "extra", {}).get("_lock")
held = lock is not None and lock.acquire(timeout=10.0)
try:
    page.run()
finally:
    if held:
        lock.release()
