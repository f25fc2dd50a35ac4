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
from semviz.analysis.metrics import REPETITION_N, pooled_distinct, self_bleu, word_metrics
from semviz.frontier.executor import ShardTask
from semviz.output import files, style

__all__ = [
    "DEFAULT_OUT",
    "KNOBS",
    "PROMPTS_PATH",
    "SHIPPED",
    "SHIPPED_SWEEPS",
    "X_AXES",
    "AUTO",
    "Dominance",
    "Progress",
    "Prompt",
    "Summary",
    "SweepConfig",
    "SweepResult",
    "SweepTask",
    "agreement",
    "axis_resolution",
    "best_axis",
    "dominance",
    "frontier_figure",
    "load_prompts",
    "load_results",
    "matched_gap",
    "normalize_knob",
    "per_prompt",
    "run_sweep",
    "score_results",
    "select",
    "shards",
    "summarize",
    "sweep_task",
]

ROOT = Path(__file__).resolve().parents[2]
PROMPTS_PATH = ROOT / "data" / "prompts" / "prompts.jsonl"
# finished sweeps on the test half that the "Does it help?" page opens without a model run:
# the default gravity's first (the page opens on it), then the seed's first gravity's
SHIPPED_SWEEPS: dict[str, Path] = {
    "the default gravity (contrast, λ 0.5) against top-p 0.95": (
        ROOT / "data" / "frontier" / "frontier_contrast_test.parquet"
    ),
    "the first gravity (attention-weighted pull, λ 0.5 and 1) against top-p 0.95": (
        ROOT / "data" / "frontier" / "frontier_test.parquet"
    ),
}
SHIPPED = next(iter(SHIPPED_SWEEPS.values()))
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
# diversity axes, each "higher is more diverse"; the last three compare a prompt's seeds
X_AXES: dict[str, str] = {
    "distinct_2": "distinct-2 (word bigrams)",
    "distinct_1": "distinct-1 (words)",
    "dissimilarity": "1 − cross-seed similarity",
    "bleu_diversity": "1 − self-BLEU between seeds",
    "pooled_distinct_2": "distinct-2 pooled over seeds",
}
AUTO = "auto"  # summarize(x="auto"): the axis the sweep resolves best (see best_axis)
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
    n_prompts: int | None = None  # None: every prompt of the half
    seeds: int = 4  # self-BLEU and pooled distinct-n compare a prompt's seeds
    new_tokens: int = 128
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
            if (v is not None or name not in ("batch_rows", "n_prompts")) and v < 1:
                raise ValueError(f"{name} must be at least 1, got {v}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        for side in self.settings:
            for v in self.values:
                p = self.params(side, v)  # every point's PruneParams is valid before any work
                if p.adaptive == "entropix":  # the batched sampler would refuse mid-sweep
                    raise ValueError(
                        f"{side.label}: adaptive temperature 'entropix' reads each step's "
                        "attention, which a batched sweep does not capture"
                    )

    def params(self, side: Side, value: float):
        """The point's ``PruneParams``: the setting with the knob set to ``value``."""
        try:
            return side.params.replace(**{self.knob: value})
        except ValueError as exc:
            raise ValueError(f"{side.label} at {self.knob}={value:g}: {exc}") from None


@dataclass
class Progress:
    """Where a sweep stands; handed to ``on_progress`` as the work goes on.

    ``rows_done`` is the rows' worth of work done: finished rows (those already in the file
    included) plus the done share of every batch in flight.
    """

    rows_done: float
    rows_total: int
    point: str

    @property
    def fraction(self) -> float:
        if self.rows_total == 0:
            return 1.0
        return min(self.rows_done / self.rows_total, 1.0)


@dataclass
class SweepResult:
    """What a :func:`run_sweep` call left in its Parquet file, and what it cost."""

    frame: pd.DataFrame  # the rows of this sweep's points (old and new)
    new_rows: int
    skipped_rows: int
    stopped: bool
    timings: dict = field(default_factory=dict)  # seconds: generate (sampler within), judge
    path: str = ""  # the Parquet file
    workers: int = 0  # Ray workers that generated the rows (0: this process)


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


def _rows(cfg: SweepConfig, model: str, chat: bool, prompts: list[Prompt]) -> list[dict]:
    """Every row of the sweep, grouped by point (setting, value) in sweep order."""
    rows = []
    for side in cfg.settings:
        for v in cfg.values:
            for pr in prompts:
                for seed in range(cfg.seeds):
                    rows.append(
                        {
                            "setting": side.label,
                            "spec": spec_of(side),
                            "knob": cfg.knob,
                            "value": float(v),
                            "prompt_id": pr.id,
                            "prompt_sha": pr.sha,
                            "kind": pr.kind,
                            "split": pr.split,
                            "prompt": pr.text,
                            "seed": seed,
                            "model": model,
                            "new_tokens": cfg.new_tokens,
                            "chat": chat,
                            "_side": side,
                        }
                    )
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


def shards(cfg: SweepConfig, model: str, chat: bool, prompts: list[Prompt], done: set) -> list:
    """The batches still to run, as :class:`~semviz.frontier.executor.Shard` s.

    The batches are cut from the whole sweep, before the rows already done are removed, so
    a resumed sweep runs the same batches (the same rows padded together) as one that never
    stopped: a stop drops whole batches only.
    """
    from semviz.frontier.executor import Shard

    rows = _rows(cfg, model, chat, prompts)
    size = cfg.batch_rows or len(prompts) * cfg.seeds
    out = []
    for i, chunk in enumerate(_chunks(rows, size)):
        todo = [r for r in chunk if _key(r) not in done]
        if todo:
            label = f"{todo[0]['setting']} @ {cfg.knob}={todo[0]['value']:g}"
            out.append(Shard(key=i, payload=todo, size=len(todo), label=label))
    return out


def run_sweep(
    lm,
    cfg: SweepConfig,
    out: str | Path = DEFAULT_OUT,
    *,
    judge=None,
    score: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    executor=None,
) -> SweepResult:
    """Generate and score every missing row of ``cfg``, appending to ``out`` after each batch.

    Rows already in ``out`` (same setting, knob value, prompt text, seed, model, length and
    chat template) are skipped, so a stopped sweep resumes. ``should_stop`` is polled after
    every generated position; a stop drops the unfinished batches and keeps every finished one.

    Parameters
    ----------
    lm : the loaded model, for a sweep in this process (None with a Ray ``executor``)
    score : False writes the rows without the judge's scores (``coherence`` and ``emb``
        empty), for a machine without the judge; :func:`score_results` fills them later
    executor : an :class:`~semviz.frontier.executor.Executor` of :func:`sweep_task` to run the
        batches on (Ray workers); default: this process, on ``lm``
    """
    from semviz.frontier.executor import Executor

    path = Path(out)
    prompts = load_prompts(cfg.prompts_path, split=cfg.split, n=cfg.n_prompts)
    old = load_results(path)
    missing = [k for k in KEY if k not in old.columns] if len(old) else []
    if missing:
        raise ValueError(f"{path.name} is not a frontier results file (no {missing[0]!r} column)")
    own = executor is None
    if own:
        if score and judge is None:
            from semviz.analysis.judge import load_judge

            judge = load_judge()
        executor = Executor(sweep_task(cfg, score=score, judge=judge), lm=lm)
    try:
        info = executor.info()
        chat = info.is_chat if cfg.chat is None else bool(cfg.chat)
        done = {_key(r) for r in old.to_dict("records")} if len(old) else set()
        todo = shards(cfg, info.model, chat, prompts, done)
        total = len(cfg.settings) * len(cfg.values) * len(prompts) * cfg.seeds
        skipped = total - int(sum(s.size for s in todo))
        timings = {"generate": 0.0, "sampler": 0.0, "judge": 0.0, "points": 0.0}
        state = {"frame": old, "made": 0}

        def on_result(shard, res) -> None:
            rows, t = res
            frame = state["frame"]
            new = pd.DataFrame(rows)
            state["frame"] = pd.concat([frame, new], ignore_index=True) if len(frame) else new
            _write(state["frame"], path)
            state["made"] += len(rows)
            for k in ("generate", "sampler", "judge"):
                timings[k] += t[k]
            timings["points"] += len(rows) / (len(prompts) * cfg.seeds)

        def progress(done_rows: float, _total: float, label: str) -> None:
            if on_progress is not None:
                on_progress(Progress(skipped + done_rows, total, label))

        stopped = executor.run(
            todo, on_result=on_result, on_progress=progress, should_stop=should_stop
        )
    finally:
        if own:
            executor.close()
    if on_progress is not None:
        on_progress(Progress(skipped + state["made"], total, "done"))
    mine = select(state["frame"], cfg, info.model, chat, prompts)
    workers = int(getattr(executor, "workers", None) or 0) if executor is not None else 0
    return SweepResult(mine, state["made"], skipped, stopped, timings, str(out), workers)


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


class SweepTask(ShardTask):
    """The frontier's :class:`~semviz.frontier.executor.ShardTask`: a shard is one batch of
    rows of one point; the result is its finished rows and their timings."""

    def __init__(self, cfg: SweepConfig, score: bool, judge=None) -> None:
        self.cfg, self.score, self.judge = cfg, score, judge

    def __getstate__(self) -> dict:  # a Ray worker loads its own judge
        return {"cfg": self.cfg, "score": self.score, "judge": None}

    def setup(self, lm):
        judge = self.judge
        if self.score and judge is None:
            from semviz.analysis.judge import load_judge

            judge = load_judge()
        if judge is not None and judge.model is lm.model:
            raise ValueError("the judge must not be the model being steered")
        return lm, (judge if self.score else None)

    def run(self, state, chunk, tick, should_stop):
        lm, judge = state
        n = self.cfg.new_tokens
        return _run_chunk(lm, self.cfg, judge, chunk, lambda step: tick(step / n), should_stop)


def sweep_task(cfg: SweepConfig, *, score: bool = True, judge=None) -> SweepTask:
    """The :class:`~semviz.frontier.executor.ShardTask` that runs ``cfg``'s batches."""
    return SweepTask(cfg, score, judge)


def _run_chunk(lm, cfg, judge, chunk: list[dict], tick, should_stop):
    """Generate one batch and score it: ``(rows, timings)``, or None when stopped."""
    from semviz.decoding.decoder import encode_prompt
    from semviz.frontier.batched import generate_batch

    chat = chunk[0]["chat"]
    texts_p = {r["prompt_id"]: r["prompt"] for r in chunk}
    ids = {k: encode_prompt(lm, t, chat) for k, t in texts_p.items()}
    params = cfg.params(chunk[0]["_side"], chunk[0]["value"])
    gen = generate_batch(
        lm,
        [ids[r["prompt_id"]] for r in chunk],
        [r["seed"] for r in chunk],
        params,
        max_new_tokens=cfg.new_tokens,
        on_token=tick,
        should_stop=should_stop,
    )
    if gen.stopped:
        return None
    tok = lm.tokenizer
    texts = [tok.decode(c, skip_special_tokens=True) for c in gen.ids]
    t0 = time.perf_counter()
    if judge is not None:
        p_emb = dict(zip(texts_p, judge.embed(list(texts_p.values())).numpy(), strict=True))
        emb = judge.embed(texts).numpy()  # (B, d)
    t1 = time.perf_counter()
    timings = {"generate": gen.seconds, "sampler": gen.sampler_seconds, "judge": t1 - t0}
    share = {"gen_seconds": gen.seconds / len(chunk), "judge_seconds": (t1 - t0) / len(chunk)}
    rows = []
    for i, (r, c, text, n, stop) in enumerate(
        zip(chunk, gen.ids, texts, gen.nll, gen.stop, strict=True)
    ):
        wm = word_metrics(text)
        row = {k: v for k, v in r.items() if k != "_side"}
        row.update(
            text=text,
            n_tokens=len(c),
            stop=stop,
            **wm,
            nll=n,
            ppl=math.exp(n) if math.isfinite(n) else math.nan,
            batch_rows=len(chunk),
            **share,
        )
        row.update(_judged(judge, wm, p_emb[r["prompt_id"]], emb[i]) if judge else _UNSCORED)
        rows.append(row)
    return rows, timings


_UNSCORED = {"coherence": math.nan, "judge": None, "emb": None}


def _judged(judge, wm: dict, prompt_emb: np.ndarray, e: np.ndarray) -> dict:
    """The judge's columns of a row: coherence (0 for a text without words) and embedding."""
    coh = 0.0 if wm["n_words"] == 0 else float(np.dot(prompt_emb, e))
    return {"coherence": coh, "judge": judge.name, "emb": e.astype(np.float16).tobytes()}


def score_results(
    path: str | Path,
    judge=None,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    batch: int = 512,
) -> int:
    """Fill the judge's columns of every row of ``path`` that lacks them; returns how many.

    For sweeps generated where the judge is not (``run_sweep(score=False)``, e.g. on a GPU
    machine): the same scores as a sweep that judged as it went. The file is rewritten after
    every ``batch`` rows, so a stop keeps what was scored.
    """
    from semviz.analysis.judge import load_judge

    p = Path(path)
    df = load_results(p)
    if not len(df):
        raise ValueError(f"{p.name} holds no results to score")
    for col, default in _UNSCORED.items():
        if col not in df.columns:
            df[col] = default
    df["emb"] = df["emb"].astype(object)
    df["judge"] = df["judge"].astype(object)
    todo = np.flatnonzero(df["coherence"].isna().to_numpy() | df["emb"].isna().to_numpy())
    if not len(todo):
        return 0
    judge = judge if judge is not None else load_judge()
    prompts = df["prompt"].iloc[todo].unique().tolist()
    p_emb = dict(zip(prompts, judge.embed(prompts).numpy(), strict=True))
    done = 0
    for lo in range(0, len(todo), batch):
        if should_stop is not None and should_stop():
            break
        idx = todo[lo : lo + batch]
        emb = judge.embed(df["text"].iloc[idx].tolist()).numpy()  # (b, d)
        for i, e in zip(idx, emb, strict=True):
            r = df.iloc[i]
            got = _judged(judge, {"n_words": r["n_words"]}, p_emb[r["prompt"]], e)
            for k, v in got.items():
                df.at[df.index[i], k] = v
        _write(df, p)
        done += len(idx)
        if on_progress is not None:
            on_progress(Progress(done, len(todo), "scoring"))
    return done


# -- statistics ---------------------------------------------------------------------------------


def _cross_sim(group: pd.DataFrame) -> float:
    import torch

    from semviz.analysis.judge import cross_similarity

    embs = [b for b in group["emb"] if isinstance(b, bytes)]  # unscored rows have none
    if len(embs) < 2:
        return math.nan
    e = np.stack([np.frombuffer(b, dtype=np.float16).astype(np.float32) for b in embs])
    return cross_similarity(torch.from_numpy(e))


def _between_seeds(group: pd.DataFrame) -> pd.Series:
    texts = group["text"].tolist()
    return pd.Series(
        {"self_bleu": self_bleu(texts), "pooled_distinct_2": pooled_distinct(texts, 2)}
    )


def per_prompt(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, knob value, prompt): each score averaged over that prompt's seeds.

    ``short`` is the share of seeds whose continuation has fewer than four words;
    ``cross_sim`` the mean cosine between different seeds' continuations (the judge's);
    ``dissimilarity`` is ``1 - cross_sim``; ``self_bleu`` the mean BLEU of each seed's
    continuation against the others' and ``bleu_diversity`` ``1 - self_bleu``;
    ``pooled_distinct_2`` distinct word bigrams over all the seeds' continuations together
    (:mod:`semviz.analysis.metrics`); ``nll`` the mean per-token NLL (nats).
    Rows without the judge's scores (``coherence`` NaN) keep their text metrics.
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
    between = g[["text"]].apply(_between_seeds)
    out["self_bleu"] = between["self_bleu"]
    out["bleu_diversity"] = 1.0 - out["self_bleu"]
    out["pooled_distinct_2"] = between["pooled_distinct_2"]
    return out.reset_index()


METRICS = (
    "coherence",
    "distinct_1",
    "distinct_2",
    "dissimilarity",
    "cross_sim",
    "repetition",
    "short",
    "nll",
    "self_bleu",
    "bleu_diversity",
    "pooled_distinct_2",
)


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
    def winner(self) -> str:
        """``"b"`` or ``"a"`` (that side dominates), ``"neither"``, or ``"none"`` (no overlap)."""
        if not math.isfinite(self.gap):
            return "none"
        return "b" if self.lo > 0 else "a" if self.hi < 0 else "neither"

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
    """Points with bootstrap CIs, and every setting against the first at matched diversity.

    ``dominance`` is on the axis ``x``; ``by_axis`` holds the same comparisons on every
    axis of ``X_AXES``, ``agreement`` one sentence per compared setting saying which axes
    agree, and ``resolution`` how well the sweep resolves each axis (:func:`axis_resolution`).
    """

    points: pd.DataFrame  # one row per (setting, value): mean, lo, hi of each metric
    dominance: list[Dominance]
    x: str
    knob: str
    n_prompts: int
    n_boot: int
    by_axis: dict[str, list[Dominance]] = field(default_factory=dict)
    agreement: list[str] = field(default_factory=list)
    resolution: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        pts = self.points.drop(columns=["spec"], errors="ignore")
        recs = json.loads(pts.to_json(orient="records"))
        res = {k: (v if math.isfinite(v) else None) for k, v in self.resolution.items()}
        return {
            "x": self.x,
            "knob": self.knob,
            "n_prompts": self.n_prompts,
            "n_boot": self.n_boot,
            "points": recs,
            "dominance": [d.to_dict() for d in self.dominance],
            "axes": {a: [d.to_dict() for d in ds] for a, ds in self.by_axis.items()},
            "agreement": self.agreement,
            "resolution": res,
        }


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


def axis_resolution(points: pd.DataFrame, x: str) -> float:
    """How many point CIs the sweep's matched diversity range spans on axis ``x``.

    The range is the one the settings share (inside every setting's curve), or the one
    setting's own range when there is only one; it is divided by the median width of the
    points' 95 % CIs on ``x``. An axis that saturates (every point near 1, as word distinct-2
    does on short texts) spans few CI widths, and one on which the settings do not overlap
    spans none, so no matched comparison is possible there. NaN without data.
    """
    ok = points[[x, x + "_lo", x + "_hi"]].notna().all(axis=1)
    t = points[ok]
    if not len(t):
        return math.nan
    ranges = [(g[x].min(), g[x].max()) for _, g in t.groupby("spec", sort=False)]
    lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
    width = float(np.median(t[x + "_hi"] - t[x + "_lo"]))
    if not hi > lo:
        return 0.0
    return float((hi - lo) / width) if width > 0 else math.inf


def best_axis(points: pd.DataFrame) -> str:
    """The axis of ``X_AXES`` with the highest :func:`axis_resolution` (ties: listed first)."""
    res = {a: axis_resolution(points, a) for a in X_AXES if a in points.columns}
    finite = {a: r for a, r in res.items() if not math.isnan(r)}
    return max(finite, key=finite.get) if finite else next(iter(X_AXES))


def summarize(df: pd.DataFrame, *, x: str = AUTO, n_boot: int = 1000, seed: int = 0) -> Summary:
    """Points with 95 % bootstrap CIs over prompts, and dominance of every setting over the first.

    Parameters
    ----------
    df : result rows (from :func:`run_sweep` or :func:`load_results`), one knob; rows the
        judge has not scored yet (``coherence`` NaN) are left out
    x : diversity axis of ``dominance``, one of ``X_AXES``, or ``"auto"``: the one the sweep
        resolves best (:func:`best_axis`). Dominance is computed on every axis either way.
    n_boot : bootstrap draws; ``seed`` makes them reproducible
    """
    if x != AUTO and x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)} or auto, got {x!r}")
    if n_boot < 10:
        raise ValueError(f"n_boot must be at least 10, got {n_boot}")
    if not len(df):
        raise ValueError("there are no results to summarise")
    knobs = df["knob"].unique()
    if len(knobs) != 1:
        raise ValueError(f"the rows sweep several knobs ({', '.join(map(str, knobs))}): pick one")
    df = df[df["coherence"].notna()]
    if not len(df):
        raise ValueError(
            "no row has the judge's scores yet: score the file first (python -m semviz "
            "frontier --score --out FILE)"
        )
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
    resolution = {a: axis_resolution(table, a) for a in X_AXES}
    x = best_axis(table) if x == AUTO else x
    by_axis = {
        a: [_dominance(table, boots, points, (specs[0], s), x=a, label=label) for s in specs[1:]]
        for a in X_AXES
    }
    agree = [agreement([by_axis[a][i] for a in X_AXES]) for i in range(len(specs) - 1)]
    return Summary(
        table, by_axis[x], x, str(knobs[0]), len(prompts), n_boot, by_axis, agree, resolution
    )


def _names(axes: list[str]) -> str:
    names = [X_AXES[a] for a in axes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def agreement(doms: Sequence[Dominance]) -> str:
    """One sentence on which diversity axes agree, for one pair compared on several axes.

    Examples
    --------
    >>> d = lambda x, lo, hi: Dominance("A", "B", x, (lo + hi) / 2, lo, hi, 0.1, 0.9, 100)
    >>> agreement([d("distinct_2", -0.2, -0.1), d("dissimilarity", -0.05, 0.02)])
    'On no diversity axis does B beat A: A dominates on distinct-2 (word bigrams); neither dominates on 1 − cross-seed similarity.'
    """
    if not doms:
        raise ValueError("doms: give at least one comparison")
    a, b = doms[0].a, doms[0].b
    by: dict[str, list[str]] = {"a": [], "b": [], "neither": [], "none": []}
    for d in doms:
        by[d.winner].append(d.x)
    n = len(doms)
    rest = []
    if by["neither"]:
        rest.append(f"neither dominates on {_names(by['neither'])}")
    if by["none"]:
        rest.append(f"the curves share no range on {_names(by['none'])}")
    tail = "; ".join(rest)
    if len(by["a"]) == n:
        return f"On every diversity axis {a} dominates {b}."
    if len(by["b"]) == n:
        return f"On every diversity axis {b} dominates {a}."
    if by["a"] and by["b"]:
        return (
            f"The diversity axes disagree: {b} dominates {a} on {_names(by['b'])}, {a} "
            f"dominates {b} on {_names(by['a'])}" + (f"; {tail}." if tail else ".")
        )
    if by["b"]:
        return f"On no diversity axis does {a} beat {b}: {b} dominates on {_names(by['b'])}" + (
            f"; {tail}." if tail else "."
        )
    if by["a"]:
        return f"On no diversity axis does {b} beat {a}: {a} dominates on {_names(by['a'])}" + (
            f"; {tail}." if tail else "."
        )
    return f"On no diversity axis does either of {a} and {b} dominate: {tail}."


def _dominance(table, boots, points, pair, *, x: str, label: dict) -> Dominance:
    """Setting ``pair[1]`` against ``pair[0]``: the gap on the data and on every draw."""
    sa, sb = pair
    ia = [i for i, p in enumerate(points) if p[0] == sa]
    ib = [i for i, p in enumerate(points) if p[0] == sb]
    xs, ys = table[x].to_numpy(), table["coherence"].to_numpy()
    ok = np.isfinite(xs) & np.isfinite(ys)
    ia, ib = [i for i in ia if ok[i]], [i for i in ib if ok[i]]
    if len(ia) < 2 or len(ib) < 2:  # a single point has no range to match
        return Dominance(label[sa], label[sb], x, *([math.nan] * 5), 0)
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
            x=g[x],
            y=g["coherence"],
            mode="lines+markers+text",
            name=name,
            text=[f"{short}={v:g}" for v in g["value"]],
            textposition="top center",
            line={"color": color},
            marker={"size": 9},
            error_x={
                "type": "data",
                "symmetric": False,
                "array": g[x + "_hi"] - g[x],
                "arrayminus": g[x] - g[x + "_lo"],
                "thickness": 1,
            },
            error_y={
                "type": "data",
                "symmetric": False,
                "array": g["coherence_hi"] - g["coherence"],
                "arrayminus": g["coherence"] - g["coherence_lo"],
                "thickness": 1,
            },
            customdata=np.stack([g["value"], g["repetition"], g["ppl"]], axis=-1),
            hovertemplate=(
                f"<b>{name}</b><br>{summary.knob}=%{{customdata[0]:g}}<br>coherence %{{y:.3f}}"
                f"<br>{X_AXES[x]} %{{x:.3f}}<br>repeated 4-grams %{{customdata[1]:.1%}}"
                "<br>perplexity %{customdata[2]:.1f}<extra></extra>"
            ),
        )
    fig.update_layout(
        template="plotly_white",
        height=480,
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        xaxis_title=f"diversity: {X_AXES[x]} →",
        yaxis_title="coherence with the prompt (judge) →",
        legend={"orientation": "h", "y": -0.18, "x": 0.0},
    )
    return fig
