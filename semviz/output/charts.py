"""Figures for the app and reports: pure functions from traces and prune results to Plotly.

Nothing here imports streamlit. Inputs are the recorded ``StepRecord``s, the ``PruneResult``s
of a replay, and plain arrays; outputs are ``plotly.graph_objects.Figure``. Every chart caps
what it draws (top candidates, binned context positions) so a long trace stays cheap to
render.

Decisions
---------
- Colours come from :mod:`semviz.output.style`, one per concept. Figures set no template, no
  background and no text colour, so the app's light or dark theme styles them; reports apply
  ``style.EXPORT_TEMPLATE`` when they write a file.
- The selected step and the token taken are a yellow highlighter band, not an outline.
- Attention is coloured by ``log10`` of the mass, clipped at :data:`ATT_FLOOR`, with the same
  scale and range in both attention charts: the sink at position 0 takes up to 0.9 of a row,
  so on a linear scale every other cell is the darkest colour.
- Every point on a step axis carries its step as ``customdata[0]``, so a click on it can
  select that step (the app's chart selections).
- Only Plotly: one grammar means one palette to apply, one selection API and one PNG
  exporter (kaleido). Altair is not used.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from semviz import gravity
from semviz.output import escape, style
from semviz.output.style import display_token
from semviz.output.trace import StepRecord, Trace
from semviz.sampling import PruneParams, PruneResult, active_filters

TOP = 30
MAX_COLS = 400  # context positions drawn before binning
MAX_ROWS = 256  # steps drawn before binning
ATT_FLOOR = 1e-4  # attention mass below this shares the lowest colour
LABELLED_COLS = 64  # attention columns labelled with their token (more: position numbers)
STAGE_ORDER = ("raw", "gravity", "temperature", "final")
STAGE_LABEL = {
    "raw": "raw",
    "gravity": "gravity-adjusted",
    "temperature": "after temperature",
    "final": "final (kept, renormalised)",
}
LOG_PROB_FLOOR = -12  # a log probability axis reaches no lower than 1e-12
STAGE_COLOR = style.STAGE
ACTION_COLOR = style.ACTION

__all__ = [
    "ACTION_COLOR",
    "attention_flow",
    "attention_metrics_figure",
    "attention_heatmap",
    "bin_columns",
    "block_contributions_figure",
    "cache_bytes_figure",
    "chain_figure",
    "chain_stages",
    "cuts",
    "display_token",
    "distribution_figure",
    "entropy_figure",
    "entropy_scatter",
    "fmt_prob",
    "gravity_terms_figure",
    "head_contributions_figure",
    "kv_eval_figure",
    "kv_budgets",
    "kv_layer_positions",
    "kv_timeline_figure",
    "kv_timeline_matrix",
    "lens_grid_figure",
    "lens_layers_figure",
    "lens_row_labels",
    "log_prob_axis",
    "prefill_scaling_figure",
    "quadrant_figure",
    "rank_shift_figure",
    "step_frame",
    "step_stages",
    "thermo_figure",
    "timing_figure",
    "waterfall_figure",
]

_LEGEND = {"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0}


def _layout(fig: go.Figure, title: str | None = None, height: int = 360) -> go.Figure:
    fig.update_layout(
        title=None if title is None else {"text": title, "x": 0.0, "font": {"size": 14}},
        height=height,
        # subplot titles are annotations above the plot area: give them room too
        margin={"l": 50, "r": 20, "t": 44 if title or fig.layout.annotations else 28, "b": 40},
        legend=_LEGEND,
        hoverlabel={"namelength": -1},
    )
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def _np(t) -> np.ndarray:
    if t is None:
        return np.zeros(0)
    if hasattr(t, "detach"):
        return t.detach().float().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


def _show(label: str) -> str:
    """A token made visible (see ``style.display_token``), long ones cut, and markup shown
    as text (Plotly renders ``<b>``, ``<a href>`` … in labels)."""
    s = display_token(label)
    return escape.plotly(s if len(s) <= 14 else s[:13] + "…")


def _text(label: object) -> str:
    """A token (whole) or any text from a trace for a hover label: visible and literal."""
    return escape.plotly(display_token(str(label)))


def fmt_prob(p: float) -> str:
    """A probability a reader can tell from zero: ``0.153``, ``0.0042``, ``3.1e-05``."""
    if not math.isfinite(p):
        return "–"
    if p >= 0.01 or p == 0.0:
        return f"{p:.3f}"
    if p >= 0.001:
        return f"{p:.4f}"
    return f"{p:.1e}"


# --------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------


def step_stages(
    rec: StepRecord, result: PruneResult | None = None, params: PruneParams | None = None
) -> dict[str, np.ndarray]:
    """Per-stage probabilities over the step's K candidates, from a replay or as recorded.

    With ``params`` (the settings shown), a stage they leave off is not returned: with
    gravity off (λ = 0) the gravity stage only repeats the raw bars, so no panel is drawn.
    """
    src = result.index_probs if result is not None else rec.stage_probs
    off = {"gravity"} if params is not None and params.gravity_lambda == 0 else set()
    return {k: _np(src[k]) for k in STAGE_ORDER if k in src and k not in off}


def _base(title: str | None, height: int) -> dict:
    return {
        "title": None if title is None else {"text": title, "x": 0.0, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 50, "r": 20, "t": 44 if title else 28, "b": 40},
        "legend": dict(_LEGEND),
        "hoverlabel": {"namelength": -1},
    }


def _figure(data: list[dict], layout: dict) -> go.Figure:
    """A figure from plain dicts, skipping Plotly's per-property validation.

    Validation costs ~10 ms per trace; the what-if views rebuild ~8 figures on every slider
    move, so they are assembled as dicts (checked by the tests' JSON round trips instead).
    Every axis grows its margin to fit its labels.
    """
    for k, v in layout.items():
        if (k.startswith("xaxis") or k.startswith("yaxis")) and isinstance(v, dict):
            v.setdefault("automargin", True)
    return go.Figure(data=data, layout=layout, _validate=False)


def _rows(n: int, spacing: float = 0.06) -> list[list[float]]:
    """y-domains of ``n`` stacked rows, top first."""
    h = (1.0 - spacing * (n - 1)) / n
    return [
        [
            max(0.0, round(1.0 - (r + 1) * h - r * spacing, 6)),
            min(1.0, round(1.0 - r * h - r * spacing, 6)),
        ]
        for r in range(n)
    ]


def _stacked(n: int, titles: Sequence[str], spacing: float = 0.06) -> dict:
    """Layout axes for ``n`` rows sharing one x axis, with a title above each row."""
    lay: dict = {}
    ann = []
    for r, dom in enumerate(_rows(n, spacing), start=1):
        sfx = "" if r == 1 else str(r)
        lay[f"yaxis{sfx}"] = {"domain": dom, "anchor": f"x{sfx}"}
        lay[f"xaxis{sfx}"] = {
            "anchor": f"y{sfx}",
            "matches": "x" if r > 1 else None,
            "showticklabels": r == n,
        }
        ann.append(
            {
                "text": titles[r - 1],
                "x": 0.5,
                "y": dom[1],
                "xref": "paper",
                "yref": "paper",
                "xanchor": "center",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 12},
            }
        )
    lay["annotations"] = ann
    return lay


def _band(x: float, half: float, xref: str = "x", yref: str = "y domain") -> dict:
    """The focus highlighter: a translucent yellow band over ``x ± half``."""
    return {
        "type": "rect",
        "xref": xref,
        "x0": x - half,
        "x1": x + half,
        "yref": yref,
        "y0": 0,
        "y1": 1,
        "fillcolor": style.rgba(style.FOCUS, style.FOCUS_ALPHA),
        "line": {"width": 0},
        "layer": "below",
    }


def _candidate_index(n: int, chosen: int | None, available: int) -> list[int]:
    """The top ``n`` candidates, plus the chosen one when it ranks below them."""
    idx = list(range(n))
    if chosen is not None and n <= chosen < available:
        idx.append(int(chosen))
    return idx


def distribution_figure(
    labels: Sequence[str],
    stages: dict[str, np.ndarray],
    *,
    kept: np.ndarray | None = None,
    chosen: int | None = None,
    mode: str = "side",
    top: int = TOP,
    stages_shown: Sequence[str] = STAGE_ORDER,
    horizontal: bool = False,
    log: bool = False,
) -> go.Figure:
    """Raw / gravity-adjusted / after temperature / final probabilities of the top candidates.

    Parameters
    ----------
    labels : token texts of the candidates, in candidate order (at least ``top``; up to
        ``chosen`` to draw a chosen token that ranks below the top).
    stages : stage name → (K,) probabilities over the candidates.
    kept : (K,) bool, tokens that survived every filter; in the final panel the others are
        pale hatched bars at the probability they had when the filters cut them.
    chosen : candidate index of the token taken: highlighted, and drawn as an extra bar
        after the top ones when it ranks below them.
    mode : ``"side"`` one panel per stage, ``"overlay"`` grouped bars in one panel.
    horizontal : overlay only: candidates down the y axis (long labels stay level).
    log : a log probability axis, so the tail of a peaked distribution shows; every panel
        gets the same decades (:func:`log_prob_axis`).
    """
    names = [s for s in stages_shown if s in stages]
    size = min([len(labels), *(len(stages[s]) for s in names)]) if names else 0
    n = min(top, size)
    idx = _candidate_index(n, chosen, size)
    cats = [f"{i + 1}. {_show(labels[i])}" for i in idx]
    focus = idx.index(chosen) if chosen is not None and chosen in idx else None
    kept_all = np.ones(size, bool) if kept is None else np.asarray(kept[:size], bool)
    kept_n = kept_all[idx] if size else kept_all
    axis = log_prob_axis([stages[s][idx] for s in names]) if log else {}
    if mode == "overlay" or len(names) <= 1:
        return _overlay(names, stages, idx, cats, focus, horizontal, axis)
    layout = _base(None, 150 * len(names) + 110)
    layout.update(_stacked(len(names), [STAGE_LABEL[s] for s in names], 0.05))
    layout["shapes"] = []
    # a cut candidate has no final probability: its final bar is a pale hatched ghost at the
    # height it had when the filters cut it (the stage before them)
    before = next((b for b in ("temperature", "gravity", "raw") if b in stages), None)
    data = []
    for r, s in enumerate(names, start=1):
        sfx = "" if r == 1 else str(r)
        pruned = [s == "final" and before is not None and not k for k in kept_n.tolist()]
        ys = [
            float(stages[before][i]) if p else float(stages[s][i])
            for i, p in zip(idx, pruned, strict=True)
        ]
        data.append(
            {
                "type": "bar",
                "x": cats,
                "y": ys,
                "name": STAGE_LABEL[s],
                "xaxis": f"x{sfx}",
                "yaxis": f"y{sfx}",
                "showlegend": False,
                "marker": {
                    "color": STAGE_COLOR[s],
                    "opacity": [0.3 if p else 1.0 for p in pruned],
                    "pattern": {"shape": ["/" if p else "" for p in pruned]},
                },
                "customdata": [
                    f"cut by the filters (p {before} = {fmt_prob(y)})" if p else f"p={fmt_prob(y)}"
                    for p, y in zip(pruned, ys, strict=True)
                ],
                "hovertemplate": "%{x}<br>%{customdata}<extra>" + STAGE_LABEL[s] + "</extra>",
            }
        )
        layout[f"yaxis{sfx}"].update(axis)
        if focus is not None:
            layout["shapes"].append(_band(focus, 0.5, f"x{sfx}", f"y{sfx} domain"))
    layout[f"xaxis{len(names) if len(names) > 1 else ''}"].update(
        tickangle=-45, tickfont={"size": 11}
    )
    return _figure(data, layout)


def log_prob_axis(values: Sequence[np.ndarray]) -> dict:
    """A log probability axis from the smallest drawn probability's decade up to p = 1.

    One range for every panel, so a bar's height means the same probability in each; a
    decade per tick (every other one past 8 decades), printed as 10⁻ⁿ. Zeros (a stage
    that leaves a candidate no mass) have no log and are not drawn.

    >>> log_prob_axis([np.array([0.9, 0.02, 3e-5])])["range"]
    [-5, 0.05]
    """
    pos = [float(v) for a in values for v in np.asarray(a, np.float64).ravel() if v > 0]
    lo = max(math.floor(math.log10(min(pos))), LOG_PROB_FLOOR) if pos else -3
    lo = min(lo, -1)  # at least one decade below p = 1
    return {
        "type": "log",
        "range": [lo, 0.05],
        "dtick": 1 if -lo <= 8 else 2,
        "exponentformat": "power",
        "title": {"text": "probability (log)"},
    }


def _overlay(names, stages, idx, cats, focus, horizontal: bool, axis: dict) -> go.Figure:
    """Grouped bars, one colour per stage, in one panel (``axis``: a log probability axis)."""
    data = []
    p = ("%{x" if horizontal else "%{y") + (":.3g}" if axis else ":.4f}")  # a tail reads on log
    for s in names:
        vals = stages[s][idx].tolist()
        xy = {"y": cats, "x": vals, "orientation": "h"} if horizontal else {"x": cats, "y": vals}
        data.append(
            {
                "type": "bar",
                **xy,
                "name": STAGE_LABEL[s],
                "marker": {"color": STAGE_COLOR[s]},
                "hovertemplate": ("%{y}" if horizontal else "%{x}")
                + "<br>p="
                + p
                + "<extra>"
                + STAGE_LABEL[s]
                + "</extra>",
            }
        )
    layout = _base(None, 380)
    prob_axis = axis or {"title": {"text": "probability"}, "rangemode": "tozero"}
    cat_axis = {"type": "category", "tickfont": {"size": 11}}
    if horizontal:
        cat_axis["autorange"] = "reversed"  # rank 1 at the top
        layout.update(barmode="group", bargap=0.2, xaxis=prob_axis, yaxis=cat_axis)
    else:
        cat_axis["tickangle"] = -45
        layout.update(barmode="group", bargap=0.15, xaxis=cat_axis, yaxis=prob_axis)
    if focus is not None:
        band = _band(focus, 0.5, "x", "y domain")
        if horizontal:
            band.update(xref="x domain", x0=0, x1=1, yref="y", y0=focus - 0.5, y1=focus + 0.5)
        layout["shapes"] = [band]
    return _figure(data, layout)


_NOT_CUTS = {"candidates", "gravity", "temperature"}  # waterfall rows that remove nothing


def cuts(waterfall: Sequence[dict]) -> list[dict]:
    """The waterfall rows of the filters that can remove candidates, in chain order."""
    return [w for w in waterfall if w["name"] not in _NOT_CUTS]


def waterfall_figure(waterfall: Sequence[dict]) -> go.Figure:
    """How much mass each pruning stage removed, and how many candidates it left.

    One bar per filter in chain order, labelled with the share of the mass it removed (of what
    entered it); the candidates left are part of the filter's label. Stages that cut nothing
    by design (gravity, temperature, the recorded candidate set) are left out; with no filter
    on, one row says so.
    """
    waterfall = cuts(waterfall)
    if waterfall:
        names = [f"{escape.plotly(w['name'])} → {int(w['n_kept']):,} left" for w in waterfall]
        removed = [100.0 * float(w["mass_removed"]) for w in waterfall]
        text = [f"{v:.1f}%" for v in removed]
    else:
        names, removed, text = ["no filter on"], [0.0], ["nothing removed: every candidate kept"]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "y": names,
            "x": removed,
            "marker": {"color": style.CUT},
            "name": "mass removed",
            "text": text,
            "textposition": "outside",
            "cliponaxis": False,
            "hovertemplate": "%{y}<br>removed %{x:.2f}% of the mass that entered<extra></extra>",
        }
    ]
    layout = _base(None, 100 + 40 * len(names))
    layout.update(
        showlegend=False,
        xaxis={
            "title": {"text": "mass removed, % of what entered the stage"},
            "range": [0, 118],
            "tickvals": [0, 25, 50, 75, 100],
        },
        yaxis={
            "type": "category",
            "autorange": "reversed",
            "tickfont": {"size": 12},
            "ticklabelstandoff": 6,
        },
    )
    return _figure(data, layout)


def _rank(x: np.ndarray) -> np.ndarray:
    """1-based rank of each entry, highest first (ties in index order)."""
    r = np.empty(len(x), int)
    r[np.argsort(-x, kind="stable")] = np.arange(1, len(x) + 1)
    return r


def _lanes(ranks: dict[int, int], top: int) -> dict[int, float]:
    """y position per token: its rank inside the top, else a lane below it in rank order."""
    out = {i: float(r) for i, r in ranks.items() if r <= top}
    below = sorted((r, i) for i, r in ranks.items() if r > top)
    out.update({i: top + 1.0 + k for k, (_, i) in enumerate(below)})
    return out


def rank_shift_figure(
    labels: Sequence[str], raw: np.ndarray, adjusted: np.ndarray, top: int = 15
) -> go.Figure:
    """Ranks before and after gravity for the tokens in either top ``top``.

    A line per token from its raw rank (left) to its gravity-adjusted rank (right): green when
    gravity promoted it, red when it was demoted, grey when unchanged. A token ranked below
    the top on one side sits in a lane under the dashed line, labelled with its real rank,
    so one far outlier does not squash the top ranks.
    """
    raw, adjusted = np.asarray(raw, float), np.asarray(adjusted, float)
    k = min(len(raw), len(adjusted), len(labels))
    r_raw, r_adj = _rank(raw[:k]), _rank(adjusted[:k])
    show = [i for i in range(k) if r_adj[i] <= top or r_raw[i] <= top]
    y_raw = _lanes({i: int(r_raw[i]) for i in show}, top)
    y_adj = _lanes({i: int(r_adj[i]) for i in show}, top)
    data = []
    for i in sorted(show, key=lambda i: r_adj[i]):
        d = int(r_raw[i] - r_adj[i])
        color = style.KEPT if d > 0 else (style.CUT if d < 0 else style.REFERENCE)
        lab = _show(labels[i])
        left = f"{lab}  {r_raw[i]}" if r_raw[i] > top else lab
        right = f"{r_adj[i]}  {lab}" if r_adj[i] > top else lab
        data.append(
            {
                "type": "scatter",
                "x": [0, 1],
                "y": [y_raw[i], y_adj[i]],
                "mode": "lines+markers+text",
                "text": [left, f"{right} ({'+' if d > 0 else ''}{d})"],
                "textposition": ["middle left", "middle right"],
                "cliponaxis": False,
                "line": {"color": color, "width": 2.5 if d else 1},
                "marker": {"size": 6},
                "showlegend": False,
                "hovertemplate": f"{lab}: rank {r_raw[i]} → {r_adj[i]}<extra></extra>",
            }
        )
    moved = sum(1 for i in show if r_adj[i] <= top and r_raw[i] != r_adj[i])
    entered = sum(1 for i in show if r_adj[i] <= top < r_raw[i])
    title = f"{moved} of the top {top} moved"  # short: it sits over a half-width column
    if entered:
        title += f", {entered} rose from below"
    lanes = max([top, *y_raw.values(), *y_adj.values()])
    layout = _base(title, 22 * lanes + 110)
    layout.update(
        yaxis={"range": [lanes + 0.6, 0.4], "visible": False},
        xaxis={
            "range": [-0.75, 1.75],
            "tickvals": [0, 1],
            "side": "top",
            "ticktext": ["raw rank", "after gravity"],
            "showgrid": False,
            "zeroline": False,
        },
        margin={"l": 10, "r": 10, "t": 70, "b": 10},
    )
    if lanes > top:
        layout["shapes"] = [
            {
                "type": "line",
                "xref": "x domain",
                "x0": 0,
                "x1": 1,
                "yref": "y",
                "y0": top + 0.5,
                "y1": top + 0.5,
                "line": {"color": style.REFERENCE, "width": 1, "dash": "dash"},
            }
        ]
    return _figure(data, layout)


# --------------------------------------------------------------------------------------------
# Across steps
# --------------------------------------------------------------------------------------------


def step_frame(trace: Trace, results: Sequence[PruneResult] | None = None, chosen=None):
    """One row per step: entropy, varentropy, temperature, free energy, kept, action.

    With ``results`` (a replay) the per-step quantities come from it, so what-if sliders move
    every curve; ``chosen`` gives the replay's picks (candidate indices).
    """
    import pandas as pd

    rows = []
    for i, rec in enumerate(trace.steps):
        res = results[i] if results is not None else None
        rank = int(chosen[i]) if chosen is not None else rec.chosen_rank
        fallback = res.fallback if res is not None else rec.fallback
        greedy = res.greedy if res is not None else rec.temperature == 0.0
        if fallback:
            action = "safety fallback"
        elif greedy:
            action = "greedy"
        elif rank == 0:
            action = "took the top token"
        else:
            action = "took a lower-ranked token"
        rows.append(
            {
                "step": i,
                "token": rec.token_text if rec.token_hex is None else style.step_token(rec),
                "entropy": res.entropy_raw if res is not None else rec.entropy,
                "varentropy": res.varentropy_raw if res is not None else rec.varentropy,
                "entropy_sampled": res.entropy_sampled if res is not None else rec.entropy_sampled,
                "temperature": res.temperature if res is not None else rec.temperature,
                "free_energy": res.free_energy if res is not None else rec.free_energy,
                "n_kept": res.n_kept if res is not None else rec.n_kept,
                "fallback": fallback or "",
                "action": action,
                "rank": rank,
            }
        )
    return pd.DataFrame(rows)


def entropy_bands(params: PruneParams) -> list[tuple[float, float, str, str]]:
    """(low, high, label, colour) bands of the thresholds the settings act on, in nats."""
    # reference thresholds: grey, so the entropy line keeps its contrast over them
    bands = [(0.0, 0.5, "confident (H < 0.5)", style.rgba(style.REFERENCE, 0.12))]
    bands.append((3.0, 3.0 + 50.0, "uncertain (H > 3)", style.rgba(style.REFERENCE, 0.18)))
    temp = style.STAGE["temperature"]
    if params.adaptive == "target":
        t = params.target_entropy
        bands.append((t - 0.05, t + 0.05, f"target entropy {t:g}", style.rgba(temp, 0.45)))
    if params.adaptive == "mirostat":
        t = params.mirostat_tau * math.log(2.0)
        label = f"mirostat τ {params.mirostat_tau:g} bits"
        bands.append((t - 0.05, t + 0.05, label, style.rgba(temp, 0.45)))
    if params.fallback:
        t = params.fallback_collapse_threshold
        bands.append((0.0, t, f"collapse < {t:g}", style.rgba(style.CUT, 0.22)))
    return bands


def _vlines(selected, first_diff, axes: Sequence[str] = ("",), n: int = 0) -> list[dict]:
    """The selected step as a focus band, the first what-if change as a pink line."""
    half = max(0.5, n / 300.0)  # at least a visible sliver on a long run
    out = []
    for sfx in axes:
        if selected is not None:
            out.append(_band(selected, half, f"x{sfx}", f"y{sfx} domain"))
        if first_diff is not None:
            out.append(
                {
                    "type": "line",
                    "x0": first_diff,
                    "x1": first_diff,
                    "xref": f"x{sfx}",
                    "y0": 0,
                    "y1": 1,
                    "yref": f"y{sfx} domain",
                    "line": {"color": style.WHATIF, "width": 2},
                }
            )
    return out


def _col(df, name: str) -> list:
    return df[name].tolist() if len(df) else []


def _step_data(df) -> list[list]:
    """``[step, token]`` per row: the step a click selects, and the token for the hover."""
    return [[s, _text(t)] for s, t in zip(_col(df, "step"), _col(df, "token"), strict=True)]


_KEEP_OPAQUE = {"marker": {"opacity": 1.0}}  # a clicked point does not dim the others


def entropy_figure(
    df,
    params: PruneParams,
    *,
    selected: int | None = None,
    first_diff: int | None = None,
) -> go.Figure:
    """Entropy and varentropy per step with the settings' thresholds as bands."""
    hmax = float(df["entropy"].max()) if len(df) else 1.0
    top = max(hmax * 1.1, 3.5)
    shapes, ann = [], []
    for lo, hi, label, color in entropy_bands(params):
        y1 = min(hi, top)
        shapes.append(
            {
                "type": "rect",
                "xref": "x domain",
                "x0": 0,
                "x1": 1,
                "yref": "y",
                "y0": lo,
                "y1": y1,
                "fillcolor": color,
                "line": {"width": 0},
                "layer": "below",
            }
        )
        ann.append(
            {
                "x": 0,
                "xref": "paper",
                "y": y1 if hi - lo > 0.2 else hi,
                "yref": "y",
                "text": label,
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "top",
                "font": {"size": 11},
            }
        )
    steps, cd = _col(df, "step"), _step_data(df)
    data = [
        {
            "type": "scatter",
            "x": steps,
            "y": _col(df, "entropy"),
            "name": "entropy H (nats)",
            "mode": "lines+markers",
            "marker": {"size": 5},
            "line": {"color": style.ENTROPY},
            "customdata": cd,
            "unselected": _KEEP_OPAQUE,
            "hovertemplate": "step %{x} %{customdata[1]}<br>H=%{y:.3f} nats<extra></extra>",
        },
        {
            "type": "scatter",
            "x": steps,
            "y": _col(df, "varentropy"),
            "yaxis": "y2",
            "name": "varentropy (nats²)",
            "mode": "lines",
            "customdata": cd,
            "line": {"color": style.VARENTROPY, "dash": "dot", "width": 2},
            "hovertemplate": "step %{x}<br>V=%{y:.3f}<extra></extra>",
        },
    ]
    fb = df[df["fallback"] != ""] if len(df) else df
    if len(fb):
        data.append(
            {
                "type": "scatter",
                "x": _col(fb, "step"),
                "y": _col(fb, "entropy"),
                "mode": "markers",
                "name": "safety fallback fired",
                "marker": {"symbol": "x", "size": 11, "color": style.CUT},
                "customdata": [
                    [s, escape.plotly(f)]
                    for s, f in zip(_col(fb, "step"), _col(fb, "fallback"), strict=True)
                ],
                "hovertemplate": "step %{x}: %{customdata[1]}<extra></extra>",
            }
        )
    layout = _base(None, 360)
    layout.update(
        shapes=shapes + _vlines(selected, first_diff, n=len(df)),
        annotations=ann,
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": "entropy, nats"}, "range": [0, top]},
        yaxis2={
            "title": {"text": "varentropy"},
            "overlaying": "y",
            "side": "right",
            "showgrid": False,
            "rangemode": "tozero",
            "tickmode": "auto",
            "nticks": 6,
        },
    )
    return _figure(data, layout)


def thermo_figure(df, *, selected: int | None = None, first_diff: int | None = None) -> go.Figure:
    """Effective temperature, free energy and kept-set size per step; fallbacks marked."""
    titles = ["effective temperature", "free energy F = −T log Σ exp(s/T)", "kept-set size"]
    layout = _base(None, 560)
    layout.update(_stacked(3, titles, 0.07))
    series = [
        ("temperature", style.STAGE["temperature"]),
        ("free_energy", style.FREE_ENERGY),
        ("n_kept", style.KEPT),
    ]
    steps, cd = _col(df, "step"), _step_data(df)
    fb = df[df["fallback"] != ""] if len(df) else df
    data = []
    for r, (col, color) in enumerate(series, start=1):
        sfx = "" if r == 1 else str(r)
        data.append(
            {
                "type": "scatter",
                "x": steps,
                "y": _col(df, col),
                "mode": "lines+markers",
                "marker": {"size": 4},
                "xaxis": f"x{sfx}",
                "yaxis": f"y{sfx}",
                "name": col,
                "line": {"color": color, "shape": "hv" if col == "n_kept" else "linear"},
                "showlegend": False,
                "customdata": cd,
                "unselected": _KEEP_OPAQUE,
                "hovertemplate": "step %{x} %{customdata[1]}<br>%{y:.4g}<extra>" + col + "</extra>",
            }
        )
        if len(fb):
            data.append(
                {
                    "type": "scatter",
                    "x": _col(fb, "step"),
                    "y": _col(fb, col),
                    "mode": "markers",
                    "marker": {"symbol": "x", "size": 10, "color": style.CUT},
                    "xaxis": f"x{sfx}",
                    "yaxis": f"y{sfx}",
                    "name": "safety fallback",
                    "showlegend": r == 1,
                    "customdata": [
                        [s, escape.plotly(f)]
                        for s, f in zip(_col(fb, "step"), _col(fb, "fallback"), strict=True)
                    ],
                    "hovertemplate": "%{customdata[1]}<extra></extra>",
                }
            )
    layout["shapes"] = _vlines(selected, first_diff, ("", "2", "3"), n=len(df))
    layout["xaxis3"]["title"] = {"text": "step"}
    if len(df) and df["n_kept"].max() > 50:
        # powers of ten only, written out: "1,000  10,000" rather than "2 5 10k"
        layout["yaxis3"].update(type="log", dtick=1, tickformat=",d")
    return _figure(data, layout)


def _selected_point(df, selected: int | None, *, legend: bool = True) -> list[dict]:
    """The entropy × varentropy scatters' halo under the selected step (none when out of range)."""
    if selected is None or not 0 <= selected < len(df):
        return []
    row = df.iloc[selected]
    return [
        {
            "type": "scatter",
            "x": [float(row["entropy"])],
            "y": [float(row["varentropy"])],
            "mode": "markers",
            "name": f"selected step {selected}",
            "hoverinfo": "skip",
            "marker": {"size": 24, "color": style.rgba(style.FOCUS, 0.8)},
            "showlegend": legend,
        }
    ]


def entropy_scatter(df, *, selected: int | None = None) -> go.Figure:
    """Entropy × varentropy, one point per step, coloured by what the sampler did."""
    data = _selected_point(df, selected)
    for action, color in ACTION_COLOR.items():
        sub = df[df["action"] == action] if len(df) else df
        if not len(sub):
            continue
        data.append(
            {
                "type": "scatter",
                "x": _col(sub, "entropy"),
                "y": _col(sub, "varentropy"),
                "mode": "markers",
                "name": action,
                "unselected": _KEEP_OPAQUE,
                "marker": {
                    "color": color,
                    "size": 8,
                    "opacity": 0.85,
                    "symbol": "x" if action == "safety fallback" else "circle",
                },
                "customdata": [
                    [s, _text(t), r]
                    for s, t, r in zip(
                        _col(sub, "step"), _col(sub, "token"), _col(sub, "rank"), strict=True
                    )
                ],
                "hovertemplate": "step %{customdata[0]} %{customdata[1]} (rank %{customdata[2]})"
                "<br>H=%{x:.3f}, V=%{y:.3f}<extra></extra>",
            }
        )
    layout = _base(None, 400)
    layout.update(
        xaxis={"title": {"text": "entropy H, nats"}},
        yaxis={"title": {"text": "varentropy, nats²"}},
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0.0},
        margin={"l": 50, "r": 20, "t": 20, "b": 40},
    )
    return _figure(data, layout)


# --------------------------------------------------------------------------------------------
# Attention and gravity
# --------------------------------------------------------------------------------------------


def bin_columns(
    mat: np.ndarray, max_cols: int = MAX_COLS, how: str = "sum"
) -> tuple[np.ndarray, np.ndarray]:
    """Aggregate the last axis into at most ``max_cols`` bins.

    Returns the binned matrix and each bin's first original column index.
    """
    n = mat.shape[-1]
    if n <= max_cols:
        return mat, np.arange(n)
    edges = np.linspace(0, n, max_cols + 1).astype(int)
    starts = edges[:-1]
    red = np.add.reduceat(mat, starts, axis=-1)
    if how == "mean":
        red = red / np.diff(edges)
    return red, starts


def _log_mass(m: np.ndarray) -> np.ndarray:
    """log10 of attention mass, floored at ``ATT_FLOOR``; NaN (no position yet) stays NaN."""
    with np.errstate(invalid="ignore"):
        return np.log10(np.maximum(m, ATT_FLOOR))


def _attention_trace(z: np.ndarray, x, y, **kw) -> dict:
    """A heatmap on the shared attention scale: the same colours mean the same mass."""
    lo = int(round(math.log10(ATT_FLOOR)))
    ticks = list(range(lo, 1))
    return {
        "type": "heatmap",
        "z": _log_mass(z).tolist(),
        "x": list(x),
        "y": list(y),
        "zmin": lo,
        "zmax": 0,
        "colorscale": style.ATTENTION_SCALE,
        "colorbar": {
            "title": {"text": "mass"},
            "tickvals": ticks,
            "ticktext": [f"≤{10.0**lo:g}"] + [f"{10.0**t:g}" for t in ticks[1:]],
        },
        **kw,
    }


def attention_heatmap(
    attention: np.ndarray,
    labels: Sequence[str],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    max_cols: int = MAX_COLS,
    per_head: bool = False,
) -> go.Figure:
    """Attention mass, layers × context tokens, for one step (mean over the chosen heads).

    Coloured by log10 of the mass (see the module docstring); the hover gives the mass.
    ``per_head``: a row for every chosen (layer, head), not their mean over heads: the model
    view, every head of every layer at once.

    Parameters
    ----------
    attention : (L, H, S) last-query attention over the cached positions.
    labels : S labels (token text of each cached position).
    layers, heads : subsets to show / average over (None: all).
    window : (start, stop) slice of cached positions to show; longer views are binned.
    """
    a = np.asarray(attention, dtype=np.float32)  # (L, H, S)
    L = a.shape[0]
    lay = list(range(L)) if not layers else [int(i) for i in layers]
    hd = list(range(a.shape[1])) if not heads else [int(h) for h in heads]
    if per_head:
        m = a[lay][:, hd].reshape(len(lay) * len(hd), -1)  # (L'·H', S)
        rows = [f"L{la} H{h}" for la in lay for h in hd]
    else:
        m = a[lay][:, hd].mean(1)  # (L', S)
        rows = [str(i) for i in lay]
    lab = list(labels)
    off = 0
    if window is not None:
        off, stop = max(0, window[0]), min(m.shape[1], window[1])
        m, lab = m[:, off:stop], lab[off:stop]
    m, starts = bin_columns(m, max_cols)
    xs = [off + int(s) for s in starts]
    if len(starts) < len(lab):
        ends = [off + int(e) - 1 for e in list(starts[1:]) + [len(lab)]]
        names = [f"positions {s}–{e}" for s, e in zip(xs, ends, strict=True)]
    else:
        names = [f"position {off + i} {_show(t)}" for i, t in enumerate(lab)]
    text = [[f"{v:.4f}" for v in row] for row in m.tolist()]
    trace = _attention_trace(
        m,
        xs,
        rows,
        text=text,
        customdata=[names] * len(rows),
        hovertemplate="%{customdata}<br>"
        + ("%{y}" if per_head else "layer %{y}")
        + "<br>mass %{text}<extra></extra>",
    )
    xaxis: dict = {"title": {"text": "context position"}}
    if len(xs) <= LABELLED_COLS and len(starts) == len(lab):
        xaxis.update(
            tickvals=xs,
            ticktext=[f"{x} {_show(t)}" for x, t in zip(xs, lab, strict=True)],
            tickangle=-45 if len(xs) <= 32 else -90,
            tickfont={"size": 11},
        )
    yaxis = {"title": {"text": "layer"}, "autorange": "reversed", "type": "category"}
    if per_head:  # a tick at each layer's first head; the hover names every row
        yaxis.update(
            title={"text": "layer, head"},
            tickvals=rows[:: len(hd)],
            ticktext=[f"L{la}" for la in lay],
            tickfont={"size": 10},
        )
    layout = _base(None, max(320, (5 if per_head else 14) * len(rows) + 170))
    layout.update(xaxis=xaxis, yaxis=yaxis)
    return _figure([trace], layout)


def attention_flow(
    steps: Sequence[StepRecord],
    *,
    n_positions: int,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    max_cols: int = MAX_COLS,
    max_rows: int = MAX_ROWS,
) -> go.Figure:
    """Steps × original positions: where each step's attention mass sat (mean of layers/heads).

    Same colours as :func:`attention_heatmap` (log10 of the mass); positions a step had not
    written yet, or had evicted, are blank.
    """
    idx = list(range(len(steps)))
    if len(idx) > max_rows:
        idx = np.unique(np.linspace(0, len(steps) - 1, max_rows).astype(int)).tolist()
    mat = np.full((len(idx), n_positions), np.nan, dtype=np.float32)
    for r, i in enumerate(idx):
        rec = steps[i]
        if rec.attention is None:
            continue
        a = rec.attention.float()
        if layers:
            a = a[list(layers)]
        if heads:
            a = a[:, list(heads)]
        row = a.mean((0, 1)).numpy()  # (S,)
        pos = rec.cache_positions.long().numpy()
        ok = pos < n_positions
        mat[r, pos[ok]] = row[ok]
    if n_positions > max_cols:
        written = ~np.isnan(mat)
        binned, starts = bin_columns(np.nan_to_num(mat, nan=0.0), max_cols)
        seen, _ = bin_columns(written.astype(np.float32), max_cols)
        binned[seen == 0] = np.nan
        hover = "step %{y}<br>positions from %{x}<br>mass %{text}<extra></extra>"
    else:
        binned, starts = mat, np.arange(n_positions)
        hover = "step %{y}<br>position %{x}<br>mass %{text}<extra></extra>"
    text = [["" if math.isnan(v) else f"{v:.4f}" for v in row] for row in binned.tolist()]
    trace = _attention_trace(
        binned, [int(s) for s in starts], idx, text=text, hovertemplate=hover, hoverongaps=False
    )
    layout = _base(None, 420)
    layout.update(
        xaxis={"title": {"text": "original position"}},
        yaxis={"title": {"text": "step"}, "autorange": "reversed"},
    )
    return _figure([trace], layout)


def gravity_terms_figure(
    labels: Sequence[str], terms: np.ndarray, top: int = 20, positions: Sequence[int] | None = None
) -> go.Figure:
    """The terms ``m_i·sim(w, t_i)`` of G for the chosen token, largest |term| first.

    Green pulled the token (positive term), red pushed it away.
    """
    terms = np.asarray(terms, float)
    pos = list(range(len(terms))) if positions is None else [int(p) for p in positions]
    order = np.argsort(-np.abs(terms), kind="stable")[:top]
    order = order[::-1]
    fig = go.Figure(
        go.Bar(
            x=terms[order],
            y=[f"{pos[i]} {_show(labels[i])}" for i in order],
            orientation="h",
            marker_color=[style.KEPT if terms[i] >= 0 else style.CUT for i in order],
            hovertemplate="%{y}<br>m·sim = %{x:.5f}<extra></extra>",
        )
    )
    fig.update_xaxes(title="contribution m_i · sim(w, t_i)")
    fig.update_yaxes(type="category", tickfont={"size": 11})
    return _layout(fig, None, 22 * len(order) + 100)


# --------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------


def kv_layer_positions(rec: StepRecord, layer: int) -> np.ndarray | None:
    """Original positions ``layer`` holds after step ``rec``'s eviction (None: no eviction
    record, so every layer holds ``rec.cache_positions``)."""
    ev = rec.eviction or {}
    lp = ev.get("positions")
    if lp is None:
        return None
    lp = _np(lp).astype(int)
    lp = lp.reshape(1, -1) if lp.ndim == 1 else lp
    if not 0 <= layer < lp.shape[0]:
        raise ValueError(f"layer {layer} is out of range: the record has {lp.shape[0]} layers")
    row = lp[layer]
    return row[row >= 0]


def kv_budgets(rec: StepRecord) -> list[int] | None:
    """Each layer's budget in step ``rec``'s eviction record (None: no eviction record)."""
    b = (rec.eviction or {}).get("budget")
    return None if b is None else [_count(x, 0) for x in _np(b).reshape(-1)]


def _count(value, default: int) -> int:
    """A count read from a trace's free-form record, or ``default`` when it is not one (a
    loaded file may hold anything there)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return int(default)


def kv_timeline_matrix(
    steps: Sequence[StepRecord], *, n_positions: int, layer: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Steps × original positions for one layer: 1 kept after the step's eviction, 0 written
    earlier and evicted, NaN not yet written; and the policy's score of each kept position.

    One layer at a time: a policy such as H2O keeps its own positions in each layer, so the
    union over layers holds many more positions than any layer's cache does."""
    z = np.full((len(steps), n_positions), np.nan, dtype=np.float32)
    score = np.full((len(steps), n_positions), np.nan, dtype=np.float32)
    for r, rec in enumerate(steps):
        ev = rec.eviction or {}
        # written: every position the step's forward has seen, its own query included
        upto = _count(ev.get("n_seen"), rec.position)
        upto = max(0, min(upto, n_positions))
        z[r, :upto] = 0.0
        held = kv_layer_positions(rec, layer)
        if held is None:
            held = rec.cache_positions.long().numpy()
        else:
            sc = ev.get("scores")
            if sc is not None:
                sc = _np(sc).astype(np.float32)
                sc = sc.reshape(1, -1) if sc.ndim == 1 else sc
                ok = held < n_positions
                score[r, held[ok]] = sc[layer][: len(held)][ok]
        z[r, held[held < n_positions]] = 1.0
    return z, score


def kv_timeline_figure(
    steps: Sequence[StepRecord],
    *,
    n_positions: int,
    layer: int = 0,
    selected: int | None = None,
    max_cols: int = MAX_COLS,
    max_rows: int = MAX_ROWS,
) -> go.Figure:
    """Steps × original positions in one layer's cache: kept, evicted, not yet written (blank).

    Hover shows the policy's score where the step's eviction record has one; ``selected``
    marks that step with a line across the chart.
    """
    idx = list(range(len(steps)))
    if len(idx) > max_rows:
        idx = np.unique(np.linspace(0, len(steps) - 1, max_rows).astype(int)).tolist()
    z, score = kv_timeline_matrix([steps[i] for i in idx], n_positions=n_positions, layer=layer)
    if n_positions > max_cols:
        # binned: the share of each bin's written positions still cached; a bin nothing has
        # been written to stays blank
        written = ~np.isnan(z)
        kept, starts = bin_columns(np.nan_to_num(z, nan=0.0), max_cols, how="sum")
        seen, _ = bin_columns(written.astype(np.float32), max_cols, how="sum")
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(seen > 0, kept / np.maximum(seen, 1), np.nan)
        ss, _ = bin_columns(np.nan_to_num(score, nan=0.0), max_cols, how="mean")
        z, score, xs = share, ss, starts
        hover = "step %{y}<br>positions from %{x}<br>share kept %{z:.2f}<extra></extra>"
    else:
        xs = np.arange(n_positions)
        hover = "step %{y}<br>position %{x}<br>kept %{z}<br>score %{customdata:.4g}<extra></extra>"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=xs,
            y=idx,
            customdata=score,
            zmin=0,
            zmax=1,
            colorscale=style.KV_SCALE,
            colorbar={
                "title": f"layer {layer}",
                "tickvals": [0, 1],
                "ticktext": ["evicted", "kept"],
            },
            hovertemplate=hover,
            hoverongaps=False,
        )
    )
    if selected is not None and 0 <= selected < len(steps):
        # a dashed grey line: the focus yellow sits too close to the evicted orange
        fig.add_hline(
            y=selected,
            line={"color": style.REFERENCE, "width": 2, "dash": "dash"},
            annotation_text=f"step {selected}",
            annotation_position="top left",
        )
    fig.update_yaxes(title="step", autorange="reversed")
    fig.update_xaxes(title="original position")
    return _layout(fig, None, 420)


def cache_bytes_figure(
    steps: Sequence[StepRecord], *, bytes_per_token: float | None = None, prompt_len: int = 0
) -> go.Figure:
    """Measured cache bytes per step, and the formula's line for a full cache."""
    x = [s.index for s in steps]
    y = [s.cache_bytes / 1024.0 for s in steps]
    fig = go.Figure()
    fig.add_scatter(
        x=x,
        y=y,
        mode="lines+markers",
        name="measured cache",
        marker={"size": 5},
        line={"color": style.CACHE},
        customdata=[[i] for i in x],
        unselected={"marker": {"opacity": 1.0}},
        hovertemplate="step %{x}<br>%{y:.1f} KiB<extra></extra>",
    )
    if bytes_per_token:
        full = [bytes_per_token * s.position / 1024.0 for s in steps]
        fig.add_scatter(
            x=x,
            y=full,
            mode="lines",
            name="no eviction: 2·L·kv_heads·head_dim·bytes × tokens",
            line={"dash": "dash", "color": style.REFERENCE},
        )
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="KV cache, KiB", rangemode="tozero")
    return _layout(fig, None, 320)


def kv_eval_figure(rows: Sequence[dict], *, x: str = "budget", ys: Sequence[str] = ()) -> go.Figure:
    """Quality vs cache budget, one line per policy (rows from ``kv_eval``)."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    fig = go.Figure()
    if not len(df):
        return _layout(fig, "no kv-eval results yet", 320)
    metrics = [c for c in ys if c in df.columns] or [
        c for c in df.columns if c not in (x, "policy") and pd.api.types.is_numeric_dtype(df[c])
    ][:1]
    group = "policy" if "policy" in df.columns else None
    dashes = ("solid", "dot", "dash", "dashdot")
    for m, metric in enumerate(metrics):
        for k, (name, sub) in enumerate(df.groupby(group) if group else [("all", df)]):
            sub = sub.sort_values(x)
            fig.add_scatter(
                x=sub[x],
                y=sub[metric],
                mode="lines+markers",
                name=f"{name} · {metric}" if len(metrics) > 1 else str(name),
                line={"color": style.policy_color(str(name), k), "dash": dashes[m % len(dashes)]},
                hovertemplate=f"{name}<br>{x} %{{x}}<br>{metric} %{{y:.4g}}<extra></extra>",
            )
    fig.update_xaxes(title=x)
    fig.update_yaxes(title=", ".join(metrics))
    return _layout(fig, None, 360)


# --------------------------------------------------------------------------------------------
# Pipeline
# --------------------------------------------------------------------------------------------


def timing_figure(
    prefill_seconds: float, n_prompt: int, decode_seconds: Sequence[float]
) -> go.Figure:
    """Prefill time (once, for the whole prompt) against each decode step's forward time."""
    ms = [1e3 * s for s in decode_seconds]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.3, 0.7],
        subplot_titles=[f"prefill: {n_prompt} tokens at once", "decode: one token per forward"],
    )
    per_tok = 1e3 * prefill_seconds / max(n_prompt, 1)
    fig.add_bar(
        x=["prefill total", "prefill per token", "decode median"],
        y=[1e3 * prefill_seconds, per_tok, float(np.median(ms)) if ms else 0.0],
        marker_color=[style.PREFILL, style.rgba(style.PREFILL, 0.55), style.DECODE],
        showlegend=False,
        hovertemplate="%{x}: %{y:.2f} ms<extra></extra>",
        row=1,
        col=1,
    )
    fig.add_scatter(
        x=list(range(1, len(ms) + 1)),
        y=ms,
        mode="lines+markers",
        marker={"size": 4},
        line={"color": style.DECODE},
        name="decode forward",
        showlegend=False,
        row=1,
        col=2,
        hovertemplate="step %{x}: %{y:.2f} ms<extra></extra>",
    )
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(tickangle=-30, row=1, col=1)
    fig.update_xaxes(title="step", row=1, col=2)
    return _layout(fig, None, 340)


def prefill_scaling_figure(lengths: Sequence[int], seconds: Sequence[float]) -> go.Figure:
    """Measured prefill time vs prompt length with a fitted ``a + b·n + c·n²``."""
    n = np.asarray(lengths, float)
    t = 1e3 * np.asarray(seconds, float)
    fig = go.Figure()
    fig.add_scatter(
        x=n,
        y=t,
        mode="markers",
        name="measured",
        marker={"size": 10, "color": style.PREFILL},
        hovertemplate="%{x:.0f} tokens: %{y:.1f} ms<extra></extra>",
    )
    title = None
    if len(n) >= 3:
        coef = np.polyfit(n, t, 2)  # c, b, a
        grid = np.linspace(0, n.max(), 100)
        fig.add_scatter(
            x=grid,
            y=np.polyval(coef, grid),
            mode="lines",
            name="fit a + b·n + c·n²",
            line={"color": style.PREFILL},
        )
        lin = np.polyval([0.0, coef[1], coef[2]], grid)
        fig.add_scatter(
            x=grid,
            y=lin,
            mode="lines",
            name="linear part a + b·n",
            line={"dash": "dot", "color": style.REFERENCE},
        )
        share = coef[0] * n.max() ** 2 / max(np.polyval(coef, n.max()), 1e-9)
        if coef[0] > 0:
            title = f"quadratic term c·n² = {100 * share:.0f}% of the time at {int(n.max())} tokens"
        else:
            title = "no quadratic term measurable at these lengths (timings noisy: measure again)"
    fig.update_xaxes(title="prompt length, tokens", rangemode="tozero")
    fig.update_yaxes(title="prefill time, ms", rangemode="tozero")
    _layout(fig, title, 360)
    # below the plot: the title takes the top-left
    fig.update_layout(legend={"yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0})
    return fig


def chain_stages(params: PruneParams) -> list[tuple[str, str]]:
    """The sampling chain in the order the core runs it for ``params``: (name, detail)."""
    p = params
    out = [("logits", "model output, one per vocabulary token")]
    if p.gravity_lambda != 0.0:
        mode = f"rerank top {p.rerank_k}" if p.gravity_mode == "rerank" else "full vocabulary"
        out.append(
            (
                "gravity",
                f"s = log P + {p.gravity_lambda:g}·G ({gravity.describe(p)}, {mode})",
            )
        )
    temp = {
        "none": f"T = {p.temperature:g}",
        "target": f"T = T0 − gain·(H − {p.target_entropy:g})",
        "edt": "T = T0·N^(θ/H)",
        "dynatemp": f"T in [{max(0, p.temperature - p.dynatemp_range):g}, {p.temperature + p.dynatemp_range:g}] by H",
        "mirostat": f"T = {p.temperature:g}",
        "entropix": (
            f"T = T0·(1 + {p.entropix_logits_gain:g}·(H+V) + {p.entropix_attention_gain:g}"
            f"·(H_attn+V_attn) − {p.entropix_agreement_gain:g}·agreement)"
        ),
    }[p.adaptive]
    if p.temperature == 0.0:
        temp = "greedy (argmax)"
    filters = [(f.label, f.describe(p)) for f in active_filters(p)]
    if p.temperature == 0.0:
        out.append(("greedy", temp))
    elif p.order == "hf":
        out.append(("temperature", temp))
        out.extend(filters)
    else:
        out.extend(filters)
        out.append(("temperature", temp))
    if p.adaptive == "mirostat" and p.temperature > 0:
        out.append(("mirostat", f"τ = {p.mirostat_tau:g} bits"))
    if p.temperature > 0:
        out.append(("renormalise", "softmax over the kept set"))
        out.append(("sample", "inverse CDF with one uniform draw"))
    if p.fallback:
        out.append(("fallback", "loops/collapse → plain sampling"))
    return out


_CHAIN_COLOR = {
    "logits": style.REFERENCE,
    "gravity": style.STAGE["gravity"],
    "temperature": style.STAGE["temperature"],
    "greedy": style.STAGE["temperature"],
    "mirostat": style.STAGE["temperature"],
    "renormalise": style.KEPT,
    "sample": style.KEPT,
}  # the filters cut: style.CUT


def chain_figure(params: PruneParams, *, per_row: int = 5) -> go.Figure:
    """The sampling chain drawn as boxes and arrows, from the live settings.

    Captions are wrapped under their box so neighbours never overlap.
    """
    stages = chain_stages(params)
    n = len(stages)
    xs, ys = [], []
    for i in range(n):
        row, col = divmod(i, per_row)
        xs.append(col if row % 2 == 0 else per_row - 1 - col)
        ys.append(-row)
    arrow = {
        "xref": "x",
        "yref": "y",
        "axref": "x",
        "ayref": "y",
        "showarrow": True,
        "arrowhead": 3,
        "arrowsize": 1.2,
        "arrowwidth": 1.5,
        "arrowcolor": style.REFERENCE,
        "standoff": 22,
        "text": "",
    }
    ann, elbows = [], []
    for i in range(n - 1):
        if ys[i + 1] == ys[i]:
            ann.append(
                {
                    **arrow,
                    "x": xs[i + 1],
                    "y": ys[i + 1],
                    "ax": xs[i],
                    "ay": ys[i],
                    "startstandoff": 22,
                }
            )
            continue
        # to the next row: out past the captions, down, and back in (never across a caption)
        side = 0.5 if xs[i] == per_row - 1 else -0.5
        x, y0, y1 = xs[i], ys[i], ys[i + 1]
        elbows.append(
            {
                "type": "path",
                "xref": "x",
                "yref": "y",
                "path": f"M {x + side / 4},{y0} L {x + side},{y0} L {x + side},{y1}",
                "line": {"color": style.REFERENCE, "width": 1.5},
            }
        )
        ann.append({**arrow, "x": x, "y": y1, "ax": x + side, "ay": y1, "startstandoff": 0})
    ann += [
        {
            "x": x,
            "y": y - 0.2,
            "text": "<br>".join(textwrap.wrap(st[1], 22)) or " ",
            "showarrow": False,
            "xref": "x",
            "yref": "y",
            "yanchor": "top",
            "font": {"size": 11},
        }
        for x, y, st in zip(xs, ys, stages, strict=True)
    ]
    data = [
        {
            "type": "scatter",
            "x": xs,
            "y": ys,
            "mode": "markers+text",
            "text": [f"<b>{i + 1}. {s[0]}</b>" for i, s in enumerate(stages)],
            "textposition": "top center",
            "customdata": [s[1] for s in stages],
            "cliponaxis": False,
            "marker": {
                "size": 28,
                "symbol": "square",
                "color": [_CHAIN_COLOR.get(s[0], style.CUT) for s in stages],
            },
            "hovertemplate": "%{text}<br>%{customdata}<extra></extra>",
            "showlegend": False,
        }
    ]
    rows = (n - 1) // per_row + 1
    layout = _base(None, 170 * rows + 30)
    layout.update(
        annotations=ann,
        shapes=elbows,
        xaxis={"visible": False, "range": [-0.75, per_row - 0.25]},
        yaxis={"visible": False, "range": [-rows + 0.3, 0.4]},
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
    )
    return _figure(data, layout)


# --------------------------------------------------------------------------------------------
# Inside the choice: the logit lens, direct logit attribution, attention metrics
# --------------------------------------------------------------------------------------------

LENS_TEXT_COLS = 40  # grid columns that print their top token in the cell


def _legend_below(layout: dict, rows: int = 2) -> dict:
    """The legend under the x axis's title, left-aligned, in room of its own: at the top it
    would cover the subplot titles on a narrow screen."""
    layout["legend"] = {
        "orientation": "h",
        "yref": "container",
        "y": 0.0,
        "yanchor": "bottom",
        "x": 0.0,
        "xanchor": "left",
    }
    layout["margin"] = {**layout["margin"], "b": 70 + 22 * rows}
    return layout


def lens_row_labels(n_rows: int) -> list[str]:
    """The lens's rows: ``emb`` (the embedding output), then ``0``… (after each layer)."""
    return ["emb"] + [str(i) for i in range(n_rows - 1)]


def lens_layers_figure(step, chosen_text: str, top_texts: Sequence[str]) -> go.Figure:
    """One step's logit lens layer by layer: the chosen token's rank and probability beside
    the layer's own top token, and how far each layer is from the final distribution.

    Parameters
    ----------
    step : a ``semviz.analysis.lens.LensStep`` (L+1 rows)
    chosen_text : the token the step chose
    top_texts : (L+1,) each row's top token
    """
    n = len(step.chosen_rank)
    x = lens_row_labels(n)
    tops = [_text(t) for t in top_texts]
    cd = [[t, fmt_prob(float(p))] for t, p in zip(tops, step.top_probs[:, 0], strict=True)]
    chosen = _text(chosen_text)
    titles = [f"rank of “{_show(chosen_text)}” (1 = top)", "probability", "KL(final ‖ layer), nats"]
    layout = _base(None, 560)
    layout.update(_stacked(3, titles, 0.08))
    data = [
        {
            "type": "scatter",
            "x": x,
            "y": step.chosen_rank.tolist(),
            "mode": "lines+markers",
            "line": {"color": style.KEPT},
            "name": chosen,
            "showlegend": False,
            "customdata": cd,
            "hovertemplate": "after %{x}<br>" + chosen + " rank %{y}<br>top: %{customdata[0]} "
            "(%{customdata[1]})<extra></extra>",
        },
        {
            "type": "scatter",
            "x": x,
            "y": step.chosen_prob.tolist(),
            "mode": "lines+markers",
            "line": {"color": style.KEPT},
            "name": f"chosen {chosen}",
            "xaxis": "x2",
            "yaxis": "y2",
            "hovertemplate": "after %{x}<br>%{y:.4f}<extra>chosen</extra>",
        },
        {
            "type": "scatter",
            "x": x,
            "y": step.top_probs[:, 0].tolist(),
            "mode": "lines",
            "line": {"color": style.REFERENCE, "dash": "dot"},
            "name": "the layer's top token",
            "xaxis": "x2",
            "yaxis": "y2",
            "customdata": cd,
            "hovertemplate": "after %{x}<br>%{customdata[0]} %{y:.4f}<extra>top</extra>",
        },
        {
            "type": "scatter",
            "x": x,
            "y": step.kl.tolist(),
            "mode": "lines+markers",
            "line": {"color": style.ENTROPY},
            "name": "KL",
            "showlegend": False,
            "xaxis": "x3",
            "yaxis": "y3",
            "hovertemplate": "after %{x}<br>KL %{y:.3f} nats<extra></extra>",
        },
    ]
    layout["yaxis"].update(type="log", autorange="reversed", tickformat=",d", dtick=1)
    layout["yaxis2"].update(range=[0, 1.02])
    layout["yaxis3"].update(rangemode="tozero")
    layout["xaxis3"]["title"] = {"text": "residual after layer (emb: the embedding)"}
    for ax in ("xaxis", "xaxis2", "xaxis3"):
        layout[ax]["type"] = "category"
    layout["height"] += 40
    return _figure(data, _legend_below(layout))


def _probability_scale(lo: float = 0.12, n: int = 11) -> list[list]:
    """``style.PROBABILITY_SCALE`` as the shade of probability chips reads it (pale for 0,
    dark for 1, from a tint rather than white), as explicit stops: plotly.js's own scale of
    that name runs the other way."""
    return [[i / (n - 1), style.shade(i / (n - 1), lo=lo)] for i in range(n)]


def lens_grid_figure(
    grid,
    top_texts: Sequence[Sequence[str]],
    chosen_texts: Sequence[str],
    *,
    selected: int | None = None,
) -> go.Figure:
    """The classic logit-lens grid: layers × steps, each cell the layer's top token coloured
    by its probability; the step's own token labels the column.

    Parameters
    ----------
    grid : a ``semviz.analysis.lens.LensGrid`` ((L+1, n) arrays)
    top_texts : (L+1, n) the text of each cell's top token
    chosen_texts : (n,) the token each step chose
    selected : a step to highlight
    """
    rows, n = grid.top_prob.shape
    ys = lens_row_labels(rows)
    steps = [int(s) for s in grid.steps]
    chosen = [_text(t) for t in chosen_texts]
    trace = {
        "type": "heatmap",
        "z": grid.top_prob.tolist(),
        "x": steps,
        "y": ys,
        "zmin": 0.0,
        "zmax": 1.0,
        "colorscale": _probability_scale(),
        "hoverinfo": "skip",
        "colorbar": {"title": {"text": "top p"}},
        "xgap": 1,
        "ygap": 1,
    }
    # heatmap cells cannot be selected: a transparent marker on every cell carries the hover
    # and the step a click selects (customdata[0], as on every step-axis chart)
    cells = [(r, j) for r in range(rows) for j in range(n)]
    picker = {
        "type": "scatter",
        "mode": "markers",
        "x": [steps[j] for _, j in cells],
        "y": [ys[r] for r, _ in cells],
        "showlegend": False,
        "unselected": _KEEP_OPAQUE,
        "marker": {"symbol": "square", "size": 12, "color": style.rgba(style.REFERENCE, 0.0)},
        "customdata": [
            [
                steps[j],
                _text(top_texts[r][j]),
                chosen[j],
                fmt_prob(float(grid.chosen_prob[r, j])),
                int(grid.chosen_rank[r, j]),
                fmt_prob(float(grid.top_prob[r, j])),
            ]
            for r, j in cells
        ],
        "hovertemplate": "step %{customdata[0]}, after %{y}<br>top: %{customdata[1]} "
        "(%{customdata[5]})<br>chosen %{customdata[2]}: p %{customdata[3]}, rank "
        "%{customdata[4]}<extra></extra>",
    }
    if n <= LENS_TEXT_COLS:
        trace["text"] = [[_show(top_texts[r][j]) for j in range(n)] for r in range(rows)]
        trace["texttemplate"] = "%{text}"
        trace["textfont"] = {"size": 9}
    xaxis: dict = {"title": {"text": "step"}}
    if n <= LENS_TEXT_COLS:
        xaxis.update(
            tickvals=steps,
            ticktext=[f"{s} {_show(t)}" for s, t in zip(steps, chosen_texts, strict=True)],
            tickangle=-60,
            tickfont={"size": 10},
        )
    layout = _base(None, max(360, 16 * rows + 200))
    # the cells exactly: the markers would pad an automatic range
    xaxis["range"] = [steps[0] - 0.5, steps[-1] + 0.5] if steps else None
    layout.update(
        xaxis=xaxis,
        yaxis={
            "title": {"text": "after layer"},
            "type": "category",
            "tickfont": {"size": 10},
            "range": [-0.5, rows - 0.5],
        },
    )
    if selected is not None and selected in steps:
        # an outline round the selected column, with no fill (the default)
        layout["shapes"] = [
            {
                "type": "rect",
                "xref": "x",
                "x0": selected - 0.5,
                "x1": selected + 0.5,
                "yref": "y domain",
                "y0": 0,
                "y1": 1,
                "line": {"color": style.FOCUS, "width": 3},
            }
        ]
    return _figure([trace, picker], layout)


def _attribution_bars(
    x: Sequence, terms: np.ndarray, token_texts: Sequence[str], axis: str = ""
) -> list[dict]:
    colors = (style.KEPT, style.LOWER_RANKED, style.STAGE["temperature"], style.CUT)
    out = []
    for t, (row, text) in enumerate(zip(terms, token_texts, strict=True)):
        name = ("chosen " if t == 0 else "runner-up " if t == 1 else "") + _text(text)
        out.append(
            {
                "type": "bar",
                "x": list(x),
                "y": [float(v) for v in row],
                "name": name,
                "marker": {"color": colors[t % len(colors)]},
                "xaxis": f"x{axis}",
                "yaxis": f"y{axis}",
                "legendgroup": name,
                "showlegend": axis in ("", "1"),
                "hovertemplate": "%{x}<br>%{y:+.3f} to the logit<extra>" + name + "</extra>",
            }
        )
    return out


def block_contributions_figure(ba, token_texts: Sequence[str]) -> go.Figure:
    """Direct logit attribution: what each layer's attention and MLP wrote into the final
    residual, read as each token's logit (the final norm linearised at the final residual).

    Parameters
    ----------
    ba : a ``semviz.analysis.lens.BlockAttribution`` for T tokens over L layers
    token_texts : (T,) the tokens' texts (the chosen one first, then the runner-up)
    """
    L = ba.attn.shape[1]
    x = list(range(L))
    titles = ["attention", "MLP"]
    layout = _base(None, 560)
    layout.update(_stacked(2, titles, 0.12))
    data = _attribution_bars(x, ba.attn, token_texts)
    data += _attribution_bars(x, ba.mlp, token_texts, "2")
    layout.update(barmode="group")
    layout["xaxis2"]["title"] = {"text": "layer"}
    for ax in ("yaxis", "yaxis2"):
        layout[ax].update(title={"text": "logit term"}, zeroline=True)
    return _figure(data, _legend_below(layout))


def head_contributions_figure(ha, token_texts: Sequence[str]) -> go.Figure:
    """One layer's attention split by head: each head's direct term in each token's logit.

    Parameters
    ----------
    ha : a ``semviz.analysis.lens.HeadAttribution`` (T tokens, H heads)
    token_texts : (T,) the tokens' texts
    """
    H = ha.heads.shape[1]
    data = _attribution_bars([f"head {h}" for h in range(H)], ha.heads, token_texts)
    layout = _base(None, 380)
    layout.update(
        barmode="group",
        xaxis={"title": {"text": f"layer {ha.layer}"}},
        yaxis={"title": {"text": "logit term"}, "zeroline": True},
    )
    return _figure(data, _legend_below(layout))


def attention_metrics_figure(df, series: dict, *, selected: int | None = None) -> go.Figure:
    """entropix's attention metrics beside the logits' on the step axis.

    Parameters
    ----------
    df : :func:`step_frame` of the run (entropy, varentropy of the logits)
    series : ``semviz.analysis.lens.attention_series`` of the run (per-step arrays)
    selected : the step to highlight
    """
    titles = [
        "logits: entropy, varentropy (right)",
        "attention: entropy, varentropy (right), mean over heads",
        "heads: agreement, interaction strength (right)",
    ]
    layout = _base(None, 600)
    layout.update(_stacked(3, titles, 0.08))
    steps, cd = _col(df, "step"), _step_data(df)
    rows = (
        (
            ("entropy", _col(df, "entropy"), style.ENTROPY, "solid"),
            ("varentropy", _col(df, "varentropy"), style.VARENTROPY, "dot"),
        ),
        (
            ("attention entropy", series["entropy"], style.ENTROPY, "solid"),
            ("attention varentropy", series["varentropy"], style.VARENTROPY, "dot"),
        ),
        (
            ("head agreement", series["agreement"], style.REFERENCE, "solid"),
            ("interaction strength", series["interaction"], style.FREE_ENERGY, "dot"),
        ),
    )
    data = []
    for r, pair in enumerate(rows, start=1):
        sfx = "" if r == 1 else str(r)
        for k, (name, ys, color, dash) in enumerate(pair):
            ys = [None if v is None or not math.isfinite(float(v)) else float(v) for v in ys]
            data.append(
                {
                    "type": "scatter",
                    "x": steps,
                    "y": ys,
                    "mode": "lines+markers",
                    "marker": {"size": 4},
                    "line": {"color": color, "dash": dash},
                    "name": name,
                    "xaxis": f"x{sfx}",
                    "yaxis": f"y{sfx}" if k == 0 else f"y{3 + r}",
                    "customdata": cd,
                    "unselected": _KEEP_OPAQUE,
                    "hovertemplate": "step %{x} %{customdata[1]}<br>%{y:.4g}<extra>"
                    + name
                    + "</extra>",
                }
            )
        layout[f"yaxis{3 + r}"] = {
            "overlaying": f"y{sfx}",
            "side": "right",
            "showgrid": False,
            "rangemode": "tozero",
            "anchor": f"x{sfx}",
        }
    layout["shapes"] = _vlines(selected, None, ("", "2", "3"), n=len(df))
    layout["xaxis3"]["title"] = {"text": "step"}
    layout["height"] += 60
    return _figure(data, _legend_below(layout, rows=3))


def quadrant_figure(df, *, selected: int | None = None, max_labels: int = 60) -> go.Figure:
    """entropix's quadrant: each step's logits entropy × varentropy, the run's tokens written
    at their points, split at the run's medians (low/low: the model is sure; high entropy,
    low varentropy: evenly unsure; low entropy, high varentropy: a few distinct options;
    high/high: lost)."""
    data = _selected_point(df, selected, legend=False)
    label = len(df) <= max_labels
    data.append(
        {
            "type": "scatter",
            "x": _col(df, "entropy"),
            "y": _col(df, "varentropy"),
            "mode": "markers+text" if label else "markers",
            "name": "step",
            "text": [_show(t) for t in _col(df, "token")] if label else None,
            "textposition": "top center",
            "textfont": {"size": 10},
            "showlegend": False,
            "marker": {"color": style.ENTROPY, "size": 7},
            "customdata": _step_data(df),
            "unselected": _KEEP_OPAQUE,
            "hovertemplate": "step %{customdata[0]} %{customdata[1]}<br>H=%{x:.3f}, V=%{y:.3f}<extra></extra>",
        }
    )
    layout = _base(None, 420)
    layout.update(
        xaxis={"title": {"text": "entropy H, nats"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "varentropy, nats²"}, "rangemode": "tozero"},
        margin={"l": 50, "r": 20, "t": 20, "b": 40},
    )
    if len(df):
        mh, mv = float(df["entropy"].median()), float(df["varentropy"].median())
        line = {"color": style.REFERENCE, "width": 1, "dash": "dash"}
        layout["shapes"] = [
            {
                "type": "line",
                "xref": "x",
                "x0": mh,
                "x1": mh,
                "yref": "y domain",
                "y0": 0,
                "y1": 1,
                "line": line,
            },
            {
                "type": "line",
                "xref": "x domain",
                "x0": 0,
                "x1": 1,
                "yref": "y",
                "y0": mv,
                "y1": mv,
                "line": line,
            },
        ]
        corners = (
            ("sure", 0.01, 0.01, "left", "bottom"),
            ("evenly unsure", 0.99, 0.01, "right", "bottom"),
            ("a few options", 0.01, 0.99, "left", "top"),
            ("lost", 0.99, 0.99, "right", "top"),
        )
        layout["annotations"] = [
            {
                "text": t,
                "x": x,
                "y": y,
                "xref": "x domain",
                "yref": "y domain",
                "xanchor": xa,
                "yanchor": ya,
                "showarrow": False,
                "font": {"size": 11, "color": style.REFERENCE},
            }
            for t, x, y, xa, ya in corners
        ]
    return _figure(data, layout)
