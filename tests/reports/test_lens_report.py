"""The report's lens views: the logit lens and attribution with the run's model, the
attention metrics from the trace alone, nothing for a run without the lens."""

from __future__ import annotations

import dataclasses

import pytest

from semviz.analysis import lens
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output import report
from semviz.sampling import PruneParams

LENS_VIEWS = ["lens_layers", "lens_grid", "lens_blocks", "attention_metrics", "quadrant"]


def _trace(lm, *, lens_on: bool = True):
    d = Decoder(
        lm,
        "The capital of France is",
        PruneParams(temperature=0),
        DecodeSettings(chat=False, max_new_tokens=4, lens=lens_on),
    )
    d.eos_ids = set()
    d.run(4)
    return d.trace


@pytest.fixture(scope="module")
def trace(tiny_lm):
    return _trace(tiny_lm)


def _lens_names(vs) -> list[str]:
    return [v.name for v in vs if v.name in LENS_VIEWS]


def test_with_the_model_the_report_reads_the_lens(tiny_lm, trace):
    vs = report.views(trace, tokenizer=tiny_lm.tokenizer, selected=2, lm=tiny_lm)
    assert _lens_names(vs) == LENS_VIEWS
    by = {v.name: v for v in vs}
    want = lens.lens_step(tiny_lm, trace.steps[2])
    assert list(by["lens_layers"].figure.data[0].y) == want.chosen_rank.tolist()
    z = by["lens_grid"].figure.data[0].z
    assert len(z) == 3 and all(len(row) == 3 for row in z)  # 2 layers + emb, steps 0..2
    for v in vs:
        if v.name in LENS_VIEWS:
            assert v.figure.data and v.json()["data"], v.name
    assert vs[-1].name == "chain"


def test_without_the_model_only_the_attention_metrics(tiny_lm, trace):
    vs = report.views(trace, tokenizer=tiny_lm.tokenizer)
    assert _lens_names(vs) == ["attention_metrics", "quadrant"]


def test_a_run_without_the_lens_adds_nothing(tiny_lm):
    vs = report.views(_trace(tiny_lm, lens_on=False), tokenizer=tiny_lm.tokenizer, lm=tiny_lm)
    assert _lens_names(vs) == []


def test_another_model_than_the_runs_skips_the_lens_views(tiny_lm, trace):
    """A residual of another width is refused by the lens; the report keeps the rest."""
    steps = [
        dataclasses.replace(s, residual=s.residual[:, :8], residual_last=s.residual_last[:8])
        for s in trace.steps
    ]
    other = dataclasses.replace(trace, steps=steps)
    vs = report.views(other, tokenizer=tiny_lm.tokenizer, lm=tiny_lm)
    assert _lens_names(vs) == ["attention_metrics", "quadrant"]


def test_every_chart_can_be_written_as_svg_and_pdf(tiny_lm, trace, tmp_path):
    rep = report.build(
        trace,
        tmp_path / "r",
        tokenizer=tiny_lm.tokenizer,
        png=False,
        lm=tiny_lm,
        vector=("svg", "pdf"),
    )
    charts = rep.manifest["charts"]
    assert [c["name"] for c in charts] == [v.name for v in rep.views]
    assert {"lens_grid", "lens_blocks", "quadrant"} <= {c["name"] for c in charts}
    for c in charts:
        svg = (rep.out / c["svg"]).read_text(encoding="utf-8")
        assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>"), c["name"]
        # something was drawn: bars and markers are points, lines js-line, heatmaps images,
        # the chain's boxes annotations
        marks = ('class="point"', 'class="js-line"', "<image", 'class="annotation-text')
        assert any(m in svg for m in marks), c["name"]
        pdf = (rep.out / c["pdf"]).read_bytes()
        assert pdf.startswith(b"%PDF") and len(pdf) > 2000, c["name"]
    assert not rep.stopped


def test_an_unknown_vector_format_is_refused_before_any_file(tiny_lm, trace, tmp_path):
    with pytest.raises(ValueError, match=r"^vector: 'eps' is not one of svg, pdf$"):
        report.build(trace, tmp_path / "r", png=False, vector=("eps",))
    assert not (tmp_path / "r").exists()
