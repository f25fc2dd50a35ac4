"""KV-cache eviction on the real cache: policies, key re-rotation and the evaluation harness.

Four modules, in the manner of kvpress:

- :mod:`semviz.eviction.base`: what a policy sees (:class:`CacheView`) and returns
  (:class:`Plan`), and the base class, which resolves budgets and thresholds, protects,
  selects and records the timeline.
- :mod:`semviz.eviction.policies`: each policy is a small ``@dataclass`` with a ``score()``:
  ``full``, ``window``, ``streaming``, ``h2o``, ``tova``, ``ema``, ``gravity``
  (:func:`make_policy`).
- :mod:`semviz.eviction.rerotate`: :class:`KeyRerotation` wraps any policy and re-rotates the
  kept keys to cache-relative positions; it alone checks that the model has plain RoPE.
- :mod:`semviz.eviction.harness`: teacher-forced evaluation (:func:`kv_eval`, the ``kv-eval``
  command) with every policy a row of one batch on :func:`semviz.model.forward.forward`, and the
  full-cache reference from one prefill.

A :class:`~semviz.decoding.decoder.Decoder` takes a policy as ``eviction=``: after every forward it
calls ``policy.after_forward(decoder, attention)``, which evicts from the decoder's own cache
and returns the step's timeline record (``StepRecord.eviction``, described in
:mod:`semviz.eviction.base`). Eviction therefore always happens *after* the step's
attention has been computed, and the next forward passes the true ``position_ids``.

Examples
--------
>>> from semviz.eviction import make_policy
>>> make_policy("window", budget=64).name
'window'
"""

from semviz.eviction import base, harness, policies, rerotate
from semviz.eviction.base import RULES, CacheView, EvictionPolicy, Plan, parse_budget, parse_budgets
from semviz.eviction.harness import KVEval, kv_eval, teacher_force, teacher_forced_ids
from semviz.eviction.policies import (
    POLICIES,
    EMAPolicy,
    FullPolicy,
    GravityPolicy,
    H2OPolicy,
    StreamingPolicy,
    TOVAPolicy,
    WindowPolicy,
    make_policy,
)
from semviz.eviction.rerotate import KeyRerotation

__all__ = [
    "base",
    "POLICIES",
    "RULES",
    "CacheView",
    "EMAPolicy",
    "EvictionPolicy",
    "FullPolicy",
    "GravityPolicy",
    "H2OPolicy",
    "KVEval",
    "KeyRerotation",
    "Plan",
    "StreamingPolicy",
    "TOVAPolicy",
    "WindowPolicy",
    "harness",
    "kv_eval",
    "make_policy",
    "parse_budget",
    "parse_budgets",
    "policies",
    "rerotate",
    "teacher_force",
    "teacher_forced_ids",
]
