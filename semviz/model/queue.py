"""One line for the model: turns at it, first come first served, one at a time (or a few).

Threads that run model forwards at the same time (the app's sessions on one server) each spin
up the CPU's whole thread pool, and on a few cores they slow each other down many times over.
A :class:`ForwardQueue` makes them take turns instead: a turn runs alone with every thread, and
the others wait in line, in the order they came. Anyone can read how long the line is and
where an owner stands in it, so a page can show its place.

A turn is re-entrant within a thread, so code that already holds one can call code that takes
one. Long work (an evaluation over many forwards) keeps its turn but calls
:meth:`Turn.let_others` between forwards: anyone waiting then goes first, and the work joins
the back of the line.

When each forward uses only some of the cores (torch's threads), a few turns can run side by
side, one per ``lanes`` (:func:`lanes_for`): they share the machine without fighting over
threads, and each forward is the same computation as alone, so its results are the same bits.

Nothing here knows about models or Streamlit; :data:`QUEUE` is the process's one line.

Examples
--------
>>> q = ForwardQueue()
>>> with q.turn("alice") as t:
...     q.state().running, q.state().waiting
(True, 0)
>>> q.place("alice") is None  # not waiting
True
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_log = logging.getLogger(__name__)

__all__ = ["QUEUE", "ForwardQueue", "Gather", "Place", "QueueState", "Turn", "lanes_for"]


@dataclass(frozen=True)
class Place:
    """Where one waiting turn stands: ``ahead`` turns go before it (the one running
    included); ``waited`` seconds so far; ``per_turn`` the recent mean length of a turn."""

    ahead: int
    waited: float
    per_turn: float

    @property
    def eta(self) -> float:
        """Seconds until this turn starts, at the recent pace."""
        return self.ahead * self.per_turn


@dataclass(frozen=True)
class QueueState:
    """The line at one moment: a turn running or not, how many wait, how long turns take."""

    running: bool
    waiting: int
    per_turn: float
    served: int


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def lanes_for(threads: int, n_cores: int | None = None) -> int:
    """Turns that fit side by side when each forward uses ``threads`` threads.

    >>> lanes_for(1, 2), lanes_for(2, 2), lanes_for(3, 8), lanes_for(16, 8)
    (2, 1, 2, 1)
    """
    n = cores() if n_cores is None else n_cores
    return max(1, n // max(1, int(threads)))


class _Ticket:
    __slots__ = ("owner", "thread", "since", "depth", "started")

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.thread = threading.get_ident()
        self.since = time.monotonic()
        self.depth = 0  # re-entrant turns of its thread while it holds a lane
        self.started = 0.0


class Turn:
    """The turn being held (what ``with queue.turn(...) as turn`` gives)."""

    def __init__(self, queue: ForwardQueue, ticket: _Ticket, on_wait) -> None:
        self._queue, self._ticket, self._on_wait = queue, ticket, on_wait

    def let_others(self) -> None:
        """If anyone is waiting, let them go first and wait for the next turn; else go on.

        Call it only between two forwards: the work gives the model up until it returns.
        """
        self._queue._let_others(self._ticket, self._on_wait)


class ForwardQueue:
    """Turns at the model in arrival order, ``lanes`` at a time (one by default).

    Parameters
    ----------
    poll : seconds between two ``on_wait`` calls while a turn waits
    lanes : turns that may run at once. One, unless each forward uses only some of the cores
        (torch's threads): then ``cores // threads`` forwards side by side fill the machine
        without fighting over its threads, and each is the same computation as alone.
    """

    def __init__(self, poll: float = 0.25, lanes: int = 1) -> None:
        if not poll > 0:
            raise ValueError(f"poll must be > 0 seconds, got {poll!r}")
        self.poll = float(poll)
        self.lanes = 1
        self._cond = threading.Condition()
        self._line: deque[_Ticket] = deque()
        self._holders: list[_Ticket] = []  # the turns running now, at most ``lanes``
        self._per_turn = 0.0  # running mean of turn lengths, seconds
        self._served = 0
        self.set_lanes(lanes)

    def set_lanes(self, lanes: int) -> None:
        """How many turns may run at once from now on (turns running are not cut short)."""
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes must be a whole number >= 1, got {lanes!r}")
        with self._cond:
            self.lanes = lanes
            self._cond.notify_all()

    # -- reading ---------------------------------------------------------------------------
    def state(self) -> QueueState:
        """How the line stands now."""
        with self._cond:
            return QueueState(bool(self._holders), len(self._line), self._per_turn, self._served)

    def place(self, owner: str) -> Place | None:
        """Where ``owner``'s first waiting turn stands; None when it has none waiting."""
        with self._cond:
            for i, t in enumerate(self._line):
                if t.owner == owner:
                    return self._place(t, i)
        return None

    def _place(self, ticket: _Ticket, index: int) -> Place:
        # the turns that must end before this one starts: those ahead of it in line, and one
        # running turn for each lane they leave it short of
        ahead = index + max(0, len(self._holders) - self.lanes + 1)
        return Place(ahead, time.monotonic() - ticket.since, self._per_turn / self.lanes)

    def _held(self) -> _Ticket | None:
        """The turn this thread holds, if any (call with the lock held)."""
        me = threading.get_ident()
        return next((t for t in self._holders if t.thread == me), None)

    def _free(self, ticket: _Ticket) -> bool:
        """May ``ticket`` take a lane now (call with the lock held)?"""
        return len(self._holders) < self.lanes and self._line[0] is ticket

    # -- taking turns ----------------------------------------------------------------------
    @contextlib.contextmanager
    def turn(
        self, owner: str = "", *, on_wait: Callable[[Place], None] | None = None
    ) -> Iterator[Turn]:
        """Wait for a turn in line, hold it for the block, then hand it on.

        ``on_wait(place)`` is called every ``poll`` seconds while waiting, outside the lock;
        an exception it raises leaves the line (the turn is not taken) and propagates. A
        thread that already holds the turn goes on at once.
        """
        with self._cond:
            holder = self._held()
            if holder is not None:
                holder.depth += 1
        if holder is not None:
            try:
                yield Turn(self, holder, on_wait)
            finally:
                with self._cond:
                    holder.depth -= 1
            return
        ticket = _Ticket(owner)
        self._wait(ticket, on_wait)
        try:
            yield Turn(self, ticket, on_wait)
        finally:
            self._release(ticket)

    def _wait(self, ticket: _Ticket, on_wait) -> None:
        """Join the back of the line and return holding the turn."""
        with self._cond:
            ticket.since = time.monotonic()
            self._line.append(ticket)
        try:
            while True:
                with self._cond:
                    if self._free(ticket):
                        self._line.popleft()
                        self._holders.append(ticket)
                        ticket.depth, ticket.started = 0, time.monotonic()
                        return
                    self._cond.wait(self.poll)
                    if self._free(ticket):
                        continue  # our turn: take it without a callback
                    place = self._place(ticket, self._line.index(ticket))
                if on_wait is not None:
                    on_wait(place)
        except BaseException:
            with self._cond:
                if ticket in self._line:
                    self._line.remove(ticket)
                self._cond.notify_all()
            raise

    def _release(self, ticket: _Ticket) -> None:
        with self._cond:
            if ticket not in self._holders:
                return
            took = time.monotonic() - ticket.started
            self._served += 1
            # a short memory: the pace of the last turns, for the wait estimate
            self._per_turn = took if self._served == 1 else 0.8 * self._per_turn + 0.2 * took
            self._holders.remove(ticket)
            self._cond.notify_all()

    def _let_others(self, ticket: _Ticket, on_wait) -> None:
        with self._cond:
            if ticket not in self._holders or not self._line or ticket.depth:
                return  # nobody waits, or an outer block of this thread still holds the turn
        self._release(ticket)
        self._wait(ticket, on_wait)


class _Entry:
    __slots__ = ("item", "state")

    def __init__(self, item) -> None:
        self.item = item
        self.state = "waiting"  # then "running", then "done"


class Gather:
    """Work items from many threads run together, as one batch in one turn at the queue.

    A thread hands in its item with :meth:`submit` and waits. The first thread to find no
    batch being gathered leads: it takes a turn at the queue, and once it holds the turn runs
    ``run(items)`` on every item handed in up to then, its own included; the threads that
    handed those in wake up and go on. Items that arrive while a batch runs make the next
    one. This is how the sessions of one server share model forwards: while one forward
    runs, the next sessions' tokens gather, and go as rows of one batch.

    ``run`` must leave every item in a state its owner can go on from whether or not it
    raises. An ``Exception`` from it is logged, not raised: each owner goes on and does
    alone what the batch did not do for it, where its own error, if any, is its own.

    Examples
    --------
    >>> seen = []
    >>> g = Gather(ForwardQueue(), seen.append)
    >>> g.submit("a"); seen, g.batches, g.rows
    ([['a']], 1, 1)
    """

    def __init__(self, queue: ForwardQueue, run: Callable[[list], object]) -> None:
        self.queue, self.run = queue, run
        self._cond = threading.Condition()
        self._waiting: list[_Entry] = []
        self._leading = False
        self.batches = 0  # batches run so far
        self.rows = 0  # items they held

    def submit(self, item, owner: str = "", *, on_wait=None) -> None:
        """Run ``item`` in the next batch; return once that batch has run.

        ``on_wait`` is the queue's (called while the leader waits for its turn). An
        exception while waiting withdraws the item unless its batch already runs, in which
        case the batch is waited for first, so the item is never touched after this returns.
        """
        entry = _Entry(item)
        with self._cond:
            self._waiting.append(entry)
        try:
            while True:
                with self._cond:
                    if entry.state == "done":
                        return
                    lead = not self._leading
                    if lead:
                        self._leading = True
                    else:
                        self._cond.wait(self.queue.poll)
                        continue
                try:
                    self._lead(owner, on_wait)
                finally:
                    with self._cond:
                        self._leading = False
                        self._cond.notify_all()
        except BaseException:
            with self._cond:
                if entry.state == "waiting":
                    self._waiting.remove(entry)
                while entry.state == "running":
                    self._cond.wait(self.queue.poll)
            raise

    def _lead(self, owner: str, on_wait) -> None:
        with self.queue.turn(owner, on_wait=on_wait):
            with self._cond:
                batch, self._waiting = self._waiting, []
                for e in batch:
                    e.state = "running"
            try:
                self.run([e.item for e in batch])
            except Exception:
                _log.exception("a gathered batch of %d failed; its owners go on alone", len(batch))
            finally:
                with self._cond:
                    for e in batch:
                        e.state = "done"
                    self.batches += 1
                    self.rows += len(batch)
                    self._cond.notify_all()


QUEUE = ForwardQueue()
