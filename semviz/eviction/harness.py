"""Teacher-forced evaluation of eviction policies, batched, on the decoder's own forward.

Every policy in one evaluation reads the same tokens at the same positions, so they run as
rows of one batch: one :func:`semviz.model.forward.forward` per token feeds all of them, each row
with its own cache entries (:class:`semviz.model.forward.KVRows`: padded, masked, true
``position_ids``) and its own policy state. After each forward every row's policy plans its
eviction on its own slice of the captured attention, and the cache is packed once for all rows.
A row's results equal those of the same policy run alone (``batch_size=1``) up to float rounding:
padded keys get exactly zero attention (tests hold logits to 1e-5).

The full-cache reference is one prefill over the text (fed in chunks of ``REFERENCE_CHUNK``
tokens, so memory stays bounded and a caller can stop between chunks): it gives every position's
next-token log-probabilities, against which each row's perplexity, top-1 agreement and KL
divergence are scored as it goes. :class:`KVEval` advances the whole evaluation one forward per
``step()``; :func:`kv_eval` runs it to the end (or to a stop request).

Examples
--------
>>> rows = kv_eval(lm, ids, ["full", "window", "h2o"], budgets=(64,))  # doctest: +SKIP
>>> [r["policy"] for r in rows]  # doctest: +SKIP
['full', 'window', 'h2o']
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from semviz.eviction.base import Value, apply_plans, view_of
from semviz.eviction.policies import POLICIES, make_policy
from semviz.model.forward import KVRows, forward, kv_bytes_per_token, lm_head

__all__ = ["KVEval", "TeacherStep", "kv_eval", "teacher_force", "teacher_forced_ids"]

REFERENCE_CHUNK = 512


def teacher_forced_ids(
    lm, source: str | Sequence[int], n: int, *, repeat: bool = False
) -> list[int]:
    """The first ``n`` token ids of a text (or of ids) to teacher-force.

    Parameters
    ----------
    source : a text (tokenised without special tokens) or token ids
    n : how many tokens; at least 2 and at most the model's context
    repeat : repeat ``source`` until it has ``n`` tokens; otherwise a short source is an error

    Raises ``ValueError`` with one sentence when the source is empty or too short, or ``n``
    is out of range.
    """
    if n < 2:
        raise ValueError(f"tokens must be at least 2, got {n}")
    if n > lm.max_context:
        raise ValueError(f"{lm.name} reads at most {lm.max_context:,} tokens; ask for fewer")
    if isinstance(source, str):
        ids = list(lm.tokenizer(source, add_special_tokens=False)["input_ids"])
    else:
        ids = [int(i) for i in source]
    if not ids:
        raise ValueError("there is no text to read: give a text or generate some tokens first")
    if len(ids) < n:
        if not repeat:
            raise ValueError(f"the text has {len(ids):,} tokens, fewer than the {n:,} asked for")
        ids = ids * (n // len(ids) + 1)
    return ids[:n]


# --------------------------------------------------------------------------------------------
# Rows of one batch
# --------------------------------------------------------------------------------------------


@dataclass
class TeacherStep:
    """One batched forward of :func:`teacher_force`.

    Attributes
    ----------
    positions : the true positions fed (T of them)
    logits : (B, T, V) float32 next-token logits per row, or None (``head=False``)
    events : per row, the policy's timeline record plus ``peak_bytes`` (the row's cache
        bytes after the forward, before eviction)
    seconds : the shared forward and LM head
    policy_seconds : per row, the time its policy took
    rows : the rows' cache after this step's eviction (live: the next step changes it)
    """

    positions: list[int]
    logits: Tensor | None
    events: list[dict]
    seconds: float
    policy_seconds: list[float]
    rows: KVRows | None = None


class _Batch:
    """Policies as rows of one batch over one text: their cache, their hidden states."""

    def __init__(self, lm, policies: Sequence[Any], n_tokens: int) -> None:
        self.lm = lm
        self.policies = list(policies)
        for p in self.policies:
            p.reset(lm)
        self.rows = KVRows.empty(lm.model, len(self.policies))
        self.entry_bytes = kv_bytes_per_token(lm.summary()) // lm.model.config.num_hidden_layers
        self.hidden: Tensor | None = None
        if any(p.needs_hidden for p in self.policies):
            d = lm.model.config.hidden_size
            self.hidden = torch.zeros(len(self.policies), n_tokens, d)  # (B, N, d)

    def feed(self, ids: Sequence[int], start: int, stop: int, *, head: bool = True) -> TeacherStep:
        """Feed ``ids[start:stop]`` to every row, then let every row's policy evict."""
        b, dev = len(self.policies), self.lm.device
        chunk = torch.tensor(ids[start:stop], dtype=torch.long)  # (T,)
        pos = torch.arange(start, stop)  # (T,)
        t0 = time.perf_counter()
        out = forward(
            self.lm.model,
            chunk.expand(b, -1).to(dev),
            pos.expand(b, -1).to(dev),
            self.rows.cache,
            capture=True,
            masks=self.rows.masks(stop - start),
        )
        logits = lm_head(self.lm.model, out.hidden) if head else None  # (B, T, V)
        seconds = time.perf_counter() - t0
        self.rows.append(pos)
        if self.hidden is not None:
            self.hidden[:, start:stop] = out.hidden.float().cpu()
        plans, secs, peaks = [], [], []
        seen = list(ids[:stop])
        for r, policy in enumerate(self.policies):
            t1 = time.perf_counter()
            view = view_of(
                self.rows,
                r,
                out.attention,
                lm=self.lm,
                entry_bytes=self.entry_bytes,
                n_seen=stop,
                ids=seen,
                hidden=None if self.hidden is None else self.hidden[r, :stop],
            )
            peaks.append(int(view.count.sum()) * self.entry_bytes)
            plans.append(policy.plan(view))
            secs.append(time.perf_counter() - t1)
        t2 = time.perf_counter()
        apply_plans(self.rows, plans)
        share = (time.perf_counter() - t2) / b  # packing the cache, shared by the rows
        events = [{**p.record, "peak_bytes": peak} for p, peak in zip(plans, peaks, strict=True)]
        return TeacherStep(
            positions=pos.tolist(),
            logits=logits,
            events=events,
            seconds=seconds,
            policy_seconds=[s + share for s in secs],
            rows=self.rows,
        )


def _schedule(n: int, prefill: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of every forward: the prefill chunk, then one token at a time."""
    first = max(1, min(int(prefill), n))
    return [(0, first)] + [(i, i + 1) for i in range(first, n)]


def teacher_force(
    lm, ids: Sequence[int], policies: Sequence[Any], *, prefill: int = 1, head: bool = True
) -> Iterator[TeacherStep]:
    """Feed ``ids`` (a prefill chunk, then one token per forward) to one row per policy.

    Every row reads the same tokens at their true positions; each keeps its own cache and
    evicts after every forward. ``policies`` are ready policies (``make_policy``); pass one
    for an unbatched run.
    """
    ids = list(ids)
    if not ids:
        raise ValueError("ids must not be empty")
    if not policies:
        raise ValueError("give at least one policy")
    batch = _Batch(lm, policies, len(ids))
    for start, stop in _schedule(len(ids), prefill):
        yield batch.feed(ids, start, stop, head=head)


# --------------------------------------------------------------------------------------------
# The evaluation
# --------------------------------------------------------------------------------------------


class _Reference:
    """The full cache's next-token log-probabilities, from one prefill over the text.

    The prefill is fed in chunks of ``REFERENCE_CHUNK`` tokens onto one cache (a chunked
    prefill computes what one prefill does); :meth:`step` feeds one chunk, so a caller can
    stop between chunks, and the chunk bounds the (T, V) logits held at once.
    """

    def __init__(self, lm, ids: list[int]) -> None:
        self.lm, self.ids = lm, ids
        self.cache = lm.new_cache()
        self.logp = torch.empty(len(ids) - 1, lm.model.config.vocab_size)  # (N-1, V)
        self.read = 0
        self.seconds = 0.0
        self.top: Tensor | None = None  # (N-1,) the full cache's top-1, once done
        self.nll = 0.0

    @property
    def done(self) -> bool:
        return self.read >= len(self.ids)

    def step(self) -> None:
        """Feed the next chunk; after the last one, free the cache and sum the NLL."""
        model, dev, n = self.lm.model, self.lm.device, len(self.ids)
        start, stop = self.read, min(n, self.read + REFERENCE_CHUNK)
        t0 = time.perf_counter()
        x = torch.tensor([self.ids[start:stop]], device=dev)  # (1, T)
        pos = torch.arange(start, stop, device=dev)[None]  # (1, T)
        out = forward(model, x, pos, self.cache)
        keep = min(stop, n - 1) - start  # the last position has no next token
        if keep > 0:
            lg = lm_head(model, out.hidden[0, :keep])  # (T', V)
            self.logp[start : start + keep] = torch.log_softmax(lg, -1).cpu()
        self.seconds += time.perf_counter() - t0
        self.read = stop
        if self.done:
            self.cache = None
            targets = torch.tensor(self.ids[1:])  # (N-1,)
            self.nll = -float(self.logp.gather(1, targets[:, None]).double().sum())
            self.top = self.logp.argmax(-1)


@dataclass
class _Run:
    """One (policy, budget) row of the table and its running sums."""

    name: str
    budget: Any
    policy: Any
    nll: float = 0.0
    kl: float = 0.0
    agree: float = 0.0
    n: int = 0
    peak: int = 0
    len_sum: float = 0.0
    mass: float = 0.0
    regret: float = 0.0
    n_fwd: int = 0
    n_read: int = 0
    seconds: float = 0.0

    def row(self) -> dict:
        n, f = max(self.n, 1), max(self.n_fwd, 1)
        return {
            "policy": self.name,
            "budget": self.budget,
            "tokens": self.n,
            "ppl": math.exp(self.nll / n),
            "nll": self.nll / n,
            "top1_agree": self.agree / n,
            "kl": max(self.kl / n, 0.0),
            "peak_cache_bytes": self.peak,
            "mean_cache_len": self.len_sum / f,
            "evicted_mass": self.mass / f,
            "regret_est": self.regret / f,
            "tokens_per_s": self.n_read / self.seconds if self.seconds else float("nan"),
            "seconds": self.seconds,
        }


def _score(runs: list[_Run], step: TeacherStep, ids: list[int], ref: _Reference) -> None:
    """Add one batched forward's predictions and records to each row's sums."""
    n = len(ids)
    idx = [i for i, p in enumerate(step.positions) if p < n - 1]
    if idx:
        p = torch.tensor([step.positions[i] for i in idx])  # (T',)
        lp = torch.log_softmax(step.logits[:, idx], -1)  # (B, T', V)
        target = torch.tensor(ids)[p + 1]  # (T',)
        ref_lp = ref.logp[p]  # (T', V)
        nll = -lp.gather(2, target.view(1, -1, 1).expand(len(runs), -1, 1)).double().sum((1, 2))
        agree = (lp.argmax(-1) == ref.top[p]).sum(1)  # (B,)
        kl = (ref_lp.exp() * (ref_lp - lp)).double().sum((1, 2))  # (B,)
    share = step.seconds / len(runs)
    for r, run in enumerate(runs):
        if idx:
            run.nll += float(nll[r])
            run.agree += float(agree[r])
            run.kl += float(kl[r])
            run.n += len(idx)
        e = step.events[r]
        run.peak = max(run.peak, int(e["peak_bytes"]))
        run.len_sum += float(e["lengths"].float().mean())
        run.mass += float(e["evicted_mass"].mean())
        run.regret += float(e["regret"].mean())
        run.n_fwd += 1
        run.n_read += len(step.positions)
        run.seconds += share + step.policy_seconds[r]


MAX_ROWS = 64  # policies × budgets in one kv-eval
MEMORY_BUDGET = 1 << 30  # bytes one kv-eval's batch may hold: rows are batched to fit


def row_bytes(lm, n_tokens: int, prefill: int) -> int:
    """An upper estimate of one row's memory in a batch: its cache before eviction (every
    token), and the float32 logits of its largest forward with their log-softmax."""
    kv = n_tokens * kv_bytes_per_token(lm.summary())
    logits = 2 * max(prefill, 1) * int(lm.model.config.vocab_size) * 4
    return kv + logits


def _unique(values: Sequence[Any]) -> list[Any]:
    """In order, each value once (a per-layer budget is a tuple, a list is made one)."""
    out: list[Any] = []
    for v in values:
        v = tuple(v) if isinstance(v, list) else v
        if not any(type(v) is type(w) and v == w for w in out):
            out.append(v)
    return out


def _runs(
    policies: Sequence[Any], budgets: Sequence[Value], kw: dict[str, dict]
) -> tuple[list[_Run], bool]:
    """The table's rows: every named policy at every budget (``full`` is the reference),
    then the ready policies as given; and whether the reference row is wanted. Repeated
    names and budgets count once; at most ``MAX_ROWS`` rows."""
    names = [p for p in policies if isinstance(p, str)]
    policies = list(dict.fromkeys(names)) + [p for p in policies if not isinstance(p, str)]
    budgets = _unique(budgets)
    n_rows = sum(p != "full" for p in policies if isinstance(p, str)) * len(budgets) + sum(
        not isinstance(p, str) for p in policies
    )
    if n_rows > MAX_ROWS:
        raise ValueError(
            f"kv-eval runs at most {MAX_ROWS} rows (policies × budgets); this asks for "
            f"{n_rows:,}: give fewer policies or budgets"
        )
    runs = []
    for b in budgets:
        for p in policies:
            if isinstance(p, str) and p != "full":
                if p not in POLICIES:
                    raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {p!r}")
                runs.append(_Run(p, b, make_policy(p, b, **kw.get(p, {}))))
    runs += [_Run(p.name, p.budget, p) for p in policies if not isinstance(p, str)]
    return runs, "full" in policies


class KVEval:
    """A kv-eval run that advances one batched forward per :meth:`step`.

    :func:`kv_eval` loops over it; the app's KV page ticks it between reruns, so it can stop
    and keep what it computed. Arguments are those of :func:`kv_eval`.

    Attributes
    ----------
    done, total : tokens read so far and in all (over every batch)
    finished : every row has read the whole text
    """

    def __init__(
        self,
        lm,
        ids: Sequence[int],
        policies: Sequence[Any] = tuple(POLICIES),
        budgets: Sequence[Value] = (128,),
        *,
        prefill: int = 1,
        policy_kwargs: dict[str, dict] | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.lm, self.ids = lm, list(ids)
        if len(self.ids) < 2:
            raise ValueError("ids must hold at least 2 tokens")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        self.prefill = max(1, min(int(prefill), len(self.ids)))
        self.runs, self.want_full = _runs(policies, budgets, policy_kwargs or {})
        for r in self.runs:  # settings the model cannot take fail here, before any forward
            r.policy.reset(lm)
        # memory is estimated before the run: rows are batched so that a batch fits
        self.row_bytes = row_bytes(lm, len(self.ids), self.prefill)
        if self.row_bytes > MEMORY_BUDGET:
            raise ValueError(
                f"kv-eval of {len(self.ids):,} tokens (prefill {self.prefill:,}) needs about "
                f"{self.row_bytes / 2**20:,.0f} MiB a row, more than the "
                f"{MEMORY_BUDGET / 2**20:,.0f} MiB it may take: read fewer tokens or prefill less"
            )
        fit = max(1, MEMORY_BUDGET // self.row_bytes)
        size = min(batch_size or max(len(self.runs), 1), fit)
        self.groups = [self.runs[i : i + size] for i in range(0, len(self.runs), size)]
        self.schedule = _schedule(len(self.ids), self.prefill)
        self.total = len(self.ids) * max(len(self.groups), 1)
        self.done = 0
        self.ref = _Reference(lm, self.ids)
        self._group = 0
        self._forward = 0
        self._batch: _Batch | None = None

    @property
    def finished(self) -> bool:
        return self.ref.done and self._group >= len(self.groups)

    def label(self) -> str:
        """What the next step runs."""
        if not self.ref.done:
            return "full cache (reference)"
        if self.finished:
            return "done"
        group = self.groups[self._group]
        names = ", ".join(dict.fromkeys(r.name for r in group))
        budgets = ", ".join(dict.fromkeys(str(r.budget) for r in group))
        return f"{names} @ {budgets}"

    def step(self) -> None:
        """A chunk of the reference prefill until it is done, then one batched forward."""
        if not self.ref.done:
            self.ref.step()
            if self.ref.done and not self.groups:
                self.done = self.total
            return
        if self.finished:
            return
        group = self.groups[self._group]
        if self._batch is None:
            self._batch = _Batch(self.lm, [r.policy for r in group], len(self.ids))
        start, stop = self.schedule[self._forward]
        step = self._batch.feed(self.ids, start, stop)
        _score(group, step, self.ids, self.ref)
        self.done += stop - start
        self._forward += 1
        if self._forward == len(self.schedule):
            self._group, self._forward, self._batch = self._group + 1, 0, None

    def rows(self) -> list[dict]:
        """The table so far: the reference, then every row that has read tokens (partial
        rows, ``tokens`` fewer than the others', when the run was stopped early)."""
        out = []
        if self.want_full and self.ref.done:
            out.append(self._full_row())
        out += [r.row() for r in self.runs if r.n_fwd]
        return out

    def _full_row(self) -> dict:
        """The reference's row. Its cache holds every token: at the end ``N`` entries per
        layer; over the forwards a policy row makes (prefill, then one token each) it holds
        ``prefill … N``, whose mean is ``mean_cache_len``."""
        n, ref = len(self.ids), self.ref
        return {
            "policy": "full",
            "budget": None,
            "tokens": n - 1,
            "ppl": math.exp(ref.nll / (n - 1)),
            "nll": ref.nll / (n - 1),
            "top1_agree": 1.0,
            "kl": 0.0,
            "peak_cache_bytes": n * kv_bytes_per_token(self.lm.summary()),
            "mean_cache_len": (self.prefill + n) / 2,
            "evicted_mass": 0.0,
            "regret_est": 0.0,
            "tokens_per_s": n / ref.seconds if ref.seconds else float("nan"),
            "seconds": ref.seconds,
        }


def kv_eval(
    lm,
    ids: Sequence[int],
    policies: Sequence[Any] = tuple(POLICIES),
    budgets: Sequence[Value] = (128,),
    *,
    prefill: int = 1,
    policy_kwargs: dict[str, dict] | None = None,
    batch_size: int | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[dict]:
    """Teacher-forced quality of each policy against the full cache, eviction live.

    Parameters
    ----------
    lm : a ``LoadedModel``
    ids : the text's token ids; position ``t``'s logits are scored against ``ids[t+1]``
    policies : names (built for every budget; ``full`` is the reference row) or ready
        policies (run once, as given)
    budgets : token counts or fractions, swept for every named policy except ``full``
    prefill : tokens in the first forward; every later forward feeds one token
    policy_kwargs : extra constructor arguments per policy name
    batch_size : rows per batch (None: every row in one batch; 1: each policy alone)
    on_progress : ``(done, total, label)`` in tokens, after the reference and every forward
    should_stop : polled after every forward; when True, the rows so far are returned, each
        scored on the tokens it has read

    Returns
    -------
    Repeated policies and budgets run once; more than ``MAX_ROWS`` rows, or a row whose
    estimated memory (:func:`row_bytes`) exceeds ``MEMORY_BUDGET``, raise ``ValueError``
    before any forward; rows are batched so that a batch's estimate fits ``MEMORY_BUDGET``.

    One dict per (policy, budget): ``policy``, ``budget``, ``tokens`` (predictions scored),
    ``ppl``, ``nll``, ``top1_agree`` and ``kl`` (mean KL(full ‖ policy), nats) against the
    full cache, ``peak_cache_bytes``, ``mean_cache_len``, ``evicted_mass`` (mean exact share of
    attention on entries evicted after each step), ``regret_est`` (mean estimated regret),
    ``tokens_per_s`` (tokens read per second of the row's share of the time: its policy and
    1/B of each shared forward) and ``seconds``. ``pandas.DataFrame(rows)`` makes the table.
    """
    run = KVEval(
        lm,
        ids,
        policies,
        budgets,
        prefill=prefill,
        policy_kwargs=policy_kwargs,
        batch_size=batch_size,
    )
    while not run.finished:
        label = run.label()
        run.step()
        if on_progress is not None:
            on_progress(run.done, run.total, label)
        if should_stop is not None and should_stop():
            break
    return run.rows()
