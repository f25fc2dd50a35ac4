"""Long work, one way for every kind: a task advances for a time budget and reports progress.

A :class:`Task` is plain Python, with no thread of its own. Whoever runs it (a thread of
``ui.work`` in the app, a test, a script) calls :meth:`Task.advance` with a budget in seconds
and a :class:`Turns`, and reads :meth:`Task.progress` and :meth:`Task.result` between two calls.
After each unit the task keeps a copy of its result in :attr:`Task.latest`: another thread
(a page drawing while the task runs) reads that, never the work in progress.
``advance`` always does at least one unit of work (a token, a batched forward, a chunk), and
every model call inside it waits for its turn in the model's line (``semviz.model.queue``)
through ``turns``. :meth:`Task.stop` may be called from any thread: the task ends after the
unit in progress, or leaves the line if it is waiting there, and keeps everything it made.

A new kind of long work is a subclass with one method, :meth:`Task.unit` (one unit of work;
True while more remains), and a ``progress`` that says how far it is::

    class Count(Task):
        label = "Counting"

        def __init__(self, n):
            super().__init__()
            self.n, self.done = n, 0

        def unit(self, turns):
            with turns.turn():  # a model call would go here
                self.done += 1
            return self.done < self.n

        def progress(self):
            return Progress(self.done, self.n, "counting")

The tasks of semviz: :class:`DecodeTask` (a run: step, run N, play, branch, regenerate,
reproduce a link, continue a recording, the what-if ghost), :class:`CompareTask`,
:class:`KVEvalTask`, :class:`FrontierTask`, :class:`ReportTask`, :class:`PrefillScanTask` and
:class:`GravityTask`.

A run's :class:`Recipe` (its base settings, the settings in effect from each step on, and the
tokens chosen by hand) is what a :class:`DecodeTask` follows to reproduce a run and records
while it decodes, so a link can carry a branch and a run made under changing sliders.

Examples
--------
>>> class Count(Task):
...     def __init__(self, n):
...         super().__init__()
...         self.n, self.done = n, 0
...     def unit(self, turns):
...         with turns.turn():
...             self.done += 1
...         return self.done < self.n
...     def progress(self):
...         return Progress(self.done, self.n, "counting")
>>> t = Count(3)
>>> t.advance(0.0, Turns("doc")), t.progress().done  # at least one unit per call
(False, 1)
>>> t.advance(60.0, Turns("doc")), t.progress().done
(True, 3)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semviz.model.queue import QUEUE, ForwardQueue, Place
from semviz.sampling import PruneParams, parse_field

__all__ = [
    "Bundle",
    "CompareTask",
    "DecodeTask",
    "Edit",
    "FrontierTask",
    "GravityTask",
    "KVEvalTask",
    "PrefillScanTask",
    "Progress",
    "Recipe",
    "ReportTask",
    "Stopped",
    "Task",
    "Turns",
]


class Stopped(Exception):
    """Raised inside a task's unit when a stop request ends it while it waits in line."""


@dataclass(frozen=True)
class Progress:
    """How far a task is: ``done`` of ``total`` ``unit`` (total None: open-ended), and the
    phase in words. ``seconds`` is the time spent so far, for the estimate."""

    done: int = 0
    total: int | None = None
    phase: str = ""
    unit: str = "tokens"
    seconds: float = 0.0

    @property
    def fraction(self) -> float:
        """0 … 1 (0 while open-ended)."""
        return min(1.0, self.done / self.total) if self.total else 0.0

    def eta(self) -> float | None:
        """Seconds left at the pace so far; None before the first unit or when open-ended."""
        if self.total is None or self.done <= 0:
            return None
        return max(0, self.total - self.done) * self.seconds / self.done


class Turns:
    """One owner's place in the model's line: every model call a task makes goes through it.

    Parameters
    ----------
    owner : who waits (the app's session id), shown to nobody but used to find its place
    queue : the line (default the process's one, ``semviz.model.queue.QUEUE``)
    should_stop : polled while waiting; True leaves the line with :class:`Stopped`
    on_wait : told each :class:`Place` while waiting, and None once the turn is held
    """

    def __init__(
        self,
        owner: str = "",
        queue: ForwardQueue = QUEUE,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_wait: Callable[[Place | None], None] | None = None,
    ) -> None:
        self.owner, self.queue = owner, queue
        self.should_stop, self.on_wait = should_stop, on_wait

    def _waiting(self, place: Place) -> None:
        if self.should_stop is not None and self.should_stop():
            raise Stopped
        if self.on_wait is not None:
            self.on_wait(place)

    @contextlib.contextmanager
    def turn(self) -> Iterator[Any]:
        """Hold the model for the block (after waiting in line); yields the queue's turn,
        whose ``let_others()`` lets anyone waiting go first between two forwards."""
        with self.queue.turn(self.owner, on_wait=self._waiting) as t:
            if self.on_wait is not None:
                self.on_wait(None)
            yield t

    def step(self, dec: Any, force_token: int | None = None) -> Any:
        """``dec.step(force_token)`` with a turn when it runs the model (not when the token's
        logits are ready, as after the prefill)."""
        if dec.fed or dec.done:
            return dec.step(force_token=force_token)
        with self.turn():
            return dec.step(force_token=force_token)


class Task:
    """Long work that advances in slices (see the module docstring).

    Attributes
    ----------
    label : what the work is, for a progress line ("Run 32")
    stopped : a stop request ended it before it was done
    seconds : time spent in :meth:`advance` so far
    latest : :meth:`result` as it was after the last unit, made by the thread that ran it
    """

    label: str = "Working"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.stopped = False
        self.finished = False
        self.seconds = 0.0
        self.latest: Any = None

    def stop(self) -> None:
        """Ask the task to end after the unit in progress; safe from any thread."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def advance(self, seconds: float, turns: Turns) -> bool:
        """Work for about ``seconds`` (at least one unit); True once finished or stopped."""
        t0 = time.perf_counter()
        try:
            while not self.finished:
                if self._stop.is_set():
                    self.stopped = self.finished = True
                    break
                try:
                    more = self.unit(turns)
                except Stopped:
                    self.stopped = self.finished = True
                    break
                finally:
                    self.latest = self.result()
                if not more:
                    self.finished = True
                    break
                if time.perf_counter() - t0 >= seconds:
                    break
        finally:
            self.seconds += time.perf_counter() - t0
        return self.finished

    def unit(self, turns: Turns) -> bool:
        """One unit of work; True while more remains."""
        raise NotImplementedError

    def progress(self) -> Progress:
        return Progress(phase=self.label, seconds=self.seconds)

    def result(self) -> Any:
        """What the task has made so far, as a value the caller may keep (it is not changed
        by later units)."""
        return None


# -- a run's recipe ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Edit:
    """A change at step ``at``: the settings in effect from there on, and/or a token taken
    by hand there (a branch)."""

    at: int
    params: PruneParams | None = None
    token: int | None = None


@dataclass(frozen=True)
class Recipe:
    """How a run is made: the settings of its first step (``base``) and its edits, by step.

    Together with the prompt, model and seed it determines every token, so following it
    reproduces the run exactly, a branch and a change of sliders between two steps included.
    """

    base: PruneParams = field(default_factory=PruneParams)
    edits: tuple[Edit, ...] = ()

    def params_at(self, n: int) -> PruneParams:
        """The settings step ``n`` decodes with."""
        p = self.base
        for e in self.edits:
            if e.at > n:
                break
            if e.params is not None:
                p = e.params
        return p

    def token_at(self, n: int) -> int | None:
        """The token taken by hand at step ``n`` (None: sampled)."""
        return next((e.token for e in self.edits if e.at == n and e.token is not None), None)

    def cut(self, k: int) -> Recipe:
        """The recipe of the first ``k`` steps."""
        return dataclasses.replace(self, edits=tuple(e for e in self.edits if e.at < k))

    def edit(
        self, at: int, *, params: PruneParams | None = None, token: int | None = None
    ) -> Recipe:
        """This recipe cut at ``at`` with one more edit there (a settings change that changes
        nothing is left out)."""
        out = self.cut(at)
        if params is not None and params == out.params_at(at):
            params = None
        if params is None and token is None:
            return out
        return dataclasses.replace(out, edits=(*out.edits, Edit(at, params, token)))

    # -- as text (a link's ``rec`` and ``edits``) ---------------------------------------------
    def to_text(self, view: PruneParams) -> tuple[str, str]:
        """``(base, edits)`` as text: ``base`` the fields where ``base`` differs from ``view``
        (the settings a link shows), ``edits`` one ``step@changes`` per edit, ``;``-separated,
        where changes are ``tN`` (the token taken) and ``field:value`` (the fields that
        change there).

        >>> r = Recipe(PruneParams(temperature=0.8)).edit(3, token=7)
        >>> r.edit(5, params=PruneParams(temperature=0.8, top_p=0.5)).to_text(PruneParams())
        ('temperature:0.8', '3@t7;5@top_p:0.5')
        """
        parts = []
        prev = self.base
        for e in self.edits:
            bits = [] if e.token is None else [f"t{e.token}"]
            if e.params is not None:
                bits.append(_diff(prev, e.params))
                prev = e.params
            parts.append(f"{e.at}@{','.join(b for b in bits if b)}")
        return _diff(view, self.base), ";".join(parts)

    @classmethod
    def from_text(cls, view: PruneParams, base: str = "", edits: str = "") -> Recipe:
        """The inverse of :meth:`to_text`; ``ValueError`` naming the part it cannot read."""
        p = _apply(view, base)
        out = cls(p)
        last = -1
        for part in (s.strip() for s in edits.split(";")):
            if not part:
                continue
            at_text, sep, rest = part.partition("@")
            if not sep or not at_text.strip().isdigit():
                raise ValueError(f"{part!r}: expected step@changes")
            at = int(at_text)
            if at <= last:
                raise ValueError(f"{part!r}: edits must come in order of their steps")
            token, fields = None, []
            for bit in (b.strip() for b in rest.split(",")):
                if bit[:1] == "t" and bit[1:].isdigit():
                    token = int(bit[1:])
                elif bit:
                    fields.append(bit)
            params = _apply(out.params_at(at), ",".join(fields)) if fields else None
            out = dataclasses.replace(out, edits=(*out.edits, Edit(at, params, token)))
            last = at
        return out


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, tuple):
        return "/".join(map(str, v))
    return "none" if v is None else str(v)


def _diff(a: PruneParams, b: PruneParams) -> str:
    """``b``'s fields that differ from ``a``'s, as ``field:value,…``."""
    da, db = a.to_dict(), b.to_dict()
    names = [f.name for f in dataclasses.fields(PruneParams)]
    return ",".join(
        f"{k}:{_value_text(getattr(b, k))}" for k in names if k in db and db[k] != da.get(k)
    )


def _apply(p: PruneParams, text: str) -> PruneParams:
    """``p`` with the ``field:value,…`` changes of ``text``; ``ValueError`` naming the field."""
    changes = {}
    for bit in (b.strip() for b in text.split(",")):
        if not bit:
            continue
        name, sep, raw = bit.partition(":")
        if not sep:
            raise ValueError(f"{bit!r}: expected field:value")
        changes[name.strip()], _ = parse_field(name.strip(), raw.strip())
    return p.replace(**changes) if changes else p


# -- decoding ---------------------------------------------------------------------------------


class DecodeTask(Task):
    """Decode on a run: build it first if asked, re-feed recorded tokens, then sample.

    Parameters
    ----------
    decoder : the ``Decoder`` to step, or None with ``build``
    recipe : what the run follows: each step takes the settings and the hand-picked token
        the recipe has for it
    build : makes the decoder (its prefill is the task's first unit)
    refeed : recorded tokens to take first, with the recipe's settings (a recording shown
        without a model, a cache policy's state rebuilt); they are not edits
    sample : tokens to decode after them (None: until stopped or the run ends); more can be
        asked for while it runs (:meth:`extend`)
    params : the settings new tokens are decoded with (the sliders; another thread may set
        it while the task runs), hand-picked ones included; where they differ from the
        recipe's, the recipe gains an edit. None follows the recipe (reproducing a link).
    label : for the progress line

    Its result is a copy of the run's ``Trace`` (None before the prefill), which later tokens
    do not change.
    """

    def __init__(
        self,
        decoder: Any = None,
        recipe: Recipe | None = None,
        *,
        build: Callable[[], Any] | None = None,
        refeed: Sequence[int] = (),
        sample: int | None = 0,
        params: PruneParams | None = None,
        label: str = "Decoding",
    ) -> None:
        super().__init__()
        if decoder is None and build is None:
            raise ValueError("a DecodeTask needs a decoder or a way to build one")
        self.decoder, self.build = decoder, build
        if recipe is None:  # a new run follows the settings it starts with
            recipe = Recipe(getattr(decoder, "params", None) or params or PruneParams())
        self.recipe = recipe
        self.refeed = list(refeed)
        self._refed = len(self.refeed)  # re-fed tokens in all, for the progress
        self.sample, self.params, self.label = sample, params, label
        self.made = 0  # tokens this task has decoded (re-fed ones included)
        self.sampled = 0
        self._more_lock = threading.Lock()  # extend() against the last token's decision
        self._closed = False  # no more tokens will be asked for
        self.latest = self.result()

    def extend(self, n: int) -> bool:
        """Decode ``n`` more tokens (Step clicks queued while the first one's prefill runs);
        False once the task has taken its last token, when they must be a task of their own."""
        with self._more_lock:
            if self._closed or self.sample is None:
                return False
            self.sample += int(n)
            return True

    @property
    def total(self) -> int | None:
        return None if self.sample is None else self._refed + self.sample

    def unit(self, turns: Turns) -> bool:
        if self.decoder is None:
            with turns.turn():
                self.decoder = self.build()
            return self._more()
        if not self._more():  # asked for nothing more (a branch whose tokens are all made)
            return False
        dec = self.decoder
        n = dec.n_steps
        if self.refeed:
            dec.params = self.recipe.params_at(n)
            if turns.step(dec, self.refeed[0]) is None:
                return False
            self.refeed.pop(0)
        else:
            token = self.recipe.token_at(n)
            p = self.recipe.params_at(n) if self.params is None else self.params
            if p != self.recipe.params_at(n):
                self.recipe = self.recipe.edit(n, params=p, token=token)
            dec.params = p
            if turns.step(dec, token) is None:
                return False
            self.sampled += 1
        self.made += 1
        return self._more()

    def _more(self) -> bool:
        with self._more_lock:
            more = not self.decoder.done and (
                bool(self.refeed) or self.sample is None or self.sampled < self.sample
            )
            self._closed = not more
            return more

    def progress(self) -> Progress:
        if self.decoder is None:
            phase = "prefill"
        elif self.refeed:
            phase = "re-feeding the recorded tokens"
        else:
            phase = "decoding"
        return Progress(self.made, self.total, phase, seconds=self.seconds)

    def result(self) -> Any:
        dec = self.decoder
        if dec is None:
            return None
        tr = copy.copy(dec.trace)
        tr.steps, tr.settings, tr.extra = list(tr.steps), dict(tr.settings), dict(tr.extra)
        return tr


# -- the pages' long work ---------------------------------------------------------------------


class CompareTask(Task):
    """Two or more settings on one prompt and seed (``semviz.analysis.compare``), every side a
    row of one forward a token; the result is the comparison so far."""

    label = "Compare"

    def __init__(
        self,
        lm,
        prompt: str,
        sides: Sequence,
        *,
        steps: int,
        seed: int = 0,
        chat: bool | None = None,
    ) -> None:
        super().__init__()
        self.lm, self.prompt, self.sides = lm, prompt, list(sides)
        self.steps, self.seed, self.chat = int(steps), int(seed), chat
        self.cmp = None

    def unit(self, turns: Turns) -> bool:
        from semviz.analysis import compare

        with turns.turn():
            if self.cmp is None:
                self.cmp = compare.start(
                    self.lm,
                    self.prompt,
                    self.sides,
                    steps=self.steps,
                    seed=self.seed,
                    chat=self.chat,
                )
            else:
                compare.advance(self.cmp, seconds=0.0)  # one token a side
        if self.cmp.finished:
            self.cmp.release()
            return False
        return True

    def advance(self, seconds: float, turns: Turns) -> bool:
        done = super().advance(seconds, turns)
        if self.stopped and self.cmp is not None:
            self.cmp.stopped = not self.cmp.finished
            self.cmp.release()  # the caches go; the traces stay
            self.latest = self.result()
        return done

    def progress(self) -> Progress:
        if self.cmp is None:
            return Progress(0, self.steps, "reading the prompt", seconds=self.seconds)
        made = [len(t.steps) for t in self.cmp.traces]
        # a side the model ended early (EOS) is finished, not behind
        done = sum(
            self.steps if t.stop_reason not in (None, "max_new_tokens") else n
            for t, n in zip(self.cmp.traces, made, strict=True)
        )
        total = self.steps * len(made)
        return Progress(done, total, "decoding both sides", seconds=self.seconds)

    def result(self) -> Any:
        """The comparison so far: a copy whose traces are not changed by later tokens."""
        if self.cmp is None:
            return None
        c = self.cmp
        traces = [dataclasses.replace(t, steps=list(t.steps)) for t in c.traces]
        return dataclasses.replace(c, traces=traces, decoders=[], extra=dict(c.extra))


class KVEvalTask(Task):
    """kv-eval (``semviz.eviction.KVEval``): one batched forward a unit; the result is the
    table so far (a stopped run's rows score the tokens read)."""

    label = "kv-eval"

    def __init__(self, run) -> None:
        super().__init__()
        self.run = run
        self.token_seconds = 0.0  # the per-token forwards' time: the estimate's pace

    def unit(self, turns: Turns) -> bool:
        with turns.turn():
            reference = not self.run.ref.done
            t0 = time.perf_counter()
            self.run.step()
            if not reference:  # the reference's one prefill is not a token's pace
                self.token_seconds += time.perf_counter() - t0
        return not self.run.finished

    def progress(self) -> Progress:
        return Progress(self.run.done, self.run.total, self.run.label(), seconds=self.token_seconds)

    def result(self) -> list[dict]:
        return self.run.rows()


class GravityTask(Task):
    """Gravity recomputed with the model for a recorded run whose record holds another, or
    none (``semviz.analysis.replay.gravity_slice``): a few steps a unit, each slice going on
    from the last one's carry. The result is the ``G`` of the steps done so far, one (K,)
    tensor a step, which a finished task hands to the replay's ``GravityCache``."""

    label = "Gravity"

    def __init__(self, model, trace, params: PruneParams, hidden=None, *, chunk: int = 4) -> None:
        super().__init__()
        self.model, self.trace, self.params, self.hidden = model, trace, params, hidden
        self.chunk, self.total = max(1, int(chunk)), len(trace.steps)
        self.gravities: list = []
        self._ema = None

    def unit(self, turns: Turns) -> bool:
        from semviz.analysis.replay import gravity_slice

        start = len(self.gravities)
        with turns.turn():
            outs = gravity_slice(
                self.model,
                self.trace,
                self.params,
                self.hidden,
                start,
                min(start + self.chunk, self.total),
                upto=self.total,
                ema=self._ema,
            )
        self.gravities += [o.gravity for o in outs]
        self._ema = outs[-1].ema if outs else None
        return len(self.gravities) < self.total

    def progress(self) -> Progress:
        return Progress(
            len(self.gravities),
            self.total,
            f"recomputing {self.params.gravity_kind} gravity with the model, since the "
            "recorded steps were decoded with other gravity settings",
            unit="steps",
            seconds=self.seconds,
        )

    def result(self) -> list:
        return list(self.gravities)


class PrefillScanTask(Task):
    """Prefill time against prompt length (``semviz.model.forward.prefill_scan``), one length
    a unit; the result is ``(lengths, seconds)`` so far."""

    label = "Measuring prefill times"

    def __init__(self, lm, lengths: Sequence[int], repeats: int = 2) -> None:
        super().__init__()
        self.lm, self.todo, self.repeats = lm, list(lengths), repeats
        self.total = len(self.todo)
        self.n: list[int] = []
        self.s: list[float] = []

    def unit(self, turns: Turns) -> bool:
        from semviz.model.forward import prefill_scan

        with turns.turn():
            n, s = prefill_scan(self.lm, [self.todo[0]], repeats=self.repeats)
        self.todo.pop(0)
        self.n += n
        self.s += s
        return bool(self.todo)

    def progress(self) -> Progress:
        return Progress(len(self.n), self.total, "measuring", unit="lengths", seconds=self.seconds)

    def result(self) -> tuple[list[int], list[float]]:
        return list(self.n), list(self.s)


class FrontierTask(Task):
    """A frontier sweep (``semviz.frontier.sweep.run_sweep``): one unit runs the whole sweep,
    polling the stop request between two generated positions. In this process it runs in a
    turn at the model, letting others go first there; with ``workers`` its batches go to that
    many Ray workers of a local Ray started for it, each loading ``model`` once, and this
    process's model is not used. The result is the :class:`~semviz.frontier.sweep.SweepResult`;
    the finished batches stay in the file."""

    label = "Sweep"

    def __init__(
        self, lm, cfg, out: str | Path, *, judge=None, workers: int = 0, model: str | None = None
    ) -> None:
        super().__init__()
        self.lm, self.cfg, self.out, self.judge = lm, cfg, out, judge
        self.workers, self.model = int(workers), model
        self._progress = None
        self._result = None
        self._t0: float | None = None

    def unit(self, turns: Turns) -> bool:
        from semviz.frontier.sweep import run_sweep, sweep_task

        self._t0 = time.perf_counter()
        stop = lambda: self.stopping  # noqa: E731
        if self.workers:
            from semviz.analysis.judge import load_judge
            from semviz.frontier.executor import Executor, ModelSpec

            judge = self.judge if self.judge is not None else load_judge()
            spec = ModelSpec(self.model or None, threads=1)
            task = sweep_task(self.cfg, score=True, judge=judge)
            with Executor(task, model=spec, workers=self.workers) as ex:
                self._result = run_sweep(
                    None, self.cfg, self.out, executor=ex, on_progress=self._tick, should_stop=stop
                )
        else:
            with turns.turn() as turn:

                def tick(p) -> None:
                    self._tick(p)
                    turn.let_others()

                self._result = run_sweep(
                    self.lm,
                    self.cfg,
                    self.out,
                    judge=self.judge,
                    on_progress=tick,
                    should_stop=stop,
                )
        if self._result.stopped:
            self.stopped = True
        return False

    def _tick(self, p) -> None:
        self._progress = p

    def progress(self) -> Progress:
        p = self._progress
        spent = (
            self.seconds if self._t0 is None or self.finished else (time.perf_counter() - self._t0)
        )
        if p is None:
            return Progress(0, None, "loading the judge", unit="rows", seconds=spent)
        return Progress(
            int(round(p.fraction * p.rows_total)), p.rows_total, p.point, unit="rows", seconds=spent
        )

    def result(self) -> Any:
        return self._result


@dataclass(frozen=True)
class Bundle:
    """A report built in a folder that is gone: the zip of every file it held, how many PNGs
    it made, and whether it is complete (not stopped, not failed)."""

    zip: bytes
    pngs: int
    complete: bool


class ReportTask(Task):
    """A report bundle (``semviz.output.report.build``): one unit builds it, polling the stop
    request between two PNGs; it runs no model.

    With ``out``, the bundle is written there and stays; the result is the ``Report`` (None
    until built). With ``out=None`` it is built in a temporary folder that goes when the unit
    ends, even when it is stopped or fails; the result is a :class:`Bundle` of what was made.
    """

    label = "Report build"

    def __init__(self, trace, out: str | Path | None = None, **kw: Any) -> None:
        super().__init__()
        self.trace, self.out, self.kw = trace, None if out is None else Path(out), kw
        self._say = ("starting", 0.0)
        self._made: Any = None

    def unit(self, turns: Turns) -> bool:
        if self.out is not None:
            self._made = self._build(self.out)
            return False
        import tempfile

        from semviz.output import report

        with tempfile.TemporaryDirectory(prefix="semviz-report-") as tmp:
            rep = None
            try:
                rep = self._build(Path(tmp))
            finally:  # what was made is kept when the build stops or fails
                self._made = Bundle(
                    report.zip_bytes(tmp),
                    len(list(Path(tmp).glob("png/*.png"))),
                    complete=rep is not None and not rep.stopped,
                )
        return False

    def _build(self, out: Path) -> Any:
        from semviz.output import report

        def say(msg: str, frac: float) -> None:
            self._say = (msg, frac)

        rep = report.build(
            self.trace, out, progress=say, should_stop=lambda: self.stopping, **self.kw
        )
        self.stopped = self.stopping
        return rep

    def progress(self) -> Progress:
        msg, frac = self._say
        return Progress(int(round(100 * frac)), 100, msg, unit="%", seconds=self.seconds)

    def result(self) -> Any:
        return self._made
