"""Reports: a recorded trace as one offline HTML page, one PNG per chart, JSON and Parquet.

The charts are :mod:`semviz.output.charts` figures built from the trace alone (no model run), in
the order :func:`views` lists them. The app's Report page draws the same list, so a trace
reloaded in the app shows exactly the views the report shows.

A report folder holds::

    report.html     every chart interactive, plotly.js inline (opens with no network)
    report.json     manifest: settings, model, prompt, text, metrics, charts and files
    trace.json      the trace (``Trace.load`` reads it back bit-exact)
    trace.parquet   one row per step (``Trace.to_dataframe``)
    png/<name>.png  one image per chart, exported offline

PNGs are exported by Plotly's kaleido driving a local chromium (no CDN: MathJax is off and
plotly.js is the copy shipped with plotly.py), or, when kaleido fails, by a Playwright
screenshot of each chart in ``report.html``.

Examples
--------
>>> rep = build(Trace.load("trace.json"), "out", tokenizer=lm.tokenizer)  # doctest: +SKIP
>>> rep.pngs  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import math
import os
import shutil
import unicodedata
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from semviz.analysis import lens
from semviz.analysis.metrics import METRIC_INFO, run_metrics
from semviz.analysis.replay import WhatIf
from semviz.model.forward import kv_bytes_per_token
from semviz.output import charts, escape, files, style
from semviz.output.trace import Trace
from semviz.sampling import PruneParams

__all__ = [
    "OUTPUTS",
    "PNG_WIDTH",
    "VECTOR_FORMATS",
    "Report",
    "View",
    "build",
    "chromium_path",
    "export_pngs",
    "export_vector",
    "report_html",
    "shown_state",
    "text_preview",
    "trace_params",
    "views",
    "zip_bytes",
]

FORMAT = "semviz-report"
OUTPUTS = ("report.html", "report.json", "trace.json", "trace.parquet", "png")  # what build writes
PNG_WIDTH = 1000
TITLE_ROOM = 40  # px above an exported chart for the view's title
Progress = Callable[[str, float], None]


@dataclass
class View:
    """One chart of the report: a stable name (file name), a title, a caption, the figure.

    ``step``: the selected step a chart over the run marks (a per-step chart's title names
    its step already); the exported image's title names it too.
    """

    name: str
    title: str
    caption: str
    figure: object  # plotly.graph_objects.Figure
    width: int = PNG_WIDTH
    step: int | None = None

    @property
    def export_title(self) -> str:
        """The title an exported image carries: the view's, and the step it marks."""
        return self.title if self.step is None else f"{self.title} · selected step {self.step}"

    @property
    def height(self) -> int:
        h = self.figure.layout.height
        return int(h) if h else 450

    @property
    def png_height(self) -> int:
        """An exported image's height: the chart's, and a band above it for the title."""
        return self.height + TITLE_ROOM

    def title_layout(self) -> dict:
        """The title band of an exported image: the view's title, which names the step a
        per-step view shows, so a PNG read on its own says what it is."""
        return {
            "title": {
                "text": escape.plotly(self.export_title),
                "x": 0,
                "xanchor": "left",
                "xref": "container",
                "y": 1,
                "yanchor": "top",
                "yref": "container",
                "pad": {"t": 12, "l": 14},
                "font": {"size": 16},
            },
            "margin": {"t": _margin_top(self.figure) + TITLE_ROOM},
            "height": self.png_height,
        }

    def exported(self):
        """The figure as a file shows it: on the light export template, whatever theme the
        app gave it, with its title above it (:meth:`title_layout`)."""
        import plotly.graph_objects as go

        fig = go.Figure(self.figure)
        fig.update_layout(template=style.EXPORT_TEMPLATE, **self.title_layout())
        return fig

    def json(self) -> dict:
        """The figure as plain JSON (what the HTML embeds; the page adds the template)."""
        return json.loads(self.figure.to_json())


def _margin_top(fig) -> int:
    t = fig.layout.margin.t
    return 100 if t is None else int(t)  # Plotly's default


# -- building the views ------------------------------------------------------------------------


def trace_params(trace: Trace) -> PruneParams:
    """The pruning parameters the trace was recorded with (defaults for unknown keys)."""
    p = trace.settings.get("params", {}) if isinstance(trace.settings, dict) else {}
    known = set(PruneParams().to_dict())
    return PruneParams.from_dict({k: v for k, v in p.items() if k in known})


def _printable(text: str) -> str:
    """Control characters as escapes: a raw one (form feed…) makes SVG, and so PNG, invalid."""
    if text.isprintable() or all(c in "\n\t" or c.isprintable() for c in text):
        return text
    return "".join(
        c if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cs") else f"\\x{ord(c):02x}"
        for c in text
    )


def _labeler(trace: Trace, tokenizer) -> Callable[[Sequence[int]], list[str]]:
    known = {int(i): t for i, t in zip(trace.prompt_ids, trace.prompt_tokens, strict=False)}
    known.update({s.token_id: s.token_text for s in trace.steps})
    # a piece of a character shows as its bytes, which only the record knows
    memo: dict[int, str] = {s.token_id: style.step_token(s) for s in trace.steps if s.token_hex}
    for k, h in trace.prompt_hex.items():
        if k.isdigit() and int(k) < len(trace.prompt_ids):
            memo[int(trace.prompt_ids[int(k)])] = style.display_token("", h)

    def labels(ids: Sequence[int]) -> list[str]:
        out = []
        for i in (int(x) for x in ids):
            if i not in memo:
                if tokenizer is not None:
                    memo[i] = tokenizer.decode([i])
                else:
                    memo[i] = known.get(i, f"#{i}")
                memo[i] = _printable(memo[i])
            out.append(memo[i])
        return out

    return labels


def views(
    trace: Trace,
    *,
    tokenizer=None,
    selected: int | None = None,
    whatif: WhatIf | None = None,
    lm=None,
) -> list[View]:
    """The report's charts for ``trace``, at step ``selected`` (default: the last step).

    ``tokenizer`` turns candidate ids into text for the per-step charts; without one the
    candidates the trace never decoded are shown as ``#id``. With ``whatif`` (a
    :func:`semviz.analysis.replay.replay` of this trace under other settings) the sampling charts
    (entropy, temperature, kept set, the step's distribution and waterfall, the chain) show
    the replay; attention, cache and timing are the recorded run's either way. With ``lm``
    (the model the run was made with) a run recorded with the lens adds the logit lens and
    direct logit attribution of the selected step; the attention metrics need no model.
    """
    steps = trace.steps
    params = whatif.params if whatif is not None else trace_params(trace)
    if not steps:
        chain = charts.chain_figure(params)
        return [View("chain", "The sampling chain", "The settings, as the core runs them.", chain)]
    n = len(steps)
    sel = n - 1 if selected is None else max(0, min(int(selected), n - 1))
    out = _run_views(trace, params, sel, whatif)
    out += _step_views(trace, params, sel, _labeler(trace, tokenizer), whatif)
    out += _recorded_views(trace, sel)
    out += _lens_views(trace, sel, _labeler(trace, tokenizer), lm)
    out.append(
        View(
            "chain",
            "The sampling chain",
            "The settings "
            + ("of the what-if" if whatif is not None else "the run used")
            + ", in the order the core runs them.",
            charts.chain_figure(params),
            width=1400,  # five boxes a row with their captions need the room
        )
    )
    return out


def _run_views(trace: Trace, params: PruneParams, sel: int, whatif: WhatIf | None) -> list[View]:
    """Entropy, temperature and kept set over the steps (the replay's under a what-if)."""
    if whatif is not None:
        df = charts.step_frame(trace, whatif.results, whatif.chosen)
        first = whatif.first_diff
    else:
        df, first = charts.step_frame(trace), None
    mark = f"the yellow band is the selected step ({sel})"
    if first is not None:
        mark += f", the pink line the first step the what-if changes ({first})"
    return [
        View(
            "entropy",
            "Entropy and varentropy per step",
            f"Raw next-token entropy (nats) with the thresholds the settings act on; {mark}.",
            charts.entropy_figure(df, params, selected=sel, first_diff=first),
            step=sel,
        ),
        View(
            "thermo",
            "Effective temperature, free energy and kept-set size",
            "What the sampler did at each step; crosses mark the safety fallback.",
            charts.thermo_figure(df, selected=sel, first_diff=first),
            step=sel,
        ),
        View(
            "entropy_scatter",
            "Entropy × varentropy",
            "One point per step, coloured by what the sampler did.",
            charts.entropy_scatter(df, selected=sel),
            step=sel,
        ),
    ]


def _step_views(
    trace: Trace, params: PruneParams, sel: int, labels, whatif: WhatIf | None
) -> list[View]:
    """The selected step's distribution, waterfall and rank shifts (``params``: the settings
    shown; with gravity off neither a gravity panel nor rank shifts are drawn)."""
    rec = trace.steps[sel]
    res = whatif.results[sel] if whatif is not None else None
    stages = charts.step_stages(rec, res, params)
    chosen = whatif.chosen[sel] if whatif is not None else rec.chosen_rank
    if res is not None:
        kept = res.kept.numpy()
    else:
        final = stages.get("final")
        kept = None if final is None else np.asarray(final) > 0
    top = min(charts.TOP, rec.cand_ids.numel())
    shown = max(top, chosen + 1)
    token = labels([whatif.token_ids[sel] if whatif is not None else rec.token_id])[0]
    out = [
        View(
            "distribution",
            f"Step {sel}: the distribution at each stage",
            f"Top {top} candidates by raw logit; the yellow band marks the token taken "
            f"({token!r}), pale hatched bars were pruned.",
            charts.distribution_figure(
                labels(rec.cand_ids[:shown].tolist()), stages, kept=kept, chosen=chosen, top=top
            ),
        )
    ]
    wf = [w.to_dict() for w in res.waterfall] if res is not None else rec.waterfall
    out.append(
        View(
            "waterfall",
            f"Step {sel}: what each pruning stage removed",
            "Mass removed by each stage (share of what entered it) and the candidates left.",
            charts.waterfall_figure(wf),
        )
    )
    if (
        "gravity" in stages
        and "raw" in stages
        and not np.array_equal(stages["gravity"], stages["raw"])
    ):
        k = min(200, len(stages["raw"]))
        out.append(
            View(
                "rank_shift",
                f"Step {sel}: ranks before and after gravity",
                "Green lines: tokens gravity promoted; red: demoted; ranks below the top 15 sit "
                "in lanes under the dashed line.",
                charts.rank_shift_figure(
                    labels(rec.cand_ids[:k].tolist()), stages["raw"][:k], stages["gravity"][:k]
                ),
            )
        )
    return out


def _recorded_views(trace: Trace, sel: int) -> list[View]:
    """Attention, the cache and timing: what the live run measured."""
    steps = trace.steps
    rec = steps[sel]
    out = []
    ctx_tokens = [
        _printable(t) if (h := trace.prompt_hex.get(str(i))) is None else style.display_token(t, h)
        for i, t in enumerate(trace.prompt_tokens)
    ] + [_printable(s.token_text) if s.token_hex is None else style.step_token(s) for s in steps]
    if rec.attention is not None:
        pos = rec.cache_positions.long().tolist()
        out.append(
            View(
                "attention",
                f"Step {sel}: attention by layer over the context",
                "Last-query attention, mean over heads, per layer and cached position; coloured by "
                "log10 of the mass, so the structure beside the attention sink shows.",
                charts.attention_heatmap(
                    rec.attention.float().numpy(),
                    [ctx_tokens[p] if p < len(ctx_tokens) else "?" for p in pos],
                ),
            )
        )
    if any(s.attention is not None for s in steps):
        out.append(
            View(
                "attention_flow",
                "Where each step's attention sat",
                "Steps × original positions, mean over layers and heads, on the same log scale.",
                charts.attention_flow(steps, n_positions=len(ctx_tokens)),
            )
        )
    if "eviction" in trace.settings:
        out.append(
            View(
                "kv_timeline",
                "KV cache: kept and evicted positions, layer 0",
                "Steps × original positions in layer 0's cache: blue kept, orange evicted, blank "
                "not yet written. Each layer keeps its own positions; the app's KV page picks the "
                "layer.",
                charts.kv_timeline_figure(
                    steps, n_positions=len(ctx_tokens), layer=0, selected=sel
                ),
                step=sel,
            )
        )
    m = trace.model
    bpt = None
    if all(k in m for k in ("num_layers", "num_kv_heads", "head_dim")):
        with contextlib.suppress(ValueError):  # a dtype this torch does not know: no formula
            bpt = kv_bytes_per_token(m)
    out.append(
        View(
            "cache_bytes",
            "KV cache size per step",
            "Measured bytes held by the cache, against the formula for a full cache.",
            charts.cache_bytes_figure(steps, bytes_per_token=bpt, prompt_len=len(trace.prompt_ids)),
        )
    )
    out.append(
        View(
            "timing",
            "Prefill and decode time",
            "Prefill reads the whole prompt in one forward; decoding runs one forward per token.",
            charts.timing_figure(
                trace.prefill_seconds, len(trace.prompt_ids), [s.t_forward for s in steps]
            ),
        )
    )
    return out


LENS_GRID_STEPS = 64  # steps in the report's lens grid: the last ones up to the selected step


def _lens_views(trace: Trace, sel: int, labels, lm) -> list[View]:
    """Inside the choice: the logit lens and direct logit attribution of the selected step
    (with the model), and entropix's attention metrics over the run (from the trace)."""
    steps = trace.steps
    rec = steps[sel]
    out = []
    if lm is not None and rec.residual is not None:
        try:
            s = lens.lens_step(lm, rec)
            shown = [
                r
                for r in steps[max(0, sel + 1 - LENS_GRID_STEPS) : sel + 1]
                if r.residual is not None
            ]
            grid = lens.lens_grid(lm, shown)
            ba = lens.block_attribution(lm, rec)
        except lens.LensError:  # another model than the run's: the rest of the report stands
            s = None
        if s is not None:
            token = _printable(rec.token_text)
            out.append(
                View(
                    "lens_layers",
                    f"Step {sel}: the logit lens, layer by layer",
                    f"The rank and probability of {token!r} when the residual stream after each "
                    "layer is read through the final norm and LM head; the last row is the model's "
                    "own distribution.",
                    charts.lens_layers_figure(s, rec.token_text, labels(s.top_ids[:, 0].tolist())),
                )
            )
            out.append(
                View(
                    "lens_grid",
                    "The logit lens: each layer's top token at every step",
                    "Layers × steps, coloured by the probability of the layer's top token.",
                    charts.lens_grid_figure(
                        grid,
                        [labels(row) for row in grid.top_id.tolist()],
                        [r.token_text for r in shown],
                        selected=sel,
                    ),
                    width=1400,
                    step=sel,
                )
            )
            names = labels(ba.token_ids.tolist())
            out.append(
                View(
                    "lens_blocks",
                    f"Step {sel}: each block's direct share of the logit",
                    "Direct logit attribution of the chosen token and the runner-up, the final norm "
                    "linearised at the final residual: "
                    + "; ".join(
                        f"{_printable(n)!r} logit {float(v):.2f}"
                        for n, v in zip(names, ba.logit, strict=True)
                    )
                    + ".",
                    charts.block_contributions_figure(ba, names),
                )
            )
    if any(r.attn_metrics is not None for r in steps):
        df = charts.step_frame(trace)
        out.append(
            View(
                "attention_metrics",
                "Attention metrics per step (entropix)",
                "Attention entropy and varentropy of the last layer's last query (mean over heads), "
                "head agreement and interaction strength, beside the logits' entropy and varentropy.",
                charts.attention_metrics_figure(df, lens.attention_series(trace), selected=sel),
                step=sel,
            )
        )
        out.append(
            View(
                "quadrant",
                "The entropix quadrant",
                "Each step's logits entropy × varentropy, split at the run's medians.",
                charts.quadrant_figure(df, selected=sel),
                step=sel,
            )
        )
    return out


# -- HTML --------------------------------------------------------------------------------------

_CSS = style.report_css()

_JS = """
(function () {
  window.semvizDrawn = 0;
  var figs = document.querySelectorAll('script.semviz-fig');
  var tpl = JSON.parse(document.getElementById('semviz-template').textContent);
  window.semvizCharts = figs.length;
  figs.forEach(function (s) {
    var f = JSON.parse(s.textContent);
    f.layout = f.layout || {};
    f.layout.template = tpl;  // a light page, whatever theme built the figure
    var cfg = {responsive: true, displaylogo: false, toImageButtonOptions: {
      format: 'png', filename: s.dataset.name, width: +s.dataset.width, height: +s.dataset.height}};
    Plotly.newPlot(s.dataset.target, f.data, f.layout, cfg).then(function () {
      window.semvizDrawn += 1;
    });
  });
})();
"""


def _e(x) -> str:
    return html.escape(str(x))


def _shade(v: float) -> str:
    return style.shade(v, style.PROBABILITY_SCALE)


def _text_html(trace: Trace) -> str:
    parts = [f'<span class="prompt">{_e(trace.prompt_text)}</span>']
    for group in _whole_characters(trace.steps):
        s = group[0]
        p = s.chosen_prob
        v = 1.0 - (p if math.isfinite(p) else 0.0)
        tip = f"step {s.index} · p={p:.3f} · H={s.entropy:.2f} nats · kept {s.n_kept}"
        if len(group) > 1:  # one character spread over tokens: one span, the first's shade
            tip = f"steps {s.index}–{group[-1].index} (one character) · " + tip.split(" · ", 1)[1]
        raw = b"".join(_bytes(r) for r in group)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # the run stopped mid-character: show the bytes
            text = style.display_token("", raw)
        parts.append(
            f'<span class="tok" title="{_e(tip)}" style="background:{_shade(v)}">'
            f"{_e(text) or '∅'}</span>"
        )
    return "".join(parts)


PREVIEW_PROMPT_CHARS = 600  # a longer prompt is previewed as its start and its end


def text_preview(trace: Trace, max_prompt_chars: int = PREVIEW_PROMPT_CHARS) -> str:
    """The prompt from its beginning, then the generated text in ⟨ ⟩, as plain text.

    A prompt longer than ``max_prompt_chars`` keeps its first and last parts, with a line
    that says how much of it is left out between them.

    >>> t = Trace({}, {}, "Once upon a time", [1], ["Once upon a time"])
    >>> text_preview(t)
    'Once upon a time⟨⟩'
    >>> print(text_preview(Trace({}, {}, "x", [1], ["a" * 30 + "z" * 30]), 20))
    aaaaaaaaaaaa
    [… 40 characters of the prompt left out …]
    zzzzzzzz⟨⟩
    """
    prompt = trace.prompt_text
    if len(prompt) > max_prompt_chars:
        head, tail = max_prompt_chars * 3 // 5, max_prompt_chars * 2 // 5
        cut = len(prompt) - head - tail
        prompt = (
            f"{prompt[:head]}\n[… {cut:,} characters of the prompt left out …]\n{prompt[-tail:]}"
        )
    return f"{prompt}⟨{trace.text}⟩"


def _bytes(rec) -> bytes:
    return bytes.fromhex(rec.token_hex) if rec.token_hex else rec.token_text.encode()


def _whole_characters(steps) -> list[list]:
    """Steps grouped so that each group's bytes are whole UTF-8 characters (a token that is
    a piece of a character joins the next ones until the character is complete)."""
    groups: list[list] = []
    buf: list = []
    for s in steps:
        buf.append(s)
        try:
            b"".join(_bytes(r) for r in buf).decode("utf-8")
        except UnicodeDecodeError:
            if len(buf) < 4:  # a UTF-8 character is at most 4 bytes: at most 4 tokens
                continue
        groups.append(buf)
        buf = []
    if buf:
        groups.append(buf)
    return groups


def _table(rows: Sequence[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _fmt(v) -> str:
    """A table value: large numbers with thousands separators, never in e-notation
    (``49150.0`` → ``49,150``); others to 4 significant digits.

    >>> [_fmt(v) for v in (49150.0, 1234.5, 3.14159, 0.000123, None, 7)]
    ['49,150', '1,234', '3.142', '0.000123', '–', '7']
    """
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _script_json(obj) -> str:
    # "</" would end the <script> element early; "<\/" is the same JSON string
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def shown_state(whatif: WhatIf | None) -> tuple[str, str]:
    """Which state a view shows, as ``(kind, sentence)``; kind is ``recorded`` or ``what-if``."""
    if whatif is None:
        return "recorded", "The recorded run: what the model and the sampler did."
    head = "The recorded steps re-pruned with other settings (a replay, no model run)"
    if whatif.first_diff is None:
        return "what-if", head + "; no pick changes."
    return "what-if", f"{head}; the picks differ from step {whatif.first_diff} on."


def report_html(
    trace: Trace,
    vs: Sequence[View],
    *,
    selected: int | None = None,
    whatif: WhatIf | None = None,
) -> str:
    """The report as one self-contained HTML page (plotly.js inline, no network needed)."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    params = whatif.params if whatif is not None else trace_params(trace)
    kind, sentence = shown_state(whatif)
    base = PruneParams().to_dict()
    changed = [(k, v) for k, v in params.to_dict().items() if base.get(k) != v]
    other = [(k, v) for k, v in trace.settings.items() if k != "params"]
    m = run_metrics(trace).to_dict()
    n = len(trace.steps)
    sel = (n - 1 if selected is None else max(0, min(int(selected), n - 1))) if n else None
    title = f"semviz report: {trace.model.get('name', '?')}, {n} tokens"
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(title)}</title><style>{_CSS}</style>",
        f"<script>{get_plotlyjs()}</script></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p class='caption'>stop: {_e(trace.stop_reason or 'not stopped (run cut short)')}"
        f" · selected step {sel} · {len(trace.prompt_ids)} prompt tokens</p>",
        f"<p><span class='state state-{'whatif' if whatif is not None else 'recorded'}'>"
        f"{_e(kind)}</span> {_e(sentence)}</p>",
        "<h2>Prompt and generated text</h2>",
        f"<div class='text' id='text'>{_text_html(trace)}</div>",
        "<p class='caption'>Grey: the prompt. Darker tokens were less likely; hover for "
        "probability, entropy and kept-set size.</p>",
        f"<div class='grid'><div><h2>Settings{' of the what-if' if whatif else ''}</h2>",
        _table(changed or [("(all defaults)", "plain sampling")]),
        "<details><summary class='caption'>every setting</summary>",
        _table(list(params.to_dict().items()) + other),
        "</details></div><div><h2>Metrics</h2>",
        _table([(METRIC_INFO[k][0], _fmt(v)) for k, v in m.items()]),
        "<h2>Model</h2>",
        _table([(k, v) for k, v in trace.model.items()]),
        "</div></div>",
    ]
    for v in vs:
        out += [
            f"<h2 id='h-{v.name}'>{_e(v.title)}</h2>",
            f"<p class='caption'>{_e(v.caption)}</p>",
            f"<div class='chart' id='chart-{v.name}' style='height:{v.height}px'></div>",
            f"<script type='application/json' class='semviz-fig' id='fig-{v.name}' "
            f"data-target='chart-{v.name}' data-name='{v.name}' data-width='{v.width}' "
            f"data-height='{v.height}'>{_script_json(v.json())}</script>",
        ]
    tpl = _script_json(pio.templates[style.EXPORT_TEMPLATE].to_plotly_json())
    out += [
        f"<script type='application/json' id='semviz-template'>{tpl}</script>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(out)


# -- PNG export --------------------------------------------------------------------------------


def chromium_path() -> str | None:
    """The chromium to drive: ``$SEMVIZ_CHROMIUM``, ``$BROWSER_PATH``, or Debian's."""
    for p in (os.environ.get("SEMVIZ_CHROMIUM"), os.environ.get("BROWSER_PATH")):
        if p:
            return p
    for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(p).exists():
            return p
    return shutil.which("chromium") or shutil.which("google-chrome")


def _kaleido_export(
    vs: Sequence[View], out: Path, progress: Progress | None, should_stop, fmt: str = "png"
) -> list[Path]:
    import asyncio

    import kaleido

    async def run() -> list[Path]:
        done: list[Path] = []
        kw = {"path": chromium_path()} if chromium_path() else {}
        # mathjax=False: kaleido's default page would fetch MathJax from a CDN
        async with kaleido.Kaleido(n=1, mathjax=False, timeout=120, **kw) as k:
            for i, v in enumerate(vs):
                if should_stop is not None and should_stop():
                    break
                if progress:
                    progress(f"{fmt.upper()} {i + 1}/{len(vs)}: {v.name}", i / max(len(vs), 1))
                opts = {"format": fmt, "width": v.width, "height": v.png_height, "scale": 1}
                img = await k.calc_fig(v.exported(), opts=opts)
                done.append(files.write_bytes(out / f"{v.name}.{fmt}", img))
        return done

    return asyncio.run(run())


def _playwright_export(
    vs: Sequence[View], out: Path, html_path: Path, progress: Progress | None, should_stop
) -> list[Path]:
    from playwright.sync_api import sync_playwright

    done: list[Path] = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=BROWSER_ARGS, headless=True)
        try:
            wide = max([PNG_WIDTH, *(v.width for v in vs)]) + 200
            page = b.new_page(viewport={"width": wide, "height": 900})
            page.route(
                "**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort()
            )
            page.goto(html_path.resolve().as_uri())
            page.wait_for_function("window.semvizDrawn === window.semvizCharts", timeout=60_000)
            for i, v in enumerate(vs):
                if should_stop is not None and should_stop():
                    break
                if progress:
                    progress(f"PNG {i + 1}/{len(vs)}: {v.name}", i / max(len(vs), 1))
                tl = v.title_layout()  # the title band, as kaleido draws it
                page.evaluate(
                    "([id, w, h, t]) => { const d = document.getElementById(id);"
                    " d.style.width = w + 'px'; d.style.height = h + 'px'; d.style.border = '0';"
                    " return Plotly.relayout(d, {title: t.title, 'margin.t': t.margin.t,"
                    " height: h, width: w}); }",
                    [f"chart-{v.name}", v.width, v.png_height, tl],
                )
                path = out / f"{v.name}.png"
                loc = page.locator(f"#chart-{v.name}")
                loc.scroll_into_view_if_needed()
                box = loc.bounding_box()  # the page may place it at a fractional offset
                clip = {
                    "x": round(box["x"]),
                    "y": round(box["y"]),
                    "width": v.width,
                    "height": v.png_height,
                }
                with files.atomic_path(path) as tmp:
                    page.screenshot(path=str(tmp), clip=clip, type="png")
                done.append(path)
        finally:
            b.close()
    return done


BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def export_pngs(
    vs: Sequence[View],
    out: str | Path,
    *,
    engine: str = "auto",
    html_path: str | Path | None = None,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[Path], str]:
    """Write ``out/<name>.png`` for each view; returns the files written and the engine used.

    ``engine``: ``"kaleido"``, ``"playwright"`` (needs ``html_path``, the report page), or
    ``"auto"`` (kaleido, then playwright if kaleido fails). A stop request ends the export
    after the current image; the images already written are kept.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if engine not in ("auto", "kaleido", "playwright"):
        raise ValueError(f"engine must be auto, kaleido or playwright, got {engine!r}")
    if engine in ("auto", "kaleido"):
        try:
            return _off_loop(_kaleido_export, vs, out, progress, should_stop), "kaleido"
        except Exception:
            if engine == "kaleido":
                raise
    if html_path is None:
        raise ValueError("the playwright engine screenshots report.html: pass html_path")
    pngs = _off_loop(_playwright_export, vs, out, Path(html_path), progress, should_stop)
    return pngs, "playwright"


VECTOR_FORMATS = ("svg", "pdf")


def export_vector(
    vs: Sequence[View],
    out: str | Path,
    fmt: str,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[Path]:
    """Write ``out/<name>.<fmt>`` for each view as SVG or PDF (kaleido); returns the files.

    Vector files keep every mark of a chart at any size, for print and papers."""
    if fmt not in VECTOR_FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(VECTOR_FORMATS)}, got {fmt!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return _off_loop(_kaleido_export, vs, out, progress, should_stop, fmt)


def _off_loop(fn, *args):
    """Call ``fn`` here, or in a worker thread when this thread already runs an event loop.

    Both exporters drive a browser through asyncio (kaleido's ``asyncio.run``, Playwright's
    sync API), which refuses to start inside a running loop (a notebook, an async caller).
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


class PngExportError(RuntimeError):
    """The images could not be made; the rest of the report is written (one sentence)."""


# -- the bundle --------------------------------------------------------------------------------


@dataclass
class Report:
    """What :func:`build` wrote."""

    out: Path
    views: list[View]
    html: Path
    manifest: dict
    pngs: list[Path] = field(default_factory=list)
    stopped: bool = False

    def files(self) -> list[Path]:
        return sorted(p for p in self.out.rglob("*") if p.is_file())


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _manifest(trace: Trace, vs: Sequence[View], selected, whatif: WhatIf | None) -> dict:
    """report.json before the PNGs: what the bundle holds and which state it shows."""
    n = len(trace.steps)
    return {
        "format": FORMAT,
        "version": 1,
        "model": trace.model,
        "prompt": trace.prompt,
        "text": trace.text,
        "steps": n,
        "stop_reason": trace.stop_reason,
        "selected": (n - 1 if selected is None else max(0, min(int(selected), n - 1)))
        if n
        else None,
        "settings": trace.settings,
        "shows": {
            "state": shown_state(whatif)[0],
            "params": None if whatif is None else whatif.params.to_dict(),
            "first_diff": None if whatif is None else whatif.first_diff,
        },
        "metrics": run_metrics(trace).to_dict(),
        "charts": [
            # the size of the exported image: the chart and its title band
            {
                "name": v.name,
                "title": v.title,
                "width": v.width,
                "height": v.png_height,
                "png": None,
            }
            for v in vs
        ],
        "files": {"html": "report.html", "trace": "trace.json", "table": "trace.parquet"},
        "png_engine": None,
        "stopped": False,
    }


def build(
    trace: Trace,
    out: str | Path,
    *,
    tokenizer=None,
    selected: int | None = None,
    png: bool = True,
    engine: str = "auto",
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    whatif: WhatIf | None = None,
    lm=None,
    vector: Sequence[str] = (),
) -> Report:
    """Write the report for ``trace`` into ``out`` (created; existing report files replaced).

    The HTML, the trace and the table are written first (fast); then the PNGs, one per
    chart. A stop request skips the PNGs not yet made; the manifest says which exist. With
    ``whatif`` the sampling charts show that replay, and the page and manifest say so; with
    ``lm`` the lens views are added (:func:`views`). ``vector`` ("svg", "pdf") also writes
    every chart in those formats, into ``svg/`` and ``pdf/``.
    """
    for fmt in vector:
        if fmt not in VECTOR_FORMATS:
            raise ValueError(f"vector: {fmt!r} is not one of {', '.join(VECTOR_FORMATS)}")
    out = Path(out)

    def say(msg: str, frac: float) -> None:
        if progress:
            progress(msg, frac)

    say("building the charts", 0.0)
    vs = views(trace, tokenizer=tokenizer, selected=selected, whatif=whatif, lm=lm)
    # all made before the first file is written
    page = report_html(trace, vs, selected=selected, whatif=whatif)
    say("writing report.html", 0.1)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        html_path = files.write_text(out / "report.html", page)
        trace.save(out / "trace.json")
        with files.atomic_path(out / "trace.parquet") as tmp:
            trace.to_dataframe().to_parquet(tmp, index=False)
    except OSError:  # a full disk: a folder made here is not left behind half written
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    manifest = _manifest(trace, vs, selected, whatif)
    pngs: list[Path] = []
    stopped = False
    manifest["stopped"] = png  # until the PNGs are done, so an interrupted bundle says so
    files.write_text(out / "report.json", json.dumps(_clean(manifest), indent=2, default=float))
    if png:
        png_dir = out / "png"
        if png_dir.exists():
            shutil.rmtree(png_dir)

        def sub(msg: str, frac: float) -> None:
            say(msg, 0.15 + 0.85 * frac)

        try:
            pngs, manifest["png_engine"] = export_pngs(
                vs,
                png_dir,
                engine=engine,
                html_path=html_path,
                progress=sub,
                should_stop=should_stop,
            )
        except Exception as exc:  # the browser would not start, or timed out
            detail = (str(exc).strip().splitlines() or ["no detail"])[0][:120]
            raise PngExportError(
                f"the PNG export failed ({type(exc).__name__}: {detail});"
                f" report.html, trace.json and trace.parquet are written in {out}: run again "
                "with --no-png to skip the images"
            ) from exc
        made = {p.stem for p in pngs}
        for c in manifest["charts"]:
            if c["name"] in made:
                c["png"] = f"png/{c['name']}.png"
        stopped = len(pngs) < len(vs)
    for fmt in vector:
        if stopped or (should_stop is not None and should_stop()):
            stopped = True
            break
        folder = out / fmt
        if folder.exists():
            shutil.rmtree(folder)
        made = {p.stem for p in export_vector(vs, folder, fmt, should_stop=should_stop)}
        for c in manifest["charts"]:
            if c["name"] in made:
                c[fmt] = f"{fmt}/{c['name']}.{fmt}"
        stopped = len(made) < len(vs)
    manifest["stopped"] = stopped
    files.write_text(out / "report.json", json.dumps(_clean(manifest), indent=2, default=float))
    say("done", 1.0)
    return Report(out=out, views=vs, html=html_path, manifest=manifest, pngs=pngs, stopped=stopped)


def zip_bytes(folder: str | Path) -> bytes:
    """Every file under ``folder`` as one zip (paths relative to it)."""
    folder = Path(folder)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(folder).as_posix())
    return buf.getvalue()
