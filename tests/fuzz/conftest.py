"""Fuzz fixtures: real tiny-model traces to mutate, and a tally of every bad input tried.

Each fuzz test records, per class of input, how many inputs it tried and how each ended; the
tally is printed at the end of the run (``pytest tests/fuzz``) so the numbers can be quoted.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

TALLY: dict[str, Counter] = defaultdict(Counter)
OUTCOMES = ("tried", "refused", "accepted", "traceback", "not one line", "leftover")


def record(klass: str, outcome: str) -> None:
    """Count one input of ``klass``: ``tried`` plus how it ended."""
    TALLY[klass]["tried"] += 1
    TALLY[klass][outcome] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not TALLY:
        return
    tr = terminalreporter
    tr.section("fuzz: bad inputs tried per class")
    width = max(len(k) for k in TALLY) + 2
    tr.write_line(f"{'class':<{width}}" + "".join(f"{o:>14}" for o in OUTCOMES))
    for klass in sorted(TALLY):
        c = TALLY[klass]
        tr.write_line(f"{klass:<{width}}" + "".join(f"{c[o]:>14}" for o in OUTCOMES))
    total = sum((TALLY[k] for k in TALLY), Counter())
    tr.write_line(f"{'total':<{width}}" + "".join(f"{total[o]:>14}" for o in OUTCOMES))


@pytest.fixture(scope="session")
def base_traces(tiny_lm) -> dict[str, dict]:
    """Two short real traces as JSON documents: one with every optional part (gravity,
    attention, the KV policy's per-step records), one with capture off (no attention)."""
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.eviction import POLICIES
    from semviz.sampling import PruneParams

    grav = PruneParams(temperature=0.9, top_p=0.95, gravity_lambda=0.5, gravity_mass="uniform")
    runs = {
        "full": (
            grav,
            DecodeSettings(max_new_tokens=3, seed=5, record_k=16),
            POLICIES["h2o"](budget=4),
        ),
        "no_capture": (
            PruneParams(top_k=5),
            DecodeSettings(max_new_tokens=3, seed=6, record_k=16, capture=False),
            None,
        ),
    }
    out = {}
    for name, (params, settings, policy) in runs.items():
        d = Decoder(tiny_lm, "A quiet harbour at dawn", params, settings, eviction=policy)
        d.run(settings.max_new_tokens)
        out[name] = json.loads(d.trace.to_json())
    return out
