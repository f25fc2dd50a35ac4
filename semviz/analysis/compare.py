"""A/B comparison: two (or more) settings on the same prompt and seed, one step axis.

Each side is a :class:`Side`: a label and a :class:`~semviz.sampling.PruneParams`. Sides are
written as short specs so the CLI, the app and the docs share one syntax::

    "story"                          a preset (code, story, qa, brainstorm)
    "plain"                          PruneParams() (plain sampling at T = 1)
    "top_p=0.9"                      overrides of the plain defaults
    "top_p=0.9,gravity_lambda=0.5"   comma-separated key=value; dashes allowed (top-p=0.9)
    "story,temperature=0.7"          a preset with overrides
    "gravity_layers=0/1/2"           tuples use '/'; booleans are on/off

All sides are decoded by their own :class:`~semviz.decoding.decoder.Decoder` over the one shared
model, one token at a time for every side, so a stop request leaves every side at the same
length and both see the same machine load for the tokens/s figure. The sides share the
prompt, the model and the chat template, and none evicts, so each token's forward runs them as
rows of one batch (:func:`~semviz.decoding.together.step_together`); a row's logits equal its own
forward's to float rounding. Each decoder draws from its own generator seeded with the same
seed: where the kept sets agree the draws agree, so the first divergence is caused by the
settings.

:func:`start` builds a comparison (the prompt read once per side), :func:`advance` decodes
more of it (until done, a time budget or a stop request) and :func:`compare` does both.

Examples
--------
>>> parse_side("top_p=0.9,gravity_lambda=0.5").params.gravity_lambda
0.5
>>> parse_side("story,temperature=0.7").label
'story,temperature=0.7'
>>> first_divergence([1, 2, 3], [1, 2, 4])
2
"""

from __future__ import annotations

import difflib
import html
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from semviz.analysis.metrics import METRIC_INFO, RunMetrics, run_metrics
from semviz.output.style import SIDES, WHATIF, rgba
from semviz.output.trace import StepRecord, Trace
from semviz.sampling import PruneParams, parse_field
from semviz.sampling.presets import PRESETS

__all__ = [
    "Comparison",
    "Side",
    "advance",
    "compare",
    "comparison_figure",
    "diff_html",
    "first_divergence",
    "format_metric",
    "kept_axis",
    "markdown_table",
    "parse_side",
    "start",
    "text_diff",
]

PLAIN = ("plain", "default", "none")


@dataclass(frozen=True)
class Side:
    """One setting under comparison."""

    label: str
    params: PruneParams

    def changes(self) -> dict:
        """Fields that differ from plain sampling (what a table should show)."""
        base = PruneParams().to_dict()
        return {k: v for k, v in self.params.to_dict().items() if base[k] != v}


def parse_side(spec: str, label: str | None = None) -> Side:
    """A :class:`Side` from a spec (see the module docstring); ``ValueError`` names the part.

    Parameters
    ----------
    spec : preset name, "plain", key=value overrides, or a preset followed by overrides.
    label : shown in tables and charts; default the spec itself.
    """
    if spec is None or not spec.strip():
        raise ValueError("a side is empty: give a preset name or key=value settings")
    params = PruneParams()
    changes: dict = {}
    for i, part in enumerate(p.strip() for p in spec.split(",")):
        if not part:
            continue
        if "=" not in part:
            if i != 0:
                raise ValueError(f"{part!r}: only the first part may be a preset name")
            if part.lower() in PLAIN:
                continue
            if part not in PRESETS:
                raise ValueError(
                    f"unknown preset {part!r}; choose from {', '.join(PRESETS)} or plain, "
                    "or write key=value settings"
                )
            params = PRESETS[part].params
            continue
        key, raw = (s.strip() for s in part.split("=", 1))
        key = key.replace("-", "_")
        if key == "preset":
            if i != 0 or raw not in PRESETS:
                raise ValueError(f"preset={raw!r}: give a known preset as the first part")
            params = PRESETS[raw].params
            continue
        changes[key], _ = parse_field(key, raw)  # ValueError names the key, with a hint
    params = params.replace(**changes) if changes else params  # validates, naming the field
    return Side(label=label or spec.strip(), params=params)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the token sequences differ (or where one ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def text_diff(a: Sequence[str], b: Sequence[str]) -> list[tuple[str, str, str]]:
    """Token-level diff: ``[(op, a_text, b_text)]`` with op in equal/replace/delete/insert."""
    sm = difflib.SequenceMatcher(a=list(a), b=list(b), autojunk=False)
    return [(op, "".join(a[i1:i2]), "".join(b[j1:j2])) for op, i1, i2, j1, j2 in sm.get_opcodes()]


DIFF_BG = (rgba(SIDES[0], 0.28), rgba(SIDES[1], 0.28))  # A's and B's changed runs


def diff_html(a: Sequence[str], b: Sequence[str]) -> tuple[str, str]:
    """Both texts as HTML with the differing runs tinted in their side's colour."""
    left, right = [], []
    for op, x, y in text_diff(a, b):
        ex, ey = html.escape(x), html.escape(y)
        if op == "equal":
            left.append(ex)
            right.append(ey)
        else:
            if x:
                left.append(f'<span style="background:{DIFF_BG[0]}">{ex}</span>')
            if y:
                right.append(f'<span style="background:{DIFF_BG[1]}">{ey}</span>')
    style = "font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-word"
    return (f'<div style="{style}">{"".join(p)}</div>' for p in (left, right))  # type: ignore[return-value]


@dataclass
class Comparison:
    """Sides decoded on one prompt and seed.

    Attributes
    ----------
    target : tokens asked for per side
    stopped : a stop request ended the decoding before every side was done
    decoders : one per side while the comparison can go on (:func:`advance`); empty after
        :meth:`release`
    """

    prompt: str
    seed: int
    sides: list[Side]
    traces: list[Trace]
    stopped: bool = False
    target: int = 0
    extra: dict = field(default_factory=dict)
    decoders: list = field(default_factory=list, repr=False, compare=False)

    @property
    def steps(self) -> int:
        return min((len(t.steps) for t in self.traces), default=0)

    @property
    def finished(self) -> bool:
        """Every side is done: ``target`` tokens, or its own stop (EOS, a stop string)."""
        return all(d.done for d in self.decoders)

    def release(self) -> None:
        """Drop the decoders (their caches) once no more tokens are wanted."""
        self.decoders = []

    def metrics(self) -> list[RunMetrics]:
        return [run_metrics(t) for t in self.traces]

    def metrics_table(self, names: Sequence[str] | None = None):
        """The sides' metrics for reading: one row per metric, one column per side (``names``,
        default the sides' labels) and ``means``, what the metric measures; values are
        :func:`format_metric` strings, so a metric a side has none of reads ``–``, not None."""
        import pandas as pd

        names = [s.label for s in self.sides] if names is None else list(names)
        ds = [m.to_dict() for m in self.metrics()]
        cols = {
            n: [format_metric(k, d[k]) for k in METRIC_INFO] for n, d in zip(names, ds, strict=True)
        }
        index = pd.Index([label for label, _ in METRIC_INFO.values()], name="metric")
        return pd.DataFrame({**cols, "means": [u for _, u in METRIC_INFO.values()]}, index=index)

    def first_divergence(self, i: int = 0, j: int = 1) -> int | None:
        return first_divergence(self.traces[i].token_ids, self.traces[j].token_ids)

    def frame(self):
        """One row per step and side: step, side, token, entropy, kept-set size (long form)."""
        import pandas as pd

        rows = []
        for side, tr in zip(self.sides, self.traces, strict=True):
            for s in tr.steps:
                rows.append(
                    {
                        "step": s.index,
                        "side": side.label,
                        "token": s.token_text,
                        "entropy": s.entropy,
                        "n_kept": s.n_kept,
                        "temperature": s.temperature,
                    }
                )
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        out = {
            "prompt": self.prompt,
            "seed": self.seed,
            "stopped": self.stopped,
            "steps": self.steps,
            "sides": [
                {
                    "label": s.label,
                    "changes": s.changes(),
                    "text": t.text,
                    "tokens": len(t.steps),
                    "stop_reason": t.stop_reason,
                    "metrics": _finite(m.to_dict()),
                }
                for s, t, m in zip(self.sides, self.traces, self.metrics(), strict=True)
            ],
        }
        if len(self.sides) >= 2:
            out["first_divergence"] = self.first_divergence()
        return out


def _finite(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def start(
    lm,
    prompt: str,
    sides: Sequence[Side],
    *,
    steps: int = 64,
    seed: int = 0,
    chat: bool | None = None,
    capture: bool = False,
) -> Comparison:
    """A comparison of ``sides`` on ``prompt``, each side's prompt read, no token decoded yet.

    Parameters
    ----------
    lm : the shared ``LoadedModel``
    sides : two or more :class:`Side` (one works too)
    steps : tokens to decode per side
    capture : record attention (not needed for the metrics; gravity turns it on when needed)
    """
    from semviz.decoding.decoder import Decoder, DecodeSettings

    if not sides:
        raise ValueError("compare needs at least one side")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    settings = DecodeSettings(seed=seed, max_new_tokens=steps, chat=chat, capture=capture)
    decoders = [Decoder(lm, prompt, s.params, settings) for s in sides]
    return Comparison(
        prompt=prompt,
        seed=seed,
        sides=list(sides),
        traces=[d.trace for d in decoders],
        target=steps,
        decoders=decoders,
    )


def advance(
    cmp: Comparison,
    *,
    seconds: float | None = None,
    on_step: Callable[[int, StepRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Decode one token per side at a time, every side in one forward, until all are done.

    Parameters
    ----------
    seconds : return after about this long (at least one token), to be called again
    on_step : called as ``on_step(side_index, record)`` after every token
    should_stop : polled before every token; True stops all sides where they are and marks
        the comparison ``stopped``

    Returns
    -------
    How many tokens each side advanced.
    """
    from semviz.decoding.together import step_together

    t0 = time.perf_counter()
    made = 0
    while not cmp.finished:
        if should_stop is not None and should_stop():
            cmp.stopped = True
            break
        for i, rec in enumerate(step_together(cmp.decoders)):
            if rec is not None and on_step is not None:
                on_step(i, rec)
        made += 1
        if seconds is not None and time.perf_counter() - t0 >= seconds:
            break
    return made


def compare(
    lm,
    prompt: str,
    sides: Sequence[Side],
    *,
    steps: int = 64,
    seed: int = 0,
    chat: bool | None = None,
    capture: bool = False,
    on_step: Callable[[int, StepRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Comparison:
    """Decode ``steps`` tokens for every side (:func:`start`, then :func:`advance`); a stop
    request keeps what was made. ``cmp.stopped`` is True when ``should_stop`` ended it."""
    cmp = start(lm, prompt, sides, steps=steps, seed=seed, chat=chat, capture=capture)
    advance(cmp, on_step=on_step, should_stop=should_stop)
    return cmp


# -- tables ---------------------------------------------------------------------------------


def format_metric(name: str, v) -> str:
    """A metric as a table shows it: a dash where it has no value (``mean_gravity`` with
    gravity off, a rate of a text too short for its n-grams), counts with thousands separators.

    >>> [format_metric(k, v) for k, v in (("mean_gravity", None), ("mean_kept", 49152.0),
    ...                                   ("steps", 64), ("distinct_1", 0.75))]
    ['–', '49,152.0', '64', '0.750']
    """
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if name in ("steps",):
        return f"{int(v):,}"
    if name in ("mean_kept", "tokens_per_s"):
        return f"{v:,.1f}"
    return f"{v:.3f}"


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of metric rows (each ``{"side": label, <metric>: value, …}``)."""
    cols = list(columns or METRIC_INFO)
    head = ["side"] + [METRIC_INFO[c][0] if c in METRIC_INFO else c for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * len(cols)) + "|"]
    for r in rows:
        cells = [f"`{r['side']}`"] + [format_metric(c, r.get(c)) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_rows(per_prompt: Sequence[Sequence[RunMetrics]], labels: Sequence[str]) -> list[dict]:
    """Average each side's metrics over prompts: ``per_prompt[p][side]`` → one row per side."""
    rows = []
    for i, label in enumerate(labels):
        ms = [run[i].to_dict() for run in per_prompt if i < len(run)]
        row: dict = {"side": label}
        for k in METRIC_INFO:
            vals = [m[k] for m in ms if m[k] is not None and math.isfinite(m[k])]
            if k == "steps":
                row[k] = sum(vals)
            else:
                row[k] = sum(vals) / len(vals) if vals else None
        rows.append(row)
    return rows


# -- figure ---------------------------------------------------------------------------------

SIDE_COLORS = SIDES  # one colour per side, in the line and in its text


def kept_axis(counts: Sequence[int]) -> dict:
    """The kept-set axis: whole token counts with thousands separators, from 1 (or 0) up.

    Past 50 tokens the axis is log with one tick per decade (1, 10, 100, 1,000, …), so a
    side that keeps the whole vocabulary and one that keeps a handful share it, and a flat
    line still sits among labelled decades rather than between Plotly's 2s and 5s.

    >>> kept_axis([49152, 49152])["tickvals"]
    [1, 10, 100, 1000, 10000, 100000]
    >>> kept_axis([1, 3])["dtick"]
    1
    """
    top = max(counts, default=1)
    if top > 50:
        decades = math.ceil(math.log10(top))
        return {
            "type": "log",
            "range": [-0.1, math.log10(top) + 0.15],
            "tickvals": [10**d for d in range(decades + 1)],
            "tickformat": ",d",
        }
    axis = {"type": "linear", "rangemode": "tozero", "tickformat": ",d"}
    if top <= 10:
        axis["dtick"] = 1  # no 0.5 ticks between whole tokens
    return axis


def comparison_figure(cmp: Comparison):
    """Entropy and kept-set size of every side on one step axis; the first divergence marked."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=["raw entropy H, nats", "kept-set size"],
    )
    for i, (side, tr) in enumerate(zip(cmp.sides, cmp.traces, strict=True)):
        color = SIDE_COLORS[i % len(SIDE_COLORS)]
        x = [s.index for s in tr.steps]
        toks = [[s.token_text] for s in tr.steps]
        fig.add_scatter(
            x=x,
            y=[s.entropy for s in tr.steps],
            mode="lines+markers",
            marker={"size": 4},
            name=side.label,
            legendgroup=side.label,
            line={"color": color},
            customdata=toks,
            hovertemplate="step %{x} %{customdata[0]!r}<br>H=%{y:.3f}<extra>"
            + side.label
            + "</extra>",
            row=1,
            col=1,
        )
        fig.add_scatter(
            x=x,
            y=[s.n_kept for s in tr.steps],
            mode="lines",
            line={"color": color, "shape": "hv"},
            name=side.label,
            legendgroup=side.label,
            showlegend=False,
            customdata=toks,
            hovertemplate="step %{x} %{customdata[0]!r}<br>kept %{y:,}<extra>"
            + side.label
            + "</extra>",
            row=2,
            col=1,
        )
    fd = cmp.first_divergence() if len(cmp.traces) >= 2 else None
    if fd is not None:
        for r in (1, 2):
            fig.add_vline(x=fd, line={"color": WHATIF, "width": 2}, row=r, col=1)
        fig.add_annotation(
            x=fd,
            y=1.0,
            xref="x",
            yref="paper",
            text=f"first divergence: step {fd}",
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"color": WHATIF},
        )
    fig.update_yaxes(kept_axis([s.n_kept for tr in cmp.traces for s in tr.steps]), row=2, col=1)
    fig.update_xaxes(title="step", row=2, col=1)
    fig.update_layout(
        height=480,
        margin={"l": 50, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.15, "x": 0.0},
    )
    return fig
