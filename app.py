"""semviz: watch, and steer, a real language model choosing its next token.

Run with ``make run`` (``streamlit run app.py``). Pages are listed in ``ui/nav.py``; each one
starts with ``ui.page.context(...)``, which draws the shared sidebar (kept across pages).
Set ``SEMVIZ_MODEL`` to a model folder to open with another default model.
"""

import streamlit as st

from ui import nav

st.set_page_config(page_title="semviz", page_icon="🔭", layout="wide")
st.navigation(nav.st_pages(), expanded=True).run()
