"""A report of a short real-model run, built once for the report and browser tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
REAL_STEPS = 10

_FIG = re.compile(
    r"<script type='application/json' class='semviz-fig' id='fig-([a-z_]+)'[^>]*>(.*?)</script>",
    re.S,
)


def embedded_figures(html: str) -> dict[str, dict]:
    """The chart JSON embedded in a report page, by chart name."""
    return {name: json.loads(body.replace("<\\/", "</")) for name, body in _FIG.findall(html)}


@pytest.fixture(scope="session")
def real_report(real_lm, tmp_path_factory):
    """The story preset on its example prompt, 10 tokens, reported with PNGs (kaleido)."""
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.output import report
    from semviz.sampling.presets import PRESETS

    p = PRESETS["story"]
    dec = Decoder(real_lm, p.example_prompt, p.params, DecodeSettings(seed=0, max_new_tokens=64))
    dec.run(REAL_STEPS)
    out = tmp_path_factory.mktemp("report")
    rep = report.build(dec.trace, out, tokenizer=real_lm.tokenizer, engine="kaleido", lm=real_lm)
    return dec.trace, rep
