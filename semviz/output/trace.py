"""What a decoding run saw, step by step: ``StepRecord``, ``Trace``, JSON and DataFrame views.

A step keeps the top ``K`` candidates' raw logits (sorted, stable by id) and the log-sum-exp of
every other logit, so any later re-pruning (the replay, the app's what-if sliders) sees the
exact raw distribution over those K tokens and the exact total mass of the tail. K is 1,024 by
default, which on the default model covers all but a few 1e-4 of the mass at T ≤ 1. By
default a step also keeps every raw logit (``full_logits``), so that a replay at any setting
can run the live chain over the whole vocabulary where the candidates cannot decide a pick;
such a step leaves out the tail's binned summary, which follows from them
(``StepRecord.tail_summary``), unless full-mode gravity ran (its ``G`` over the tail is not
kept).

Tensors are written to JSON as base64 of their raw bytes with dtype and shape, so a round
trip is bit-exact.

Reading a trace is strict, because a trace file is input from anyone: ``Trace.load`` and
``Trace.from_json`` refuse files over ``MAX_BYTES``, with more than ``MAX_ELEMENTS`` JSON
elements (counted before parsing) or nested deeper than ``MAX_DEPTH``, and free-form ``extra``
fields of more than ``MAX_EXTRA_ELEMENTS`` values, so a read takes at most ``READ_BUDGET`` of
memory; they accept only the integer format version, and ``Trace.validate`` checks every
field's type, dtype, shape and range and the fields' consistency (``cand_logits`` as long as ``cand_ids``,
``chosen_rank`` pointing at ``token_id``, attention ``(L, H, S)`` over the
``cache_positions``, …). Token ids are checked against a vocabulary size: the one the caller
passes (``vocab_size=``, from the model it will use the trace with), else the one the trace
records in ``model["vocab_size"]``; without either, against the int32 range the ids are
stored in. Anything invalid raises :class:`TraceError` with one sentence that names the field,
e.g. ``steps[3].cand_ids: expected an int32 tensor, got float32``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semviz.output import files

FORMAT = "semviz-trace"
# 2: the lens fields (residual, residual_last, head_out, attn_metrics); 3: each step's tail
# summary (tail) and the bytes of tokens that are pieces of a character (token_hex, prompt_hex);
# 4: each step's every raw logit (full_logits), for a replay that is exact at any setting
FORMAT_VERSION = 4
READ_VERSIONS = (1, 2, 3, 4)  # older traces lack the later fields, which are optional
LENS_FIELDS = ("residual", "residual_last", "head_out", "attn_metrics")
# per head of each layer (semviz.model.capture.attention_metrics): attention entropy and
# varentropy (nats, nats²), head agreement and interaction strength, as entropix defines them
ATTENTION_METRICS = ("entropy", "varentropy", "agreement", "interaction")
TOP = 64
# a 256-step run of the default model writes ~38 MiB, ~63 with the lens, ~130 with the full logits
MAX_BYTES = 256 * files.MiB
MAX_DEPTH = 16  # the format itself nests 6 deep (trace, steps, step, eviction, tensor, shape)
# JSON elements (values, counted by their separators) a file may hold: a step writes about 80,
# its tensors being single base64 strings, so this is over 10,000 steps; it bounds the Python
# objects a parse makes (a list of small lists costs ~100 bytes an element), so that a read
# stays within READ_BUDGET
MAX_ELEMENTS = 1_000_000
MAX_EXTRA_ELEMENTS = 10_000  # each free-form ``extra`` (a step's, the trace's)
# what reading a trace may take at most: the file's bytes, the parsed objects, the tensors
# decoded from base64 (3/4 of their text) and the validation's copies
READ_BUDGET = 3 * MAX_BYTES + 200 * MAX_ELEMENTS
ID_LIMIT = 2**31  # ids and positions are stored as int32


class TraceError(ValueError):
    """A trace file that cannot be read; the message says why in one sentence."""


_NP_DTYPES = {"float32", "float16", "int32", "int64", "bool", "uint8"}
_SPECIAL_FLOATS = {"nan", "inf", "-inf"}


def encode_tensor(t: torch.Tensor) -> dict:
    a = t.detach().cpu().contiguous().numpy()
    return {
        "__tensor__": str(a.dtype),
        "shape": list(a.shape),
        "data": base64.b64encode(a.tobytes()).decode("ascii"),
    }


def decode_tensor(d: dict, where: str = "tensor") -> torch.Tensor:
    """A tensor from its JSON form; ``TraceError`` naming ``where`` if the form is wrong."""
    if set(d) != {"__tensor__", "shape", "data"}:
        raise TraceError(f"{where}: a tensor needs exactly the keys __tensor__, shape and data")
    dtype = d["__tensor__"]
    if not isinstance(dtype, str) or dtype not in _NP_DTYPES:
        raise TraceError(f"{where}: unsupported tensor dtype {_short(dtype)}")
    shape = d["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > 8
        or any(type(s) is not int or not 0 <= s < ID_LIMIT for s in shape)
    ):
        raise TraceError(f"{where}: shape must be a list of at most 8 sizes, got {_short(shape)}")
    if not isinstance(d["data"], str):
        raise TraceError(f"{where}: data must be a base64 string, got {_kind(d['data'])}")
    try:
        raw = base64.b64decode(d["data"], validate=True)
    except (binascii.Error, ValueError):
        raise TraceError(f"{where}: data is not valid base64") from None
    np_dtype = np.dtype(dtype)
    need = math.prod(shape)
    if len(raw) != need * np_dtype.itemsize:
        raise TraceError(
            f"{where}: tensor data has {len(raw) // np_dtype.itemsize} values, "
            f"shape {tuple(shape)} needs {need}"
        )
    a = np.frombuffer(raw, dtype=np_dtype)
    if dtype == "bool" and a.view(np.uint8).max(initial=0) > 1:
        raise TraceError(f"{where}: a bool tensor holds bytes other than 0 and 1")
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


def _dec(v: Any, where: str, depth: int) -> Any:
    """JSON → Python: tensors and non-finite floats decoded; ``depth`` is ``v``'s level in the
    document, at most ``MAX_DEPTH``, which bounds this recursion. Every string and key must be
    valid Unicode (JSON escapes can encode lone surrogates, which no UTF-8 file, HTML page or
    tokenizer takes)."""
    if isinstance(v, str):
        if not _text_ok(v):
            raise TraceError(f"{where}: text holds a lone surrogate (not valid Unicode)")
        return v
    if not isinstance(v, (dict, list)):
        return v
    if depth > MAX_DEPTH:
        top = where.split(".")[0].split("[")[0]
        raise TraceError(f"{top}: the JSON is nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, list):
        if all(type(x) is int for x in v) or all(type(x) is str and _text_ok(x) for x in v):
            return list(v)  # ids and token texts: the long lists, kept fast
        return [_dec(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
    if "__tensor__" in v:
        return decode_tensor(v, where)
    if "__float__" in v:
        if set(v) != {"__float__"} or v["__float__"] not in _SPECIAL_FLOATS:
            raise TraceError(f"{where}: a __float__ must be one of nan, inf, -inf")
        return float(v["__float__"])
    out = {}
    for k, x in v.items():
        if not _text_ok(k):
            raise TraceError(f"{where}: a key holds a lone surrogate (not valid Unicode)")
        out[k] = _dec(x, f"{where}.{k}" if where else k, depth + 1)
    return out


def _text_ok(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _same_with_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal where numbers, NaN where NaN: what a bit-exact round trip of NaN gives."""
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and (torch.equal(a, b) or (a.is_floating_point() and _same_with_nan(a, b)))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


# -- validation --------------------------------------------------------------------------------


def _kind(v: Any) -> str:
    """The JSON-level kind of ``v`` for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, torch.Tensor):
        name = str(v.dtype).replace("torch.", "")
        return f"{'an' if name[0] in 'aeiou' else 'a'} {name} tensor"
    if isinstance(v, (list, tuple)):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "…"


def _bad(where: str, msg: str) -> TraceError:
    return TraceError(f"{where}: {msg}")


def _int(v: Any, where: str, lo: int = 0, hi: int = ID_LIMIT - 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(where, f"expected an integer, got {_kind(v)}")
    if not lo <= v <= hi:
        raise _bad(where, f"{_short(v)} is out of range [{lo}, {hi}]")
    return v


def _float(
    v: Any, where: str, lo: float = -math.inf, hi: float = math.inf, neg_inf: bool = False
) -> float:
    """A finite number in [lo, hi] (``neg_inf``: -inf allowed too)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(where, f"expected a number, got {_kind(v)}")
    if neg_inf and v == -math.inf:
        return v
    if not math.isfinite(v):
        raise _bad(where, f"expected a finite number, got {v!r}")
    if not lo <= v <= hi:
        raise _bad(where, f"{_short(v)} is out of range [{lo:g}, {hi:g}]")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _bad(where, f"expected a string, got {_kind(v)}")
    if not _text_ok(v):
        raise _bad(where, "text holds a lone surrogate (not valid Unicode)")
    return v


def _opt_str(v: Any, where: str) -> str | None:
    return None if v is None else _str(v, where)


def _obj(v: Any, where: str) -> dict:
    if not isinstance(v, dict) or any(not isinstance(k, str) for k in v):
        raise _bad(where, f"expected an object, got {_kind(v)}")
    return v


def _check_extra(v: Any, where: str) -> None:
    """A free-form field: an object of at most ``MAX_EXTRA_ELEMENTS`` values in all."""
    _obj(v, where)
    stack, n = [v], 0
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
            n += len(x)
        elif isinstance(x, list):
            stack.extend(x)
            n += len(x)
        if n > MAX_EXTRA_ELEMENTS:
            raise _bad(where, f"holds more than {MAX_EXTRA_ELEMENTS:,} values")


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise _bad(where, f"expected a list, got {_kind(v)}")
    return v


def _tensor(
    v: Any, where: str, dtype: torch.dtype | tuple[torch.dtype, ...], shape: tuple
) -> torch.Tensor:
    """A tensor of ``dtype`` whose shape matches ``shape`` (None: any size in that place)."""
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
    if not isinstance(v, torch.Tensor) or v.dtype not in dtypes:
        article = "an" if names[0] in "aeiou" else "a"
        raise _bad(where, f"expected {article} {names} tensor, got {_kind(v)}")
    if v.dim() != len(shape) or any(
        n is not None and n != s for n, s in zip(shape, v.shape, strict=True)
    ):
        want = "(" + ", ".join("·" if n is None else str(n) for n in shape)
        want += ",)" if len(shape) == 1 else ")"
        raise _bad(where, f"expected shape {want}, got {tuple(v.shape)}")
    return v


def _in_range(t: torch.Tensor, where: str, lo: float, hi: float, what: str = "values") -> None:
    """Every value in [lo, hi]; NaN fails too (it propagates through the min and max)."""
    if t.numel() == 0:
        return
    mn, mx = (x.item() for x in torch.aminmax(t.float() if t.dtype == torch.float16 else t))
    if not (mn >= lo and mx <= hi):
        bad = mx if math.isnan(mx) or mn >= lo else mn
        raise _bad(where, f"{what} must be in [{lo:g}, {hi:g}], found {bad!r}")


@dataclass(frozen=True)
class _Shape:
    """What a trace's steps are checked against."""

    vocab: int  # ids must be below this
    layers: int | None
    heads: int | None
    n_prompt: int
    hidden: int | None = None  # the residual stream's width


_MODEL_INTS = (
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "hidden_size",
    "vocab_size",
    "max_context",
)
_MODEL_STRS = ("name", "source", "architecture", "dtype", "device")


def _check_model(m: Any) -> None:
    _obj(m, "model")
    for k in _MODEL_INTS:
        if k in m:
            _int(m[k], f"model.{k}", 1)
    for k in _MODEL_STRS:
        if k in m:
            _str(m[k], f"model.{k}")


def _check_settings(s: Any, model: dict) -> None:
    """The settings the run recorded: the pruning parameters through ``PruneParams``' own
    validation and the model's shape; the decode settings by type. Other keys are free."""
    _obj(s, "settings")
    for k in ("seed",):
        if k in s:
            _int(s[k], f"settings.{k}", -(2**63), 2**64 - 1)
    for k in ("max_new_tokens", "record_k"):
        if k in s:
            _int(s[k], f"settings.{k}", 1)
    for k in ("chat", "capture", "lens", "full_logits"):
        if k in s and s[k] is not None and not isinstance(s[k], bool):
            raise _bad(f"settings.{k}", f"expected true, false or null, got {_kind(s[k])}")
    if "system_prompt" in s:
        _opt_str(s["system_prompt"], "settings.system_prompt")
    if "stop" in s:
        for i, x in enumerate(_list(s["stop"], "settings.stop")):
            _str(x, f"settings.stop[{i}]")
    if "eviction" in s:
        _str(_obj(s["eviction"], "settings.eviction").get("policy"), "settings.eviction.policy")
    if "params" in s:
        _check_params(_obj(s["params"], "settings.params"), model)


def _check_params(p: dict, model: dict) -> None:
    """Each recorded pruning parameter against its field's own rules (the metadata every door
    uses), then the model's shape for the layer and head indices."""
    from semviz.sampling import SPECS, PruneParams, check_model_shape, field_spec

    known = {}
    for k, v in p.items():
        if k not in SPECS:  # a key a newer semviz added: ignored, as report.trace_params does
            continue
        spec = field_spec(k)
        if spec.kind == "indices" and isinstance(v, list):
            v = tuple(v)
        if spec.kind == "float" and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        why = spec.problem(v)
        if why is not None:
            raise _bad(f"settings.params.{k}", f"{why}, got {_short(v)}")
        known[k] = v
    try:
        params = PruneParams.from_dict(known)
        if "num_layers" in model and "num_heads" in model:
            check_model_shape(params, n_layers=model["num_layers"], n_heads=model["num_heads"])
    except (TypeError, ValueError) as exc:
        raise _bad("settings.params", str(exc)) from None


def _check_waterfall(w: Any, where: str, vocab: int) -> None:
    for j, row in enumerate(_list(w, where)):
        at = f"{where}[{j}]"
        if set(_obj(row, at)) != {"name", "n_kept", "mass_removed"}:
            raise _bad(at, "a waterfall row has exactly the keys name, n_kept and mass_removed")
        _str(row["name"], f"{at}.name")
        _int(row["n_kept"], f"{at}.n_kept", 0, vocab)
        _float(row["mass_removed"], f"{at}.mass_removed")


def _check_eviction(ev: Any, where: str) -> None:
    """The parts of the KV policy's record that the charts read; the rest is free-form."""
    _obj(ev, where)
    if "policy" in ev:
        _str(ev["policy"], f"{where}.policy")
    pos, sc = ev.get("positions"), ev.get("scores")
    if pos is not None:
        _tensor(pos, f"{where}.positions", (torch.int32, torch.int64), _any_shape(pos))
        _in_range(pos, f"{where}.positions", -1, ID_LIMIT - 1, "positions (-1 pads)")
    if sc is not None:
        shape = tuple(pos.shape) if pos is not None else _any_shape(sc)
        _tensor(sc, f"{where}.scores", (torch.float16, torch.float32), shape)


def _join_bytes(texts: list[str], hexes: list[str | None]) -> bytes:
    """Token texts joined byte-wise: a token's hex bytes where it has them, else its text."""
    return b"".join(
        bytes.fromhex(h) if h is not None else t.encode("utf-8", "replace")
        for t, h in zip(texts, hexes, strict=True)
    )


MAX_TOKEN_BYTES = 256  # one token's bytes; a vocabulary's longest are far shorter
_HEX = re.compile(r"(?:[0-9a-f]{2})*")

_TAIL_KEYS = {"top", "bottom", "width", "dead", "counts", "lse"}


def _check_tail(t: Any, where: str, outside: int | None) -> None:
    """The tail summary: bins of a positive width from ``top`` down to ``bottom``, their
    counts (with the ``-inf`` tokens in ``dead``, as many as the candidates leave) and
    logsumexps, each within its bin's edges; optionally each bin's range of ``G``."""
    from semviz.sampling.tail import MAX_BINS
    from semviz.sampling.tail import edges as tail_edges

    _obj(t, where)
    keys = set(t)
    if not _TAIL_KEYS <= keys <= _TAIL_KEYS | {"g_lo", "g_hi"}:
        raise _bad(
            where,
            "a tail summary has the keys top, bottom, width, dead, counts, lse (and g_lo, g_hi)",
        )
    _float(t["width"], f"{where}.width", 1e-6, 1e3)
    top, bottom = _float(t["top"], f"{where}.top"), _float(t["bottom"], f"{where}.bottom")
    if bottom > top:
        raise _bad(f"{where}.bottom", f"{bottom:g} is above the top {top:g}")
    counts = _tensor(t["counts"], f"{where}.counts", torch.int32, (None,))
    n_bins = counts.numel()
    if n_bins > MAX_BINS:
        raise _bad(f"{where}.counts", f"has {n_bins} bins, more than {MAX_BINS}")
    _in_range(counts, f"{where}.counts", 0, ID_LIMIT - 1, "counts")
    dead = _int(t["dead"], f"{where}.dead", 0)
    total = int(counts.long().sum()) + dead
    if outside is not None and total != outside:
        raise _bad(
            f"{where}.counts", f"count {total:,} tokens, but {outside:,} lie outside the candidates"
        )
    lse = _tensor(t["lse"], f"{where}.lse", torch.float32, (n_bins,))
    if bool(torch.isnan(lse).any()) or bool((lse == math.inf).any()):
        raise _bad(f"{where}.lse", "holds NaN or +inf")
    if bool(((counts > 0) != torch.isfinite(lse)).any()):
        raise _bad(f"{where}.lse", "must be finite exactly where a bin holds tokens")
    lower, upper = tail_edges(t)
    m = lse.double() - torch.log(counts.double().clamp(min=1))  # log of the bin's mean e^x
    slack = 1e-3 * (1 + m.abs())
    if bool((((m < lower - slack) | (m > upper + slack)) & (counts > 0)).any()):
        raise _bad(f"{where}.lse", "a bin's mean lies outside its edges")
    if "g_lo" in t or "g_hi" in t:
        g_lo = _tensor(t.get("g_lo"), f"{where}.g_lo", torch.float32, (n_bins,))
        g_hi = _tensor(t.get("g_hi"), f"{where}.g_hi", torch.float32, (n_bins,))
        if not bool(torch.isfinite(g_lo).all() and torch.isfinite(g_hi).all()):
            raise _bad(f"{where}.g_lo", "holds NaN or inf")
        if bool((g_lo > g_hi).any()):
            raise _bad(f"{where}.g_lo", "is above g_hi")


def _any_shape(v: Any) -> tuple:
    return (None,) * v.dim() if isinstance(v, torch.Tensor) else ()


def _check_step(rec: StepRecord, i: int, ctx: _Shape) -> None:
    """Every field of step ``i``: types, dtypes, shapes, ranges, and their consistency."""
    w = f"steps[{i}]"
    if _int(rec.index, f"{w}.index") != i:
        raise _bad(f"{w}.index", f"is {rec.index}, but the step is number {i}")
    if _int(rec.position, f"{w}.position") != ctx.n_prompt + i:
        raise _bad(
            f"{w}.position", f"is {rec.position}, expected {ctx.n_prompt} prompt tokens + {i}"
        )
    _int(rec.token_id, f"{w}.token_id", 0, ctx.vocab - 1)
    _str(rec.token_text, f"{w}.token_text")
    if rec.token_hex is not None:
        _str(rec.token_hex, f"{w}.token_hex")
        if len(rec.token_hex) > 2 * MAX_TOKEN_BYTES or not _HEX.fullmatch(rec.token_hex):
            raise _bad(f"{w}.token_hex", f"must be up to {MAX_TOKEN_BYTES} bytes in hex")
    for k in ("entropy", "varentropy", "entropy_sampled", "free_energy", "lse"):
        _float(getattr(rec, k), f"{w}.{k}")
    _float(rec.temperature, f"{w}.temperature", 0.0)
    _float(rec.tail_lse, f"{w}.tail_lse", neg_inf=True)
    _float(rec.u, f"{w}.u", 0.0, 1.0)
    _float(rec.final_tail_mass, f"{w}.final_tail_mass", 0.0, 1.0)
    _float(rec.t_forward, f"{w}.t_forward", 0.0)
    _float(rec.t_semviz, f"{w}.t_semviz", 0.0)
    _int(rec.n_kept, f"{w}.n_kept", 0, ctx.vocab)
    _int(rec.cache_bytes, f"{w}.cache_bytes", 0, 2**62)
    ids = _tensor(rec.cand_ids, f"{w}.cand_ids", torch.int32, (None,))
    k = ids.numel()
    if k == 0:
        raise _bad(f"{w}.cand_ids", "is empty (the chosen token is always recorded)")
    _in_range(ids, f"{w}.cand_ids", 0, ctx.vocab - 1, "ids")
    if torch.unique(ids).numel() != k:
        raise _bad(f"{w}.cand_ids", "holds the same id twice")
    logits = _tensor(rec.cand_logits, f"{w}.cand_logits", torch.float32, (k,))
    if not bool((logits < math.inf).all()):  # NaN and +inf fail; -inf is a masked token
        raise _bad(f"{w}.cand_logits", "holds NaN or +inf")
    if k > 1 and bool((logits[:-1] < logits[1:]).any()):
        raise _bad(f"{w}.cand_logits", "must be sorted descending, as the candidates are")
    top = float(logits[0])
    if top > -math.inf and rec.lse < top - 1e-3:  # a logsumexp is at least its largest term
        raise _bad(f"{w}.lse", f"{rec.lse} is below the top candidate's logit {top:.4g}")
    rank = _int(rec.chosen_rank, f"{w}.chosen_rank", -1, k - 1)
    hit = (ids == rec.token_id).nonzero()
    if (int(hit[0, 0]) if hit.numel() else -1) != rank:
        raise _bad(f"{w}.chosen_rank", f"{rank} does not point at token_id {rec.token_id}")
    for name, p in _obj(rec.stage_probs, f"{w}.stage_probs").items():
        _tensor(p, f"{w}.stage_probs.{name}", torch.float16, (k,))
        _in_range(p, f"{w}.stage_probs.{name}", 0.0, 1.0, "probabilities")
    _check_waterfall(rec.waterfall, f"{w}.waterfall", ctx.vocab)
    pos = _tensor(rec.cache_positions, f"{w}.cache_positions", torch.int32, (None,))
    _in_range(pos, f"{w}.cache_positions", 0, rec.position - 1, "positions")
    if pos.numel() > 1 and bool((pos[1:] <= pos[:-1]).any()):
        raise _bad(f"{w}.cache_positions", "must be strictly increasing")
    if _int(rec.cache_len, f"{w}.cache_len") != pos.numel():
        raise _bad(f"{w}.cache_len", f"is {rec.cache_len}, but cache_positions has {pos.numel()}")
    if rec.attention is not None:
        att = _tensor(
            rec.attention, f"{w}.attention", torch.float16, (ctx.layers, ctx.heads, pos.numel())
        )
        _in_range(att, f"{w}.attention", 0.0, 1.0, "weights")
    if rec.gravity is not None:
        g = _tensor(rec.gravity, f"{w}.gravity", torch.float32, (k,))
        if not bool(torch.isfinite(g).all()):
            raise _bad(f"{w}.gravity", "holds NaN or inf")
    _opt_str(rec.fallback, f"{w}.fallback")
    if rec.eviction is not None:
        _check_eviction(rec.eviction, f"{w}.eviction")
    _check_lens(rec, w, ctx)
    if rec.tail is not None:
        _check_tail(rec.tail, f"{w}.tail", ctx.vocab - k if ctx.vocab < ID_LIMIT else None)
    if rec.full_logits is not None:
        # one a vocabulary entry: more than the largest id, at most the vocabulary (whose
        # size the caller's model checks against the trace's with its own message)
        full = _tensor(rec.full_logits, f"{w}.full_logits", torch.float32, (None,))
        if not int(ids.max()) < full.numel() <= ctx.vocab:
            raise _bad(f"{w}.full_logits", f"has {full.numel():,} logits, not one per token")
        if not bool((full < math.inf).all()):
            raise _bad(f"{w}.full_logits", "holds NaN or +inf")
        if not torch.equal(full[ids.long()], logits):
            raise _bad(f"{w}.full_logits", "disagrees with cand_logits on the candidates")
    _check_extra(rec.extra, f"{w}.extra")


def _finite(t: torch.Tensor, where: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise _bad(where, "holds NaN or inf")


def _check_lens(rec: StepRecord, w: str, ctx: _Shape) -> None:
    """The lens fields: the residual rows with their float32 last row, the head outputs and
    the attention metrics, each shaped by the model (L layers, H heads, width d)."""
    halfs = (torch.float16, torch.float32)
    layers = None if ctx.layers is None else ctx.layers + 1
    if (rec.residual is None) != (rec.residual_last is None):
        raise _bad(f"{w}.residual_last", "comes with residual: both or neither")
    if rec.residual is not None:
        r = _tensor(rec.residual, f"{w}.residual", halfs, (layers, ctx.hidden))
        _finite(r, f"{w}.residual")
        last = _tensor(rec.residual_last, f"{w}.residual_last", torch.float32, (r.shape[1],))
        _finite(last, f"{w}.residual_last")
        if not torch.equal(last.to(r.dtype), r[-1]):
            raise _bad(f"{w}.residual_last", "is not the last row of residual")
    if rec.head_out is not None:
        h = _tensor(rec.head_out, f"{w}.head_out", halfs, (ctx.layers, ctx.heads, None))
        _finite(h, f"{w}.head_out")
    if rec.attn_metrics is not None:
        m = _obj(rec.attn_metrics, f"{w}.attn_metrics")
        if tuple(m) != ATTENTION_METRICS:
            raise _bad(f"{w}.attn_metrics", f"must hold {', '.join(ATTENTION_METRICS)} in order")
        for name, t in m.items():
            where = f"{w}.attn_metrics.{name}"
            _tensor(t, where, torch.float32, (ctx.layers, ctx.heads))
            _in_range(t, where, 0.0, 2.0 if name == "agreement" else math.inf)


def _no_constant(name: str) -> float:
    raise TraceError(f"the file holds a bare {name}, which is not JSON")


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
    # the logits outside cand_ids, binned (semviz.sampling.tail); None where full_logits hold
    # them (see tail_summary) and no full-mode gravity ran
    tail: dict | None = None
    full_logits: torch.Tensor | None = None  # (V,) float32 every raw logit, when recorded
    token_hex: str | None = None  # the token's bytes in hex, when they are not UTF-8 alone
    fallback: str | None = None
    eviction: dict | None = None
    # the lens (semviz.analysis.lens), at the position that chose this token:
    residual: torch.Tensor | None = None  # (L+1, d) float16: embedding output, each block's
    residual_last: torch.Tensor | None = None  # (d,) float32 the last block's output, exactly
    head_out: torch.Tensor | None = None  # (L, H, D) float16 each head's output before o_proj
    attn_metrics: dict[str, torch.Tensor] | None = None  # ATTENTION_METRICS → (L, H) float32
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

    def tail_summary(self) -> dict | None:
        """The tail's binned summary (``semviz.sampling.tail.summarize``): as recorded, or
        made from ``full_logits`` on first use and kept (not a field: the record stays as it
        was read or made). None when the record holds neither."""
        if self.tail is not None or self.full_logits is None:
            return self.tail
        made = self.__dict__.get("_tail_made")
        if made is None:
            from semviz.sampling.tail import summarize

            outside = torch.ones(self.full_logits.numel(), dtype=torch.bool)  # (V,)
            outside[self.cand_ids.long()] = False
            made = self.__dict__["_tail_made"] = summarize(self.full_logits[outside])
        return made

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepRecord):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    def to_dict(self) -> dict:
        return {f.name: _enc(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "step") -> StepRecord:
        """A step from its JSON form, decoded but not yet checked (``Trace.validate`` checks
        it against the rest of the trace)."""
        if not isinstance(d, dict):
            raise _bad(where, f"expected an object, got {_kind(d)}")
        names = {f.name for f in fields(cls)}
        required = {
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        }
        missing = required - d.keys()
        if missing:
            raise _bad(where, f"a step is missing {', '.join(sorted(missing))}")
        unknown = d.keys() - names
        if unknown:
            raise _bad(where, f"a step has unknown fields {', '.join(sorted(unknown))}")
        return cls(**{k: _dec(v, f"{where}.{k}", 4) for k, v in d.items()})


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
    # prompt tokens that are pieces of a character: their bytes in hex, by place ("3": "e697")
    prompt_hex: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        """The prompt as the model read it (chat template included), its tokens' bytes joined."""
        return _join_bytes(
            self.prompt_tokens,
            [self.prompt_hex.get(str(i)) for i in range(len(self.prompt_tokens))],
        ).decode("utf-8", "replace")

    @property
    def text(self) -> str:
        """The generated text: the tokens' bytes joined, then decoded, so a character split
        over tokens reads whole (as the tokenizer's decode of the ids does)."""
        return self.bytes_upto(len(self.steps)).decode("utf-8", "replace")

    def bytes_upto(self, n: int) -> bytes:
        """The bytes of the first ``n`` steps' tokens, joined (they may end inside a
        character: ``style.piece_text`` shows those bytes as bytes)."""
        steps = self.steps[:n]
        return _join_bytes([s.token_text for s in steps], [s.token_hex for s in steps])

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
        return files.write_text(path, self.to_json())

    def validate(self, *, vocab_size: int | None = None) -> Trace:
        """Check every field (type, dtype, shape, range) and their consistency; return self.

        Token ids are checked against ``vocab_size`` when given, else against the recorded
        ``model["vocab_size"]``. Raises ``TraceError`` naming the first bad field.
        """
        _check_model(self.model)
        _check_settings(self.settings, self.model)
        _str(self.prompt, "prompt")
        if vocab_size is None:
            vocab = self.model.get("vocab_size", ID_LIMIT)
        else:
            vocab = _int(vocab_size, "vocab_size", 1, ID_LIMIT)
        ids = _list(self.prompt_ids, "prompt_ids")
        if not ids:
            raise _bad("prompt_ids", "is empty (a run always has a prompt)")
        if not all(type(t) is int for t in ids) or min(ids) < 0 or max(ids) >= vocab:
            for i, t in enumerate(ids):  # the first bad one, for the message
                _int(t, f"prompt_ids[{i}]", 0, vocab - 1)
        toks = _list(self.prompt_tokens, "prompt_tokens")
        if len(toks) != len(ids):
            raise _bad("prompt_tokens", f"has {len(toks)} entries for {len(ids)} prompt_ids")
        for i, t in enumerate(toks):
            _str(t, f"prompt_tokens[{i}]")
        _obj(self.prompt_hex, "prompt_hex")
        for k, h in self.prompt_hex.items():
            if not (k.isdigit() and int(k) < len(toks)):
                raise _bad("prompt_hex", f"names no prompt token: {_short(k)}")
            _str(h, f"prompt_hex[{k}]")
            if len(h) > 2 * MAX_TOKEN_BYTES or not _HEX.fullmatch(h):
                raise _bad(f"prompt_hex[{k}]", f"must be up to {MAX_TOKEN_BYTES} bytes in hex")
        _float(self.prefill_seconds, "prefill_seconds", 0.0)
        _opt_str(self.stop_reason, "stop_reason")
        _check_extra(self.extra, "extra")
        ctx = _Shape(
            vocab=vocab,
            layers=self.model.get("num_layers"),
            heads=self.model.get("num_heads"),
            n_prompt=len(ids),
            hidden=self.model.get("hidden_size"),
        )
        for i, rec in enumerate(_list(self.steps, "steps")):
            if not isinstance(rec, StepRecord):
                raise _bad(f"steps[{i}]", f"expected a step record, got {_kind(rec)}")
            _check_step(rec, i, ctx)
        return self

    @classmethod
    def from_dict(cls, d: Any, *, vocab_size: int | None = None) -> Trace:
        """A validated trace from its JSON form (see ``validate``)."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TraceError("this is not a semviz trace (no 'format': 'semviz-trace' field)")
        version = d.get("version")
        if type(version) is not int:
            raise _bad("version", f"the format version must be an integer, got {_short(version)}")
        if version not in READ_VERSIONS:
            raise TraceError(
                f"trace format version {version!r} is not supported "
                f"(this semviz reads versions {', '.join(map(str, READ_VERSIONS))})"
            )
        body = {k: v for k, v in d.items() if k not in ("format", "version")}
        names = {f.name for f in fields(cls)}
        if unknown := body.keys() - names:
            raise TraceError(f"the trace has unknown fields {', '.join(sorted(unknown))}")
        for need in ("settings", "model", "prompt", "prompt_ids", "prompt_tokens"):
            if need not in body:
                raise TraceError(f"the trace is missing its {need!r} field")
        raw_steps = _list(body.pop("steps", []), "steps")
        if version < 2:
            for i, st in enumerate(raw_steps):
                if isinstance(st, dict) and (lens := [k for k in LENS_FIELDS if k in st]):
                    raise _bad(f"steps[{i}].{lens[0]}", "a version 1 trace has no lens fields")
        steps = [StepRecord.from_dict(s, where=f"steps[{i}]") for i, s in enumerate(raw_steps)]
        kw = {k: _dec(v, k, 2) for k, v in body.items()}
        return cls(steps=steps, **kw).validate(vocab_size=vocab_size)

    @classmethod
    def from_json(
        cls, text: str | bytes, *, vocab_size: int | None = None, max_bytes: int = MAX_BYTES
    ) -> Trace:
        """Parse and validate; at most ``max_bytes`` and ``MAX_DEPTH`` levels of nesting."""
        if len(text) > max_bytes:
            raise TraceError(f"the trace is larger than the {max_bytes / files.MiB:,.0f} MiB limit")
        # an upper bound on the elements, counted before any object is made (separators
        # inside strings count too; base64 has none)
        seps = (",", "[", "{") if isinstance(text, str) else (b",", b"[", b"{")
        n = sum(text.count(c) for c in seps)
        if n > MAX_ELEMENTS:
            raise TraceError(
                f"the trace holds about {n:,} JSON elements, more than the {MAX_ELEMENTS:,} "
                "a trace may have"
            )
        try:
            d = json.loads(text, parse_constant=_no_constant)
        except RecursionError:
            raise TraceError(f"the JSON is nested deeper than {MAX_DEPTH} levels") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"the file is not valid JSON ({exc})") from None
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits
            raise TraceError(f"the file is not valid JSON ({exc})") from None
        return cls.from_dict(d, vocab_size=vocab_size)

    @classmethod
    def load(
        cls, path: str | Path, *, vocab_size: int | None = None, max_bytes: int = MAX_BYTES
    ) -> Trace:
        """Read a trace; raise ``TraceError`` with one clear sentence if it cannot be read.

        At most ``max_bytes`` are read, from a regular file only (not a folder or a device).
        """
        try:
            raw = files.read_bytes(path, max_bytes)
        except files.FileError as exc:
            raise TraceError(str(exc)) from None
        try:
            return cls.from_json(raw, vocab_size=vocab_size, max_bytes=max_bytes)
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
