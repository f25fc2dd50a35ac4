"""Thermodynamics on the tiny model: entropix's attention metrics and quadrant from the run."""

from __future__ import annotations

import json

from app_pages.thermodynamics import NO_METRICS

PAGE = "app_pages/thermodynamics.py"


def _figures(at) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def _trace(fig: dict, name: str) -> dict:
    return next(d for d in fig["data"] if d.get("name") == name)


def test_the_page_draws_the_recorded_attention_metrics_and_the_quadrant(generated):
    at = generated
    at.switch_page(PAGE).run()
    assert not at.exception and not [e.value for e in at.error]
    steps = at.session_state["semviz"].trace.steps
    assert all(r.attn_metrics is not None for r in steps)
    figs = _figures(at)
    # entropy, the thermo series, the scatter, then the attention metrics and the quadrant
    assert len(figs) == 5
    metrics, quadrant = figs[3], figs[4]
    # the last layer's metrics, each the plain mean over its heads of the recorded (L, H) values
    for name, key in (
        ("attention entropy", "entropy"),
        ("attention varentropy", "varentropy"),
        ("head agreement", "agreement"),
        ("interaction strength", "interaction"),
    ):
        want = [float(r.attn_metrics[key][-1].double().mean()) for r in steps]
        got = _trace(metrics, name)["y"]
        assert got == want, name
    assert _trace(metrics, "entropy")["y"] == [float(r.entropy) for r in steps]
    assert _trace(metrics, "varentropy")["y"] == [float(r.varentropy) for r in steps]
    points = _trace(quadrant, "step")
    assert points["x"] == [float(r.entropy) for r in steps]
    assert points["y"] == [float(r.varentropy) for r in steps]
    assert len(points["text"]) == len(steps)


def test_the_mean_of_every_layer_is_drawn_when_chosen(generated):
    at = generated
    at.switch_page(PAGE).run()
    at.selectbox(key="thermo_att_layer").set_value("mean of every layer").run()
    assert not at.exception
    steps = at.session_state["semviz"].trace.steps
    got = _trace(_figures(at)[3], "attention entropy")["y"]
    assert got == [float(r.attn_metrics["entropy"].double().mean(0).mean()) for r in steps]
    assert got != [float(r.attn_metrics["entropy"][-1].double().mean()) for r in steps]


def test_a_run_without_the_metrics_says_so_in_one_sentence(generated):
    at = generated
    for rec in at.session_state["semviz"].trace.steps:
        rec.attn_metrics = None
    at.switch_page(PAGE).run()
    assert not at.exception and not [e.value for e in at.error]
    assert [i.value for i in at.info] == [NO_METRICS]
    figs = _figures(at)
    assert len(figs) == 4  # the quadrant reads the logits, which every run records
    assert not any(d.get("name") == "attention entropy" for f in figs for d in f["data"])
