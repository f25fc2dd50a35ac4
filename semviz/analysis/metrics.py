"""Run metrics (seed §7.2): diversity, repetition, entropy, gravity, pruning and speed.

All of them read a recorded :class:`~semviz.output.trace.Trace`, so a saved trace, a live run and
each side of an A/B comparison are measured by the same code.

Definitions, over the generated tokens only (the prompt is not counted):

- ``distinct_1``, ``distinct_2``: distinct n-grams / n-grams (token ids). 1.0 means no
  n-gram repeats; low values mean the text circles.
- ``repetition_rate``: share of the 4-grams that already occurred earlier in the text
  (the safety fallback's loop detector uses the same n by default).
- ``mean_entropy``: mean raw next-token entropy, nats.
- ``mean_gravity``: mean over steps of the largest normalised gravity potential among the
  candidates (the seed's "引力势最大值"); None when gravity was off.
- ``pruning_ratio``: mean share of the probability mass the filters removed (from the
  recorded waterfall). 0 keeps everything, 0.9 means the token was drawn from 10 % of it.
- ``mean_kept``: mean size of the final kept set.
- ``tokens_per_s``: steps / (model forward + semviz time), so prefill and I/O are excluded.

Word-level metrics of a finished text (:func:`words`, :func:`word_metrics`) use the same
n-gram definitions over lower-cased words instead of token ids, so texts from different
tokenizers compare. A text with fewer than ``n`` words has no n-gram: its distinct-n and
repetition are undefined (NaN) and left out of averages, rather than counted as fully
repeated; callers report how many texts were that short (``n_words``) beside the mean.

Diversity *between* the continuations of one prompt (several seeds), which a text's own
distinct-n cannot see:

- ``pooled_distinct``: distinct word n-grams over every continuation together / all their
  n-grams (an n-gram never spans two texts). Seeds that say the same thing share n-grams,
  so the pooled value drops even when each text alone is varied.
- ``self_bleu``: the mean, over the continuations, of the sentence BLEU of each against the
  others as references (Zhu et al. 2018, Texygen), on the same lower-cased words, through
  ``sacrebleu`` (4-grams, exponential smoothing, effective order). 1 means every seed
  wrote the same text; lower is more diverse.

Examples
--------
>>> distinct_n([1, 2, 1, 2], 1)
0.5
>>> distinct_n([1, 2, 1, 2], 2)
0.6666666666666666
>>> repetition_rate([1, 2, 3, 4, 1, 2, 3, 4], n=4)
0.2
>>> words("It's a cat, a CAT!")
["it's", 'a', 'cat', 'a', 'cat']
>>> pooled_distinct(["a b c", "a b d"], 2)  # ab, bc, ab, bd: three distinct of four
0.75
>>> round(self_bleu(["the cat sat on the mat", "the cat sat on the mat"]), 6)
1.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass

from semviz.output.trace import StepRecord, Trace

__all__ = [
    "METRIC_INFO",
    "RunMetrics",
    "distinct_n",
    "pooled_distinct",
    "pruned_mass",
    "repetition_rate",
    "run_metrics",
    "self_bleu",
    "word_metrics",
    "words",
]

REPETITION_N = 4

# name → (label, unit/direction) for tables and the app
METRIC_INFO: dict[str, tuple[str, str]] = {
    "steps": ("tokens", ""),
    "distinct_1": ("distinct-1", "higher = more varied"),
    "distinct_2": ("distinct-2", "higher = more varied"),
    "repetition_rate": ("repetition rate", "share of repeated 4-grams"),
    "mean_entropy": ("mean entropy", "nats"),
    "mean_gravity": ("mean max gravity", "z-score, blank when off"),
    "pruning_ratio": ("pruning ratio", "share of mass removed"),
    "mean_kept": ("mean kept set", "tokens"),
    "tokens_per_s": ("tokens/s", "forward + semviz"),
}


def _ngrams(ids: Sequence[Hashable], n: int) -> list[tuple]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def distinct_n(ids: Sequence[Hashable], n: int) -> float:
    """Distinct n-grams over all n-grams; nan when the text is shorter than ``n``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = _ngrams(list(ids), n)
    if not grams:
        return float("nan")
    return len(set(grams)) / len(grams)


def repetition_rate(ids: Sequence[Hashable], n: int = REPETITION_N) -> float:
    """Share of n-grams that occurred earlier in ``ids``; nan when shorter than ``n``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    seen: set[tuple] = set()
    repeats = 0
    grams = _ngrams(list(ids), n)
    for g in grams:
        if g in seen:
            repeats += 1
        seen.add(g)
    return repeats / len(grams) if grams else float("nan")


_WORD = re.compile(r"\w+(?:'\w+)*")


def words(text: str) -> list[str]:
    """Lower-cased words of ``text``: runs of letters, digits and ``_`` (``it's`` is one word).

    Punctuation and whitespace separate words and are not words themselves, so a text's
    layout (newlines, code indentation) does not count as variety or as repetition.
    """
    return _WORD.findall(text.lower())


def word_metrics(text: str, n_rep: int = REPETITION_N) -> dict[str, float]:
    """Word-level ``n_words``, ``distinct_1``, ``distinct_2`` and ``repetition`` of a text.

    ``repetition`` is :func:`repetition_rate` over word ``n_rep``-grams. Values a text is
    too short for are NaN (see the module docstring).

    Examples
    --------
    >>> word_metrics("the cat sat on the cat sat on")["repetition"]  # 1 of 5 four-grams
    0.2
    """
    w = words(text)
    return {
        "n_words": float(len(w)),
        "distinct_1": distinct_n(w, 1),
        "distinct_2": distinct_n(w, 2),
        "repetition": repetition_rate(w, n_rep),
    }


def pooled_distinct(texts: Sequence[str], n: int = 2) -> float:
    """Distinct word ``n``-grams over all of ``texts`` / their n-grams; NaN when none has any.

    Each text contributes its own n-grams (none spans two texts), so ``k`` copies of one
    text score ``1/k`` of that text's distinct-n, and ``k`` texts with no n-gram in common
    score the mean of their own.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [g for t in texts for g in _ngrams(words(t), n)]
    return len(set(grams)) / len(grams) if grams else float("nan")


_BLEU = None


def self_bleu(texts: Sequence[str]) -> float:
    """Mean sentence BLEU of each text against the others (0..1); NaN with < 2 texts.

    Texts without a word are left out (BLEU of nothing is not a similarity). Each text is
    the hypothesis once, with every other as a reference, scored by ``sacrebleu`` on the
    lower-cased :func:`words` (so punctuation and layout count as in distinct-n).
    """
    global _BLEU
    if _BLEU is None:
        from sacrebleu.metrics import BLEU

        _BLEU = BLEU(tokenize="none", effective_order=True)
    ws = [" ".join(w) for w in (words(t) for t in texts) if w]
    if len(ws) < 2:
        return float("nan")
    scores = [_BLEU.sentence_score(h, ws[:i] + ws[i + 1 :]).score for i, h in enumerate(ws)]
    return sum(scores) / (100.0 * len(scores))


def pruned_mass(rec: StepRecord) -> float:
    """Share of the probability mass the step's pruning removed, in [0, 1].

    Read from the recorded waterfall: each stage removed a fraction of the mass entering it,
    measured on the distribution that stage looks at, so what survives every stage is the
    product of the survivors' shares. Exact for any kept-set size (unlike counting the
    recorded candidates, which stop at K).
    """
    kept = 1.0
    for w in rec.waterfall:
        kept *= 1.0 - min(max(float(w.get("mass_removed", 0.0)), 0.0), 1.0)
    return 1.0 - kept


@dataclass(frozen=True)
class RunMetrics:
    """The metrics of one run (see the module docstring for definitions)."""

    steps: int
    distinct_1: float
    distinct_2: float
    repetition_rate: float
    mean_entropy: float
    mean_gravity: float | None
    pruning_ratio: float
    mean_kept: float
    tokens_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def run_metrics(trace: Trace, upto: int | None = None) -> RunMetrics:
    """Metrics of the first ``upto`` steps of ``trace`` (all by default)."""
    steps = trace.steps[: len(trace.steps) if upto is None else upto]
    ids = [s.token_id for s in steps]
    grav = [float(s.gravity.max()) for s in steps if s.gravity is not None and s.gravity.numel()]
    seconds = sum(s.t_forward + s.t_semviz for s in steps)
    return RunMetrics(
        steps=len(steps),
        distinct_1=distinct_n(ids, 1),
        distinct_2=distinct_n(ids, 2),
        repetition_rate=repetition_rate(ids),
        mean_entropy=_mean([s.entropy for s in steps]),
        mean_gravity=_mean(grav) if grav else None,
        pruning_ratio=_mean([pruned_mass(s) for s in steps]),
        mean_kept=_mean([float(s.n_kept) for s in steps]),
        tokens_per_s=len(steps) / seconds if seconds > 0 else float("nan"),
    )
