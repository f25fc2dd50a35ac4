"""Reports: the real model's report holds every chart, real PNGs and an equal Parquet table;
the CLI's --prompt and --trace routes write the same report; stopping keeps what was made."""

from __future__ import annotations

import io
import json
import re
import zipfile

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from semviz.output import report
from semviz.output.trace import Trace
from tests.reports.conftest import embedded_figures


def assert_real_image(path, width: int, height: int) -> None:
    """A PNG of exactly width×height that draws something (not blank, not one colour)."""
    img = Image.open(path)
    assert img.format == "PNG"
    assert img.size == (width, height), (path.name, img.size)
    a = np.asarray(img.convert("RGB"), dtype=np.int16)  # (H, W, 3)
    ink = (np.abs(a - 255).sum(-1) > 60).mean()  # share of clearly non-white pixels
    assert ink > 0.005, f"{path.name} is blank ({ink:.4%} ink)"
    colours = len(np.unique(a.reshape(-1, 3)[::7], axis=0))
    assert colours > 8, f"{path.name} has only {colours} colours"


@pytest.mark.real_model
def test_real_model_report(real_report):
    trace, rep = real_report
    out = rep.out
    names = [v.name for v in rep.views]
    for need in ("entropy", "thermo", "distribution", "waterfall", "attention", "chain"):
        assert need in names
    # the HTML: self-contained, every chart's data embedded exactly
    page = (out / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=", page), "the page loads a script from elsewhere"
    assert "Plotly.newPlot" in page and len(page) > 3_000_000  # plotly.js inline
    figs = embedded_figures(page)
    assert list(figs) == names
    for v in rep.views:
        assert figs[v.name] == v.json(), v.name
        assert figs[v.name]["data"], f"{v.name} has no data"
    assert trace.text and all(
        __import__("html").escape(s.token_text) in page for s in trace.steps if s.token_text.strip()
    )
    # one real PNG per chart, of the size the manifest gives
    man = json.loads((out / "report.json").read_text())
    assert man["png_engine"] == "kaleido" and not man["stopped"]
    assert [c["name"] for c in man["charts"]] == names
    for c in man["charts"]:
        assert c["png"] == f"png/{c['name']}.png"
        assert_real_image(out / c["png"], c["width"], c["height"])
    assert man["text"] == trace.text and man["prompt"] == trace.prompt
    assert man["model"]["name"] == trace.model["name"]
    assert man["metrics"]["steps"] == len(trace.steps)
    # trace JSON and Parquet reload equal
    again = Trace.load(out / "trace.json")
    assert again == trace
    table = pd.read_parquet(out / "trace.parquet")
    pd.testing.assert_frame_equal(table, trace.to_dataframe())
    pd.testing.assert_frame_equal(table, again.to_dataframe())
    # the app's download: one zip of the folder
    with zipfile.ZipFile(io.BytesIO(report.zip_bytes(out))) as z:
        listed = set(z.namelist())
    assert {"report.html", "report.json", "trace.json", "trace.parquet"} <= listed
    assert {f"png/{n}.png" for n in names} <= listed


@pytest.mark.real_model
def test_cli_report_from_saved_trace_matches(real_report, tmp_path, capsys):
    from semviz.cli import main

    trace, rep = real_report
    assert (
        main(
            [
                "report",
                "--trace",
                str(rep.out / "trace.json"),
                "--out",
                str(tmp_path),
                "--no-png",
                "--json",
            ]
        )
        == 0
    )
    man = json.loads(capsys.readouterr().out)
    assert man["png_engine"] is None and all(c["png"] is None for c in man["charts"])
    a = embedded_figures((rep.out / "report.html").read_text(encoding="utf-8"))
    b = embedded_figures((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert a == b
    assert Trace.load(tmp_path / "trace.json") == trace


def test_cli_prompt_and_trace_routes_write_the_same_report(tiny_dir, tmp_path, capsys):
    from semviz.cli import main

    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--model", str(tiny_dir), "--no-png", "--json"]
    assert (
        main(
            [
                "report",
                "--prompt",
                "The sea",
                "--preset",
                "story",
                "--steps",
                "5",
                "--out",
                str(a),
                *common,
            ]
        )
        == 0
    )
    man = json.loads(capsys.readouterr().out)
    assert man["steps"] == 5 and man["settings"]["params"]["target_entropy"] == 2.5  # the preset
    assert main(["report", "--trace", str(a / "trace.json"), "--out", str(b), *common]) == 0
    capsys.readouterr()
    assert (a / "report.html").read_text() == (b / "report.html").read_text()
    assert json.loads((a / "report.json").read_text()) == json.loads(
        (b / "report.json").read_text()
    )


def test_playwright_export_and_stop_keep_what_was_made(tiny_lm, tmp_path):
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.sampling import PruneParams

    dec = Decoder(tiny_lm, "The sea", PruneParams(top_k=8), DecodeSettings(max_new_tokens=4))
    dec.run(4)
    asked = {"n": 0}

    def stop_after_two():
        asked["n"] += 1
        return asked["n"] > 2

    rep = report.build(
        dec.trace,
        tmp_path,
        tokenizer=tiny_lm.tokenizer,
        engine="playwright",
        should_stop=stop_after_two,
    )
    assert rep.stopped and len(rep.pngs) == 2
    man = json.loads((tmp_path / "report.json").read_text())
    assert man["stopped"] and man["png_engine"] == "playwright"
    made = [c for c in man["charts"] if c["png"]]
    assert [c["name"] for c in made] == [v.name for v in rep.views[:2]]
    for c in made:
        assert_real_image(tmp_path / c["png"], c["width"], c["height"])
    assert (tmp_path / "report.html").exists() and (tmp_path / "trace.parquet").exists()


def test_report_of_an_empty_run_and_bad_input(tiny_lm, tmp_path, capsys):
    from semviz.cli import main
    from semviz.decoding.decoder import Decoder

    empty = Decoder(tiny_lm, "The sea").trace
    rep = report.build(empty, tmp_path, png=False)
    assert [v.name for v in rep.views] == ["chain"]
    assert main(["report", "--trace", str(tmp_path / "nope.json"), "--out", str(tmp_path)]) == 2
    assert "nope.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="engine"):
        report.export_pngs(rep.views, tmp_path, engine="gimp")


def _small_trace(tiny_lm, tmp_path):
    from semviz.decoding.decoder import Decoder, DecodeSettings

    dec = Decoder(tiny_lm, "The sea", settings=DecodeSettings(max_new_tokens=3, capture=False))
    dec.run(3)
    return dec.trace.save(tmp_path / "t.json")


def test_a_png_failure_exits_2_suggesting_no_png_and_keeps_the_rest(
    tiny_lm, tmp_path, capsys, monkeypatch
):
    from semviz.cli import main

    path = _small_trace(tiny_lm, tmp_path)

    def no_browser(*a, **kw):
        raise TimeoutError("Timeout 30000ms exceeded.\n=== logs ===\nmore")

    monkeypatch.setattr(report, "export_pngs", no_browser)
    out = tmp_path / "rep"
    rc = main(["report", "--trace", str(path), "--out", str(out)])
    err = capsys.readouterr().err.splitlines()[-1]  # after the progress lines
    assert rc == 2, err
    assert err.startswith(
        "semviz report: the PNG export failed (TimeoutError: Timeout 30000ms exceeded.); "
        "report.html, trace.json and trace.parquet are written in "
    )
    assert err.endswith("run again with --no-png to skip the images")
    assert {"report.html", "trace.json", "trace.parquet", "report.json"} <= {
        p.name for p in out.iterdir()
    }


def test_a_full_disk_leaves_no_folder_behind(tiny_lm, tmp_path, capsys, monkeypatch):
    import errno

    from semviz.cli import main
    from semviz.output import files

    path = _small_trace(tiny_lm, tmp_path)
    real = files.write_text

    def full(p, text, *a, **kw):
        if str(p).endswith("trace.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(p, text, *a, **kw)

    monkeypatch.setattr(files, "write_text", full)
    out = tmp_path / "rep"
    assert main(["report", "--trace", str(path), "--out", str(out), "--no-png"]) == 2
    assert capsys.readouterr().err.endswith("semviz report: no space left on device\n")
    assert not out.exists()


def _run(tiny_lm, params, steps: int = 3) -> Trace:
    from semviz.decoding.decoder import Decoder, DecodeSettings

    dec = Decoder(tiny_lm, "The sea", params, DecodeSettings(max_new_tokens=steps, seed=0))
    dec.run(steps)
    return dec.trace


def _panels(view) -> list[str]:
    """The titles above a stacked figure's panels."""
    return [a.text for a in view.figure.layout.annotations]


def test_gravity_off_draws_no_gravity_panel(tiny_lm):
    from semviz.output.charts import STAGE_LABEL
    from semviz.sampling import PruneParams

    off = {v.name: v for v in report.views(_run(tiny_lm, PruneParams(top_k=8)))}
    assert STAGE_LABEL["gravity"] not in _panels(off["distribution"])
    assert _panels(off["distribution"]) == [STAGE_LABEL[s] for s in ("raw", "temperature", "final")]
    assert "rank_shift" not in off
    on = {v.name: v for v in report.views(_run(tiny_lm, PruneParams(top_k=8, gravity_lambda=1.0)))}
    assert STAGE_LABEL["gravity"] in _panels(on["distribution"])


def test_exported_charts_carry_the_title_that_names_the_step(tiny_lm, tmp_path):
    from semviz.sampling import PruneParams

    vs = report.views(_run(tiny_lm, PruneParams(top_k=8)), selected=1)
    dist = next(v for v in vs if v.name == "distribution")
    fig = dist.exported()
    assert fig.layout.title.text == dist.title == "Step 1: the distribution at each stage"
    assert fig.layout.height == dist.png_height == dist.height + report.TITLE_ROOM
    assert fig.layout.margin.t == dist.figure.layout.margin.t + report.TITLE_ROOM
    assert dist.figure.layout.title.text is None  # the app and the HTML page keep their own
    # a chart over the run names the step its yellow band marks
    ent = next(v for v in vs if v.name == "entropy")
    assert ent.exported().layout.title.text == "Entropy and varentropy per step · selected step 1"
    assert next(v for v in vs if v.name == "chain").exported().layout.title.text == (
        "The sampling chain"
    )
    pngs, _ = report.export_pngs([dist], tmp_path, engine="kaleido")
    assert_real_image(pngs[0], dist.width, dist.png_height)
    band = np.asarray(Image.open(pngs[0]).convert("L"))[: report.TITLE_ROOM, :400]
    assert (band < 128).mean() > 0.01  # the title's dark text in the band above the chart


def test_text_preview_starts_at_the_prompts_beginning(tiny_lm):
    from semviz.sampling import PruneParams

    tr = _run(tiny_lm, PruneParams(top_k=8))
    assert report.text_preview(tr) == tr.prompt_text + "⟨" + tr.text + "⟩"
    assert tr.prompt_text.startswith(tr.prompt_tokens[0])
    long = Trace(tr.settings, tr.model, "x", [1, 2], ["A" * 700, "Z" * 300])
    cut = report.text_preview(long)
    assert cut.startswith("A" * 360) and cut.endswith("Z" * 240 + "⟨⟩")
    assert "\n[… 400 characters of the prompt left out …]\n" in cut
