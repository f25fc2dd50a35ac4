"""What a decoding run saw, step by step: ``StepRecord``, ``Trace``, JSON and DataFrame views.

A step keeps the top ``K`` candidates' raw logits (sorted, stable by id) and the log-sum-exp of
every other logit, so any later re-pruning (the replay, the app's what-if sliders) sees the
exact raw distribution over those K tokens and the exact total mass of the tail. K is 1,024 by
default, which on the default model covers all but a few 1e-4 of the mass at T ≤ 1.

Tensors are written to JSON as base64 of their raw bytes with dtype and shape, so a round
trip is bit-exact.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = "semviz-trace"
FORMAT_VERSION = 1
TOP = 64


class TraceError(ValueError):
    """A trace file that cannot be read; the message says why in one sentence."""


_NP_DTYPES = {"float32", "float16", "int32", "int64", "bool", "uint8"}


def encode_tensor(t: torch.Tensor) -> dict:
    a = t.detach().cpu().contiguous().numpy()
    return {
        "__tensor__": str(a.dtype),
        "shape": list(a.shape),
        "data": base64.b64encode(a.tobytes()).decode("ascii"),
    }


def decode_tensor(d: dict) -> torch.Tensor:
    dtype = d.get("__tensor__")
    if dtype not in _NP_DTYPES:
        raise TraceError(f"unsupported tensor dtype {dtype!r}")
    shape = tuple(int(s) for s in d["shape"])
    raw = base64.b64decode(d["data"], validate=True)
    a = np.frombuffer(raw, dtype=np.dtype(dtype))
    if a.size != math.prod(shape):
        raise TraceError(f"tensor data has {a.size} values, shape {shape} needs {math.prod(shape)}")
    return torch.from_numpy(a.reshape(shape).copy())


def _enc(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return encode_tensor(v)
    if isinstance(v, dict):
        return {str(k): _enc(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_enc(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return {"__float__": repr(v)}
    return v


def _dec(v: Any) -> Any:
    if isinstance(v, dict):
        if "__tensor__" in v:
            return decode_tensor(v)
        if "__float__" in v:
            return float(v["__float__"])
        return {k: _dec(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_dec(x) for x in v]
    return v


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@dataclass(eq=False)
class StepRecord:
    """Everything one decode step saw and did.

    Shapes: K recorded candidates, L layers, H query heads, S cached positions.
    """

    index: int  # 0-based step number
    position: int  # absolute position of the chosen token in the sequence
    token_id: int
    token_text: str
    entropy: float  # raw full-vocabulary entropy, nats
    varentropy: float  # raw full-vocabulary varentropy, nats²
    entropy_sampled: float  # entropy of the distribution sampled from, nats
    temperature: float  # effective temperature used
    free_energy: float
    n_kept: int
    cand_ids: torch.Tensor  # (K,) int32, raw logits descending, ties by id
    cand_logits: torch.Tensor  # (K,) float32 raw logits
    tail_lse: float  # logsumexp of every logit outside cand_ids
    lse: float  # logsumexp of all logits
    stage_probs: dict[str, torch.Tensor]  # stage → (K,) float16 probabilities
    waterfall: list[dict]  # [{"name", "n_kept", "mass_removed"}] in chain order
    u: float  # the uniform draw the sampler used
    chosen_rank: int  # rank of token_id among cand_ids (-1 if outside)
    attention: torch.Tensor | None  # (L, H, S) float16 last-query attention
    cache_positions: torch.Tensor  # (S,) int32 original positions held in the cache
    cache_len: int
    cache_bytes: int
    t_forward: float  # seconds in the model forward that produced these logits
    t_semviz: float  # seconds in semviz's own work for this step
    gravity: torch.Tensor | None = None  # (K,) float32 normalised G over the candidates
    final_tail_mass: float = 0.0  # final-distribution mass outside cand_ids
    fallback: str | None = None
    eviction: dict | None = None
    extra: dict = field(default_factory=dict)

    # -- derived views ------------------------------------------------------------------
    @property
    def top_ids(self) -> torch.Tensor:
        return self.cand_ids[:TOP]

    @property
    def top_probs(self) -> torch.Tensor:
        """(TOP,) raw probabilities of the top candidates."""
        return torch.exp(self.cand_logits[:TOP].double() - self.lse).float()

    @property
    def chosen_prob(self) -> float:
        """Raw probability of the chosen token (nan if outside the recorded candidates)."""
        if self.chosen_rank < 0:
            return float("nan")
        return math.exp(float(self.cand_logits[self.chosen_rank]) - self.lse)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepRecord):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    def to_dict(self) -> dict:
        return {f.name: _enc(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> StepRecord:
        names = {f.name for f in fields(cls)}
        required = {
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        }
        missing = required - d.keys()
        if missing:
            raise TraceError(f"a step is missing {', '.join(sorted(missing))}")
        unknown = d.keys() - names
        if unknown:
            raise TraceError(f"a step has unknown fields {', '.join(sorted(unknown))}")
        return cls(**{k: _dec(v) for k, v in d.items()})


@dataclass(eq=False)
class Trace:
    """A whole run: settings, model, prompt and steps."""

    settings: dict
    model: dict
    prompt: str
    prompt_ids: list[int]
    prompt_tokens: list[str]
    steps: list[StepRecord] = field(default_factory=list)
    prefill_seconds: float = 0.0
    stop_reason: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The generated text (token texts joined)."""
        return "".join(s.token_text for s in self.steps)

    @property
    def token_ids(self) -> list[int]:
        return [s.token_id for s in self.steps]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    # -- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"format": FORMAT, "version": FORMAT_VERSION}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = [s.to_dict() for s in v] if f.name == "steps" else _enc(v)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    def save(self, path: str | Path) -> Path:
        """Write atomically (a temp file then rename) so a crash never leaves half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, d: Any) -> Trace:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TraceError("this is not a semviz trace (no 'format': 'semviz-trace' field)")
        if d.get("version") != FORMAT_VERSION:
            raise TraceError(
                f"trace format version {d.get('version')!r} is not supported "
                f"(this semviz reads version {FORMAT_VERSION})"
            )
        body = {k: v for k, v in d.items() if k not in ("format", "version")}
        names = {f.name for f in fields(cls)}
        if unknown := body.keys() - names:
            raise TraceError(f"the trace has unknown fields {', '.join(sorted(unknown))}")
        for need in ("settings", "model", "prompt", "prompt_ids", "prompt_tokens"):
            if need not in body:
                raise TraceError(f"the trace is missing its {need!r} field")
        if not isinstance(body.get("steps", []), list):
            raise TraceError("the trace's 'steps' is not a list")
        try:
            steps = [StepRecord.from_dict(s) for s in body.pop("steps", [])]
            kw = {k: _dec(v) for k, v in body.items()}
            return cls(steps=steps, **kw)
        except TraceError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TraceError(f"the trace is corrupt ({type(exc).__name__}: {exc})") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> Trace:
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"the file is not valid JSON ({exc})") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace; raise ``TraceError`` with one clear sentence if it cannot be read."""
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            return cls.from_json(raw)
        except TraceError as exc:
            raise TraceError(f"{Path(path).name}: {exc}") from None

    # -- tables ------------------------------------------------------------------------
    def to_dataframe(self):
        """One row per step with the scalar fields (pandas)."""
        import pandas as pd

        rows = []
        for s in self.steps:
            rows.append(
                {
                    "step": s.index,
                    "position": s.position,
                    "token_id": s.token_id,
                    "token": s.token_text,
                    "prob": s.chosen_prob,
                    "chosen_rank": s.chosen_rank,
                    "entropy": s.entropy,
                    "varentropy": s.varentropy,
                    "entropy_sampled": s.entropy_sampled,
                    "temperature": s.temperature,
                    "free_energy": s.free_energy,
                    "n_kept": s.n_kept,
                    "gravity_max": float(s.gravity.max()) if s.gravity is not None else None,
                    "fallback": s.fallback,
                    "cache_len": s.cache_len,
                    "cache_bytes": s.cache_bytes,
                    "t_forward_ms": 1e3 * s.t_forward,
                    "t_semviz_ms": 1e3 * s.t_semviz,
                }
            )
        return pd.DataFrame(rows)
