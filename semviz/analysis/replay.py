"""Replay: re-prune recorded steps with new settings, without running the model.

The app's what-if sliders, ``python -m semviz replay`` and the reports all call
:func:`replay`. Each recorded step is re-pruned through the one pruning core with the step's
recorded uniform draw (common random numbers), teacher-forced on the recorded tokens, so a
changed choice comes from the settings alone. The first step whose choice changes is the
point where "regenerate from here" would continue.

The record holds each step's top candidates exactly and the rest of the vocabulary as a
binned summary (:mod:`semviz.sampling.tail`; made on demand from the full logits where the
record keeps them, ``StepRecord.tail_summary``), which bounds the tail's mass at any
temperature. A step's pick is exact, what a live decode with the new settings picks from
the same draw, when every vocabulary consistent with the record makes the same pick; where
it depends on tokens the record does not hold (the draw lands in the tail, or too near a
boundary the bounds leave open), the step is marked ``approximate`` with the reason in
``why``, and the pick shown is an estimate with the draw scaled by the new tail's share. A
record that holds the step's every raw logit (``StepRecord.full_logits``, recorded by
default) skips all this: the live chain itself runs over the whole vocabulary and picks what
the live decode picks (except where it needs what the record lacks: full-mode gravity's ``G``
over unrecorded tokens, or mirostat's state).

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
from semviz.sampling import tail as tail_mod


@dataclass
class WhatIf:
    """The recorded steps re-pruned with ``params``.

    Attributes
    ----------
    results : one ``PruneResult`` per step, over that step's recorded candidates (K,).
    chosen : the candidate index each step would pick (into ``cand_ids``); -1 for a token
        outside the candidates, which a record with every raw logit can pick.
    token_ids : the token each step would pick.
    first_diff : first step whose pick differs from the recorded token, or None.
    approximate : per step, True where the pick depends on tokens the record does not hold
        (``why`` says what); the pick shown there is replay's best estimate.
    why : per step, the reason a step is approximate (None where it is exact).
    model_gravity : gravity was recomputed with the model for these settings (the record
        held another, or none), so the what-if is not the record's alone.
    """

    params: PruneParams
    n: int
    results: list[PruneResult]
    chosen: list[int]
    token_ids: list[int]
    first_diff: int | None
    seconds: float = 0.0
    note: str | None = None
    model_gravity: bool = False
    approximate: list[bool] = field(default_factory=list)
    why: list[str | None] = field(default_factory=list)
    key: tuple = field(default=(), repr=False)
    # where the replay stands after its last step, so that :func:`cached` can go on from there
    # when the run grows: the sampler state and that step's record (None where gravity was
    # recomputed over the whole trace, which a longer trace changes)
    state: sampling.SamplerState | None = field(default=None, repr=False)
    last: object = field(default=None, repr=False)

    def differs(self, i: int) -> bool:
        return self.first_diff is not None and i >= self.first_diff

    @property
    def n_approximate(self) -> int:
        """Steps whose pick the record cannot decide exactly."""
        return sum(self.approximate)


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
    n = upto if upto is not None else len(trace.steps)
    return [out.gravity for out in gravity_slice(model, trace, params, hidden, 0, n, upto=n)]


def gravity_slice(
    model: torch.nn.Module,
    trace: Trace,
    params: PruneParams,
    hidden: torch.Tensor | None,
    start: int,
    stop: int,
    *,
    upto: int | None = None,
    ema: torch.Tensor | None = None,
) -> list[grav.GravityOut]:
    """:func:`recompute_gravity` of steps ``start`` … ``stop - 1`` alone, for work done in
    slices (``semviz.tasks.GravityTask``): ``ema`` is what the step before ``start`` carried
    (its ``GravityOut.ema``), and ``upto`` the length the settings are degraded for (the
    whole run's, so that every slice computes the same kind of ``G``)."""
    steps = trace.steps[start:stop]
    if not steps:
        return []
    params, _ = _degraded(trace, params, hidden, upto if upto is not None else len(trace.steps))
    todo = [
        grav.GravityStep(
            ctx=grav.trace_context(trace, i, hidden=hidden),
            logits=rec.cand_logits,
            lse=rec.lse,
            index=rec.cand_ids.long(),
        )
        for i, rec in enumerate(steps, start)
    ]
    if ema is not None:  # the chain goes on from the slice before
        todo[0] = dataclasses.replace(todo[0], ctx=dataclasses.replace(todo[0].ctx, ema=ema))
    return grav.compute(model, params, todo, chained=True)


def _degraded(
    trace: Trace, params: PruneParams, hidden: torch.Tensor | None, upto: int
) -> tuple[PruneParams, str | None]:
    """``params`` with the gravity settings a recorded run can give, and why they changed."""
    kind = grav.get_kind(params.gravity_kind)
    g, note = kind.degrade(params.gravity_params, _missing(trace, hidden, upto))
    if note is None:
        return params, None
    return params.replace(**{k: getattr(g, k) for k in GRAVITY_FIELDS}), note


def run_key(trace: Trace) -> tuple:
    """The run and its length, named by its first and last step records, which every copy of
    the trace shares (a page draws the copy a decoding task keeps after each token, a new
    object each time). Whoever keeps the key holds those records, so their ids stay theirs."""
    steps = trace.steps
    return (
        id(steps[0]) if steps else id(trace),
        len(steps),
        id(steps[-1]) if steps else None,
    )


class GravityCache:
    """Recomputed gravity per (run, length, gravity configuration); the run as
    :func:`run_key` names it."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: list = []
        self._held: tuple = ()

    @staticmethod
    def key(trace: Trace, params: PruneParams, hidden=None) -> tuple:
        return (*run_key(trace), params.gravity_params, hidden is not None)

    def has(self, trace: Trace, params: PruneParams, hidden=None) -> bool:
        return self._key == self.key(trace, params, hidden)

    def put(self, trace: Trace, params: PruneParams, hidden, value: list) -> None:
        """Keep ``value``, gravity computed elsewhere (a ``GravityTask``), for ``trace``."""
        self._key, self._value = self.key(trace, params, hidden), list(value)
        self._held = (trace.steps[0], trace.steps[-1]) if trace.steps else (trace,)

    def get(self, model, trace: Trace, params: PruneParams, hidden=None) -> list:
        if not self.has(trace, params, hidden):
            self.put(trace, params, hidden, recompute_gravity(model, trace, params, hidden))
        return self._value


def needs_new_gravity(trace: Trace, params: PruneParams) -> bool:
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
) -> tuple[list[PruneResult], list[int], list[int], list[str | None]]:
    """Re-prune the recorded steps from ``start`` on with ``params``; teacher-forced on the
    recorded tokens. Returns per step replayed one result, one pick (a candidate index, -1
    for a token outside the candidates), the token picked and one reason: the reason is
    None where the pick is exact (what a live run with ``params`` picks from the same draw),
    else why the record cannot decide it.

    The sampler state (histories, mirostat mu) advances with the recorded token, because
    the later logits were computed after it. ``state`` is the state before step ``start``
    (a fresh one at step 0); it is advanced in place.
    """
    state = sampling.SamplerState() if state is None else state
    recorded = gravities is None and params == _recorded_params(trace)
    vocab = trace.model.get("vocab_size") if isinstance(trace.model, dict) else None
    results, chosen, tokens, whys = [], [], [], []
    for i in range(start, len(trace.steps)):
        rec = trace.steps[i]
        g = rec.gravity if gravities is None else gravities[i]
        mu = state.mirostat_mu
        res = sampling.prune(
            rec.cand_logits,
            params,
            gravity=g,
            state=state,
            tail_logsumexp=rec.tail_lse,
            raw_moments=(rec.entropy, rec.varentropy),  # the record's: the full vocabulary's
            tail_count=_tail_count(rec, vocab) if params.adaptive == "dynatemp" else 0,
            attention=record_reading(rec) if params.adaptive == "entropix" else None,
        )
        token = None
        if recorded:  # the recorded settings: the recorded pick is the live one
            decision = tail_mod.Decision(index=rec.chosen_rank if rec.chosen_rank >= 0 else None)
        elif (token := _full_pick(rec, params, g, state)) is not None:
            # every raw logit is recorded: the live chain itself decides, over the vocabulary
            # (cheaper than bounding the tail from its summary, and the same pick)
            hit = (rec.cand_ids == token).nonzero()
            decision = tail_mod.Decision(index=int(hit[0, 0]) if hit.numel() else -1)
        else:
            decision = _decide(rec, res, params, g, gravities is None, mu, vocab)
        why = decision.why
        if decision.index is not None:
            idx = decision.index
        else:
            idx = _pick(rec, res, decision.tail_share)
            why = why or "the record cannot decide this pick"
        if why is None and state.mu_estimated and params.adaptive == "mirostat":
            why = "mirostat's state rests on an estimated probability from an earlier step"
        if res.n_kept == rec.cand_ids.numel() and rec.final_tail_mass > 0:
            # every recorded candidate survived, so the unrecorded tail the live run kept
            # survives too: count it, rather than report the record's size
            res.n_kept = max(res.n_kept, rec.n_kept)
        if rec.chosen_rank >= 0:
            q = None if recorded else decision.final_q
            state.observe(res, rec.chosen_rank, rec.token_id, q=q, q_exact=decision.q_exact)
        else:
            state.tokens.append(rec.token_id)
            state.entropies.append(float(res.entropy_raw))
            state.steps += 1
        results.append(res)
        chosen.append(idx)
        tokens.append(int(rec.cand_ids[idx]) if token is None else token)
        whys.append(why)
    return results, chosen, tokens, whys


def _recorded_params(trace: Trace) -> PruneParams | None:
    p = trace.settings.get("params") if isinstance(trace.settings, dict) else None
    try:
        return PruneParams.from_dict(p) if isinstance(p, dict) else None
    except (TypeError, ValueError):
        return None


def _tail_count(rec, vocab: int | None) -> int:
    """Finite tokens outside the record (dynatemp counts them as the live run did)."""
    if rec.tail is None and rec.full_logits is not None:  # counted, not binned
        finite = int(torch.count_nonzero(rec.full_logits > float("-inf")))
        return finite - int(torch.count_nonzero(rec.cand_logits > float("-inf")))
    if isinstance(rec.tail, dict):
        return int(rec.tail["counts"].sum())
    if isinstance(vocab, int) and vocab > rec.cand_ids.numel():
        return vocab - rec.cand_ids.numel()
    return 0


def _decide(rec, res: PruneResult, params: PruneParams, g, g_recorded: bool, mu, vocab):
    """The record's decision for one step (:func:`semviz.sampling.tail.decide`)."""
    eff = sampling.default_params(params) if res.fallback else params
    tail = rec.tail_summary()
    if tail is None and rec.tail_lse is not None and isinstance(vocab, int):
        # a record from before tail summaries: one bin below the last candidate
        n = vocab - rec.cand_ids.numel()
        if n > 0 and rec.tail_lse > float("-inf"):
            tail = tail_mod.Tail.from_lse(float(rec.cand_logits.min()), float(rec.tail_lse), n)
    return tail_mod.decide(
        rec.cand_ids,
        rec.cand_logits,
        tail,
        eff,
        temperature=float(res.temperature),
        greedy=bool(res.greedy),
        u=min(max(rec.u, 0.0), 1.0 - 1e-12),
        entropy=float(rec.entropy),
        gravity=g,
        gravity_recorded=g_recorded,
        mirostat_mu=mu,
        token_rank=rec.chosen_rank,
    )


def _full_pick(rec, params: PruneParams, g, state: sampling.SamplerState) -> int | None:
    """The token a live decode with ``params`` picks at ``rec`` from the same draw, from the
    step's every raw logit (``full_logits``) through the live chain; None where the record
    lacks them or another input the live chain read: full-mode gravity's ``G`` over the
    unrecorded tokens, a rerank set wider than the candidates, or mirostat's state (which
    rests on the probabilities of earlier picks)."""
    full = rec.full_logits
    if full is None or params.adaptive == "mirostat":
        return None
    gravity = None
    if g is not None and params.gravity_lambda != 0.0:
        k, r = rec.cand_ids.numel(), params.rerank_k
        if params.gravity_mode != "rerank" or r > k:
            return None
        if int((full > rec.cand_logits[r - 1]).sum()) >= r:  # the rerank set leaves the record
            return None
        g = g.float()
        if bool(g.max() == g.min()):  # a constant G: the live run's is that constant too
            gravity = torch.full_like(full, float(g[0]))
        else:  # only the rerank set, inside the candidates, reads G
            gravity = torch.zeros_like(full).index_copy_(0, rec.cand_ids.long(), g)
    # the recorded raw entropy and varentropy are the live run's, from these same logits
    res = sampling.prune(
        full,
        params,
        gravity=gravity,
        state=state,
        raw_moments=(rec.entropy, rec.varentropy),
        attention=record_reading(rec) if params.adaptive == "entropix" else None,
    )
    return int(sampling.choose(res, rec.u, state=sampling.SamplerState()))


def record_reading(rec) -> sampling.AttentionReading | None:
    """What entropix's temperature reads of a recorded step: its attention metrics' last
    layer (None when the step recorded none)."""
    m = rec.attn_metrics
    return None if m is None else sampling.attention_reading(m["entropy"][-1], m["agreement"][-1])


def _pick(rec, res: PruneResult, share: float | None = None) -> int:
    """Replay's best estimate of the candidate the draw ``u`` picks, where the record
    cannot decide it.

    Replay's distribution is renormalised over the record, so ``u`` is scaled by the share
    of the final mass the candidates hold: ``share`` is the tail's estimated share under the
    new settings (from the tail summary); without one, the recorded share is used when the
    replay keeps every recorded candidate, and none when a filter cut inside the record
    (the tail lies below every recorded raw probability). A draw that lands in the
    unrecorded tail keeps the recorded token.
    """
    u = min(max(rec.u, 0.0), 1.0 - 1e-12)
    if share is None:
        share = float(getattr(rec, "final_tail_mass", 0.0) or 0.0)
        if res.n_kept < rec.cand_ids.numel():
            share = 0.0
    if res.greedy or share <= 0.0:
        return sampling.choose(res, u, state=sampling.SamplerState())
    scaled = u / (1.0 - min(share, 1.0 - 1e-12))
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
    if needs_new_gravity(trace, params):
        if model is None:
            note = (
                "Gravity settings that were not recorded need the model; showing λ·G as recorded."
            )
        else:
            cache = gravity_cache or GravityCache()
            gravities = cache.get(model, trace, params, hidden)
            note = _degraded(trace, params, hidden, len(trace.steps))[1]
    state = sampling.SamplerState()
    results, chosen, tokens, whys = replay_steps(trace, params, gravities, state=state)
    w = WhatIf(
        params=params,
        n=0,
        results=[],
        chosen=[],
        token_ids=[],
        first_diff=None,
        note=note,
        state=state if gravities is None else None,
        model_gravity=gravities is not None,
    )
    _append(w, trace, results, chosen, tokens, whys)
    w.seconds = time.perf_counter() - t0
    return w


def _append(
    w: WhatIf,
    trace: Trace,
    results: list[PruneResult],
    chosen: list[int],
    ids: list[int],
    whys: list,
) -> None:
    """Add the replayed steps ``w.n`` on to ``w``."""
    new = trace.steps[w.n : w.n + len(results)]
    if w.first_diff is None:
        w.first_diff = next(
            (w.n + i for i, (t, rec) in enumerate(zip(ids, new, strict=True)) if t != rec.token_id),
            None,
        )
    w.results, w.chosen, w.token_ids = w.results + results, w.chosen + chosen, w.token_ids + ids
    w.why = w.why + list(whys)
    w.approximate = w.approximate + [why is not None for why in whys]
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
    if needs_new_gravity(trace, w.params):  # a new step lacks the gravity these settings use
        return None
    t0 = time.perf_counter()
    state = w.state.copy()
    results, chosen, tokens, whys = replay_steps(trace, w.params, start=n, state=state)
    out = dataclasses.replace(
        w, results=list(w.results), chosen=list(w.chosen), token_ids=list(w.token_ids), state=state
    )
    _append(out, trace, results, chosen, tokens, whys)
    out.seconds = time.perf_counter() - t0
    return out


def cached(store: dict, trace: Trace, params: PruneParams, **kw) -> WhatIf:
    """:func:`replay` memoised in ``store`` (a session's dict) on the run, its length and last
    step, and the params.

    The run is named as :func:`run_key` names it, so every copy of the trace finds the stored
    replay (which holds the last step, ``WhatIf.last``), and a run that plays on under the same
    settings has it carried on over its new steps (:func:`extend`) rather than redone from
    step 0 at every redraw."""
    key = (*run_key(trace), params, kw.get("hidden") is not None)
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
