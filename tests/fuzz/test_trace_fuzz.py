"""Mutated real traces: every result is a valid trace that every view handles, or one
``TraceError`` line that names what is wrong.

The sweep swaps every field of a real trace (top level, settings, model, one step, the eviction
record, the parts of each tensor) for a value of every other JSON kind. The hypothesis tests
then draw values, tensor dtypes, shapes and contents, structure edits, nesting depths and sizes.
"""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semviz.output.trace import MAX_DEPTH, Trace, TraceError

from .conftest import record
from .mutate import NEST, TYPE_SWAPS, dumps, exercise, get, kind, paths, tensor, with_value, without

FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


class Bad(AssertionError):
    """A mutation that ended in something other than a valid trace or one TraceError line."""


def outcome(klass: str, text: str | bytes, *, charts: bool = True, where="", **load) -> str:
    """Load ``text``; a refusal must be one ``TraceError`` line (returned), an acceptance
    must survive :func:`exercise` (returns ""). Anything else raises ``Bad`` and is counted."""
    try:
        trace = Trace.from_json(text, **load)
    except TraceError as exc:
        msg = str(exc)
        if "\n" in msg or not msg:
            record(klass, "not one line")
            raise Bad(f"{where}: a TraceError of more than one line: {msg!r}") from None
        record(klass, "refused")
        return msg
    except Exception as exc:
        record(klass, "traceback")
        raise Bad(f"{where}: {type(exc).__name__} from Trace.from_json: {exc}") from exc
    try:
        exercise(trace, charts=charts)
    except Exception as exc:
        record(klass, "traceback")
        raise Bad(f"{where}: accepted, then {type(exc).__name__} using it: {exc}") from exc
    record(klass, "accepted")
    return ""


def _sweep_paths(doc: dict) -> list[tuple]:
    """Every path, except in steps other than steps[1] (the steps share one layout) and
    beyond the first two items of the long lists."""
    out = []
    for p in paths(doc):
        if p[0] == "steps" and len(p) > 1 and p[1] != 1:
            continue
        if any(isinstance(k, int) and k > 1 for k in p[2:] if p[0] == "steps") or (
            p[0] in ("prompt_ids", "prompt_tokens") and len(p) > 1 and p[1] > 1
        ):
            continue
        out.append(p)
    return out


def test_every_field_swapped_for_every_other_type(base_traces):
    doc = base_traces["full"]
    tried = refused = 0
    charted: set[tuple] = set()
    bad = []
    for path in _sweep_paths(doc):
        old = get(doc, path)
        for name, value in TYPE_SWAPS.items():
            if kind(value) == kind(old) and name not in ("negative int", "nan", "empty list"):
                continue
            # the charts cost ~1 s a trace: drawn for the first value each step field
            # accepts, and once for each other part of the trace
            field = tuple(k for k in path if isinstance(k, str))[: 2 if path[0] == "steps" else 1]
            charts = field not in charted
            try:
                msg = outcome(
                    "trace: type swap",
                    dumps(with_value(doc, path, value)),
                    charts=charts,
                    where=f"{path} <- {name}",
                )
            except Bad as exc:
                bad.append(str(exc))
                continue
            if not msg:
                charted.add(field)
            tried += 1
            refused += bool(msg)
    assert not bad, "\n".join(bad)
    assert tried > 300 and refused > 0.7 * tried


def test_every_field_removed_or_joined_by_an_unknown_one(base_traces):
    doc = base_traces["full"]
    for path in _sweep_paths(doc):
        parent = get(doc, path[:-1])
        if isinstance(parent, dict):
            outcome("trace: field removed", dumps(without(doc, path)), charts=False)
            grown = with_value(doc, (*path[:-1], "zz_unknown"), 1)
            outcome("trace: unknown field", dumps(grown), charts=False)


# -- hypothesis: values, tensors, structure, nesting, sizes -----------------------------------

special = st.sampled_from(
    [{"__float__": "nan"}, {"__float__": "inf"}, {"__float__": "-inf"}, {"__float__": "1.0"}]
)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 70000),
    st.floats(allow_nan=False, allow_infinity=False),
    special,
    st.text(max_size=20),
    st.sampled_from(["<b>bold</b>", "![x](http://example.invalid/x.png)", "\ud800", "&lt;", ""]),
    st.lists(st.integers(-2, 70000), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@given(data=st.data())
@settings(FUZZ, max_examples=150)
def test_random_values_in_random_fields(base_traces, data):
    doc = base_traces[data.draw(st.sampled_from(sorted(base_traces)), label="base")]
    path = data.draw(st.sampled_from(list(paths(doc))), label="path")
    value = data.draw(values, label="value")
    outcome("trace: random value", dumps(with_value(doc, path, value)))


def _tensor_paths(doc: dict) -> list[tuple]:
    return [p for p in paths(doc) if isinstance(get(doc, p), dict) and "__tensor__" in get(doc, p)]


DTYPES = ["float32", "float16", "int32", "int64", "bool", "uint8", "float64", "complex64", "<U1"]


@st.composite
def tensor_mutation(draw, old: dict):
    """A tensor's JSON form with its dtype tag, shape or contents changed."""
    shape = list(old["shape"])
    how = draw(st.sampled_from(["dtype", "shape", "data", "values", "base64"]))
    if how == "dtype":
        return {**old, "__tensor__": draw(st.sampled_from(DTYPES))}
    if how == "shape":
        edits = [
            shape[:-1],
            [*shape, 1],
            [s + 1 for s in shape],
            shape[::-1],
            [0, *shape],
            [-1],
            [True],
            ["2"],
            [2**40, 2**40],
            [0, 2**40],
        ]
        return {**old, "shape": draw(st.sampled_from(edits))}
    if how == "data":
        return {**old, "data": old["data"][: draw(st.integers(0, max(len(old["data"]) - 1, 0)))]}
    if how == "base64":
        return {**old, "data": draw(st.sampled_from(["!!!", "AAA", 5, None, "A" * 7]))}
    dt = np.dtype(old["__tensor__"])
    n = int(np.prod(shape))
    if dt.kind == "f":
        pool = st.sampled_from([np.nan, np.inf, -np.inf, -1.0, 2.0, 1e4, 0.0])
    elif dt.kind == "b":
        pool = st.booleans()
    else:
        pool = st.sampled_from([-5, -1, 0, 49151, 49152, 2**31 - 1, 7])
    filled = draw(st.lists(pool, min_size=n, max_size=n)) if n <= 64 else [draw(pool)] * n
    return tensor(np.array(filled).astype(dt).reshape(shape))  # out of a dtype's range: wraps


@given(data=st.data())
@settings(FUZZ, max_examples=150)
def test_tensor_dtypes_shapes_and_contents(base_traces, data):
    doc = base_traces[data.draw(st.sampled_from(sorted(base_traces)), label="base")]
    path = data.draw(st.sampled_from(_tensor_paths(doc)), label="tensor")
    new = data.draw(tensor_mutation(get(doc, path)), label="mutation")
    outcome("trace: tensor dtype/shape/content", dumps(with_value(doc, path, new)))


@given(data=st.data())
@settings(FUZZ, max_examples=60)
def test_structure_edits(base_traces, data):
    doc = json.loads(json.dumps(base_traces["full"]))
    steps = doc["steps"]
    how = data.draw(
        st.sampled_from(
            [
                "drop step",
                "duplicate step",
                "swap steps",
                "reverse steps",
                "no steps",
                "prompt shorter",
                "prompt longer",
                "step as list",
                "trace as list",
                "format",
                "version",
            ]
        ),
        label="edit",
    )
    if how == "drop step":
        del steps[data.draw(st.integers(0, len(steps) - 1))]
    elif how == "duplicate step":
        steps.insert(1, json.loads(json.dumps(steps[0])))
    elif how == "swap steps":
        steps[0], steps[1] = steps[1], steps[0]
    elif how == "reverse steps":
        steps.reverse()
    elif how == "no steps":
        doc["steps"] = []
    elif how == "prompt shorter":
        doc["prompt_ids"].pop()
        doc["prompt_tokens"].pop()
    elif how == "prompt longer":
        doc["prompt_ids"].append(5)
        doc["prompt_tokens"].append("x")
    elif how == "step as list":
        steps[0] = list(steps[0].values())
    elif how == "trace as list":
        doc = [doc]
    elif how == "format":
        doc["format"] = data.draw(st.sampled_from(["semviz-trace2", None, 1, ""]))
    else:
        doc["version"] = data.draw(
            st.sampled_from([1.0, True, "1", 0, 2, -1, 2**64, None, [1], {"__float__": "inf"}])
        )
    outcome("trace: structure", json.dumps(doc))


@given(data=st.data())
@settings(FUZZ, max_examples=40)
def test_nesting_depth(base_traces, data):
    doc = base_traces["full"]
    path = data.draw(st.sampled_from(list(paths(doc))), label="path")
    depth = data.draw(st.sampled_from([2, MAX_DEPTH - 4, MAX_DEPTH + 1, 1000, 100_000]))
    msg = outcome("trace: nesting", dumps(with_value(doc, path, NEST), nest=depth), charts=False)
    if depth > MAX_DEPTH:  # refused: for its depth, or first for its type (version, format…)
        assert msg
    if depth > 1000:  # deeper than the JSON parser's own recursion limit
        assert f"nested deeper than {MAX_DEPTH} levels" in msg


@given(data=st.data())
@settings(FUZZ, max_examples=30)
def test_sizes(base_traces, data):
    doc = json.loads(json.dumps(base_traces["full"]))
    how = data.draw(st.sampled_from(["long text", "long prompt", "many steps", "over limit"]))
    n = data.draw(st.sampled_from([10, 10_000, 300_000]))
    limit = {}
    if how == "long text":
        doc["steps"][0]["token_text"] = "<b>x</b>" * (n // 8)
    elif how == "long prompt":
        doc["prompt_ids"] = doc["prompt_ids"] * (n // 10)
        doc["prompt_tokens"] = doc["prompt_tokens"] * (n // 10)
    elif how == "many steps":
        doc["steps"] = doc["steps"] * (n // 3000 + 1)
    else:
        limit = {"max_bytes": len(json.dumps(doc)) - 1}
    msg = outcome(f"trace: size ({how})", json.dumps(doc), charts=n <= 10_000, **limit)
    if limit:
        assert "larger than" in msg


def test_bit_exact_round_trip_of_every_base(base_traces):
    for doc in base_traces.values():
        text = json.dumps(doc)
        assert Trace.from_json(text).to_json() == text
