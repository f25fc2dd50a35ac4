"""AppTest fixtures: the app on the tiny random Llama (``SEMVIZ_MODEL``), with a short run."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 120
GENERATE = "app_pages/generate.py"


@pytest.fixture()
def app(tiny_dir, monkeypatch):
    """A fresh session of the app on the tiny model (no steps yet)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    at.switch_page(GENERATE).run()  # the app opens on Home
    assert not at.exception
    return at


def run_steps(at, n: int):
    """On Generate, press Run n and let the job finish (each at.run() is one tick)."""
    at.switch_page(GENERATE).run()
    at.session_state["s_run_n"] = n
    at.run()
    at.button(key="btn_run").click().run()
    return settle(at)


def settle(at, timeout: float = 60.0):
    """Run the page until the run's task has ended and the page has kept its end (the task
    decodes in its own thread, between the page's runs), then once more."""
    return run_until(at, lambda: at.session_state["semviz"].job is None, timeout)


def run_until(at, cond, timeout: float = 60.0):
    """Run the page until ``cond()`` (a task working in its own thread), then once more.

    Between two runs it waits for ``cond()`` or for the session's tasks to end, at most
    ``EVERY`` seconds: a page run while a task works only takes the CPU from it, and one run
    a second keeps the task from pausing as if its tab had closed."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        _wait_for_work(at, cond, min(EVERY, max(0.0, t0 + timeout - time.monotonic())))
        at.run()
    at.run()
    return at


EVERY = 1.0  # seconds between two page runs while a task works (``ui.work.ORPHAN_SECONDS`` is 5)


def _wait_for_work(at, cond, seconds: float) -> None:
    """Wait until ``cond()``, or until none of the session's tasks is still working, or
    ``seconds`` have passed."""
    sess = at.session_state["semviz"] if "semviz" in at.session_state else None
    slots = list(getattr(sess, "tasks", {}).values())
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond() or not any(s.task is not None and not s.task.finished for s in slots):
            return
        time.sleep(0.01)


def wait_until(cond, timeout: float = 30.0) -> None:
    """Wait for ``cond()`` (a task working in its own thread)."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


@contextlib.contextmanager
def held(line, release_after: float | None = None):
    """Another session's turn at the model (``line``, one lane) for the block's length, or
    for ``release_after`` seconds from the block's start if sooner."""
    release = threading.Event()

    def hold():
        with line.turn("another session"):
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    while not line.state().running:
        time.sleep(0.01)
    if release_after is not None:
        threading.Timer(release_after, release.set).start()
    try:
        yield
    finally:
        release.set()
        holder.join(30)


@pytest.fixture()
def one_lane(monkeypatch):
    """The model's line with one lane whatever the cores, so another session's turn fills it."""
    import ui.model
    from semviz.model.queue import QUEUE

    monkeypatch.setattr(ui.model, "fit_lanes", lambda: None)
    was = QUEUE.lanes
    QUEUE.set_lanes(1)
    yield QUEUE
    QUEUE.set_lanes(was)


@pytest.fixture()
def generated(app):
    """The app after 8 generated tokens."""
    return run_steps(app, 8)


def link_notes(at) -> list[str]:
    """The notes about the opening link that this run showed (under the page's title)."""
    from ui.controls import LINK_ICON

    return [w.value for w in at.main.warning if w.icon == LINK_ICON]


def click_step(at, times: int = 1):
    """Click Generate's Step ``times`` times at once; ``.run()`` on what it returns runs the
    page and waits for the tokens.

    Step is a ``ui.clicks`` counted button (a custom component, which AppTest draws as an
    unknown element): this puts a widget in its place that sends the count of clicks the
    browser would send next, the clicks acted on so far plus ``times``."""
    import json

    from streamlit.proto.WidgetStates_pb2 import WidgetState
    from streamlit.testing.v1.element_tree import Block, UnknownElement, Widget

    class Clicks(Widget):
        def __init__(self, el, total: int) -> None:
            self.proto, self.root, self.key, self.type = el.proto, el.root, el.key, el.type
            self.id, self.disabled, self._value = el.proto.id, False, total

        @property
        def value(self) -> int:
            return self._value

        @property
        def _widget_state(self) -> WidgetState:
            return WidgetState(id=self.id, json_value=json.dumps({"clicks": self._value}))

    def swap(block) -> bool:
        for i, node in block.children.items():
            if isinstance(node, UnknownElement) and node.key == "btn_step":
                data = json.loads(node.proto.json or "{}")
                if data.get("disabled"):
                    raise AssertionError("Step is disabled: a browser user cannot click it")
                block.children[i] = Clicks(node, int(data["count"]) + times)
                return True
            if isinstance(node, Block) and swap(node):
                return True
        return False

    assert swap(at._tree), "no Step button on this page"
    return _Clicked(at)


class _Clicked:
    """``click_step(at).run()``: the page runs with the clicks, and the tokens they asked for
    are made before it returns (a first Step's prefill is a task, decoding in its thread)."""

    def __init__(self, at) -> None:
        self.at = at

    def run(self):
        self.at.run()
        return settle(self.at)
