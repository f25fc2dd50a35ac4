"""Streamlit-side helpers for the semviz app: settings, sidebar, session, errors, views.

Only this package and the page scripts import streamlit; ``semviz`` never does.
"""
