"""Does it help? A coherence–diversity frontier, scored by an outside judge.

Steering a sampler trades diversity for staying on topic, so one number cannot say whether
narrative gravity helps: a cooler temperature also "stays on topic". The frontier answers
it. For each setting (A, B, …) one knob is swept (temperature by default); every point
continues a prompt set with several seeds and scores each continuation:

- coherence: cosine between the judge's embeddings of the prompt and of the continuation
  (all-MiniLM-L6-v2, see :mod:`semviz.analysis.judge`; never the LM being steered);
- diversity: word distinct-1 and distinct-2 of each continuation, and the similarity
  between the continuations of different seeds for one prompt (``cross_sim``);
- degeneration: the share of repeated word 4-grams (``repetition``);
- fluency: the continuation's perplexity under the LM at T = 1, read from the raw logits
  of the generating pass itself (the logits a teacher-forced pass would compute again).

Word metrics a text is too short for are undefined, not "fully repeated" (see
:mod:`semviz.analysis.metrics`); ``short`` reports the share of continuations under four words.

Each point's prompts and seeds run as rows of one batched ``generate()``
(:mod:`semviz.frontier.batched`). Results go to Parquet one row per (setting, knob value, prompt,
seed), written after every batch, so a stopped sweep resumes where it stopped.

Statistics: per prompt, scores are averaged over its seeds; a point is the mean over
prompts; 95 % CIs come from a bootstrap over prompts (prompts resampled with replacement,
seeds stay with their prompt, the same draws for every point so comparisons are paired).
"B dominates A" compares coherence at matched diversity: both curves are interpolated at
common x values inside both ranges, and the mean gap B − A over that range must have a CI
that excludes 0.

Examples
--------
>>> round(matched_gap([0.8, 0.9], [0.7, 0.6], [0.85, 0.95], [0.8, 0.7]), 3)  # B 0.15 above A
0.15
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from semviz.analysis.compare import Side
from semviz.analysis.metrics import REPETITION_N, word_metrics
from semviz.output import files, style

__all__ = [
    "DEFAULT_OUT",
    "KNOBS",
    "PROMPTS_PATH",
    "SHIPPED",
    "X_AXES",
    "Dominance",
    "Progress",
    "Prompt",
    "Summary",
    "SweepConfig",
    "SweepResult",
    "dominance",
    "frontier_figure",
    "load_prompts",
    "load_results",
    "matched_gap",
    "normalize_knob",
    "per_prompt",
    "run_sweep",
    "summarize",
]

ROOT = Path(__file__).resolve().parents[2]
PROMPTS_PATH = ROOT / "data" / "prompts" / "prompts.jsonl"
SHIPPED = ROOT / "data" / "frontier" / "frontier_test.parquet"
DEFAULT_OUT = "out/frontier.parquet"

# the knobs a sweep can turn, with default values (ordered from conservative to free)
KNOBS: dict[str, tuple[float, ...]] = {
    "temperature": (0.7, 1.0, 1.3),
    "top_p": (0.5, 0.8, 0.95, 1.0),
    "min_p": (0.2, 0.1, 0.05, 0.0),
    "gravity_lambda": (0.0, 0.5, 1.0, 2.0),
}
KNOB_SYMBOLS = {"temperature": "T", "top_p": "top-p", "min_p": "min-p", "gravity_lambda": "λ"}
_ALIASES = {
    "t": "temperature",
    "temp": "temperature",
    "lambda": "gravity_lambda",
    "λ": "gravity_lambda",
}
X_AXES: dict[str, str] = {
    "distinct_2": "distinct-2 (word bigrams)",
    "distinct_1": "distinct-1 (words)",
    "dissimilarity": "1 − cross-seed similarity",
}
KEY = ("spec", "knob", "value", "prompt_id", "prompt_sha", "seed", "model", "new_tokens", "chat")
SPLITS = ("dev", "test")


@dataclass(frozen=True)
class Prompt:
    """One prompt of the set: ``kind`` is story, explanation, question or code."""

    id: str
    kind: str
    split: str
    text: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.text.encode()).hexdigest()[:12]


def load_prompts(
    path: str | Path | None = None, *, split: str | None = "test", n: int | None = None
) -> list[Prompt]:
    """Prompts of one half (``dev`` to tune, ``test`` to report; None: both), file order.

    The file interleaves the kinds, so the first ``n`` of a half stay balanced.
    """
    p = Path(path) if path else PROMPTS_PATH
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read the prompt set {p.name}: {exc.strerror}") from None
    out: list[Prompt] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            pr = Prompt(
                id=str(d["id"]), kind=str(d["kind"]), split=str(d["split"]), text=str(d["text"])
            )
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{p.name} line {i}: not a prompt record ({exc})") from None
        if not pr.text.strip():
            raise ValueError(f"{p.name} line {i}: the prompt text is empty")
        if split is None or pr.split == split:
            out.append(pr)
    if n is not None:
        if n < 1:
            raise ValueError(f"the number of prompts must be at least 1, got {n}")
        if n > len(out):
            raise ValueError(
                f"{p.name} has {len(out)} {split} prompts, fewer than the {n} asked for"
            )
        out = out[:n]
    return out


def normalize_knob(name: str) -> str:
    """``"top-p"`` → ``"top_p"``, ``"lambda"`` → ``"gravity_lambda"``; ValueError if unknown."""
    k = name.strip().lower().replace("-", "_")
    k = _ALIASES.get(k, k)
    if k not in KNOBS:
        raise ValueError(
            f"knob {name!r} is not sweepable; choose from {', '.join(KNOBS)} (or lambda)"
        )
    return k


def spec_of(side: Side) -> str:
    """A setting's identity in the results: its changes from plain sampling, canonical JSON."""
    return json.dumps(side.changes(), sort_keys=True)


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep. Validated on creation (``ValueError`` names the field)."""

    settings: tuple[Side, ...]
    knob: str = "temperature"
    values: tuple[float, ...] = KNOBS["temperature"]
    split: str = "test"
    n_prompts: int = 12  # 3 of each kind: with 2 seeds and 48 tokens, under a minute of CPU
    seeds: int = 2
    new_tokens: int = 48
    chat: bool | None = None
    batch_rows: int | None = None  # rows per generate() call; None: a whole point
    prompts_path: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", tuple(self.settings))
        object.__setattr__(self, "knob", normalize_knob(self.knob))
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        if not self.settings:
            raise ValueError("settings: give at least one setting (two to compare)")
        specs = [spec_of(s) for s in self.settings]
        if len(set(specs)) != len(specs):
            raise ValueError("settings: two settings are the same; nothing to compare")
        if not self.values:
            raise ValueError("values: give at least one value of the knob")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"values: {list(self.values)} repeats a value")
        for name in ("n_prompts", "seeds", "new_tokens", "batch_rows"):
            v = getattr(self, name)
            if (v is not None or name != "batch_rows") and v < 1:
                raise ValueError(f"{name} must be at least 1, got {v}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        for side in self.settings:
            for v in self.values:
                self.params(side, v)  # every point's PruneParams is valid before any work

    def params(self, side: Side, value: float):
        """The point's ``PruneParams``: the setting with the knob set to ``value``."""
        try:
            return side.params.replace(**{self.knob: value})
        except ValueError as exc:
            raise ValueError(f"{side.label} at {self.knob}={value:g}: {exc}") from None


@dataclass
class Progress:
    """Where a sweep stands; handed to ``on_progress`` after every generated position."""

    rows_done: int
    rows_total: int
    point: str
    step: int = 0
    steps: int = 0
    chunk_rows: int = 0

    @property
    def fraction(self) -> float:
        if self.rows_total == 0:
            return 1.0
        part = self.chunk_rows * self.step / self.steps if self.steps else 0
        return min((self.rows_done + part) / self.rows_total, 1.0)


@dataclass
class SweepResult:
    """What a :func:`run_sweep` call left in its Parquet file, and what it cost."""

    frame: pd.DataFrame  # the rows of this sweep's points (old and new)
    new_rows: int
    skipped_rows: int
    stopped: bool
    timings: dict = field(default_factory=dict)  # seconds: generate (sampler within), judge


MAX_RESULTS_BYTES = 64 * files.MiB  # a full sweep (7 settings × 8 values × 96 rows) is < 1 MiB


def load_results(path: str | Path, *, max_bytes: int = MAX_RESULTS_BYTES) -> pd.DataFrame:
    """The rows of a results file (empty frame when it does not exist yet); a file over
    ``max_bytes`` is refused before it is read (``files.FileError``)."""
    p = Path(path)
    if not p.exists():
        return pd.DataFrame()
    data = files.read_bytes(p, max_bytes)
    try:
        return pd.read_parquet(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ValueError(f"{p.name} is not a readable results file: {exc}") from None


def _write(df: pd.DataFrame, path: Path) -> None:
    """Write atomically: a stopped or crashed write never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    df.to_parquet(tmp, index=False, compression="zstd")
    os.replace(tmp, path)


def _key(d) -> tuple:
    return tuple(d[k] if k != "value" else round(float(d[k]), 9) for k in KEY)


def _todo(cfg: SweepConfig, lm, chat: bool, prompts: list[Prompt], done: set) -> list[dict]:
    """Rows still to make, grouped by point (setting, value) in sweep order."""
    rows = []
    for side in cfg.settings:
        for v in cfg.values:
            for pr in prompts:
                for seed in range(cfg.seeds):
                    r = {
                        "setting": side.label, "spec": spec_of(side), "knob": cfg.knob,
                        "value": float(v), "prompt_id": pr.id, "prompt_sha": pr.sha,
                        "kind": pr.kind, "split": pr.split, "prompt": pr.text, "seed": seed,
                        "model": lm.name, "new_tokens": cfg.new_tokens, "chat": chat,
                        "_side": side,
                    }  # fmt: skip
                    if _key(r) not in done:
                        rows.append(r)
    return rows


def _chunks(rows: list[dict], size: int) -> list[list[dict]]:
    """Batches of at most ``size`` rows, never mixing points (one batch = one chain)."""
    out: list[list[dict]] = []
    for r in rows:
        if out and len(out[-1]) < size and out[-1][0]["_side"] is r["_side"]:
            if out[-1][0]["value"] == r["value"]:
                out[-1].append(r)
                continue
        out.append([r])
    return out


def run_sweep(
    lm,
    cfg: SweepConfig,
    out: str | Path = DEFAULT_OUT,
    *,
    judge=None,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> SweepResult:
    """Generate and score every missing row of ``cfg``, appending to ``out`` after each batch.

    Rows already in ``out`` (same setting, knob value, prompt text, seed, model, length and
    chat template) are skipped, so a stopped sweep resumes. ``should_stop`` is polled after
    every generated position; a stop drops the unfinished batch and keeps every finished one.
    """
    from semviz.analysis.judge import load_judge
    from semviz.decoding.decoder import encode_prompt

    judge = judge if judge is not None else load_judge()
    if judge.model is lm.model:
        raise ValueError("the judge must not be the model being steered")
    path = Path(out)
    chat = lm.is_chat if cfg.chat is None else bool(cfg.chat)
    prompts = load_prompts(cfg.prompts_path, split=cfg.split, n=cfg.n_prompts)
    old = load_results(path)
    missing = [k for k in KEY if k not in old.columns] if len(old) else []
    if missing:
        raise ValueError(f"{path.name} is not a frontier results file (no {missing[0]!r} column)")
    done = {_key(r) for r in old.to_dict("records")} if len(old) else set()
    todo = _todo(cfg, lm, chat, prompts, done)
    total = len(cfg.settings) * len(cfg.values) * len(prompts) * cfg.seeds
    ids = {pr.id: encode_prompt(lm, pr.text, chat) for pr in prompts}
    emb = judge.embed([pr.text for pr in prompts]).numpy()  # (P, d)
    sw = _Sweep(lm, cfg, judge, ids, dict(zip(ids, emb, strict=True)), should_stop)
    timings = sw.timings
    frame, made, stopped = old, 0, False
    for chunk in _chunks(todo, cfg.batch_rows or len(todo) or 1):
        point = f"{chunk[0]['setting']} @ {cfg.knob}={chunk[0]['value']:g}"
        base = total - len(todo) + made

        def tick(step: int, _chunk=chunk, _point=point, _base=base) -> None:
            if on_progress is not None:
                on_progress(Progress(_base, total, _point, step, cfg.new_tokens, len(_chunk)))

        rows = _run_chunk(sw, chunk, tick)
        if rows is None:
            stopped = True
            break
        frame = (
            pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
            if len(frame)
            else pd.DataFrame(rows)
        )
        _write(frame, path)
        made += len(rows)
        timings["points"] += len(rows) / (len(prompts) * cfg.seeds)
    if on_progress is not None:
        on_progress(Progress(total - len(todo) + made, total, "done"))
    mine = select(frame, cfg, lm.name, chat, prompts)
    return SweepResult(mine, made, total - len(todo), stopped, timings)


def select(frame: pd.DataFrame, cfg: SweepConfig, model: str, chat: bool, prompts) -> pd.DataFrame:
    """The rows of ``frame`` that belong to ``cfg``'s points (a results file can hold more)."""
    if not len(frame):
        return frame
    specs = {spec_of(s) for s in cfg.settings}
    shas = {p.sha for p in prompts}
    m = (
        frame["spec"].isin(specs)
        & (frame["knob"] == cfg.knob)
        & frame["value"].round(9).isin([round(v, 9) for v in cfg.values])
        & frame["prompt_sha"].isin(shas)
        & (frame["seed"] < cfg.seeds)
        & (frame["model"] == model)
        & (frame["new_tokens"] == cfg.new_tokens)
        & (frame["chat"] == chat)
    )
    return frame[m].reset_index(drop=True)


@dataclass
class _Sweep:
    """What every batch of one :func:`run_sweep` call shares."""

    lm: object
    cfg: SweepConfig
    judge: object
    ids: dict  # prompt id -> token ids (through the chat template when on)
    prompt_emb: dict  # prompt id -> (d,) judge embedding
    should_stop: Callable[[], bool] | None
    timings: dict = field(
        default_factory=lambda: {"generate": 0.0, "sampler": 0.0, "judge": 0.0, "points": 0.0}
    )


def _run_chunk(sw: _Sweep, chunk: list[dict], tick: Callable[[int], None]) -> list[dict] | None:
    """Generate one batch and score it: the finished rows, or None when stopped."""
    from semviz.frontier.batched import generate_batch

    lm, cfg, judge, ids = sw.lm, sw.cfg, sw.judge, sw.ids
    prompt_emb, timings, should_stop = sw.prompt_emb, sw.timings, sw.should_stop

    params = cfg.params(chunk[0]["_side"], chunk[0]["value"])
    p_ids = [ids[r["prompt_id"]] for r in chunk]
    gen = generate_batch(
        lm, p_ids, [r["seed"] for r in chunk], params, max_new_tokens=cfg.new_tokens,
        on_token=tick, should_stop=should_stop,
    )  # fmt: skip
    if gen.stopped:
        return None
    tok = lm.tokenizer
    texts = [tok.decode(c, skip_special_tokens=True) for c in gen.ids]
    t0 = time.perf_counter()
    emb = judge.embed(texts).numpy()  # (B, d)
    t1 = time.perf_counter()
    timings["generate"] += gen.seconds
    timings["sampler"] += gen.sampler_seconds
    timings["judge"] += t1 - t0
    share = {"gen_seconds": gen.seconds / len(chunk), "judge_seconds": (t1 - t0) / len(chunk)}
    rows = []
    for r, c, text, e, n, stop in zip(chunk, gen.ids, texts, emb, gen.nll, gen.stop, strict=True):
        wm = word_metrics(text)
        empty = wm["n_words"] == 0
        coh = 0.0 if empty else float(np.dot(prompt_emb[r["prompt_id"]], e))
        row = {k: v for k, v in r.items() if k != "_side"}
        row.update(
            text=text, n_tokens=len(c), stop=stop, coherence=coh, **wm, nll=n,
            ppl=math.exp(n) if math.isfinite(n) else math.nan, judge=judge.name,
            emb=e.astype(np.float16).tobytes(), batch_rows=len(chunk), **share,
        )  # fmt: skip
        rows.append(row)
    return rows


# -- statistics ---------------------------------------------------------------------------------


def _cross_sim(group: pd.DataFrame) -> float:
    import torch

    from semviz.analysis.judge import cross_similarity

    if len(group) < 2:
        return math.nan
    e = np.stack([np.frombuffer(b, dtype=np.float16).astype(np.float32) for b in group["emb"]])
    return cross_similarity(torch.from_numpy(e))


def per_prompt(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, knob value, prompt): each score averaged over that prompt's seeds.

    ``short`` is the share of seeds whose continuation has fewer than four words;
    ``cross_sim`` the mean cosine between different seeds' continuations (the judge's);
    ``dissimilarity`` is ``1 - cross_sim``; ``nll`` the mean per-token NLL (nats).
    """
    if not len(df):
        return pd.DataFrame()
    keys = ["spec", "knob", "value", "prompt_id"]
    d = df.assign(short=(df["n_words"] < REPETITION_N).astype(float))
    cols = ["coherence", "distinct_1", "distinct_2", "repetition", "short", "nll", "n_tokens"]
    g = d.groupby(keys, sort=False)
    out = g[cols].mean()  # pandas' mean skips NaN: an undefined score is left out, not zero
    out["setting"] = g["setting"].first()
    out["seeds"] = g.size()
    out["cross_sim"] = g.apply(_cross_sim, include_groups=False)
    out["dissimilarity"] = 1.0 - out["cross_sim"]
    return out.reset_index()


METRICS = (
    "coherence", "distinct_1", "distinct_2", "dissimilarity", "cross_sim", "repetition",
    "short", "nll",
)  # fmt: skip


@dataclass
class Dominance:
    """B against A at matched diversity (coherence gap B − A, averaged over the common x range)."""

    a: str
    b: str
    x: str
    gap: float  # NaN when the ranges do not overlap
    lo: float
    hi: float
    x_lo: float
    x_hi: float
    n_boot: int

    @property
    def verdict(self) -> str:
        """One sentence: who dominates, by how much, where (the gap is B − A)."""
        axis = X_AXES[self.x]
        if not math.isfinite(self.gap):
            return f"{self.b} vs {self.a}: no common {axis} range, so no matched comparison"
        where = f"at matched {axis} {self.x_lo:.3f}–{self.x_hi:.3f}"
        if self.lo > 0:
            return (
                f"{self.b} dominates {self.a}: {where}, {self.b} scores {self.gap:.3f} more "
                f"coherence (95% CI {self.lo:.3f} to {self.hi:.3f})"
            )
        if self.hi < 0:
            return (
                f"{self.a} dominates {self.b}: {where}, {self.b} scores {-self.gap:.3f} less "
                f"coherence (95% CI {-self.hi:.3f} to {-self.lo:.3f})"
            )
        return (
            f"neither {self.b} nor {self.a} dominates: {where}, coherence {self.b} − {self.a} "
            f"= {self.gap:+.3f} (95% CI {self.lo:+.3f} to {self.hi:+.3f}), which includes 0"
        )

    def to_dict(self) -> dict:
        d = {
            k: getattr(self, k)
            for k in ("a", "b", "x", "gap", "lo", "hi", "x_lo", "x_hi", "n_boot")
        }
        d = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()
        }
        d["verdict"] = self.verdict
        return d


def matched_gap(
    xa: Sequence[float], ya: Sequence[float], xb: Sequence[float], yb: Sequence[float], n: int = 21
) -> float:
    """Mean of ``B(x) - A(x)`` over ``n`` common x values inside both curves' x ranges.

    Each curve is its points joined in x order (linear interpolation). NaN when the ranges
    do not overlap (or a curve is a single point, which has no range to match).
    """
    xa, ya, xb, yb = (np.asarray(v, dtype=float) for v in (xa, ya, xb, yb))
    lo, hi = max(xa.min(), xb.min()), min(xa.max(), xb.max())
    if not hi > lo:
        return math.nan
    grid = np.linspace(lo, hi, n)
    ia, ib = np.argsort(xa, kind="stable"), np.argsort(xb, kind="stable")
    return float(np.mean(np.interp(grid, xb[ib], yb[ib]) - np.interp(grid, xa[ia], ya[ia])))


@dataclass
class Summary:
    """Points with bootstrap CIs, and every setting against the first at matched diversity."""

    points: pd.DataFrame  # one row per (setting, value): mean, lo, hi of each metric
    dominance: list[Dominance]
    x: str
    knob: str
    n_prompts: int
    n_boot: int

    def to_dict(self) -> dict:
        pts = self.points.drop(columns=["spec"], errors="ignore")
        recs = json.loads(pts.to_json(orient="records"))
        return {
            "x": self.x, "knob": self.knob, "n_prompts": self.n_prompts, "n_boot": self.n_boot,
            "points": recs, "dominance": [d.to_dict() for d in self.dominance],
        }  # fmt: skip


def _matrix(pp: pd.DataFrame, metric: str, points: list[tuple], prompts: list[str]) -> np.ndarray:
    """(n_points, n_prompts) of a per-prompt metric, NaN where a point lacks a prompt."""
    t = pp.pivot_table(index=["spec", "value"], columns="prompt_id", values=metric, dropna=False)
    t = t.reindex(index=pd.MultiIndex.from_tuples(points), columns=prompts)
    return t.to_numpy(dtype=float)


def _boot_means(m: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Per point, the mean over each bootstrap draw of prompts: (n_boot, n_points)."""
    with _nan_quiet():
        return np.nanmean(m[:, idx], axis=2).T


@contextlib.contextmanager
def _nan_quiet():
    """Means of all-NaN slices are NaN by design here (a point without a prompt)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def summarize(
    df: pd.DataFrame, *, x: str = "distinct_2", n_boot: int = 1000, seed: int = 0
) -> Summary:
    """Points with 95 % bootstrap CIs over prompts, and dominance of every setting over the first.

    Parameters
    ----------
    df : result rows (from :func:`run_sweep` or :func:`load_results`), one knob
    x : diversity axis, one of ``X_AXES``
    n_boot : bootstrap draws; ``seed`` makes them reproducible
    """
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    if n_boot < 10:
        raise ValueError(f"n_boot must be at least 10, got {n_boot}")
    if not len(df):
        raise ValueError("there are no results to summarise")
    knobs = df["knob"].unique()
    if len(knobs) != 1:
        raise ValueError(f"the rows sweep several knobs ({', '.join(map(str, knobs))}): pick one")
    pp = per_prompt(df)
    specs = list(dict.fromkeys(pp["spec"]))
    label = {s: pp.loc[pp["spec"] == s, "setting"].iloc[0] for s in specs}
    points = [(s, v) for s in specs for v in sorted(pp.loc[pp["spec"] == s, "value"].unique())]
    prompts = sorted(pp["prompt_id"].unique())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(prompts), size=(n_boot, len(prompts)))  # shared: paired draws
    rows = [
        {
            "setting": label[s],
            "spec": s,
            "value": v,
            "prompts": int(((pp["spec"] == s) & (pp["value"] == v)).sum()),
        }
        for s, v in points
    ]
    boots = {}
    for metric in METRICS:
        m = _matrix(pp, metric, points, prompts)
        b = _boot_means(m, idx)
        boots[metric] = b
        with _nan_quiet():
            mean = np.nanmean(m, axis=1)
            lo, hi = np.nanpercentile(b, [2.5, 97.5], axis=0)
        for i, r in enumerate(rows):
            r[metric], r[metric + "_lo"], r[metric + "_hi"] = mean[i], lo[i], hi[i]
    for r in rows:  # perplexity of the mean per-token NLL: exp keeps the CI's order
        for suffix in ("", "_lo", "_hi"):
            r["ppl" + suffix] = float(np.exp(r["nll" + suffix]))
    table = pd.DataFrame(rows)
    doms = [_dominance(table, boots, points, (specs[0], s), x=x, label=label) for s in specs[1:]]
    return Summary(table, doms, x, str(knobs[0]), len(prompts), n_boot)


def _dominance(table, boots, points, pair, *, x: str, label: dict) -> Dominance:
    """Setting ``pair[1]`` against ``pair[0]``: the gap on the data and on every draw."""
    sa, sb = pair
    ia = [i for i, p in enumerate(points) if p[0] == sa]
    ib = [i for i, p in enumerate(points) if p[0] == sb]
    xs, ys = table[x].to_numpy(), table["coherence"].to_numpy()
    gap = matched_gap(xs[ia], ys[ia], xs[ib], ys[ib])
    bx, by = boots[x], boots["coherence"]
    draws = np.array(
        [matched_gap(bx[k, ia], by[k, ia], bx[k, ib], by[k, ib]) for k in range(len(bx))]
    )
    draws = draws[np.isfinite(draws)]
    lo, hi = np.percentile(draws, [2.5, 97.5]) if len(draws) else (math.nan, math.nan)
    x_lo = max(xs[ia].min(), xs[ib].min())
    x_hi = min(xs[ia].max(), xs[ib].max())
    return Dominance(
        label[sa], label[sb], x, gap, float(lo), float(hi), float(x_lo), float(x_hi), len(draws)
    )


def dominance(
    df: pd.DataFrame, a: str, b: str, *, x: str = "distinct_2", n_boot: int = 1000
) -> Dominance:
    """``b`` against ``a`` (setting labels) at matched ``x`` (see :func:`summarize`)."""
    sub = df[df["setting"].isin([a, b])]
    missing = {a, b} - set(sub["setting"])
    if missing:
        raise ValueError(f"no results for setting {sorted(missing)[0]!r}")
    order = pd.concat([sub[sub["setting"] == a], sub[sub["setting"] == b]])
    return summarize(order, x=x, n_boot=n_boot).dominance[0]


# -- figure ---------------------------------------------------------------------------------


def frontier_figure(summary: Summary):
    """Coherence against diversity, one curve per setting, 95 % CI bars, knob values as labels."""
    import plotly.graph_objects as go

    x = summary.x
    t = summary.points
    short = KNOB_SYMBOLS.get(summary.knob, summary.knob)  # point labels stay short
    fig = go.Figure()
    for i, (_spec, g) in enumerate(t.groupby("spec", sort=False)):
        g = g.sort_values("value")
        color = style.side_color(i)
        name = str(g["setting"].iloc[0])
        fig.add_scatter(
            x=g[x], y=g["coherence"], mode="lines+markers+text", name=name,
            text=[f"{short}={v:g}" for v in g["value"]], textposition="top center",
            line={"color": color}, marker={"size": 9},
            error_x={"type": "data", "symmetric": False, "array": g[x + "_hi"] - g[x],
                     "arrayminus": g[x] - g[x + "_lo"], "thickness": 1},
            error_y={"type": "data", "symmetric": False, "array": g["coherence_hi"] - g["coherence"],
                     "arrayminus": g["coherence"] - g["coherence_lo"], "thickness": 1},
            customdata=np.stack([g["value"], g["repetition"], g["ppl"]], axis=-1),
            hovertemplate=(
                f"<b>{name}</b><br>{summary.knob}=%{{customdata[0]:g}}<br>coherence %{{y:.3f}}"
                f"<br>{X_AXES[x]} %{{x:.3f}}<br>repeated 4-grams %{{customdata[1]:.1%}}"
                "<br>perplexity %{customdata[2]:.1f}<extra></extra>"
            ),
        )  # fmt: skip
    fig.update_layout(
        template="plotly_white", height=480, margin={"l": 60, "r": 20, "t": 30, "b": 50},
        xaxis_title=f"diversity: {X_AXES[x]} →", yaxis_title="coherence with the prompt (judge) →",
        legend={"orientation": "h", "y": -0.18, "x": 0.0},
    )  # fmt: skip
    return fig
