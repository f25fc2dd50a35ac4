"""Result rows with chosen scores, for statistics and page tests that need no model run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd


def rows(
    settings: dict[str, dict[float, tuple[list[float], list[float]]]],
    *,
    knob: str = "temperature",
    seeds: int = 2,
) -> pd.DataFrame:
    """``settings[label][value] = (coherence per prompt, distinct_2 per prompt)``.

    Every seed of a prompt gets the prompt's scores, so per-prompt means are those values.
    Embeddings are unit vectors: seed k of every prompt points along axis k, so the
    continuations of different seeds are orthogonal (cross-seed similarity 0).
    """
    out = []
    for label, points in settings.items():
        for value, (coh, d2) in points.items():
            for p, (c, d) in enumerate(zip(coh, d2, strict=True)):
                for s in range(seeds):
                    e = np.zeros(384, dtype=np.float16)
                    e[s] = 1.0
                    out.append(
                        {
                            "setting": label,
                            "spec": json.dumps({"label": label}),
                            "knob": knob,
                            "value": float(value),
                            "prompt_id": f"p{p:02d}",
                            "prompt_sha": f"{p:012d}",
                            "kind": ("story", "code")[p % 2],
                            "split": "test",
                            "prompt": f"prompt {p}",
                            "seed": s,
                            "model": "synthetic",
                            "new_tokens": 8,
                            "chat": True,
                            "text": f"text of {label} at {value} for prompt {p} seed {s}",
                            "n_tokens": 8,
                            "stop": "length",
                            "coherence": c,
                            "n_words": 8.0,
                            "distinct_1": d,
                            "distinct_2": d,
                            "repetition": 0.0,
                            "nll": 1.0,
                            "ppl": float(np.e),
                            "judge": "synthetic",
                            "emb": e.tobytes(),
                            "batch_rows": 4,
                            "gen_seconds": 0.1,
                            "judge_seconds": 0.01,
                        }
                    )
    return pd.DataFrame(out)
