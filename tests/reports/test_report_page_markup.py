"""The Report page shows a trace's token text and model name as text: markdown in them (an
image the viewer's browser would fetch, bold, a link) is escaped before Streamlit renders it."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.sampling import PruneParams
from tests.app.conftest import APP, TIMEOUT

IMAGE = "![x](http://example.invalid/x.png)"


def test_markdown_from_a_trace_is_not_rendered(tiny_lm, tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dec = Decoder(tiny_lm, "The sea", PruneParams(temperature=0), DecodeSettings(max_new_tokens=2))
    dec.run(2)
    trace = dec.trace
    trace.model["name"] = f"**bold** {IMAGE}"
    trace.steps[-1].token_text = f"<b>tok</b>{IMAGE}"
    trace.save(tmp_path / "t.json")

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("app_pages/report.py").run()
    at.radio(key="report_source").set_value("a saved trace").run()
    at.text_input(key="report_path").input(str(tmp_path / "t.json")).run()
    assert not at.exception, at.exception
    shown = [c.value for c in at.caption]
    model_line = next(v for v in shown if " model " in v or v.startswith("model "))
    assert r"\*\*bold\*\* \!\[x\]\(http\:\/\/example\.invalid\/x\.png\)" in model_line
    assert not any(IMAGE in v or "<b>" in v for v in shown)
