"""Shared mode: one server a teacher hands to a class, and the model queue every page shows.

Whoever starts the server decides, through environment variables (or ``.streamlit/semviz.toml``,
whose keys are the variables' names in lower case without ``SEMVIZ_``; a variable wins):

- ``SEMVIZ_SHARED=1`` turns shared mode on; without it the app keeps a single user's freedom
  (any model by name, traces read by path, no limits unless a limit below is set).
- ``SEMVIZ_MODELS``: the models sessions may choose, comma-separated (``default`` is the
  offline default). Shared mode without it runs one model: ``SEMVIZ_MODEL``, else the default.
- ``SEMVIZ_MAX_STEPS``: tokens one run may generate; ``SEMVIZ_MAX_PROMPT_TOKENS``: tokens a
  prompt may have (chat template included); ``SEMVIZ_MAX_UPLOAD_MB``: size of an uploaded trace
  (Streamlit's own upload limit follows it, :func:`apply_upload_limit`).
- ``SEMVIZ_IDLE_MINUTES``: a session that has done nothing for this long loses its run (its
  settings stay); ``SEMVIZ_CLOSED_SECONDS``: the same for a closed tab (see ``ui.sessions``).
- ``SEMVIZ_BATCH_SESSIONS=1``: sessions decoding at the same moment share forwards, as rows of
  one batch (:func:`step`). More tokens a second for a class, but not bit for bit: a row of a
  batch differs from a lone forward by float rounding (about 3e-5 on SmolLM2's logits, since
  the CPU's matrix kernels depend on the batch's size), and a sample that falls in the far
  tail of the distribution can then pick another token than the session would alone. Off by
  default, so every session's tokens are exactly those of its run alone.

A bad value stops every page with one sentence that names it. Model work from every session
takes turns through ``semviz.model.queue.QUEUE``: :func:`model_turn` is what the app wraps
around it, and shows a waiting session its place in the line. The line has as many lanes as
the cores hold forwards of torch's threads (set when the model loads, ``ui.model``): a server
started with ``OMP_NUM_THREADS=1`` on 2 cores runs two sessions' forwards side by side, each
the same computation as alone, so every session still gets exactly its own tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from semviz.model.load import DEFAULT_MODEL, ModelLoadError, model_key
from semviz.model.queue import QUEUE, Gather, Place
from semviz.output import files
from semviz.sampling import FieldSpec, parse_bool, parse_value
from semviz.tasks import Turns

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the variables still work
    tomllib = None

CONFIG_FILE = Path(".streamlit") / "semviz.toml"
CONFIG_MAX_BYTES = 64 * 1024  # a settings file is a few lines
SHARED_DEFAULTS = {  # what shared mode uses for a limit that is not set
    "max_steps": 256,
    "max_prompt_tokens": 512,
    "max_upload_mb": 50,
    "idle_minutes": 10.0,
    "closed_seconds": 30.0,
}
# each limit's type and range, checked by the same parser as every other setting
LIMITS = {
    "max_steps": FieldSpec("int", "Tokens one run may generate.", lo=1, hi=8192),
    "max_prompt_tokens": FieldSpec("int", "Tokens a prompt may have.", lo=32, hi=131072),
    "max_upload_mb": FieldSpec("int", "Size of an uploaded trace (MiB).", lo=1, hi=1024),
    "idle_minutes": FieldSpec("float", "Idle time before a run is dropped.", lo=0.1, hi=1440.0),
    "closed_seconds": FieldSpec("float", "Time a closed tab's run is kept.", lo=1.0, hi=86400.0),
}
SHOW_WAIT_AFTER = 0.3  # seconds in line before a page shows its place


class ConfigError(ValueError):
    """A server setting that cannot be used; the message is one sentence naming it."""


@dataclass(frozen=True)
class ServerConfig:
    """How this server runs. The defaults are one person's own machine: no limits."""

    shared: bool = False
    models: tuple[str, ...] = ()  # allowed model keys (shared mode); empty: any model
    default_model: str = DEFAULT_MODEL  # what an empty model box means
    max_steps: int | None = None
    max_prompt_tokens: int | None = None
    max_upload_mb: int | None = None
    idle_minutes: float | None = None
    closed_seconds: float | None = None
    batch_sessions: bool = False

    def allows(self, name: str) -> bool:
        """May a session load the model ``name`` ('' is the server's default)?"""
        return not self.models or model_key(name.strip() or self.default_model) in self.models

    def refusal(self) -> str:
        """Why a model is refused: the end of one sentence."""
        return f"this server runs only {', '.join(map(model_label, self.models))}"

    def cap_steps(self, n: int) -> int:
        """``n`` tokens a run, or this server's limit if that is lower."""
        return int(n) if self.max_steps is None else min(int(n), self.max_steps)

    def trace_bytes(self) -> int:
        """The largest trace this server parses: ``Trace``'s own limit, or the upload limit
        if that is lower."""
        from semviz.output.trace import MAX_BYTES

        if self.max_upload_mb is None:
            return MAX_BYTES
        return min(MAX_BYTES, self.max_upload_mb * files.MiB)


def model_label(key: str) -> str:
    """A short name for a model key: a folder's or file's name, else the key."""
    return Path(key).name if key.startswith("/") else key


def _parse(name: str, raw: Any, where: str) -> Any:
    try:
        return parse_value(LIMITS[name], where, raw)[0]
    except ValueError as exc:
        raise ConfigError(f"{exc}.") from None


def _flag(raw: Any, where: str) -> bool:
    try:
        return parse_bool(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}={raw!r}: {exc}.") from None


def _file_values(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    if tomllib is None:
        raise ConfigError(f"{path} needs Python 3.11 or later; set the SEMVIZ_ variables instead.")
    try:
        data = tomllib.loads(files.read_text(path, CONFIG_MAX_BYTES))
    except files.FileError as exc:
        raise ConfigError(f"{exc}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} could not be read: {exc}.") from None
    if isinstance(data.get("models"), list):
        data["models"] = ",".join(map(str, data["models"]))
    return {k: v for k, v in data.items() if not isinstance(v, dict)}


def read_config(env: Mapping[str, str] | None = None, file: Path | None = None) -> ServerConfig:
    """The server's configuration from ``env`` (default ``os.environ``) over ``file``.

    Raises ``ConfigError`` (one sentence naming the setting) for a value it cannot use.
    """
    env = os.environ if env is None else env
    values = {
        f"SEMVIZ_{k.upper()}": (v, f"{file or CONFIG_FILE}: {k}")
        for k, v in _file_values(CONFIG_FILE if file is None else file).items()
    }
    for k, v in env.items():
        if k.startswith("SEMVIZ_"):
            values[k] = (v, k)

    def get(name: str) -> tuple[Any, str] | None:
        got = values.get(f"SEMVIZ_{name.upper()}")
        return None if got is None or str(got[0]).strip() == "" else got

    shared = _flag(*get("shared")) if get("shared") else False
    kw: dict[str, Any] = {"shared": shared}
    if get("batch_sessions"):
        kw["batch_sessions"] = _flag(*get("batch_sessions"))
    for name in LIMITS:
        got = get(name)
        if got is not None:
            kw[name] = _parse(name, *got)
        elif shared:
            kw[name] = SHARED_DEFAULTS[name]
    default = get("model")
    kw["default_model"] = model_key(default[0]) if default else DEFAULT_MODEL
    listed = get("models")
    if listed is not None:
        keys = tuple(dict.fromkeys(model_key(m) for m in str(listed[0]).split(",") if m.strip()))
        if default is None:
            kw["default_model"] = keys[0]
        elif kw["default_model"] not in keys:
            raise ConfigError(
                f"{default[1]}={default[0]!r} is not one of the allowed models ({listed[1]})."
            )
        kw["models"] = keys if shared else ()
    elif shared:
        kw["models"] = (kw["default_model"],)
    return ServerConfig(**kw)


@lru_cache(maxsize=8)
def _cached(items: tuple, stamp: float) -> ServerConfig:
    return read_config(dict(items))


def config() -> ServerConfig:
    """This server's configuration (read again when the variables or the file change)."""
    items = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("SEMVIZ_")))
    try:
        stamp = CONFIG_FILE.stat().st_mtime
    except OSError:
        stamp = 0.0
    return _cached(items, stamp)


# -- limits --------------------------------------------------------------------------------------


def upload_limit_mb() -> int:
    """The largest upload this server takes, in MiB: the largest trace it parses."""
    return max(1, -(-config().trace_bytes() // files.MiB))


def apply_upload_limit() -> None:
    """Set Streamlit's own upload limit (``server.maxUploadSize``, which its upload endpoint
    reads on every request) to :func:`upload_limit_mb`: a larger file sent straight to the
    endpoint is refused before it is read into memory, not only by the page's uploader. A
    server setting that cannot be read leaves it as it is (every page says why). The running
    server's upload store keeps at most that much of each session's files
    (:func:`bound_session_uploads`)."""
    from streamlit import config as st_config
    from streamlit import runtime

    try:
        mb = upload_limit_mb()
    except ConfigError:
        return
    if st_config.get_option("server.maxUploadSize") != mb:
        st_config.set_option("server.maxUploadSize", mb)
    if runtime.exists():
        bound_session_uploads(runtime.get_instance().uploaded_file_mgr)


def bound_session_uploads(store: Any) -> None:
    """Make Streamlit's upload store keep at most :func:`upload_limit_mb` of each session's
    files: a new file pushes out the session's older ones.

    The endpoint stores every file PUT to it under any new id until the session ends, and
    checks only each file's size, so a visitor sending files under the limit could fill the
    server's memory. The app's one uploader holds one file at a time, and replaces it by
    uploading the new one first, so dropping the older files takes nothing a page reads.
    """
    add = store.add_file
    if getattr(add, "bounded", False):
        return
    lock = getattr(store, "_lock", None) or contextlib.nullcontext()

    def add_file(session_id: str, file: Any) -> None:
        add(session_id, file)
        try:
            keep = upload_limit_mb() * files.MiB
        except ConfigError:
            keep = 0  # every page stops on the setting: keep the newest file only
        with lock:
            held = list(store.file_storage.get(session_id, {}).items())
        total = sum(len(f.data) for _, f in held)
        for file_id, f in held:  # oldest first
            if total <= keep:
                break
            if file_id != file.file_id:
                store.remove_file(session_id, file_id)
                total -= len(f.data)

    add_file.bounded = True
    store.add_file = add_file


def limit_settings(
    settings: Any, notes: list[str] | None = None, *, asked: Collection[str] = ()
) -> Any:
    """``settings`` (a ``ui.state.Settings``) within this server's limits: a model it does not
    allow becomes its default, step counts come down to ``max_steps``. Each change to a field
    named in ``asked`` (what a link set) adds one sentence to ``notes``; the app's own
    defaults come down silently."""
    cfg = config()
    changes: dict[str, Any] = {}

    def say(name: str, text: str) -> None:
        if notes is not None and name in asked:
            notes.append(text)

    if settings.model.strip() and not cfg.allows(settings.model):
        changes["model"] = ""
        say(
            "model",
            f"Ignored model={settings.model.strip()[:80]!r}: {cfg.refusal()}.",
        )
    for name in ("max_new_tokens", "run_n"):
        value = getattr(settings, name)
        if cfg.cap_steps(value) != value:
            changes[name] = cfg.cap_steps(value)
            say(
                name,
                f"{name}={value} is above this server's limit of {cfg.max_steps} tokens "
                f"a run; using {cfg.max_steps}.",
            )
    return dataclasses.replace(settings, **changes) if changes else settings


def check_model(name: str) -> str:
    """The key of the model ``name`` ('' = the server's default); ``ModelLoadError`` if this
    server does not allow it."""
    cfg = config()
    if not cfg.allows(name):
        raise ModelLoadError(f"Could not load model {name.strip()[:80]!r}: {cfg.refusal()}.")
    return model_key(name.strip() or cfg.default_model)


def prompt_chars() -> int:
    """Characters Generate's prompt box takes: ``CHARS_PER_TOKEN`` per token this server
    reads (``nav.PROMPT_BOX_TOKENS`` without a limit).

    The browser enforces it as the box's ``max_chars`` (with a counter), so a pasted book
    never crosses the websocket or the address. It depends on the server's settings only: a
    box whose limit changed would be reset by Streamlit, losing the typed prompt."""
    from semviz.decoding.decoder import CHARS_PER_TOKEN
    from ui.nav import PROMPT_BOX_TOKENS

    return CHARS_PER_TOKEN * (config().max_prompt_tokens or PROMPT_BOX_TOKENS)


def check_prompt(ids: list[int]) -> list[int]:
    """``ids`` if the prompt is within this server's limit; else ``PromptError``."""
    from semviz.decoding.decoder import PromptError

    limit = config().max_prompt_tokens
    if limit is not None and len(ids) > limit:
        raise PromptError(
            f"The prompt has {len(ids):,} tokens and this server takes at most {limit:,}: "
            "shorten it."
        )
    return ids


# -- the model queue -------------------------------------------------------------------------------


def owner() -> str:
    """Who waits in the model's line: this session (a thread without one: the thread)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)  # a task's thread has none
    return ctx.session_id if ctx is not None else f"thread-{threading.get_ident()}"


class SessionTurns(Turns):
    """A session's place in the model's line for a task's model calls: its turns keep the
    session from being swept, and its decode steps share forwards with other sessions'
    (:func:`step`)."""

    @contextlib.contextmanager
    def turn(self):
        from ui import sessions

        with sessions.busy(self.owner), super().turn() as t:
            yield t

    def step(self, dec: Any, force_token: int | None = None) -> Any:
        return step(dec, force_token, waiting=self._place, who=self.owner)

    def _place(self, place: Place | None) -> None:
        if place is not None:
            self._waiting(place)  # leaves the line with Stopped on a stop request
        elif self.on_wait is not None:
            self.on_wait(None)


def turns(
    who: str | None = None,
    *,
    waiting: Callable[[Place | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> SessionTurns:
    """The place in the model's line of session ``who`` (default this one) for a task's
    model calls (:class:`SessionTurns`). ``waiting`` is told each place while in line (a
    task's thread draws nothing; its panel shows the place)."""
    return SessionTurns(who or owner(), QUEUE, should_stop=should_stop, on_wait=waiting)


def wait_text(place: Place) -> str:
    """What a waiting page says about its place in the line."""
    eta = f", about {place.eta:.0f} s" if place.eta >= 1 else ""
    return f"Waiting for the model: {turns_before(place)}{eta}. Other sessions are using it."


def turns_before(place: Place) -> str:
    """``place`` in words: '3 turns before yours'."""
    n = place.ahead
    return f"{'1 turn' if n == 1 else f'{n} turns'} before yours"


class _Shown:
    """A turn that clears its waiting note whenever it (again) holds the model."""

    def __init__(self, turn, slot: list) -> None:
        self._turn, self._slot = turn, slot

    def let_others(self) -> None:
        self._turn.let_others()
        if self._slot:
            self._slot[0].empty()


def _feed(decoders: list) -> None:
    from semviz.decoding.together import feed_together  # torch: only once a page decodes

    feed_together(decoders)


GATHER = Gather(QUEUE, _feed)  # the sessions' decode steps, fed together


def _on_wait(
    who: str, waiting: Callable[[Place | None], None] | None = None
) -> tuple[Callable[[Place], None], list]:
    """A waiting callback that shows the page's place in line once it has waited a while,
    and the slot it draws in (empty until then). ``waiting(place)`` is told every place too;
    a task's thread, which has no page to draw in, only tells ``waiting``."""
    import streamlit as st
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    slot: list = []
    draws = get_script_run_ctx(suppress_warning=True) is not None

    def on_wait(place: Place) -> None:
        if waiting is not None:
            waiting(place)
        if place.waited < SHOW_WAIT_AFTER or not draws:
            return
        if not slot:
            slot.append(st.empty())
        slot[0].info(wait_text(place), icon=":material/hourglass_top:")

    return on_wait, slot


@contextlib.contextmanager
def model_turn(
    waiting: Callable[[Place | None], None] | None = None, who: str | None = None
) -> Iterator[_Shown]:
    """Hold the model's turn for session ``who``'s work (default this one), waiting in line
    if others hold it.

    While it waits longer than ``SHOW_WAIT_AFTER`` the page shows its place (where the call
    is made: at the top of the page from a button's callback, in place inside a fragment).
    ``waiting`` is called with every place while in line, and with None once the turn is held.
    """
    from ui import sessions

    who = who or owner()
    on_wait, slot = _on_wait(who, waiting)
    with sessions.busy(who), QUEUE.turn(who, on_wait=on_wait) as turn:
        if waiting is not None:
            waiting(None)
        if slot:
            slot[0].empty()
        yield _Shown(turn, slot)


def step(
    dec: Any,
    force_token: int | None = None,
    *,
    waiting: Callable[[Place | None], None] | None = None,
    who: str | None = None,
) -> Any:
    """One ``dec.step()`` in the model's line (its forward shared with other sessions' when
    ``batch_sessions`` is on), for session ``who`` (default this one).

    With ``batch_sessions`` on, the decoder's token is handed to the line's gatherer: the
    sessions that want a token at the same moment are fed as rows of one batched forward
    (``semviz.decoding.together.feed_together``), so eight students playing at once cost about one
    forward a turn, not eight. Otherwise, and for a decoder that cannot share (eviction,
    done), the step takes a turn of its own. Set ``dec.params`` first: the forward reads them.
    ``waiting`` is told the place in line, as for :func:`model_turn`.
    """
    from ui import sessions

    who = who or owner()
    if dec.can_share and config().batch_sessions:
        on_wait, slot = _on_wait(who, waiting)
        with sessions.busy(who):
            GATHER.submit(dec, who, on_wait=on_wait)
        if waiting is not None:
            waiting(None)
        if slot:
            slot[0].empty()
    if dec.fed or dec.done:  # the step runs no model: no turn needed
        return dec.step(force_token=force_token)
    with model_turn(waiting, who):
        return dec.step(force_token=force_token)


def queue_caption() -> str:
    """One line on the server's load: the line at the model and this server's limits."""
    cfg = config()
    state = QUEUE.state()
    busy = (
        f"{state.waiting} waiting for the model"
        if state.waiting
        else "nobody waiting for the model"
    )
    pace = f", a turn takes about {1e3 * state.per_turn:.0f} ms" if state.served else ""
    bits = [f"Shared server: {busy}{pace}."]
    if cfg.max_steps is not None:
        bits.append(f"Up to {cfg.max_steps:,} tokens a run")
    if cfg.max_prompt_tokens is not None:
        bits.append(f"{cfg.max_prompt_tokens:,} prompt tokens")
    if cfg.idle_minutes is not None:
        bits.append(f"an idle run is closed after {cfg.idle_minutes:g} min")
    return bits[0] + (" " + ", ".join(bits[1:]) + "." if len(bits) > 1 else "")
