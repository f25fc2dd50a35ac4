"""Figures for the app and reports: pure functions from traces and prune results to Plotly.

Nothing here imports streamlit. Inputs are the recorded ``StepRecord``s, the ``PruneResult``s
of a replay, and plain arrays; outputs are ``plotly.graph_objects.Figure``. Every chart caps
what it draws (top candidates, binned context positions) so a long trace stays cheap to
render.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from semviz import escape
from semviz.sampling import PruneParams, PruneResult, active_filters
from semviz.trace import StepRecord, Trace

TOP = 30
MAX_COLS = 400  # context positions drawn before binning
MAX_ROWS = 256  # steps drawn before binning
STAGE_ORDER = ("raw", "gravity", "temperature", "final")
STAGE_LABEL = {
    "raw": "raw",
    "gravity": "gravity-adjusted",
    "temperature": "after temperature",
    "final": "final (kept, renormalised)",
}
STAGE_COLOR = {"raw": "#8c8c8c", "gravity": "#9467bd", "temperature": "#1f77b4", "final": "#d62728"}
ACTION_COLOR = {
    "took the top token": "#1f77b4",
    "took a lower-ranked token": "#ff7f0e",
    "greedy": "#2ca02c",
    "safety fallback": "#d62728",
}

__all__ = [
    "ACTION_COLOR",
    "attention_flow",
    "attention_heatmap",
    "bin_columns",
    "cache_bytes_figure",
    "chain_figure",
    "chain_stages",
    "distribution_figure",
    "entropy_figure",
    "entropy_scatter",
    "gravity_terms_figure",
    "kv_eval_figure",
    "kv_timeline_figure",
    "prefill_scaling_figure",
    "rank_shift_figure",
    "step_frame",
    "step_stages",
    "thermo_figure",
    "timing_figure",
    "waterfall_figure",
]


def _layout(fig: go.Figure, title: str | None = None, height: int = 360) -> go.Figure:
    fig.update_layout(
        title=None if title is None else {"text": title, "x": 0.0, "font": {"size": 14}},
        template="plotly_white",
        height=height,
        # subplot titles are annotations above the plot area: give them room too
        margin={"l": 50, "r": 20, "t": 40 if title or fig.layout.annotations else 20, "b": 40},
        legend={"orientation": "h", "y": -0.18, "x": 0.0},
        hoverlabel={"namelength": -1},
    )
    return fig


def _np(t) -> np.ndarray:
    if t is None:
        return np.zeros(0)
    if hasattr(t, "detach"):
        return t.detach().float().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


def _show(label: str) -> str:
    """A token made visible: spaces and newlines shown, other control characters escaped
    (a raw one makes the exported SVG, and so the PNG, invalid), long ones cut, and markup
    shown as text (Plotly renders ``<b>``, ``<a href>`` … in labels)."""
    s = label.replace("\n", "↵").replace("\t", "⇥").replace(" ", "·")
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    return escape.plotly(s if len(s) <= 14 else s[:13] + "…")


def _cells(values: Sequence) -> list[list]:
    """``customdata`` rows of text from a trace, shown literally in hover labels."""
    return [[escape.plotly(v)] for v in values]


# --------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------


def step_stages(rec: StepRecord, result: PruneResult | None = None) -> dict[str, np.ndarray]:
    """Per-stage probabilities over the step's K candidates, from a replay or as recorded."""
    src = result.index_probs if result is not None else rec.stage_probs
    return {k: _np(src[k]) for k in STAGE_ORDER if k in src}


def _base(title: str | None, height: int) -> dict:
    return {
        "title": None if title is None else {"text": title, "x": 0.0, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 50, "r": 20, "t": 40 if title else 20, "b": 40},
        "legend": {"orientation": "h", "y": -0.18, "x": 0.0},
        "hoverlabel": {"namelength": -1},
        "plot_bgcolor": "white",
    }


def _figure(data: list[dict], layout: dict) -> go.Figure:
    """A figure from plain dicts, skipping Plotly's per-property validation.

    Validation costs ~10 ms per trace; the what-if views rebuild ~8 figures on every slider
    move, so they are assembled as dicts (checked by the tests' JSON round trips instead).
    """
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
        lay[f"yaxis{sfx}"] = {"domain": dom, "anchor": f"x{sfx}", "gridcolor": "#eee"}
        lay[f"xaxis{sfx}"] = {
            "anchor": f"y{sfx}",
            "matches": "x" if r > 1 else None,
            "showticklabels": r == n,
            "gridcolor": "#eee",
        }
        ann.append({
            "text": titles[r - 1], "x": 0.5, "y": dom[1], "xref": "paper", "yref": "paper",
            "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 12},
        })  # fmt: skip
    lay["annotations"] = ann
    return lay


def distribution_figure(
    labels: Sequence[str],
    stages: dict[str, np.ndarray],
    *,
    kept: np.ndarray | None = None,
    chosen: int | None = None,
    mode: str = "side",
    top: int = TOP,
    stages_shown: Sequence[str] = STAGE_ORDER,
) -> go.Figure:
    """Raw / after temperature / gravity-adjusted / final probabilities of the top candidates.

    Parameters
    ----------
    labels : token texts of the candidates (at least ``top``), in candidate order.
    stages : stage name → (K,) probabilities over the candidates.
    kept : (K,) bool, tokens that survived every filter.
    chosen : candidate index of the token taken (outlined).
    mode : ``"side"`` one panel per stage, ``"overlay"`` grouped bars in one panel.
    """
    names = [s for s in stages_shown if s in stages]
    n = min(top, len(labels), *(len(stages[s]) for s in names)) if names else 0
    x = [f"{i + 1}. {_show(labels[i])}" for i in range(n)]
    kept_n = np.ones(n, bool) if kept is None else np.asarray(kept[:n], bool)
    data = []
    if mode == "overlay" or len(names) <= 1:
        for s in names:
            data.append({
                "type": "bar", "x": x, "y": stages[s][:n].tolist(), "name": STAGE_LABEL[s],
                "marker": {"color": STAGE_COLOR[s]}, "opacity": 0.85,
                "hovertemplate": "%{x}<br>p=%{y:.4f}<extra>" + STAGE_LABEL[s] + "</extra>",
            })  # fmt: skip
        layout = _base(None, 380)
        layout.update(
            barmode="group", bargap=0.15,
            yaxis={"title": {"text": "probability"}, "gridcolor": "#eee"},
            xaxis={"tickangle": -50, "tickfont": {"size": 10}},
        )  # fmt: skip
        return _figure(data, layout)
    layout = _base(None, 150 * len(names) + 90)
    layout.update(_stacked(len(names), [STAGE_LABEL[s] for s in names], 0.05))
    for r, s in enumerate(names, start=1):
        sfx = "" if r == 1 else str(r)
        colors = [STAGE_COLOR[s] if (s != "final" or k) else "#dddddd" for k in kept_n.tolist()]
        data.append({
            "type": "bar", "x": x, "y": stages[s][:n].tolist(), "name": STAGE_LABEL[s],
            "xaxis": f"x{sfx}", "yaxis": f"y{sfx}", "showlegend": False,
            "marker": {"color": colors, "line": {"width": [2.5 if i == chosen else 0 for i in range(n)], "color": "#000"}},
            "hovertemplate": "%{x}<br>p=%{y:.4f}<extra>" + STAGE_LABEL[s] + "</extra>",
        })  # fmt: skip
    layout[f"xaxis{len(names) if len(names) > 1 else ''}"].update(
        tickangle=-50, tickfont={"size": 10}
    )
    return _figure(data, layout)


def waterfall_figure(waterfall: Sequence[dict]) -> go.Figure:
    """How much mass each pruning stage removed, and how many candidates were left."""
    names = [escape.plotly(w["name"]) for w in waterfall] or ["(no filter on)"]
    removed = [100.0 * float(w["mass_removed"]) for w in waterfall] or [0.0]
    left = [int(w["n_kept"]) for w in waterfall] or [0]
    data = [
        {
            "type": "bar", "x": names, "y": removed, "name": "mass removed (% of what entered)",
            "marker": {"color": "#d62728"},
            "hovertemplate": "%{x}: removed %{y:.2f}% of the mass<extra></extra>",
        },
        {
            "type": "scatter", "x": names, "y": left, "name": "candidates left", "yaxis": "y2",
            "mode": "lines+markers+text", "text": [str(v) for v in left],
            "textposition": "top center", "marker": {"color": "#1f77b4"},
            "hovertemplate": "%{x}: %{y} left<extra></extra>",
        },
    ]  # fmt: skip
    layout = _base(None, 340)
    layout.update(
        yaxis={"title": {"text": "mass removed, %"}, "range": [0, 105], "gridcolor": "#eee"},
        yaxis2={"title": {"text": "candidates left"}, "type": "log", "overlaying": "y",
                "side": "right", "showgrid": False},
    )  # fmt: skip
    return _figure(data, layout)


def rank_shift_figure(
    labels: Sequence[str], raw: np.ndarray, adjusted: np.ndarray, top: int = 20
) -> go.Figure:
    """Ranks before and after gravity for the tokens that end in the top ``top``.

    A line per token from its raw rank (left) to its gravity-adjusted rank (right), green when
    gravity promoted it, red when it was demoted.
    """
    raw, adjusted = np.asarray(raw, float), np.asarray(adjusted, float)
    k = min(len(raw), len(adjusted), len(labels))
    r_raw = np.empty(k, int)
    r_raw[np.argsort(-raw[:k], kind="stable")] = np.arange(1, k + 1)
    r_adj = np.empty(k, int)
    r_adj[np.argsort(-adjusted[:k], kind="stable")] = np.arange(1, k + 1)
    show = [i for i in range(k) if r_adj[i] <= top or r_raw[i] <= top]
    show = sorted(show, key=lambda i: r_adj[i])[: max(top, 1) + 10]
    data = []
    for i in show:
        d = int(r_raw[i] - r_adj[i])
        color = "#2ca02c" if d > 0 else ("#d62728" if d < 0 else "#bbbbbb")
        lab = _show(labels[i])
        data.append({
            "type": "scatter", "x": ["raw rank", "after gravity"],
            "y": [int(r_raw[i]), int(r_adj[i])], "mode": "lines+markers+text",
            "text": [lab, f"{lab} ({'+' if d > 0 else ''}{d})"],
            "textposition": ["middle left", "middle right"],
            "line": {"color": color, "width": 2 if d else 1}, "showlegend": False,
            "hovertemplate": f"{lab}: rank {r_raw[i]} → {r_adj[i]}<extra></extra>",
        })  # fmt: skip
    lim = max([top] + [int(max(r_raw[i], r_adj[i])) for i in show]) + 0.5
    moved = int(sum(1 for i in show if r_raw[i] != r_adj[i]))
    layout = _base(f"{moved} of the top {top} changed rank", 30 * min(len(show), 25) + 120)
    layout.update(
        yaxis={"autorange": False, "range": [lim, 0.5], "title": {"text": "rank"}},
        xaxis={"range": [-0.6, 1.6]},
    )
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
                "token": rec.token_text,
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
    bands = [(0.0, 0.5, "confident (H < 0.5)", "rgba(44,160,44,0.08)")]
    bands.append((3.0, 3.0 + 50.0, "uncertain (H > 3)", "rgba(214,39,40,0.06)"))
    if params.adaptive == "target":
        t = params.target_entropy
        bands.append((t - 0.05, t + 0.05, f"target entropy {t:g}", "rgba(31,119,180,0.35)"))
    if params.adaptive == "mirostat":
        t = params.mirostat_tau * math.log(2.0)
        bands.append(
            (
                t - 0.05,
                t + 0.05,
                f"mirostat τ {params.mirostat_tau:g} bits",
                "rgba(148,103,189,0.35)",
            )
        )
    if params.fallback:
        t = params.fallback_collapse_threshold
        bands.append((0.0, t, f"collapse < {t:g}", "rgba(214,39,40,0.25)"))
    return bands


def _vlines(selected, first_diff, axes: Sequence[str] = ("",)) -> list[dict]:
    """Shapes marking the selected step (dotted) and the first what-if change (orange)."""
    out = []
    for sfx in axes:
        for x, line in (
            (selected, {"color": "#444", "width": 1, "dash": "dot"}),
            (first_diff, {"color": "#ff7f0e", "width": 2}),
        ):
            if x is not None:
                out.append({
                    "type": "line", "x0": x, "x1": x, "xref": f"x{sfx}",
                    "y0": 0, "y1": 1, "yref": f"y{sfx} domain", "line": line,
                })  # fmt: skip
    return out


def _col(df, name: str) -> list:
    return df[name].tolist() if len(df) else []


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
        shapes.append({
            "type": "rect", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": lo,
            "y1": y1, "fillcolor": color, "line": {"width": 0}, "layer": "below",
        })  # fmt: skip
        ann.append({
            "x": 0, "xref": "paper", "y": y1 if hi - lo > 0.2 else hi, "yref": "y",
            "text": label, "showarrow": False, "xanchor": "left", "yanchor": "top",
            "font": {"size": 10, "color": "#555"},
        })  # fmt: skip
    steps, tokens = _col(df, "step"), _cells(_col(df, "token"))
    data = [
        {
            "type": "scatter", "x": steps, "y": _col(df, "entropy"), "name": "entropy H (nats)",
            "mode": "lines+markers", "marker": {"size": 4}, "line": {"color": "#1f77b4"},
            "customdata": tokens,
            "hovertemplate": "step %{x} %{customdata[0]}<br>H=%{y:.3f} nats<extra></extra>",
        },
        {
            "type": "scatter", "x": steps, "y": _col(df, "varentropy"), "yaxis": "y2",
            "name": "varentropy (nats²)", "mode": "lines",
            "line": {"color": "#ff7f0e", "dash": "dot"},
            "hovertemplate": "step %{x}<br>V=%{y:.3f}<extra></extra>",
        },
    ]  # fmt: skip
    fb = df[df["fallback"] != ""] if len(df) else df
    if len(fb):
        data.append({
            "type": "scatter", "x": _col(fb, "step"), "y": _col(fb, "entropy"), "mode": "markers",
            "name": "safety fallback fired", "marker": {"symbol": "x", "size": 11, "color": "#d62728"},
            "customdata": _cells(_col(fb, "fallback")),
            "hovertemplate": "step %{x}: %{customdata[0]}<extra></extra>",
        })  # fmt: skip
    layout = _base(None, 360)
    layout.update(
        shapes=shapes + _vlines(selected, first_diff),
        annotations=ann,
        xaxis={"title": {"text": "step"}, "gridcolor": "#eee"},
        yaxis={"title": {"text": "entropy, nats"}, "range": [0, top], "gridcolor": "#eee"},
        yaxis2={"title": {"text": "varentropy"}, "overlaying": "y", "side": "right",
                "showgrid": False, "rangemode": "tozero"},
    )  # fmt: skip
    return _figure(data, layout)


def thermo_figure(df, *, selected: int | None = None, first_diff: int | None = None) -> go.Figure:
    """Effective temperature, free energy and kept-set size per step; fallbacks marked."""
    titles = ["effective temperature", "free energy F = −T log Σ exp(s/T)", "kept-set size"]
    layout = _base(None, 560)
    layout.update(_stacked(3, titles, 0.07))
    series = [("temperature", "#1f77b4"), ("free_energy", "#9467bd"), ("n_kept", "#2ca02c")]
    steps, tokens = _col(df, "step"), _cells(_col(df, "token"))
    fb = df[df["fallback"] != ""] if len(df) else df
    data = []
    for r, (col, color) in enumerate(series, start=1):
        sfx = "" if r == 1 else str(r)
        data.append({
            "type": "scatter", "x": steps, "y": _col(df, col), "mode": "lines+markers",
            "marker": {"size": 3}, "xaxis": f"x{sfx}", "yaxis": f"y{sfx}", "name": col,
            "line": {"color": color, "shape": "hv" if col == "n_kept" else "linear"},
            "showlegend": False, "customdata": tokens,
            "hovertemplate": "step %{x} %{customdata[0]}<br>%{y:.4g}<extra>" + col + "</extra>",
        })  # fmt: skip
        if len(fb):
            data.append({
                "type": "scatter", "x": _col(fb, "step"), "y": _col(fb, col), "mode": "markers",
                "marker": {"symbol": "x", "size": 10, "color": "#d62728"},
                "xaxis": f"x{sfx}", "yaxis": f"y{sfx}", "name": "safety fallback",
                "showlegend": r == 1, "customdata": _cells(_col(fb, "fallback")),
                "hovertemplate": "%{customdata[0]}<extra></extra>",
            })  # fmt: skip
    layout["shapes"] = _vlines(selected, first_diff, ("", "2", "3"))
    layout["xaxis3"]["title"] = {"text": "step"}
    if len(df) and df["n_kept"].max() > 50:
        layout["yaxis3"]["type"] = "log"
    return _figure(data, layout)


def entropy_scatter(df, *, selected: int | None = None) -> go.Figure:
    """Entropy × varentropy, one point per step, coloured by what the sampler did."""
    data = []
    for action, color in ACTION_COLOR.items():
        sub = df[df["action"] == action] if len(df) else df
        if not len(sub):
            continue
        data.append({
            "type": "scatter", "x": _col(sub, "entropy"), "y": _col(sub, "varentropy"),
            "mode": "markers", "name": action,
            "marker": {"color": color, "size": 8, "opacity": 0.8,
                       "symbol": "x" if action == "safety fallback" else "circle"},
            "customdata": [[st, escape.plotly(tok), rk] for st, tok, rk
                           in sub[["step", "token", "rank"]].values.tolist()],
            "hovertemplate": "step %{customdata[0]} %{customdata[1]} (rank %{customdata[2]})"
            "<br>H=%{x:.3f}, V=%{y:.3f}<extra></extra>",
        })  # fmt: skip
    if selected is not None and 0 <= selected < len(df):
        row = df.iloc[selected]
        data.append({
            "type": "scatter", "x": [float(row["entropy"])], "y": [float(row["varentropy"])],
            "mode": "markers", "name": "selected step",
            "marker": {"size": 16, "color": "rgba(0,0,0,0)", "line": {"width": 2, "color": "#000"}},
        })  # fmt: skip
    layout = _base(None, 380)
    layout.update(
        xaxis={"title": {"text": "entropy H, nats"}, "gridcolor": "#eee"},
        yaxis={"title": {"text": "varentropy, nats²"}, "gridcolor": "#eee"},
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


def attention_heatmap(
    attention: np.ndarray,
    labels: Sequence[str],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    max_cols: int = MAX_COLS,
) -> go.Figure:
    """Attention mass, layers × context tokens, for one step (mean over the chosen heads).

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
    m = a[lay][:, hd].mean(1)  # (L', S)
    lab = list(labels)
    off = 0
    if window is not None:
        off, stop = max(0, window[0]), min(m.shape[1], window[1])
        m, lab = m[:, off:stop], lab[off:stop]
    m, starts = bin_columns(m, max_cols)
    if len(starts) < len(lab):
        ends = list(starts[1:]) + [len(lab)]
        xs = [f"{off + s}–{off + e - 1}" for s, e in zip(starts, ends, strict=True)]
        hover = "positions %{x}<br>layer %{y}<br>mass %{z:.4f}<extra></extra>"
    else:
        xs = [f"{off + i}:{_show(lab[i])}" for i in range(len(lab))]
        hover = "%{x}<br>layer %{y}<br>attention %{z:.4f}<extra></extra>"
    fig = go.Figure(
        go.Heatmap(
            z=m, x=xs, y=[str(i) for i in lay], colorscale="Viridis",
            colorbar={"title": "mass"}, hovertemplate=hover,
        )
    )  # fmt: skip
    fig.update_yaxes(title="layer", autorange="reversed", type="category")
    fig.update_xaxes(title="context position", tickangle=-60, tickfont={"size": 9}, type="category")
    return _layout(fig, None, max(320, 14 * len(lay) + 160))


def attention_flow(
    steps: Sequence[StepRecord],
    *,
    n_positions: int,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    max_cols: int = MAX_COLS,
    max_rows: int = MAX_ROWS,
) -> go.Figure:
    """Steps × original positions: where each step's attention mass sat (mean of layers/heads)."""
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
    filled = np.nan_to_num(mat, nan=0.0)
    binned, starts = bin_columns(filled, max_cols)
    fig = go.Figure(
        go.Heatmap(
            z=np.sqrt(binned), x=starts, y=idx, colorscale="Magma", reversescale=True,
            colorbar={"title": "√mass"},
            hovertemplate="step %{y}<br>position %{x}<br>√mass %{z:.3f}<extra></extra>",
        )
    )  # fmt: skip
    fig.update_yaxes(title="step", autorange="reversed")
    fig.update_xaxes(title="original position")
    return _layout(fig, None, 420)


def gravity_terms_figure(
    labels: Sequence[str], terms: np.ndarray, top: int = 20, positions: Sequence[int] | None = None
) -> go.Figure:
    """The terms ``m_i·sim(w, t_i)`` of G for the chosen token, largest |term| first."""
    terms = np.asarray(terms, float)
    pos = list(range(len(terms))) if positions is None else [int(p) for p in positions]
    order = np.argsort(-np.abs(terms), kind="stable")[:top]
    order = order[::-1]
    fig = go.Figure(
        go.Bar(
            x=terms[order], y=[f"{pos[i]}:{_show(labels[i])}" for i in order], orientation="h",
            marker_color=["#2ca02c" if terms[i] >= 0 else "#d62728" for i in order],
            hovertemplate="%{y}<br>m·sim = %{x:.5f}<extra></extra>",
        )
    )  # fmt: skip
    fig.update_xaxes(title="contribution m_i · sim(w, t_i)")
    fig.update_yaxes(type="category")
    return _layout(fig, None, 22 * len(order) + 100)


# --------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------


def kv_timeline_figure(
    steps: Sequence[StepRecord],
    *,
    n_positions: int,
    max_cols: int = MAX_COLS,
    max_rows: int = MAX_ROWS,
) -> go.Figure:
    """Steps × original positions: kept (1), evicted (0), not yet written (blank).

    Hover shows the policy's score where the step's eviction record has one.
    """
    idx = list(range(len(steps)))
    if len(idx) > max_rows:
        idx = np.unique(np.linspace(0, len(steps) - 1, max_rows).astype(int)).tolist()
    z = np.full((len(idx), n_positions), np.nan, dtype=np.float32)
    score = np.full((len(idx), n_positions), np.nan, dtype=np.float32)
    for r, i in enumerate(idx):
        rec = steps[i]
        upto = min(rec.position, n_positions)
        z[r, :upto] = 0.0
        pos = rec.cache_positions.long().numpy()
        z[r, pos[pos < n_positions]] = 1.0
        ev = rec.eviction or {}
        sc, sp = ev.get("scores"), ev.get("positions")
        if sc is not None and sp is not None:
            sc = _np(sc).reshape(-1)
            sp = _np(sp).astype(int).reshape(-1)
            ok = sp < n_positions
            score[r, sp[ok]] = sc[: len(sp)][ok]
    if n_positions > max_cols:
        # binned: the share of each bin still cached, mean score
        zz, starts = bin_columns(np.nan_to_num(z, nan=0.0), max_cols, how="mean")
        ss, _ = bin_columns(np.nan_to_num(score, nan=0.0), max_cols, how="mean")
        z, score, xs = zz, ss, starts
        hover = "step %{y}<br>positions from %{x}<br>share kept %{z:.2f}<extra></extra>"
    else:
        xs = np.arange(n_positions)
        hover = "step %{y}<br>position %{x}<br>kept %{z}<br>score %{customdata:.4g}<extra></extra>"
    fig = go.Figure(
        go.Heatmap(
            z=z, x=xs, y=idx, customdata=score, zmin=0, zmax=1,
            colorscale=[[0, "#f4a582"], [1, "#2166ac"]],
            colorbar={"title": "kept", "tickvals": [0, 1], "ticktext": ["evicted", "kept"]},
            hovertemplate=hover,
        )
    )  # fmt: skip
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
        x=x, y=y, mode="lines+markers", name="measured cache", marker={"size": 4},
        hovertemplate="step %{x}<br>%{y:.1f} KiB<extra></extra>",
    )  # fmt: skip
    if bytes_per_token:
        full = [bytes_per_token * s.position / 1024.0 for s in steps]
        fig.add_scatter(
            x=x, y=full, mode="lines", name="no eviction: 2·L·kv_heads·head_dim·bytes × tokens",
            line={"dash": "dash", "color": "#888"},
        )  # fmt: skip
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
    for metric in metrics:
        for name, sub in df.groupby(group) if group else [("all", df)]:
            sub = sub.sort_values(x)
            fig.add_scatter(
                x=sub[x], y=sub[metric], mode="lines+markers",
                name=f"{name} · {metric}" if len(metrics) > 1 else str(name),
                hovertemplate=f"{name}<br>{x} %{{x}}<br>{metric} %{{y:.4g}}<extra></extra>",
            )  # fmt: skip
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
        rows=1, cols=2, column_widths=[0.3, 0.7],
        subplot_titles=[f"prefill: {n_prompt} tokens at once", "decode: one token per forward"],
    )  # fmt: skip
    per_tok = 1e3 * prefill_seconds / max(n_prompt, 1)
    fig.add_bar(
        x=["prefill total", "prefill per token", "decode median"],
        y=[1e3 * prefill_seconds, per_tok, float(np.median(ms)) if ms else 0.0],
        marker_color=["#9467bd", "#c5b0d5", "#1f77b4"], showlegend=False,
        hovertemplate="%{x}: %{y:.2f} ms<extra></extra>", row=1, col=1,
    )  # fmt: skip
    fig.add_scatter(
        x=list(range(len(ms))), y=ms, mode="lines+markers", marker={"size": 3},
        name="decode forward", showlegend=False, row=1, col=2,
        hovertemplate="step %{x}: %{y:.2f} ms<extra></extra>",
    )  # fmt: skip
    fig.update_yaxes(title="ms", row=1, col=1)
    fig.update_xaxes(title="step", row=1, col=2)
    return _layout(fig, None, 320)


def prefill_scaling_figure(lengths: Sequence[int], seconds: Sequence[float]) -> go.Figure:
    """Measured prefill time vs prompt length with a fitted ``a + b·n + c·n²``."""
    n = np.asarray(lengths, float)
    t = 1e3 * np.asarray(seconds, float)
    fig = go.Figure()
    fig.add_scatter(
        x=n, y=t, mode="markers", name="measured", marker={"size": 9},
        hovertemplate="%{x:.0f} tokens: %{y:.1f} ms<extra></extra>",
    )  # fmt: skip
    title = None
    if len(n) >= 3:
        coef = np.polyfit(n, t, 2)  # c, b, a
        grid = np.linspace(0, n.max(), 100)
        fig.add_scatter(
            x=grid, y=np.polyval(coef, grid), mode="lines", name="fit a + b·n + c·n²",
            line={"color": "#1f77b4"},
        )  # fmt: skip
        lin = np.polyval([0.0, coef[1], coef[2]], grid)
        fig.add_scatter(
            x=grid, y=lin, mode="lines", name="linear part a + b·n",
            line={"dash": "dot", "color": "#888"},
        )  # fmt: skip
        share = coef[0] * n.max() ** 2 / max(np.polyval(coef, n.max()), 1e-9)
        if coef[0] > 0:
            title = f"quadratic term c·n² = {100 * share:.0f}% of the time at {int(n.max())} tokens"
        else:
            title = "no quadratic term measurable at these lengths (timings noisy: measure again)"
    fig.update_xaxes(title="prompt length, tokens", rangemode="tozero")
    fig.update_yaxes(title="prefill time, ms", rangemode="tozero")
    return _layout(fig, title, 340)


def chain_stages(params: PruneParams) -> list[tuple[str, str]]:
    """The sampling chain in the order the core runs it for ``params``: (name, detail)."""
    p = params
    out = [("logits", "model output, one per vocabulary token")]
    if p.gravity_lambda != 0.0:
        mode = f"rerank top {p.rerank_k}" if p.gravity_mode == "rerank" else "full vocabulary"
        out.append(
            (
                "gravity",
                f"s = log P + {p.gravity_lambda:g}·G ({p.gravity_mass}, {p.gravity_sim}, {mode})",
            )
        )
    temp = {
        "none": f"T = {p.temperature:g}",
        "target": f"T = T0 − gain·(H − {p.target_entropy:g})",
        "edt": "T = T0·N^(θ/H)",
        "dynatemp": f"T in [{max(0, p.temperature - p.dynatemp_range):g}, {p.temperature + p.dynatemp_range:g}] by H",
        "mirostat": f"T = {p.temperature:g}",
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


def chain_figure(params: PruneParams) -> go.Figure:
    """The sampling chain drawn as boxes and arrows, from the live settings."""
    stages = chain_stages(params)
    n = len(stages)
    per_row = 5
    xs, ys = [], []
    for i in range(n):
        row, col = divmod(i, per_row)
        xs.append(col if row % 2 == 0 else per_row - 1 - col)
        ys.append(-row)
    ann = [
        {
            "x": xs[i + 1], "y": ys[i + 1], "ax": xs[i], "ay": ys[i], "xref": "x", "yref": "y",
            "axref": "x", "ayref": "y", "showarrow": True, "arrowhead": 3, "arrowsize": 1.2,
            "arrowwidth": 1.5, "arrowcolor": "#888", "standoff": 38, "startstandoff": 38,
            "text": "",
        }
        for i in range(n - 1)
    ]  # fmt: skip
    ann += [
        {"x": x, "y": y - 0.28, "text": st[1], "showarrow": False, "xref": "x", "yref": "y",
         "font": {"size": 10, "color": "#444"}}
        for x, y, st in zip(xs, ys, stages, strict=True)
    ]  # fmt: skip
    colors = {"logits": "#8c8c8c", "gravity": "#9467bd", "temperature": "#1f77b4",
              "greedy": "#2ca02c", "sample": "#d62728", "fallback": "#d62728"}  # fmt: skip
    data = [{
        "type": "scatter", "x": xs, "y": ys, "mode": "markers+text",
        "text": [f"<b>{i + 1}. {s[0]}</b>" for i, s in enumerate(stages)],
        "textposition": "top center", "customdata": [s[1] for s in stages],
        "marker": {"size": 30, "symbol": "square", "color": [colors.get(s[0], "#ff7f0e") for s in stages]},
        "hovertemplate": "%{text}<br>%{customdata}<extra></extra>", "showlegend": False,
    }]  # fmt: skip
    rows = (n - 1) // per_row + 1
    layout = _base(None, 150 * rows + 40)
    layout.update(
        annotations=ann,
        xaxis={"visible": False, "range": [-0.6, per_row - 0.4]},
        yaxis={"visible": False, "range": [-rows + 0.45, 0.45]},
    )
    return _figure(data, layout)
