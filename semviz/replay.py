"""Replay: re-prune recorded steps with new settings, without running the model.

The app's what-if sliders, ``python -m semviz replay`` and the reports all call
:func:`replay`. Each recorded step is re-pruned through the one pruning core with the step's
recorded uniform draw (common random numbers), teacher-forced on the recorded tokens, so a
changed choice comes from the settings alone. The first step whose choice changes is the
point where "regenerate from here" would continue.

Gravity needs the context's vectors. When the settings ask for a gravity the trace did not
record (λ was 0, or another mass source / similarity / space), it is recomputed over the
recorded candidates from the recorded attention and the model's embedding matrix: one
``(V, d) @ (d, n)`` product for all steps, cached per gravity configuration. Without a model,
the recorded gravity is used and the result says so in ``note``.

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

import time
from dataclasses import dataclass, field

import torch

from semviz import gravity as grav
from semviz import sampling
from semviz.sampling import PruneParams, PruneResult, check_model_shape
from semviz.trace import Trace

_GRAVITY_KEYS = ("gravity_mass", "gravity_sim", "gravity_space", "gravity_layers", "gravity_heads")


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

    def differs(self, i: int) -> bool:
        return self.first_diff is not None and i >= self.first_diff


def _recorded_gravity_config(trace: Trace) -> dict:
    p = trace.settings.get("params", {}) if isinstance(trace.settings, dict) else {}
    out = {k: p.get(k) for k in _GRAVITY_KEYS}
    for k in ("gravity_layers", "gravity_heads"):
        if isinstance(out[k], list):
            out[k] = tuple(out[k])
    return out


def _context_ids(trace: Trace, i: int) -> torch.Tensor:
    """Ids of the sequence before step ``i`` (prompt + earlier picks). (N,)"""
    return torch.tensor(trace.prompt_ids + [s.token_id for s in trace.steps[:i]], dtype=torch.long)


def recompute_gravity(
    model: torch.nn.Module,
    trace: Trace,
    params: PruneParams,
    hidden: torch.Tensor | None = None,
    upto: int | None = None,
) -> list[torch.Tensor | None]:
    """Normalised gravity over each step's recorded candidates, for ``params``. [(K,)]

    ``hidden`` (T, d) final normed hidden states (the live decoder's) are needed for
    ``gravity_space="hidden"``; without them the embedding space is used.
    """
    steps = trace.steps[: upto if upto is not None else len(trace.steps)]
    if not steps:
        return []
    space = params.gravity_space if hidden is not None else "embedding"
    cand = grav.candidate_matrix(model, space, params.gravity_sim)  # (V, d)
    pulls = []
    ema = None
    for i, rec in enumerate(steps):
        pos = rec.cache_positions.long()  # (S,)
        ids = _context_ids(trace, i)[pos.clamp(max=len(trace.prompt_ids) + i - 1)]  # (S,)
        if space == "hidden":
            ctx = hidden[pos.clamp(max=hidden.shape[0] - 1)].float()  # (S, d)
        else:
            ctx = grav.context_vectors(model, "embedding", context_ids=ids)  # (S, d)
        att = rec.attention.float() if rec.attention is not None else None  # (L, H, S)
        source = params.gravity_mass
        if source in ("attention", "ema") and att is None:
            source = "uniform"
        mass = grav.context_mass(
            source,
            attention=att,
            layers=params.gravity_layers,
            heads=params.gravity_heads,
            ema=ema,
            ema_decay=params.ema_decay,
            context_ids=ids,
            embed=model.get_input_embeddings().weight if source == "norm" else None,
            vectors=ctx if source == "norm" and space == "embedding" else None,
            n=ctx.shape[0],
        )  # (S,)
        if source == "ema":
            ema = mass
        pulls.append(grav.pull_vector(ctx, mass, params.gravity_sim))  # (d,)
    with torch.inference_mode():
        g = cand @ torch.stack(pulls, 1)  # (V, n) one product for every step
        g = grav.normalize_gravity(g.T)  # (n, V) z-scored over the vocabulary
    return [g[i, rec.cand_ids.long()].float() for i, rec in enumerate(steps)]


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
            tuple(getattr(params, k) for k in _GRAVITY_KEYS),
            params.ema_decay,
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
    return any(rec[k] != getattr(params, k) for k in _GRAVITY_KEYS)


def replay_steps(
    trace: Trace,
    params: PruneParams,
    gravities: list[torch.Tensor | None] | None = None,
) -> tuple[list[PruneResult], list[int]]:
    """Re-prune every recorded step with ``params``; teacher-forced on the recorded tokens.

    The sampler state (histories, mirostat mu) advances with the recorded token, because
    the later logits were computed after it.
    """
    state = sampling.SamplerState()
    results, chosen = [], []
    for i, rec in enumerate(trace.steps):
        g = rec.gravity if gravities is None else gravities[i]
        res = sampling.prune(
            rec.cand_logits, params, gravity=g, state=state, tail_logsumexp=rec.tail_lse
        )
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
            if params.gravity_space == "hidden" and hidden is None:
                note = "Hidden-space gravity needs the live run's hidden states; using embeddings."
    results, chosen = replay_steps(trace, params, gravities)
    token_ids = [int(rec.cand_ids[c]) for rec, c in zip(trace.steps, chosen, strict=True)]
    first = next(
        (
            i
            for i, (t, rec) in enumerate(zip(token_ids, trace.steps, strict=True))
            if t != rec.token_id
        ),
        None,
    )
    return WhatIf(
        params=params,
        n=len(trace.steps),
        results=results,
        chosen=chosen,
        token_ids=token_ids,
        first_diff=first,
        seconds=time.perf_counter() - t0,
        note=note,
    )


def cached(store: dict, trace: Trace, params: PruneParams, **kw) -> WhatIf:
    """:func:`replay` memoised in ``store`` (a session's dict) on trace identity, length, params."""
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
    w = replay(trace, params, gravity_cache=store["gravity_cache"], **kw)
    w.key = key
    store["whatif"] = w
    return w
