"""The model queue: one turn at a time, in arrival order, places readable, nobody stuck."""

from __future__ import annotations

import threading
import time

import pytest

from semviz.model.queue import ForwardQueue, Place, lanes_for


def wait_until(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.002)


class Holder:
    """A thread that holds the turn until released."""

    def __init__(self, q: ForwardQueue, owner: str = "holder") -> None:
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(q, owner))
        self.thread.start()
        wait_until(lambda: q.state().running)

    def _run(self, q: ForwardQueue, owner: str) -> None:
        with q.turn(owner):
            self.release.wait(10)

    def done(self) -> None:
        self.release.set()
        self.thread.join(10)


def test_turns_go_in_arrival_order_and_places_count_down():
    q = ForwardQueue(poll=0.01)
    holder = Holder(q)
    order: list[str] = []
    places: dict[str, list[int]] = {n: [] for n in "abc"}
    threads = []
    for i, name in enumerate("abc"):

        def work(name=name):
            with q.turn(name, on_wait=lambda p, name=name: places[name].append(p.ahead)):
                order.append(name)

        t = threading.Thread(target=work)
        t.start()
        threads.append(t)
        wait_until(lambda i=i: q.state().waiting == i + 1)
    assert [q.place(n).ahead for n in "abc"] == [1, 2, 3]  # the holder runs ahead of all
    assert q.place("holder") is None and q.place("nobody") is None
    wait_until(lambda: all(places[n] for n in "abc"))
    holder.done()
    for t in threads:
        t.join(10)
    assert order == ["a", "b", "c"]
    state = q.state()
    assert (state.running, state.waiting, state.served) == (False, 0, 4)
    for n, seen in places.items():
        assert seen == sorted(seen, reverse=True), n  # never moves back in line


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_only_lanes_turns_run_at_a_time(lanes):
    q = ForwardQueue(poll=0.01, lanes=lanes)
    inside, most = [0], [0]
    lock = threading.Lock()

    def work():
        for _ in range(20):
            with q.turn("w"):
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.002)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == lanes  # never more, and the lanes are used
    assert q.state().served == 120 and q.state().waiting == 0 and not q.state().running


def test_a_waiter_that_gives_up_leaves_the_line():
    q = ForwardQueue(poll=0.01)
    holder = Holder(q)

    def impatient(place: Place) -> None:
        raise KeyboardInterrupt("the page was left")

    with pytest.raises(KeyboardInterrupt):
        with q.turn("leaver", on_wait=impatient):
            pytest.fail("a waiter that gave up must not get the turn")
    assert q.state().waiting == 0 and q.place("leaver") is None
    holder.done()
    with q.turn("next"):  # the line still moves
        assert q.state().running


def test_a_thread_holding_the_turn_can_take_it_again():
    q = ForwardQueue(poll=0.01)
    with q.turn("a"):
        with q.turn("a"):
            assert q.state().running
        assert q.state().running  # the inner block did not hand the turn on
    assert not q.state().running and q.state().served == 1


def test_let_others_lets_each_waiter_go_once_then_continues():
    q = ForwardQueue(poll=0.01)
    log: list[str] = []
    started = threading.Event()

    def long_job():
        with q.turn("long") as turn:
            started.set()
            for i in range(3):
                log.append(f"long{i}")
                if i == 0:
                    wait_until(lambda: q.state().waiting == 1)
                turn.let_others()

    def short():
        with q.turn("short"):
            log.append("short")

    t_long = threading.Thread(target=long_job)
    t_long.start()
    started.wait(5)
    t_short = threading.Thread(target=short)
    t_short.start()
    t_long.join(10)
    t_short.join(10)
    assert log == ["long0", "short", "long1", "long2"]


def test_let_others_with_nobody_waiting_keeps_the_turn():
    q = ForwardQueue()
    with q.turn("a") as turn:
        turn.let_others()
        assert q.state().served == 0 and q.state().running


def test_poll_is_validated():
    with pytest.raises(ValueError, match="poll"):
        ForwardQueue(poll=0)


def test_with_two_lanes_places_count_the_lane_that_frees_first():
    q = ForwardQueue(poll=0.01, lanes=2)
    first = Holder(q, "first")
    with q.turn("second"):  # a lane is free: no wait
        assert q.state().waiting == 0

        def third() -> None:
            with q.turn("third"):
                pass

        t = threading.Thread(target=third)
        t.start()
        wait_until(lambda: q.state().waiting == 1)
        assert q.place("third").ahead == 1  # whichever of the two running ends first
        first.done()
        t.join(10)
        assert not t.is_alive()  # it ran beside "second", which still holds its lane
    assert q.state().served == 3


def test_each_lanes_thread_can_take_its_turn_again():
    q = ForwardQueue(poll=0.01, lanes=2)
    both = threading.Barrier(2)
    seen: list[bool] = []

    def work(name: str) -> None:
        with q.turn(name):
            both.wait(5)  # both hold a lane
            with q.turn(name):  # nested: goes on at once, takes no third lane
                seen.append(q.state().waiting == 0)
            both.wait(5)

    threads = [threading.Thread(target=work, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [True, True] and q.state().served == 2


def test_lanes_are_validated_and_fit_the_cores():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="lanes must be a whole number >= 1"):
            ForwardQueue(lanes=bad)
    assert lanes_for(1, 16) == 16 and lanes_for(4, 16) == 4 and lanes_for(5, 16) == 3
    assert lanes_for(32, 16) == 1 and lanes_for(0, 4) == 4
