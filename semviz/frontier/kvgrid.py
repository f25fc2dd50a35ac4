"""kv-eval grids on the frontier's executor: policies × budgets × texts, here or on Ray.

A grid is cut into one shard per (text, budget): each runs
:func:`~semviz.eviction.kv_eval` over every policy at that budget, as the rows of one batch,
so the policies of a shard share its forwards as they do in one ``kv-eval`` call. The
full-cache reference row (budget-free) comes from each text's first budget only. Rows carry
the text's name in ``text``.

Examples
--------
>>> from semviz.frontier.kvgrid import grid_shards
>>> [s.label for s in grid_shards({"a": [1, 2, 3]}, ["full", "window"], [8, 16])]
['a · budget 8', 'a · budget 16']
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from semviz.frontier.executor import Executor, Shard, ShardTask

__all__ = ["KVGridTask", "grid_shards", "kv_grid"]


class KVGridTask(ShardTask):
    """One shard: a text's ids, the policies and one budget; the result is its rows."""

    def __init__(self, prefill: int = 1, policy_kwargs: dict | None = None) -> None:
        self.prefill, self.policy_kwargs = prefill, dict(policy_kwargs or {})

    def run(self, lm, payload, tick, should_stop):
        from semviz.eviction import kv_eval

        text, ids, policies, budget = payload
        stopped = [False]

        def stop() -> bool:
            stopped[0] = stopped[0] or bool(should_stop())
            return stopped[0]

        rows = kv_eval(
            lm,
            ids,
            policies,
            [budget],
            prefill=self.prefill,
            policy_kwargs=self.policy_kwargs,
            on_progress=lambda done, total, _label: tick(done / max(total, 1)),
            should_stop=stop,
        )
        if stopped[0]:
            return None  # a stopped shard's rows are scored on part of the text: drop them
        return [{"text": text, **r} for r in rows]


def grid_shards(
    texts: Mapping[str, Sequence[int]], policies: Sequence[str], budgets: Sequence[Any]
) -> list[Shard]:
    """One shard per (text, budget); ``full`` only in each text's first budget."""
    out = []
    for name, ids in texts.items():
        for i, b in enumerate(budgets):
            pols = [p for p in policies if p != "full" or i == 0]
            if not pols:
                continue
            out.append(
                Shard(
                    key=(name, json.dumps(b)),
                    payload=(name, list(ids), pols, b),
                    size=float(len(ids) * len(pols)),
                    label=f"{name} · budget {b}",
                )
            )
    return out


def kv_grid(
    texts: Mapping[str, Sequence[int]],
    policies: Sequence[str],
    budgets: Sequence[Any],
    *,
    lm=None,
    executor: Executor | None = None,
    prefill: int = 1,
    policy_kwargs: dict | None = None,
    on_progress: Callable[[float, float, str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[dict], bool]:
    """Every (text, policy, budget) row, in grid order; and whether it was stopped.

    Parameters
    ----------
    texts : name -> token ids (each already cut to the tokens to read)
    lm : the loaded model, to run here; or ``executor``, an :class:`Executor` of
        :class:`KVGridTask` (Ray workers)
    """
    if lm is None and executor is None:
        raise ValueError("give lm (run here) or executor (Ray workers)")
    shards = grid_shards(texts, policies, budgets)
    own = executor is None
    ex = executor or Executor(KVGridTask(prefill, policy_kwargs), lm=lm)
    got: dict = {}
    try:
        stopped = ex.run(
            shards,
            on_result=lambda s, rows: got.__setitem__(s.key, rows),
            on_progress=on_progress,
            should_stop=should_stop,
        )
    finally:
        if own:
            ex.close()
    rows = [r for s in shards if s.key in got for r in got[s.key]]
    return rows, stopped
