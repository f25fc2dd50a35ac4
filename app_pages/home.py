"""Home: what semviz shows, and three ways in (a prompt, the tour, an example run).

This page imports nothing heavy (no torch, no model) so it paints at once, while ``app.py``
warms the imports in the background. An example run opens on Generate from its recorded
trace, with no model run; a prompt opens Generate and starts decoding.
"""

import streamlit as st

from ui import examples, nav

# a link opened at the root with settings or a run in its query string belongs to Generate
# (only when the session starts here: later visits come from the navigation)
first = "semviz" not in st.session_state and "settings" not in st.session_state
if first and any(k not in ("embed", "embed_options") for k in st.query_params):
    st.switch_page(nav.GENERATE, query_params=st.query_params.to_dict())

st.title("semviz")
st.markdown(
    "**Watch a real language model choose its next token, and steer it.** semviz shows the "
    "whole distribution at every step, what temperature, top-k / top-p and *narrative "
    "gravity* do to it, where attention goes and what the KV cache keeps; move a slider "
    "afterwards and see what the model would have written instead."
)


def _settings():
    """The stored settings (the sidebar's), else the defaults."""
    from ui.state import Settings

    return st.session_state.get("settings") or Settings()


def _store(s) -> None:
    s.impose(st.session_state)
    st.session_state["settings"] = s


def _try_prompt() -> None:
    from dataclasses import replace

    from ui import runner
    from ui.errors import report
    from ui.state import session

    sess = session(st.session_state)
    sess.error = None
    s = _settings()
    typed = (st.session_state.get("home_prompt") or "").strip()
    if typed:
        s = replace(s, prompt=typed)
    _store(s)
    try:
        runner.stop(sess, quiet=True)
        runner.start(sess, s, "run", int(s.run_n))
    except Exception as exc:  # Generate shows it
        sess.error = report(exc, "opening Generate")
    st.session_state["_goto"] = nav.GENERATE


def _open_example(name: str) -> None:
    from ui import runner
    from ui.errors import report
    from ui.state import session

    sess = session(st.session_state)
    sess.error = None
    try:
        tr = examples.load(name)
        s = runner.settings_for_trace(tr, _settings())
        _store(s)
        runner.open_trace(sess, s, tr, name)
        st.session_state["_goto"] = nav.GENERATE
    except Exception as exc:
        sess.error = report(exc, "opening the example")


c1, c2, c3 = st.columns(3, gap="medium")
with c1.container(border=True):
    st.subheader(":material/edit: Try a prompt")
    st.text_area(
        "Prompt",
        key="home_prompt",
        height=110,
        label_visibility="collapsed",
        max_chars=nav.PROMPT_BOX_CHARS,
        placeholder="Type a prompt, or leave this empty for the default one "
        "(a sentence about the sea).",
    )
    st.button("Generate", key="home_go", type="primary", on_click=_try_prompt, width="stretch")
    st.caption("Opens Generate and decodes, one token at a time, with the current sliders.")
with c2.container(border=True):
    st.subheader(":material/school: Take the tour")
    st.markdown(
        "Five short steps from the standard sampling chain to narrative gravity and an A/B "
        "test: where the logits come from, what entropy says, what each filter removes."
    )
    st.page_link(nav.TOUR, label="Start the tour", icon=":material/arrow_forward:")
with c3.container(border=True):
    st.subheader(":material/history: Open an example run")
    st.caption("Recorded with the default model; they open at once, with no model run.")
    for ex in examples.available():
        st.button(
            ex.title,
            key=f"home_ex_{ex.name}",
            on_click=_open_example,
            args=(ex.name,),
            help=ex.blurb or None,
            width="stretch",
        )

error = getattr(st.session_state.get("semviz"), "error", None)
if error:
    st.error(error, icon=":material/error:")

goto = st.session_state.pop("_goto", None)
if goto and not error:
    st.switch_page(goto)

with st.expander("What am I looking at?"):
    st.markdown(
        "- **Generate**: the text as tokens coloured by how likely each was. Hover a token for "
        "its alternatives at every stage of the chain; click it to select its step on every "
        "page; click an alternative to branch from there.\n"
        "- **Distributions, Thermodynamics, Attention & gravity, KV cache, Pipeline**: one "
        "step, or the whole run, from each angle.\n"
        "- The sliders in the sidebar act on the recorded run at once (a *what-if* replay, no "
        "model run); the strip shows the continuation they would give as ghost text.\n"
        "- Every view is a link: the URL carries the settings, the number of steps and the "
        "selected step, and opening it regenerates the same tokens."
    )
