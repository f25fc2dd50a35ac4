"""Replay: re-prune recorded steps with new settings, without running the model.

The app's what-if sliders, ``python -m semviz replay`` and the reports all call
:func:`replay`. Each recorded step is re-pruned through the one pruning core with the step's
recorded uniform draw (common random numbers), teacher-forced on the recorded tokens, so a
changed choice comes from the settings alone. The first step whose choice changes is the
point where "regenerate from here" would continue.

Gravity needs the context's vectors. When the settings ask for a gravity the trace did not
record (λ was 0, or any field that shapes ``G`` differs: ``PruneParams.gravity_params``), it
is recomputed over the recorded candidates through the live run's own
:func:`semviz.gravity.compute`, from the recorded attention, prompt roles and the model's
embeddings: for a pull one ``(V, d)`` product per distinct pull vector (a prompt-anchored
pull is one for the whole trace), for a contrast each step's short forward; cached per
gravity configuration. Without a model, the recorded gravity is used and the result says so
in ``note``.

Examples
--------
``lm`` is a loaded model (``semviz.load_model()``); a trace can also come from
``Trace.load("trace.json")``.

>>> from semviz import DecodeSettings, Decoder, PruneParams
>>> dec = Decoder(lm, "The sea", PruneParams(), DecodeSettings(max_new_tokens=6, seed=0))
>>> _ = dec.run(6)
>>> same = replay(dec.trace, PruneParams())  # the recorded settings: every pick agrees
>>> same.first_diff is None and same.token_ids == dec.trace.token_ids
True
>>> cut = replay(dec.trace, PruneParams(top_k=1))  # what greedy would have kept
>>> [res.n_kept for res in cut.results]
[1, 1, 1, 1, 1, 1]
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from semviz import gravity as grav
from semviz import sampling
from semviz.output.trace import Trace
from semviz.sampling import GRAVITY_FIELDS, PruneParams, PruneResult, check_model_shape


@dataclass
class WhatIf:
    """The recorded steps re-pruned with ``params``.

    Attributes
    ----------
    results : one ``PruneResult`` per step, over that step's recorded candidates (K,).
    chosen : the candidate index each step would pick (into ``cand_ids``).
    token_ids : the token each step would pick.
    first_diff : first step whose pick differs from the recorded token, or None.
    """

    params: PruneParams
    n: int
    results: list[PruneResult]
    chosen: list[int]
    token_ids: list[int]
    first_diff: int | None
    seconds: float = 0.0
    note: str | None = None
    key: tuple = field(default=(), repr=False)
    # where the replay stands after its last step, so that :func:`cached` can go on from there
    # when the run grows: the sampler state and that step's record (None where gravity was
    # recomputed over the whole trace, which a longer trace changes)
    state: sampling.SamplerState | None = field(default=None, repr=False)
    last: object = field(default=None, repr=False)

    def differs(self, i: int) -> bool:
        return self.first_diff is not None and i >= self.first_diff


def _recorded_gravity_config(trace: Trace) -> dict:
    p = trace.settings.get("params", {}) if isinstance(trace.settings, dict) else {}
    out = {k: p.get(k) for k in GRAVITY_FIELDS}
    for k in ("gravity_layers", "gravity_heads"):
        if isinstance(out[k], list):
            out[k] = tuple(out[k])
    return out


def _missing(trace: Trace, hidden: torch.Tensor | None, upto: int) -> frozenset[str]:
    """What a recorded run cannot give gravity (see ``semviz.gravity.GravityKind.reads``)."""
    out = set() if hidden is not None else {"hidden"}
    if any(s.attention is None for s in trace.steps[:upto]):
        out.add("attention")
    return frozenset(out)


def recompute_gravity(
    model: torch.nn.Module,
    trace: Trace,
    params: PruneParams,
    hidden: torch.Tensor | None = None,
    upto: int | None = None,
) -> list[torch.Tensor | None]:
    """``G`` over each step's recorded candidates, for ``params``. [(K,)]

    Every step goes through :func:`semviz.gravity.compute`, the live run's own call, with
    the context the step recorded (tokens, prompt roles, attention, cache positions) and its
    candidates' log-probabilities, so at the recorded settings this is the gravity the run
    recorded. ``hidden`` (T, d) final normed hidden states (the live decoder's) are needed
    for the hidden spaces; without them the kind does without (:meth:`degrade`: a pull uses
    the embedding space).
    """
    steps = trace.steps[: upto if upto is not None else len(trace.steps)]
    if not steps:
        return []
    params, _ = _degraded(trace, params, hidden, len(steps))
    todo = [
        grav.GravityStep(
            ctx=grav.trace_context(trace, i, hidden=hidden),
            logits=rec.cand_logits,
            lse=rec.lse,
            index=rec.cand_ids.long(),
        )
        for i, rec in enumerate(steps)
    ]
    return [out.gravity for out in grav.compute(model, params, todo, chained=True)]


def _degraded(
    trace: Trace, params: PruneParams, hidden: torch.Tensor | None, upto: int
) -> tuple[PruneParams, str | None]:
    """``params`` with the gravity settings a recorded run can give, and why they changed."""
    kind = grav.get_kind(params.gravity_kind)
    g, note = kind.degrade(params.gravity_params, _missing(trace, hidden, upto))
    if note is None:
        return params, None
    return params.replace(**{k: getattr(g, k) for k in GRAVITY_FIELDS}), note


class GravityCache:
    """Recomputed gravity per (trace, length, gravity configuration)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: list = []

    def get(self, model, trace: Trace, params: PruneParams, hidden=None) -> list:
        key = (
            id(trace),
            len(trace.steps),
            trace.steps[-1].token_id if trace.steps else None,
            params.gravity_params,
            hidden is not None,
        )
        if key != self._key:
            self._value = recompute_gravity(model, trace, params, hidden)
            self._key = key
        return self._value


def _needs_new_gravity(trace: Trace, params: PruneParams) -> bool:
    if params.gravity_lambda == 0.0 or not trace.steps:
        return False
    if any(s.gravity is None for s in trace.steps):
        return True
    rec = _recorded_gravity_config(trace)
    return any(rec[k] != getattr(params, k) for k in GRAVITY_FIELDS)


def replay_steps(
    trace: Trace,
    params: PruneParams,
    gravities: list[torch.Tensor | None] | None = None,
    *,
    start: int = 0,
    state: sampling.SamplerState | None = None,
) -> tuple[list[PruneResult], list[int]]:
    """Re-prune the recorded steps from ``start`` on with ``params``; teacher-forced on the
    recorded tokens. Returns one result and one pick per step replayed.

    The sampler state (histories, mirostat mu) advances with the recorded token, because
    the later logits were computed after it. ``state`` is the state before step ``start``
    (a fresh one at step 0); it is advanced in place.
    """
    state = sampling.SamplerState() if state is None else state
    results, chosen = [], []
    for i in range(start, len(trace.steps)):
        rec = trace.steps[i]
        g = rec.gravity if gravities is None else gravities[i]
        res = sampling.prune(
            rec.cand_logits, params, gravity=g, state=state, tail_logsumexp=rec.tail_lse,
            raw_moments=(rec.entropy, rec.varentropy),  # the record's: the full vocabulary's
        )  # fmt: skip
        idx = _pick(rec, res)
        if res.n_kept == rec.cand_ids.numel() and rec.final_tail_mass > 0:
            # every recorded candidate survived, so the unrecorded tail the live run kept
            # survives too: count it, rather than report the record's size
            res.n_kept = max(res.n_kept, rec.n_kept)
        if rec.chosen_rank >= 0:
            state.observe(res, rec.chosen_rank, rec.token_id)
        else:
            state.tokens.append(rec.token_id)
            state.entropies.append(float(res.entropy_raw))
            state.steps += 1
        results.append(res)
        chosen.append(idx)
    return results, chosen


def _pick(rec, res: PruneResult) -> int:
    """The candidate the recorded draw ``u`` picks under ``res``, as the live run would.

    The live run sampled over the whole vocabulary; the record holds the top-K candidates,
    the kept set and the chosen token, and the share of the final mass outside them
    (``final_tail_mass``). Replay's distribution is renormalised over the record, so ``u`` is
    scaled by the share the record holds: when the replay keeps every recorded candidate,
    the unrecorded tail is taken to survive with its recorded share (exact when the
    temperature is unchanged); when a filter cut inside the record, the tail, which lies
    below every recorded raw probability, is cut too. A draw that lands in the unrecorded
    tail keeps the recorded token. With the recorded settings this reproduces every pick of
    the live run, with one known exception: full-vocabulary gravity (``gravity_mode="full"``)
    can move mass into or out of tokens outside the record, which replay cannot see, so its
    kept sets there are approximate (rerank mode only touches recorded candidates).
    """
    u = min(max(rec.u, 0.0), 1.0 - 1e-12)
    tail = float(getattr(rec, "final_tail_mass", 0.0) or 0.0)
    if res.greedy or tail <= 0.0 or res.n_kept < rec.cand_ids.numel():
        return sampling.choose(res, u, state=sampling.SamplerState())
    scaled = u / (1.0 - tail)
    if scaled >= 1.0 and rec.chosen_rank >= 0:
        return rec.chosen_rank
    return sampling.choose(res, min(scaled, 1.0 - 1e-12), state=sampling.SamplerState())


def replay(
    trace: Trace,
    params: PruneParams,
    *,
    model: torch.nn.Module | None = None,
    hidden: torch.Tensor | None = None,
    gravity_cache: GravityCache | None = None,
) -> WhatIf:
    """The what-if for ``trace`` under ``params`` (see the module docstring)."""
    t0 = time.perf_counter()
    note = None
    gravities = None
    if model is not None:  # recomputed gravity indexes the attention by these layers and heads
        c = model.config
        check_model_shape(params, n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads)
    if _needs_new_gravity(trace, params):
        if model is None:
            note = (
                "Gravity settings that were not recorded need the model; showing λ·G as recorded."
            )
        else:
            cache = gravity_cache or GravityCache()
            gravities = cache.get(model, trace, params, hidden)
            note = _degraded(trace, params, hidden, len(trace.steps))[1]
    state = sampling.SamplerState()
    results, chosen = replay_steps(trace, params, gravities, state=state)
    w = WhatIf(params=params, n=0, results=[], chosen=[], token_ids=[], first_diff=None,
               note=note, state=state if gravities is None else None)  # fmt: skip
    _append(w, trace, results, chosen)
    w.seconds = time.perf_counter() - t0
    return w


def _append(w: WhatIf, trace: Trace, results: list[PruneResult], chosen: list[int]) -> None:
    """Add the replayed steps ``w.n`` on to ``w``."""
    new = trace.steps[w.n : w.n + len(results)]
    ids = [int(rec.cand_ids[c]) for rec, c in zip(new, chosen, strict=True)]
    if w.first_diff is None:
        w.first_diff = next(
            (w.n + i for i, (t, rec) in enumerate(zip(ids, new, strict=True)) if t != rec.token_id),
            None,
        )
    w.results, w.chosen, w.token_ids = w.results + results, w.chosen + chosen, w.token_ids + ids
    w.n += len(results)
    w.last = trace.steps[w.n - 1] if w.n else None


def extend(w: WhatIf, trace: Trace) -> WhatIf | None:
    """``w`` carried on over the steps ``trace`` has gained since (a new ``WhatIf``; ``w`` is
    left as it was), equal to :func:`replay` of the whole trace; None where it cannot be:
    the trace was cut back or changed below ``w``'s last step, or ``w`` recomputed gravity.

    A run that plays on therefore costs one re-prune per new step, not one per step so far.
    """
    n = w.n
    if w.state is None or not 0 < n < len(trace.steps) or trace.steps[n - 1] is not w.last:
        return None
    if _needs_new_gravity(trace, w.params):  # a new step lacks the gravity these settings use
        return None
    t0 = time.perf_counter()
    state = w.state.copy()
    results, chosen = replay_steps(trace, w.params, start=n, state=state)
    out = dataclasses.replace(w, results=list(w.results), chosen=list(w.chosen),
                              token_ids=list(w.token_ids), state=state)  # fmt: skip
    _append(out, trace, results, chosen)
    out.seconds = time.perf_counter() - t0
    return out


def cached(store: dict, trace: Trace, params: PruneParams, **kw) -> WhatIf:
    """:func:`replay` memoised in ``store`` (a session's dict) on trace identity, length, params.

    When the same run has grown under the same settings (a run that plays on), the stored
    replay is carried on over the new steps (:func:`extend`) rather than redone."""
    key = (
        id(trace),
        len(trace.steps),
        trace.steps[-1].token_id if trace.steps else None,
        params,
        kw.get("hidden") is not None,
    )
    hit = store.get("whatif")
    if hit is not None and hit.key == key:
        return hit
    if "gravity_cache" not in store:
        store["gravity_cache"] = GravityCache()
    w = None
    if hit is not None and hit.key[0] == key[0] and hit.key[3:] == key[3:]:
        w = extend(hit, trace)  # the same run and settings, grown by a few steps
    if w is None:
        w = replay(trace, params, gravity_cache=store["gravity_cache"], **kw)
    w.key = key
    store["whatif"] = w
    return w
