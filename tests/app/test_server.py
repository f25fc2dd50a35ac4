"""Shared mode: its configuration, the model allow-list, the limits, upload-only traces, the
model queue's place on the page, and idle runs dropped."""

from __future__ import annotations

import time

import pytest

from semviz.model.load import DEFAULT_MODEL, ModelLoadError, model_key
from tests.app.conftest import (
    APP,
    GENERATE,
    TIMEOUT,
    click_step,
    held,
    link_notes,
    run_steps,
    wait_until,
)
from ui import server, sessions
from ui.server import ConfigError, ServerConfig, read_config


def app_test(monkeypatch, tiny_dir, **env):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SEMVIZ_MODEL", str(tiny_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return AppTest.from_file(APP, default_timeout=TIMEOUT)


# -- configuration -------------------------------------------------------------------------------


def test_without_shared_mode_nothing_is_limited(tmp_path):
    cfg = read_config({}, file=tmp_path / "none.toml")
    assert cfg == ServerConfig()
    assert cfg.allows("any/hub-model") and cfg.cap_steps(5000) == 5000


def test_shared_mode_defaults_and_one_model(tmp_path):
    cfg = read_config({"SEMVIZ_SHARED": "1"}, file=tmp_path / "none.toml")
    assert cfg.shared and cfg.models == (DEFAULT_MODEL,) and cfg.default_model == DEFAULT_MODEL
    assert (cfg.max_steps, cfg.max_prompt_tokens, cfg.max_upload_mb) == (256, 512, 50)
    assert (cfg.idle_minutes, cfg.closed_seconds) == (10.0, 30.0)
    assert cfg.allows("") and cfg.allows("default") and not cfg.allows(str(tmp_path))
    assert cfg.cap_steps(5000) == 256 and cfg.cap_steps(12) == 12


def test_allow_list_spellings_are_one_model(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    env = {"SEMVIZ_SHARED": "on", "SEMVIZ_MODELS": f"{d}/, default", "SEMVIZ_MAX_STEPS": "40"}
    cfg = read_config(env, file=tmp_path / "none.toml")
    assert cfg.models == (str(d.resolve()), DEFAULT_MODEL)
    assert cfg.default_model == str(d.resolve()) and cfg.max_steps == 40
    for spelling in (str(d), f"{d}/", f"{d}//", f" {d} ", f"{tmp_path}/./m", "", "  "):
        assert cfg.allows(spelling), spelling
    assert cfg.allows("SmolLM2-135M-Instruct") and not cfg.allows(str(tmp_path))


def test_file_settings_and_variables_over_them(tmp_path):
    f = tmp_path / "semviz.toml"
    f.write_text('shared = true\nmax_steps = 100\nmodels = ["default"]\n')
    assert read_config({}, file=f).max_steps == 100
    assert read_config({"SEMVIZ_MAX_STEPS": "7"}, file=f).max_steps == 7
    assert read_config({}, file=f).shared


def test_sessions_share_forwards_only_when_the_server_says_so(tmp_path, tiny_lm, monkeypatch):
    from semviz import Decoder, DecodeSettings, PruneParams

    assert not read_config({"SEMVIZ_SHARED": "1"}, file=tmp_path / "none.toml").batch_sessions
    assert read_config({"SEMVIZ_BATCH_SESSIONS": "on"}, file=tmp_path / "none.toml").batch_sessions
    ref = Decoder(tiny_lm, "The sea", PruneParams(), DecodeSettings(seed=3, max_new_tokens=9))
    ref.run(4)
    for flag, gathered in (("0", 0), ("1", 3)):
        monkeypatch.setenv("SEMVIZ_BATCH_SESSIONS", flag)
        dec = Decoder(tiny_lm, "The sea", PruneParams(), DecodeSettings(seed=3, max_new_tokens=9))
        before = server.GATHER.rows
        for _ in range(4):
            server.step(dec)
        assert server.GATHER.rows - before == gathered  # the first step reads the prefill's
        assert dec.trace.token_ids == ref.trace.token_ids


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SEMVIZ_SHARED": "maybe"}, "SEMVIZ_SHARED='maybe': expected on or off."),
        ({"SEMVIZ_BATCH_SESSIONS": "2"}, "SEMVIZ_BATCH_SESSIONS='2': expected on or off."),
        ({"SEMVIZ_MAX_STEPS": "abc"}, "SEMVIZ_MAX_STEPS='abc': expected an integer."),
        ({"SEMVIZ_MAX_STEPS": "0"}, "SEMVIZ_MAX_STEPS='0': must be in [1, 8192]."),
        (
            {"SEMVIZ_MAX_STEPS": "1e12"},
            "SEMVIZ_MAX_STEPS='1e12': expected an integer in [1, 8192].",
        ),
        ({"SEMVIZ_IDLE_MINUTES": "nan"}, "SEMVIZ_IDLE_MINUTES='nan': expected a finite number."),
        ({"SEMVIZ_IDLE_MINUTES": "0.01"}, "SEMVIZ_IDLE_MINUTES='0.01': must be in [0.1, 1440]."),
        (
            {"SEMVIZ_SHARED": "1", "SEMVIZ_MODEL": "/x", "SEMVIZ_MODELS": "default"},
            "SEMVIZ_MODEL='/x' is not one of the allowed models (SEMVIZ_MODELS).",
        ),
    ],
)
def test_a_bad_setting_is_one_sentence_naming_it(tmp_path, env, message):
    with pytest.raises(ConfigError) as exc:
        read_config(env, file=tmp_path / "none.toml")
    assert str(exc.value) == message


def test_a_bad_setting_stops_every_page_with_its_sentence(monkeypatch, tiny_dir):
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_MAX_PROMPT_TOKENS="lots")
    at.switch_page("app_pages/distributions.py").run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        "This server is not set up right: SEMVIZ_MAX_PROMPT_TOKENS='lots': expected an integer."
    ]
    assert not at.get("plotly_chart")


def test_the_server_skips_a_full_garbage_collection_after_every_run():
    """Streamlit's default collects all garbage after every script run and fragment tick;
    with torch and the model loaded that held the GIL for 40-300 ms each time and halved the
    tokens/s of a class playing at once (``benchmarks/bench_load.py``). Dropped runs are
    collected by ``ui.sessions.release_memory`` instead."""
    from pathlib import Path

    import tomllib

    cfg = tomllib.loads((Path(APP).parent / ".streamlit/config.toml").read_text())
    assert cfg["runner"]["postScriptGC"] is False


def test_model_key_makes_one_name_per_model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (tmp_path / "link").symlink_to(d)
    keys = {model_key(s) for s in (str(d), f"{d}/", f"{d}//", f"{tmp_path}/link/")}
    assert keys == {str(d.resolve())}
    assert model_key("") == model_key(None) == model_key("default") == DEFAULT_MODEL
    assert model_key(" owner/name ") == "owner/name"
    assert model_key("bad\x00name") == "bad\x00name"


# -- models ----------------------------------------------------------------------------------------


def test_a_trailing_slash_is_the_same_cached_model(monkeypatch, tiny_dir):
    from ui.model import get_model

    monkeypatch.delenv("SEMVIZ_SHARED", raising=False)
    assert get_model(str(tiny_dir)) is get_model(f"{tiny_dir}/") is get_model(f" {tiny_dir}// ")


def test_shared_mode_refuses_a_model_outside_the_list_before_reading_it(
    monkeypatch, tiny_dir, tmp_path
):
    from ui.model import get_model

    other = tmp_path / "other"
    other.mkdir()  # no config.json: reading it would fail with another message
    monkeypatch.setenv("SEMVIZ_SHARED", "1")
    monkeypatch.setenv("SEMVIZ_MODELS", str(tiny_dir))
    monkeypatch.delenv("SEMVIZ_MODEL", raising=False)
    with pytest.raises(ModelLoadError) as exc:
        get_model(str(other))
    assert (
        str(exc.value) == f"Could not load model '{other}': this server runs only {tiny_dir.name}."
    )
    for name in ("default", "HuggingFaceTB/SmolLM2-360M"):
        with pytest.raises(ModelLoadError, match="this server runs only"):
            get_model(name)
    assert get_model("").name == str(tiny_dir.resolve())


def test_a_link_cannot_load_a_model_outside_the_list(monkeypatch, tiny_dir, tmp_path):
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1")
    at.query_params["model"] = str(tmp_path)
    at.switch_page("app_pages/pipeline.py").run()
    assert not at.exception and not at.error
    assert f"Ignored model='{tmp_path}': this server runs only {tiny_dir.name}." in link_notes(at)
    assert at.session_state["settings"].model == ""
    assert "s_model" not in [w.key for w in at.text_input]  # nothing to type a path into
    assert f"Model: **{tiny_dir.name}** (the one this server runs)" in [
        c.value for c in at.sidebar.caption
    ]
    assert at.session_state["settings"].model_name() == str(tiny_dir.resolve())


def test_shared_mode_offers_only_the_allowed_models(monkeypatch, tiny_dir):
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_MODELS=f"{tiny_dir},default")
    at.switch_page(GENERATE).run()
    box = at.selectbox(key="s_model")
    assert box.options == [tiny_dir.name, DEFAULT_MODEL]
    assert not [w for w in at.text_input if w.key == "s_model"]


# -- limits ----------------------------------------------------------------------------------------


def test_runs_stop_at_the_step_limit(monkeypatch, tiny_dir):
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_MAX_STEPS="5")
    at.query_params.update({"run_n": "50", "max_new_tokens": "4000"})
    at.run()
    notes = link_notes(at)
    assert notes == [
        "max_new_tokens=4000 is above this server's limit of 5 tokens a run; using 5.",
        "run_n=50 is above this server's limit of 5 tokens a run; using 5.",
    ]
    assert at.number_input(key="s_run_n").max == 5
    run_steps(at, 5)
    dec = at.session_state["semviz"].decoder
    assert dec.n_steps == 5 and dec.done and dec.stop_reason == "max_new_tokens"


def test_a_prompt_over_the_token_limit_is_refused(monkeypatch, tiny_dir, tiny_lm):
    n = len(tiny_lm.tokenizer("word " * 60)["input_ids"])
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_MAX_PROMPT_TOKENS="40")
    at.session_state["s_chat"] = False
    at.session_state["s_prompt"] = "word " * 60
    at.switch_page(GENERATE).run()
    click_step(at).run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        f"Prompt not accepted: The prompt has {n} tokens and this server takes at most 40: "
        "shorten it."
    ]
    assert at.session_state["semviz"].decoder is None


# -- traces by upload only ---------------------------------------------------------------------------


def test_shared_report_has_no_path_box_and_reads_no_path(monkeypatch, tiny_dir, tmp_path):
    secret = tmp_path / "trace.json"
    secret.write_text("{}")
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1")
    at.switch_page("app_pages/report.py").run()
    at.radio(key="report_source").set_value("a saved trace").run()
    at.session_state["report_path"] = str(secret)  # as if a path had been typed
    at.run()
    assert not at.exception and not at.error
    assert "report_path" not in [w.key for w in at.text_input]
    assert "This server takes traces by upload only." in [c.value for c in at.caption]
    assert at.session_state["semviz"].report_trace is None


def test_single_user_report_still_reads_a_path(monkeypatch, tiny_dir, tmp_path):
    missing = tmp_path / "nope.json"
    at = app_test(monkeypatch, tiny_dir)
    monkeypatch.delenv("SEMVIZ_SHARED", raising=False)
    at.switch_page("app_pages/report.py").run()
    at.radio(key="report_source").set_value("a saved trace").run()
    at.text_input(key="report_path").input(str(missing)).run()
    assert any("Trace not read" in e.value for e in at.error)


def test_shared_frontier_page_shows_the_shipped_result_only(monkeypatch, tiny_dir, tmp_path):
    other = tmp_path / "results.parquet"
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1")
    at.switch_page("app_pages/frontier.py").run()
    at.session_state["fr_path"] = str(other)  # as if a visitor had asked for a file
    at.run()
    assert at.radio(key="fr_source").options == [
        "Shipped: the default gravity (contrast, λ 0.5) against top-p 0.95",
        "Shipped: the first gravity (attention-weighted pull, λ 0.5 and 1) against top-p 0.95",
    ]  # no file of the visitor's choosing
    assert not at.exception and not at.error
    assert [w.key for w in at.text_input] == []  # no path to read or write, no sweep
    assert [b.key for b in at.button if b.key] == []
    assert len(at.get("plotly_chart")) == 1  # the shipped frontier
    assert any(c.value.startswith("This server shows the shipped results.") for c in at.caption)
    assert not other.exists()


def test_single_user_frontier_page_keeps_the_file_and_the_sweep(monkeypatch, tiny_dir):
    at = app_test(monkeypatch, tiny_dir)
    monkeypatch.delenv("SEMVIZ_SHARED", raising=False)
    at.switch_page("app_pages/frontier.py").run()
    assert not at.exception
    assert {"fr_out", "fr_a", "fr_b"} <= {w.key for w in at.text_input}
    assert "fr_run" in [b.key for b in at.button]


def test_an_upload_over_the_limit_is_refused_before_parsing(monkeypatch):
    from semviz.output.trace import MAX_BYTES, Trace, TraceError

    monkeypatch.setenv("SEMVIZ_SHARED", "1")
    monkeypatch.setenv("SEMVIZ_MAX_UPLOAD_MB", "2")
    assert server.config().trace_bytes() == 2 * 2**20
    with pytest.raises(TraceError) as exc:  # not JSON at all: the size is what refuses it
        Trace.from_json(b"x" * (2 * 2**20 + 1), max_bytes=server.config().trace_bytes())
    assert str(exc.value) == "the trace is larger than the 2 MiB limit"
    monkeypatch.delenv("SEMVIZ_SHARED")
    monkeypatch.delenv("SEMVIZ_MAX_UPLOAD_MB")
    assert server.config().trace_bytes() == MAX_BYTES  # one person's machine: the trace's own


def test_streamlits_own_upload_limit_follows_the_servers(monkeypatch):
    """The upload endpoint checks ``server.maxUploadSize`` on every request: a file sent
    straight to it, past the page's uploader, meets the same limit."""
    from streamlit import config as st_config

    from semviz.output.trace import MAX_BYTES

    before = st_config.get_option("server.maxUploadSize")
    try:
        monkeypatch.setenv("SEMVIZ_SHARED", "1")
        monkeypatch.setenv("SEMVIZ_MAX_UPLOAD_MB", "2")
        server.apply_upload_limit()
        assert st_config.get_option("server.maxUploadSize") == 2
        monkeypatch.delenv("SEMVIZ_MAX_UPLOAD_MB")
        server.apply_upload_limit()  # shared mode's default
        assert st_config.get_option("server.maxUploadSize") == 50
        monkeypatch.delenv("SEMVIZ_SHARED")
        server.apply_upload_limit()  # one person's machine: the largest trace it parses
        assert st_config.get_option("server.maxUploadSize") == MAX_BYTES // 2**20
        monkeypatch.setenv("SEMVIZ_MAX_UPLOAD_MB", "lots")
        server.apply_upload_limit()  # a bad setting: left as it was; every page says why
        assert st_config.get_option("server.maxUploadSize") == MAX_BYTES // 2**20
    finally:
        st_config.set_option("server.maxUploadSize", before)


def test_a_session_keeps_at_most_the_upload_limit_of_files_sent_to_the_endpoint(monkeypatch):
    """Files PUT straight to the endpoint under new ids, each under the limit, no longer pile
    up: a session keeps its newest files within the limit, other sessions' stay."""
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
    from streamlit.runtime.uploaded_file_manager import UploadedFileRec

    monkeypatch.setenv("SEMVIZ_SHARED", "1")
    monkeypatch.setenv("SEMVIZ_MAX_UPLOAD_MB", "2")
    store = MemoryUploadedFileManager("/_stcore/upload_file")
    server.bound_session_uploads(store)
    server.bound_session_uploads(store)  # once is enough: a page run does it again

    def put(session: str, file_id: str, mib: float) -> None:
        data = b" " * int(mib * 2**20)
        store.add_file(session, UploadedFileRec(file_id, "t.json", "application/json", data))

    put("other", "theirs", 1.5)
    for i in range(20):
        put("attacker", f"f{i}", 1.9)
    assert [f.file_id for f in store.get_files("attacker", [f"f{i}" for i in range(20)])] == ["f19"]
    put("attacker", "small", 0.05)  # two files within the limit both stay
    assert len(store.get_files("attacker", ["f19", "small"])) == 2
    put("attacker", "next", 1.9)  # the oldest goes first
    assert store.file_storage["attacker"].keys() == {"small", "next"}
    put("attacker", "next", 1.0)  # the same id again replaces its file
    assert store.file_storage["attacker"].keys() == {"small", "next"}
    assert store.file_storage["other"].keys() == {"theirs"}
    stored = sum(len(f.data) for s in store.file_storage.values() for f in s.values())
    assert stored == int(0.05 * 2**20) + 2**20 + int(1.5 * 2**20)


def test_a_settings_file_is_read_with_a_size_limit(tmp_path):
    f = tmp_path / "semviz.toml"
    f.write_text("# " + "x" * server.CONFIG_MAX_BYTES + "\nshared = true\n")
    with pytest.raises(ConfigError) as exc:
        read_config({}, file=f)
    assert str(exc.value) == f"{f} is larger than the 65,536 bytes limit for this file."


# -- the queue on the page ---------------------------------------------------------------------------


def test_a_waiting_page_shows_its_place_then_clears_it(monkeypatch, tiny_dir, one_lane):
    from semviz.model.queue import Place

    shown: list[int] = []
    real = server.wait_text
    monkeypatch.setattr(server, "wait_text", lambda p: (shown.append(p.ahead), real(p))[1])
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1")
    at.switch_page(GENERATE).run()
    click_step(at).run()  # the first Step's prefill is a task: the next one is the page's own
    with held(one_lane, release_after=1.5):  # the page waits about 1.5 s in line
        click_step(at).run()
    assert not at.exception and not at.error
    assert shown and set(shown) == {1}  # one turn (the other session's) before this one
    assert not [i for i in at.info if "Waiting for the model" in i.value]  # cleared once served
    assert at.session_state["semviz"].decoder.n_steps == 2  # the first click's token and this one
    assert real(Place(3, 0.0, 0.5)) == (
        "Waiting for the model: 3 turns before yours, about 2 s. Other sessions are using it."
    )


def test_shared_sidebar_says_how_busy_the_model_is(monkeypatch, tiny_dir):
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_MAX_STEPS="64")
    at.switch_page(GENERATE).run()
    first = at.sidebar.caption[0].value
    assert (
        first.startswith("Shared server: ") and "Up to 64 tokens a run, 512 prompt tokens" in first
    )


# -- idle runs ---------------------------------------------------------------------------------------


def test_an_idle_session_loses_its_run_but_keeps_its_settings(monkeypatch, tiny_dir):
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_IDLE_MINUTES="1")
    at.query_params["temperature"] = "0.35"
    at.run()
    run_steps(at, 3)
    sess = at.session_state["semviz"]
    assert sess.decoder is not None
    sessions.sweep(now=time.monotonic() + 30)  # not idle long enough yet
    assert sess.decoder is not None
    assert sessions.sweep(now=time.monotonic() + 61).idle >= 1
    assert sess.decoder is None and sess.replay_memo == {}
    at.run()
    assert not at.exception
    assert any("closed after 1 idle minutes" in i.value for i in at.info)
    assert at.session_state["settings"].temperature == 0.35
    click_step(at).run()  # and a new run starts
    assert at.session_state["semviz"].decoder.n_steps == 1


def test_a_session_in_a_model_turn_is_not_dropped(monkeypatch, tiny_dir):
    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_IDLE_MINUTES="1")
    at.run()
    run_steps(at, 2)
    sess = at.session_state["semviz"]
    sid = next(s for s, e in sessions._entries.items() if e.ref() is sess)
    with sessions.busy(sid):
        sessions.sweep(now=time.monotonic() + 3600)
    assert sess.decoder is not None
    sessions.sweep(now=time.monotonic() + 3600)
    assert sess.decoder is None


def test_dropping_a_run_frees_its_memory(tiny_lm):
    import gc
    import weakref

    from semviz import Decoder, DecodeSettings, PruneParams
    from ui.state import SessionData

    sess = SessionData()
    sess.decoder = Decoder(tiny_lm, "hello there", PruneParams(), DecodeSettings(max_new_tokens=9))
    sess.decoder.run(8)
    cache = sess.decoder.cache
    ref = weakref.ref(cache)
    del cache
    assert sessions.drop_run(sess, "gone")
    gc.collect()
    assert ref() is None and sess.notice == "gone" and sess.decoder is None
    assert not sessions.drop_run(sess, "again")  # nothing left to drop: no second notice


def test_an_ended_kv_eval_keeps_its_rows_and_lets_its_evaluation_go(tiny_lm):
    """What the page keeps of an ended task is its result: the evaluation (a reference's
    log-probabilities, every row's cache) goes with the task, and a dropped run drops the rows."""
    import gc
    import weakref

    from semviz.eviction import KVEval
    from semviz.tasks import KVEvalTask
    from tests.app.conftest import wait_until
    from ui import work
    from ui.state import SessionData

    sess = SessionData()
    run = KVEval(tiny_lm, list(range(5, 37)), ["full", "window"], (8,))
    ref = weakref.ref(run)
    task = KVEvalTask(run)
    del run
    work.start(sess, "kve", task)
    del task
    s = work.slot(sess, "kve")
    wait_until(lambda: s.task.finished)
    work.keep_ended(sess, "kve")
    gc.collect()
    assert ref() is None
    rows = work.result(sess, "kve")
    assert [(r["policy"], r["budget"], r["tokens"]) for r in rows] == [
        ("full", None, 31),
        ("window", 8, 31),
    ]
    assert work.ended(sess, "kve").progress.done == 32
    assert sessions.drop_run(sess, "gone")
    assert work.result(sess, "kve") is None and sess.notice == "gone"


def test_a_tick_waits_for_a_task_due_to_end_within_it_and_not_for_one_that_is_not():
    """``work.finish_soon``: the panel's tick that finds a task within a tick of its end (by
    its own pace) waits for it, so that tick draws the end; a task further from its end is
    left to run."""
    import time

    from semviz.tasks import Progress, Task
    from tests.app.conftest import wait_until
    from ui import work
    from ui.state import SessionData

    class Sleeps(Task):  # units that take 20 ms each and need no CPU: a steady pace
        def __init__(self, n):
            super().__init__()
            self.n, self.done = n, 0

        def unit(self, turns):
            time.sleep(0.02)
            self.done += 1
            return self.done < self.n

        def progress(self):
            return Progress(self.done, self.n, seconds=self.seconds)

    sess = SessionData()
    work.start(sess, "far", Sleeps(500))  # about 10 s in all
    far = work.slot(sess, "far").task
    wait_until(lambda: far.done >= 2)
    t = time.perf_counter()
    work.finish_soon(sess, ["far"], within=0.5)
    assert time.perf_counter() - t < 0.5 and not far.finished
    work.stop(sess, "far")

    work.start(sess, "near", Sleeps(20))  # about 0.4 s in all
    near = work.slot(sess, "near").task
    wait_until(lambda: near.done >= 2)
    work.finish_soon(sess, ["near"], within=30.0)
    assert near.finished


def test_a_playing_page_draws_while_its_task_waits_in_the_models_line(
    monkeypatch, tiny_dir, one_lane
):
    """The run's task waits for the model in its own thread, so the page's runs neither wait
    for the line nor for the task; the page shows the task's place in the line."""
    from semviz.model.queue import QUEUE
    from ui import runner, work

    at = app_test(monkeypatch, tiny_dir, SEMVIZ_SHARED="1", SEMVIZ_MAX_STEPS="4096")
    at.run()
    at.switch_page(GENERATE).run()
    at.button(key="btn_play").click().run()
    sess = at.session_state["semviz"]
    j = runner.job(sess)
    slot = work.slot(sess, runner.RUN)
    assert j is not None and slot.thread.is_alive()
    wait_until(lambda: j.made >= 2)
    with QUEUE.turn("another session"):  # someone else's long forward
        time.sleep(0.2)
        n = j.made
        time.sleep(server.SHOW_WAIT_AFTER + 0.5)
        assert j.made == n  # the task waits in line ...
        t0 = time.monotonic()
        at.run(timeout=10)  # ... and the page draws without waiting for the model
        assert time.monotonic() - t0 < 10 and not at.exception
        assert "in the model's line, 1 turn before yours" in work.progress_text(slot)
        shown = " ".join(p.proto.text for p in at.get("progress"))
        assert "in the model's line, 1 turn before yours" in shown
    wait_until(lambda: j.made > n)  # its turn came: it decodes on
    at.run()
    assert slot.place is None
    at.button(key="job_stop").click().run()
    assert runner.job(sess) is None


def test_loading_the_model_gives_the_queue_a_lane_per_forwards_worth_of_cores(
    monkeypatch, tiny_dir
):
    import torch

    from semviz.model.queue import QUEUE, cores, lanes_for
    from ui.model import _load

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # a server started with OMP_NUM_THREADS=1
        _load.clear()
        at = app_test(monkeypatch, tiny_dir)
        at.switch_page(GENERATE).run()
        assert not at.exception
        assert QUEUE.lanes == cores()  # one single-threaded forward per core
        if cores() > 1:
            torch.set_num_threads(cores())  # a forward that takes every core: one lane
            _load.clear()
            at.run()
            assert QUEUE.lanes == 1
    finally:
        torch.set_num_threads(threads)
        _load.clear()
        QUEUE.set_lanes(lanes_for(threads))
