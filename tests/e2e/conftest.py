"""Start the app as ``make run`` does (real default model) on a free port, and a chromium."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from semviz.output.report import BROWSER_ARGS, chromium_path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
# the same browser and flags the report's PNG export uses
CHROMIUM = chromium_path() or "/usr/bin/chromium"
ARGS = BROWSER_ARGS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(
    env: dict[str, str] | None = None, log: str = "server.log", args: tuple[str, ...] = ()
) -> Iterator[tuple[str, int]]:
    """``streamlit run app.py`` on 127.0.0.1 and a free port, with ``env`` over this process's
    environment (without ``SEMVIZ_MODEL``: the real default model) and ``args`` after
    Streamlit's own; yields (URL, pid). Its output goes to ``ARTIFACTS / log``."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k != "SEMVIZ_MODEL"}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = open(ARTIFACTS / log, "w")  # noqa: SIM115
    streamlit = Path(sys.executable).with_name("streamlit")
    proc = subprocess.Popen(
        [
            str(streamlit),
            "run",
            "app.py",
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
            *args,
        ],
        cwd=ROOT,
        env={**base, **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited early; see {ARTIFACTS / log}")
        else:
            raise RuntimeError("streamlit did not become healthy in 90 s")
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()


@pytest.fixture(scope="session")
def app_url():
    """``streamlit run app.py`` on the real default model; yields its URL."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    with serve() as (url, _pid):
        yield url


@pytest.fixture(scope="module")
def browser():
    # module scope: playwright's sync API runs an event loop in this thread while it is open,
    # which would break later tests that call asyncio.run (kaleido's PNG export)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def nav_click(page, title: str) -> None:
    """Click the page ``title`` in the navigation, opening its section's menu first."""
    link = page.locator(
        '[data-testid="stTopNavLink"], [data-testid="stTopNavDropdownLink"], '
        '[data-testid="stSidebarNavLink"]'
    ).filter(has_text=title)
    if not link.first.is_visible():
        from ui import nav

        section = next(p.section for p in nav.PAGES if p.title == title)
        page.locator('[data-testid="stTopNavSection"]').filter(has_text=section).first.click()
    link.first.click()
