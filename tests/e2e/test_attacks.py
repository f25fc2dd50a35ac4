"""The security pass's six shared-mode findings, each replayed on a shared server this module
starts (real default model, ``SEMVIZ_SHARED=1``, a 2 MiB upload limit, its own ``TMPDIR``).

Each attack is scaled down to run in seconds but keeps its shape, and the limit is what trips:
it is refused in the one sentence the page shows, or it stays within the per-visitor budget
the README writes next to the limits table ("What one visitor can make the server hold").
Memory is the server's resident set (``VmRSS``) and its peak (``VmHWM``, reset before each
attack through ``/proc/<pid>/clear_refs``); after each attack the server's temporary folder
holds nothing.

Run with ``pytest -m e2e tests/e2e/test_attacks.py``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from semviz.output.trace import MAX_ELEMENTS, MAX_EXTRA_ELEMENTS
from tests.e2e.conftest import ARTIFACTS, CHROMIUM, serve
from tests.e2e.test_browser import goto, no_traceback, open_app, wait_idle, wait_ready

pytestmark = pytest.mark.e2e

MiB = 2**20
UPLOAD_MB = 2  # the server's SEMVIZ_MAX_UPLOAD_MB
CLOSED_SECONDS = 2  # the server's SEMVIZ_CLOSED_SECONDS
# The README's per-visitor budget for reading an upload: the file Streamlit keeps, the page's
# copy of it, and the read (3× the file and 200 bytes a JSON element, semviz.output.trace)
UPLOAD_BUDGET = 2 * UPLOAD_MB * MiB + 3 * UPLOAD_MB * MiB + 200 * MAX_ELEMENTS
VOCAB = 49152  # the default model's vocabulary
# the page's uploader counts a megabyte as 10^6 bytes, the server as 2^20
BROWSER_LIMIT = UPLOAD_MB * 10**6
SLACK = 32 * MiB  # what the page itself may add (its widgets, charts, Python's free lists)
KV_WORK = 64 * MiB  # a kv-eval forward's working memory beyond its rows and reference
# what a closed tab's freed evaluation may leave resident: the heap pages other allocations
# share with it (0-1 MiB measured when the evaluation runs alone, 41 after a report's PNG export)
BACK = 64 * MiB


@dataclass
class Server:
    url: str
    pid: int
    tmp: Path

    def mib(self, key: str = "VmRSS") -> float:
        """The server's ``VmRSS`` (resident now) or ``VmHWM`` (its peak), in MiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        raise KeyError(key)

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.tmp.iterdir())


@dataclass
class Measured:
    before: float  # MiB resident before the attack
    peak: float = 0.0  # MiB the peak rose above ``before``
    after: float = 0.0  # MiB still resident above ``before`` once it was answered


@contextlib.contextmanager
def measured(server: Server):
    """The server's memory over a block: the peak is reset first, so it is the block's."""
    Path(f"/proc/{server.pid}/clear_refs").write_text("5")
    m = Measured(server.mib())
    yield m
    m.peak = server.mib("VmHWM") - m.before
    m.after = server.mib() - m.before


RESULTS: dict[str, dict] = {}


def record(name: str, **kw) -> None:
    """Keep an attack's numbers for the module's artifact (attacks.json)."""

    def tidy(v):
        return (
            [tidy(x) for x in v]
            if isinstance(v, list)
            else round(v, 1)
            if isinstance(v, float)
            else v
        )

    RESULTS[name] = {k: tidy(v) for k, v in kw.items()}
    (ARTIFACTS / "attacks.json").write_text(json.dumps(RESULTS, indent=1))


@pytest.fixture(scope="module")
def shared(browser, tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    tmp = tmp_path_factory.mktemp("server-tmp")
    env = {
        "SEMVIZ_SHARED": "1",
        "SEMVIZ_MAX_UPLOAD_MB": str(UPLOAD_MB),
        "SEMVIZ_CLOSED_SECONDS": str(CLOSED_SECONDS),
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp),
    }
    with serve(env, log="attacks_server.log") as (url, pid):
        # the model's weights (a memory-mapped file) are read in at its first forward, about
        # 520 MiB once for every visitor: a run first, so no attack is charged for them
        ctx, page = open_app(browser, url, "?run_n=2")
        try:
            goto(page, "Generate")
            page.get_by_role("button", name="Run 2", exact=True).click()
            wait_ready(page, 2)
        finally:
            ctx.close()
        yield Server(url, pid, tmp)


def page_errors(page) -> list[str]:
    """The texts of the page's error boxes (without their icon)."""
    boxes = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
    return [t.replace("⚠️", "").strip() for t in boxes]


def no_leftovers(server: Server) -> None:
    assert server.leftovers() == [], "the server left files in its temporary folder"


# -- 1 · an upload whose step ``extra`` holds a long list of small nested lists -----------------


def trace_with_junk(real_lm, path: Path, junk: str) -> int:
    """A valid one-step trace whose step ``extra`` holds the list ``junk`` (raw JSON); returns
    the file's size in bytes."""
    from semviz import Decoder, DecodeSettings, PruneParams

    dec = Decoder(
        real_lm,
        "Hi.",
        PruneParams(),
        DecodeSettings(seed=1, max_new_tokens=2, lens=False, full_logits=False),
    )
    dec.run(1)
    d = json.loads(dec.trace.to_json())
    d["steps"][0]["extra"] = {"junk": "@JUNK@"}
    text = json.dumps(d).replace('"@JUNK@"', junk)
    path.write_text(text)
    return len(text.encode())


def upload(page, path: Path) -> None:
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    wait_idle(page)


def test_1_an_upload_of_many_small_nested_lists_is_refused_before_parsing(
    browser, shared, real_lm, tmp_path
):
    # nests 5 + 2 levels deep, within the format's 16; each "[[]]," is 3 elements in 5 bytes,
    # so a file just under the upload limit holds more elements than a trace may have
    big = tmp_path / "nested.json"
    base = trace_with_junk(real_lm, big, "[]")
    n = (BROWSER_LIMIT - base - 1024) // 5
    size = trace_with_junk(real_lm, big, "[" + ",".join(["[[]]"] * n) + "]")
    assert size <= BROWSER_LIMIT  # the upload limit is not what refuses it
    elements = sum(big.read_bytes().count(c) for c in (b",", b"[", b"{"))
    assert elements > MAX_ELEMENTS
    # under the element limit, but more values in one ``extra`` than it may hold: parsed, then
    # refused by the field's own limit
    k = (MAX_ELEMENTS - 20_000) // 3
    under = tmp_path / "nested_under.json"
    trace_with_junk(real_lm, under, "[" + ",".join(["[[]]"] * k) + "]")
    ctx, page = open_app(browser, shared.url)
    try:
        goto(page, "Report")
        page.get_by_text("a saved trace", exact=True).click()
        wait_idle(page)
        with measured(shared) as m:
            upload(page, big)
        no_traceback(page)
        assert page_errors(page) == [
            f"Trace not read: the trace holds about {elements:,} JSON elements, more than the "
            f"{MAX_ELEMENTS:,} a trace may have"
        ]
        with measured(shared) as m2:
            upload(page, under)
        no_traceback(page)
        assert page_errors(page) == [
            f"Trace not read: steps[0].extra: holds more than {MAX_EXTRA_ELEMENTS:,} values"
        ]
        assert "1 tokens" not in page.inner_text("body")  # nothing was loaded
    finally:
        ctx.close()
    record(
        "1 nested lists",
        bytes=size,
        elements=elements,
        peak_mib=m.peak,
        after_mib=m.after,
        parsed_peak_mib=m2.peak,
        parsed_after_mib=m2.after,
        budget_mib=UPLOAD_BUDGET / MiB,
    )
    assert m.peak * MiB <= 4 * UPLOAD_MB * MiB + SLACK  # refused by counting: nothing parsed
    assert m2.peak * MiB <= UPLOAD_BUDGET
    no_leftovers(shared)


# -- 2 · kv-eval's budgets ----------------------------------------------------------------------


def kv_points(page, timeout: float = 30.0) -> list[int]:
    """Points per line of the kv-eval figure (one line a policy, one point a budget), once
    the browser has drawn it: on a loaded machine Plotly can draw later than the page run
    that sent the figure ends."""
    js = (
        "() => { const p = [...document.querySelectorAll('.js-plotly-plot')].at(-1);"
        " return p && p.calcdata ? p.calcdata.map(c => c.length) : []; }"
    )
    deadline = time.time() + timeout
    while not (points := page.evaluate(js)) and time.time() < deadline:
        time.sleep(0.25)
    return points


def run_kv_eval(page, budgets: str, tokens: int | None = None) -> None:
    page.get_by_label("Budgets (tokens or fractions)").fill(budgets)
    if tokens is not None:
        page.get_by_label("Tokens", exact=True).fill(str(tokens))
    page.get_by_role("button", name="Run kv-eval").click()


def kv_row_bytes(lm, tokens: int) -> int:
    from semviz.eviction.harness import row_bytes

    return row_bytes(lm, tokens, 1)


def test_2_kv_eval_budgets_are_capped_and_counted_once(browser, shared, real_lm):
    from semviz.eviction.harness import MAX_ROWS

    ctx, page = open_app(browser, shared.url)
    try:
        goto(page, "KV cache")
        # 33 budgets × the two default policies: more rows than kv-eval runs
        many = ", ".join(str(b) for b in range(8, 8 + MAX_ROWS // 2 + 1))
        with measured(shared) as m_many:
            run_kv_eval(page, many)
            wait_idle(page)
        no_traceback(page)
        assert page_errors(page) == [
            f"Settings not accepted: kv-eval runs at most {MAX_ROWS} rows (policies × budgets); "
            f"this asks for {2 * (MAX_ROWS // 2 + 1)}: give fewer policies or budgets"
        ]
        assert "kv-eval: done" not in page.inner_text("body")
        # the attack as found: one budget 60 times, then 2,000 times; each counts once
        peaks = []
        for text in (", ".join(["8192"] * 60), " ".join(["8"] * 2000)):
            with measured(shared) as m:
                run_kv_eval(page, text)
                page.wait_for_selector("text=kv-eval: done, 64 tokens.", timeout=120_000)
                wait_idle(page)
            no_traceback(page)
            assert page_errors(page) == []
            assert kv_points(page) == [1, 1]  # two policies, one budget
            peaks.append(m.peak)
    finally:
        ctx.close()
    # the README's budget: two rows, the reference's log-probabilities (4 bytes × vocabulary a
    # token) and a forward's working memory; the 120 rows of 60 budgets held 60× the rows'
    budget = 2 * kv_row_bytes(real_lm, 64) + 64 * VOCAB * 4
    record(
        "2 kv-eval budgets",
        refused_peak_mib=m_many.peak,
        peaks_mib=peaks,
        rows_budget_mib=budget / MiB,
        budget_mib=(budget + KV_WORK) / MiB,
    )
    assert max(peaks) * MiB <= budget + KV_WORK
    no_leftovers(shared)


# -- 3 · a prompt far over what the model reads, tokenised before it was refused ------------------


def test_3_a_prompt_over_the_character_limit_is_refused_before_tokenising(browser, shared, real_lm):
    """A prompt far over what the model reads: the box takes at most the characters this
    server reads (16 a token of its 512: the browser enforces the box's max_chars, so the text
    never crosses the websocket or the address), and Step refuses that much in one sentence.
    A client that bypassed the box meets the server's own character check before tokenising
    (``check_prompt_text``, ``tests/decoding/test_decoder.py``)."""
    from semviz.decoding.decoder import CHARS_PER_TOKEN

    most = CHARS_PER_TOKEN * real_lm.max_context
    n = 4 * most  # about 128,000 tokens if it were tokenised
    box_chars = CHARS_PER_TOKEN * 512  # shared mode's SEMVIZ_MAX_PROMPT_TOKENS default
    ctx, page = open_app(browser, shared.url)
    try:
        goto(page, "Generate")
        wait_idle(page)
        box = page.get_by_label("Prompt", exact=True)
        text = ("word " * (n // 5 + 1))[:n]
        with measured(shared) as m:
            box.fill(text)  # over the box's max_chars: the box does not take it
            assert len(box.input_value()) <= box_chars
            box.fill(text[:box_chars])  # all the box takes
            assert len(box.input_value()) == box_chars
            page.keyboard.press("Control+Enter")  # send it, as leaving the box does
            wait_idle(page)
            page.get_by_role("button", name="Step", exact=True).click()
            deadline = time.time() + 120
            while not page_errors(page) and time.time() < deadline:
                page.wait_for_timeout(200)
            wait_idle(page)
        no_traceback(page)
        errors = page_errors(page)
        # one box, its one sentence after the box's icon name
        assert len(errors) == 1 and re.fullmatch(
            r"(error\s+)?Prompt not accepted: The prompt has [\d,]+ tokens and this server "
            r"takes at most 512: shorten it\.",
            errors[0],
        ), errors
        assert page.locator(".semviz-strip .tok").count() == 0  # nothing was decoded
    finally:
        ctx.close()
    record("3 prompt", characters=n, box=box_chars, limit=most, peak_mib=m.peak, after_mib=m.after)
    assert m.peak * MiB <= SLACK  # a few copies of the text, not its tokens
    no_leftovers(shared)


# -- 4 · the Report page's build folders ---------------------------------------------------------


def test_4_report_builds_leave_no_folder_behind(browser, shared):
    ctx, page = open_app(browser, shared.url, "?run_n=3")
    try:
        goto(page, "Generate")
        page.get_by_role("button", name="Run 3", exact=True).click()
        wait_ready(page, 3)
        goto(page, "Report")
        page.get_by_text("One PNG per chart", exact=False).click()  # off: the fast build
        wait_idle(page)
        for _ in range(2):  # each build wrote a folder that stayed
            page.get_by_role("button", name="Build report").click()
            page.wait_for_selector("text=Report complete", timeout=120_000)
            wait_idle(page)
            no_traceback(page)
            assert shared.leftovers() == []
        # with the PNGs, stopped during the export: what was made is kept, the folder goes
        page.get_by_text("One PNG per chart", exact=False).click()
        wait_idle(page)
        page.get_by_role("button", name="Build report").click()
        page.wait_for_function(  # the export's progress line: "PNG 1/…"
            "() => /PNG \\d+\\//.test(document.body.innerText)", polling=50, timeout=300_000
        )
        page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Stop").click()
        page.wait_for_selector("text=Report stopped early", timeout=300_000)
        wait_idle(page)
        no_traceback(page)
        assert page.get_by_role("button", name="Download report.zip").count() == 1
    finally:
        ctx.close()
    record("4 report folders", leftovers=shared.leftovers())
    no_leftovers(shared)


# -- 5 · PUTs straight to Streamlit's upload endpoint -----------------------------------------------


def put(server: Server, path: str, headers: dict[str, str], size: int, chunked: bool = False):
    """PUT a multipart body holding a ``size``-byte file to ``path``; the response's status."""
    u = urlsplit(server.url)
    boundary = "semviz-attack"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="t.json"\r\n'
        "Content-Type: application/json\r\n\r\n"
    ).encode()
    body = head + b" " * size + f"\r\n--{boundary}--\r\n".encode()
    hdrs = {**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        if chunked:  # no Content-Length: the server must count the bytes as they come
            parts = (body[i : i + 64 * 1024] for i in range(0, len(body), 64 * 1024))
            conn.request("PUT", path, body=parts, headers=hdrs, encode_chunked=True)
        else:
            conn.request("PUT", path, body=body, headers=hdrs)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed before the whole body was sent
    try:
        return conn.getresponse().status
    finally:
        conn.close()


def test_5_puts_straight_to_the_upload_endpoint_meet_the_upload_limit(
    browser, shared, real_lm, tmp_path
):
    import uuid

    small = tmp_path / "small.json"
    trace_with_junk(real_lm, small, "[]")
    ctx, page = open_app(browser, shared.url)
    seen = []
    page.on("request", lambda r: seen.append(r) if r.method == "PUT" else None)
    try:
        goto(page, "Report")
        page.get_by_text("a saved trace", exact=True).click()
        wait_idle(page)
        upload(page, small)  # the page's own upload shows the endpoint, session and token
        no_traceback(page)
        assert "1 tokens" in page.inner_text("body")  # read: the page's own upload works
        (req,) = [r for r in seen if "/_stcore/upload_file/" in r.url]
        path = urlsplit(req.url).path
        session = path.rsplit("/", 2)[-2]
        cookie = "; ".join(f"{c['name']}={c['value']}" for c in ctx.cookies())
        headers = {"Cookie": cookie, "X-Xsrftoken": req.all_headers()["x-xsrftoken"]}

        def fresh() -> str:  # a file id the attacker makes up
            return f"/_stcore/upload_file/{session}/{uuid.uuid4()}"

        limit = UPLOAD_MB * MiB
        # the attack as found: one body over the limit, declared and then undeclared
        with measured(shared) as m_over:
            over = put(shared, fresh(), headers, 3 * limit)
            chunked = put(shared, fresh(), headers, 3 * limit, chunked=True)
            just = put(shared, fresh(), headers, limit + 1024, chunked=True)  # in the margin
        assert (over, chunked, just) == (413, 413, 413)
        # and many bodies under the limit, each under a new id
        n = 24
        with measured(shared) as m_many:
            codes = {put(shared, fresh(), headers, limit - 4096) for _ in range(n)}
            time.sleep(1)
        record(
            "5 upload endpoint",
            over=over,
            chunked=chunked,
            margin=just,
            over_peak_mib=m_over.peak,
            over_after_mib=m_over.after,
            many=n,
            many_codes=sorted(codes),
            many_peak_mib=m_many.peak,
            many_after_mib=m_many.after,
        )
        assert m_over.peak * MiB <= limit + SLACK
        # a session holds one upload at a time (its page has one uploader): the ones before
        # it are let go
        assert m_many.after * MiB <= 2 * limit + SLACK
    finally:
        ctx.close()
    no_leftovers(shared)


# -- 6 · kv-eval's memory once its tab closes ----------------------------------------------------


def test_6_a_closed_kv_eval_tab_gives_its_memory_back(browser, shared):
    ctx, page = open_app(browser, shared.url)
    closed = False
    try:
        goto(page, "KV cache")
        base = shared.mib()
        run_kv_eval(page, "16, 32", tokens=512)
        deadline = time.time() + 60
        while shared.mib() - base < 100 and time.time() < deadline:  # until it holds a lot
            time.sleep(0.5)
        held = shared.mib() - base
        assert "kv-eval: done" not in page.inner_text("body")  # still running
        ctx.close()
        closed = True
        t0 = time.time()
        while shared.mib() - base > BACK / MiB and time.time() - t0 < 60:
            time.sleep(0.5)
        seconds = time.time() - t0
        after = shared.mib() - base
    finally:
        if not closed:
            ctx.close()
    record("6 closed kv-eval tab", held_mib=held, after_mib=after, seconds=seconds)
    assert held >= 100  # the evaluation held memory ...
    assert after * MiB <= BACK  # ... and gave it back within a minute of the tab closing
    no_leftovers(shared)
