"""Mutating a trace's JSON document one field at a time, and using what loads.

A path is a tuple of keys and list indices from the document's root. ``exercise`` runs what a
user runs on a loaded trace (replay, metrics, the table, every report chart, the report page,
the JSON round trip), so a mutation the schema lets through but the code cannot handle shows
up as an exception there.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np

Path = tuple[Any, ...]
NEST = "@@nest@@"


def paths(doc: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every node below ``doc`` (dict values, list items, the parts of a tensor)."""
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for k, v in items:
        yield (*prefix, k)
        yield from paths(v, (*prefix, k))


def get(doc: Any, path: Path) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _copy(doc: Any) -> Any:
    return json.loads(json.dumps(doc))  # several times faster than copy.deepcopy here


def with_value(doc: Any, path: Path, value: Any) -> Any:
    """A deep copy of ``doc`` with the node at ``path`` replaced by ``value``."""
    out = _copy(doc)
    get(out, path[:-1])[path[-1]] = value
    return out


def without(doc: Any, path: Path) -> Any:
    """A deep copy of ``doc`` with the node at ``path`` removed."""
    out = _copy(doc)
    del get(out, path[:-1])[path[-1]]
    return out


def dumps(doc: Any, nest: int = 0) -> str:
    """JSON text; a ``NEST`` string becomes ``nest`` levels of ``[`` … ``]`` (written as text,
    so depths far past Python's recursion limit can be made)."""
    return json.dumps(doc).replace(json.dumps(NEST), "[" * nest + "]" * nest)


def tensor(a: np.ndarray, dtype: str | None = None, shape: list | None = None) -> dict:
    """A tensor's JSON form, with an optionally lying dtype tag or shape."""
    return {
        "__tensor__": dtype or str(a.dtype),
        "shape": list(a.shape) if shape is None else shape,
        "data": base64.b64encode(a.tobytes()).decode("ascii"),
    }


def is_tensor(v: Any) -> bool:
    return isinstance(v, dict) and "__tensor__" in v


def kind(v: Any) -> str:
    if is_tensor(v):
        return "tensor"
    if isinstance(v, dict) and "__float__" in v:
        return "float"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return {type(None): "null", str: "string", list: "list", dict: "object"}[type(v)]


# one value of every JSON kind the format uses, each a likely mistake somewhere
TYPE_SWAPS: dict[str, Any] = {
    "null": None,
    "bool": True,
    "int": 7,
    "negative int": -1,
    "float": 1.5,
    "nan": {"__float__": "nan"},
    "string": "<b>x</b> ![i](http://example.invalid/a.png)",
    "empty list": [],
    "list": [1, 2],
    "object": {"a": 1},
    "tensor": tensor(np.zeros(1, np.float32)),
}


def exercise(trace, *, charts: bool = True) -> None:
    """Everything a user does with a loaded trace; raises on any failure."""
    from semviz.analysis.metrics import run_metrics
    from semviz.analysis.replay import replay
    from semviz.output import report
    from semviz.output.trace import Trace

    params = report.trace_params(trace)
    replay(trace, params)
    run_metrics(trace)
    trace.to_dataframe()
    vs = report.views(trace) if charts else []
    for v in vs:
        v.json()
    # the page without its 3.5 MB of plotly.js, which has nothing to do with the trace
    with mock.patch("plotly.offline.get_plotlyjs", return_value=""):
        report.report_html(trace, vs)
    assert Trace.from_json(trace.to_json()) == trace
