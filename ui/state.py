"""Every control the pages share, in one frozen dataclass, and the session's own state.

``Settings`` is the single source of truth for what the sidebar shows, and it declares almost
nothing itself. Its run fields (model, chat, seed, the KV policy and budget, max new tokens)
are ``semviz.decoding.settings.RunSettings``'s, which the CLI's flags read too, so a range is
the same in the sidebar, the URL and the CLI; only the prompt, the preset and Run N are the
app's own. Its sampling fields are the ``PruneParams`` fields whose metadata gives an app
widget (see ``semviz.sampling.params``), with that metadata's range, help, label and app
default. A field added there with a widget appears in ``Settings``, the sidebar and the URL
without an edit here.

Widgets are keyed ``s_<field>`` in ``st.session_state``; the sidebar is drawn by ``app.py``
on every rerun, so its values survive page switches. ``Settings.to_query_params`` /
``from_query_params`` give a shareable URL (out-of-range numbers are clamped to the widget's
range, with a note); ``Settings.prune_params`` builds the frozen core parameters.

``SessionData`` holds what one browser session owns, one typed field each: its run (decoder,
branches, long task, ghost), the selected step, its messages, what its link asked for, the
pages' caches and results. The model itself is shared (see ``ui.model``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any

from semviz.decoding.settings import RunSettings
from semviz.model.load import model_key
from semviz.sampling import SPECS, FieldSpec, PruneParams, parse_value, setting
from semviz.sampling.presets import PRESETS
from ui.server import config, limit_settings

KEY_PREFIX = "s_"
DEFAULT_PROMPT = "Write one sentence about the sea."

COUNT = FieldSpec("int", lo=0)  # a step index or a number of steps in a link

# the sampling fields the app shows, in PruneParams' order
PARAM_FIELDS: tuple[str, ...] = tuple(name for name, spec in SPECS.items() if spec.app)


def default_model_name() -> str:
    """The model the app opens with: ``$SEMVIZ_MODEL`` if set, else the offline default (or
    the first allowed model of a shared server, see ``ui.server``)."""
    return config().default_model


IMPOSED = "settings_imposed"  # session_state flag: the next run forces every widget key


def url_count(name: str, raw: Any, notes: list[str] | None = None) -> int | None:
    """A count from a link (``step``, ``steps``): a whole number, at least 0. None when
    ``raw`` is None or not a number; a value out of range or unreadable adds one sentence
    to ``notes``."""
    if raw is None:
        return None
    try:
        value = parse_value(COUNT, name, raw, clamp=True)
    except ValueError:
        value, note = None, f"Ignored {name}={str(raw)[:40]!r}: expected a whole number, 0 or more."
    else:
        value, note = value
    if note is not None and notes is not None:
        notes.append(note)
    return value


def spec_of(name: str) -> FieldSpec:
    """The metadata of the ``Settings`` field ``name``."""
    return Settings.__dataclass_fields__[name].metadata["spec"]


def _run_field(name: str, **app: Any) -> tuple[str, Any, Any]:
    """A ``Settings`` field for ``RunSettings.<name>``, the run's one declaration (range, help,
    label, app default), with ``app`` changing its spec where the sidebar differs."""
    f = RunSettings.__dataclass_fields__[name]
    spec = replace(f.metadata["spec"], **app)
    default = spec.app_default if spec.default_in_app else f.default
    return name, f.type, field(default=default, metadata={"spec": spec})


# The controls that are not sampling parameters, in the sidebar's order: the run's fields
# from ``RunSettings`` and the app's own (the prompt, the preset, Run N).
_RUN_FIELDS = [
    _run_field("model"),
    ("prompt", str, setting(DEFAULT_PROMPT, "The text the model continues.", label="Prompt")),
    _run_field(  # a toggle: on or off
        "chat",
        optional=False,
        note="",
        app_default=True,
        help="Wrap the prompt in the model's chat template.",
    ),
    (
        "preset",
        str,
        setting(
            "custom",
            "Sets the sliders below to a scenario's parameters.",
            choices=("custom", *PRESETS),
            label="Scenario preset",
        ),
    ),
    _run_field("kv_policy"),
    _run_field("kv_budget"),
    _run_field("seed"),
    (
        "run_n",
        int,
        setting(
            32, "Tokens one press of Run adds.", lo=1, hi=2048, app=(1, 2048, 1), label="Run N"
        ),
    ),
    _run_field("max_new_tokens"),
]


@dataclass(frozen=True)
class _RunSettings:
    """What every ``Settings`` can do (its fields are ``_RUN_FIELDS`` and the sliders)."""

    # -- core parameters -------------------------------------------------------------------
    def prune_params(self) -> PruneParams:
        """The frozen core parameters; ``ValueError`` naming the field if out of range."""
        return PruneParams(**{name: getattr(self, name) for name in PARAM_FIELDS})

    def model_name(self) -> str:
        """The name handed to ``load_model``: the typed name, else the app default."""
        return self.model.strip() or default_model_name()

    def run_key(self) -> tuple:
        """What a decoder is built from: changing any of these starts a new run."""
        return (
            model_key(self.model_name()),  # "dir" and "dir/" are one model
            self.prompt,
            self.chat,
            int(self.seed),
            self.kv_policy,
            int(self.kv_budget) if self.kv_policy != "none" else 0,
            int(self.max_new_tokens),
        )

    def with_params(self, p: PruneParams) -> Settings:
        """These settings with the slider fields taken from ``p`` (used by presets)."""
        return replace(self, **{name: getattr(p, name) for name in PARAM_FIELDS})

    # -- session_state -----------------------------------------------------------------------
    @classmethod
    def from_state(cls, state: Any) -> Settings:
        """Read the widgets (``s_<field>``) from ``st.session_state``; defaults where unset
        or of the wrong type. Ranges are checked by :meth:`prune_params`."""
        kw = {}
        for f in fields(cls):
            key = KEY_PREFIX + f.name
            if key in state:
                try:
                    kw[f.name] = f.metadata["spec"].coerce(state[key])
                except ValueError:
                    continue
        return cls(**kw)

    def seed_state(self, state: Any, *, overwrite: bool = False) -> None:
        """Write these values into the widget keys that are missing or hold another value, or
        with ``overwrite`` into every key.

        Writing a key makes Streamlit force that value onto the widget in the browser. Done on
        every run, that undid slider steps the user took while a run was drawing (an arrow key
        held down lost steps), so ``init_state`` forces every key only where the browser may
        hold older values: on a page's first run, and after the app chose settings
        (``impose``)."""
        for f in fields(self):
            key, value = KEY_PREFIX + f.name, getattr(self, f.name)
            if overwrite or key not in state or state[key] != value:
                state[key] = value

    def impose(self, state: Any) -> None:
        """Settings chosen by the app, not by the widgets (an example, the tour, a preset):
        written into every widget key now, and again by the next run's ``init_state``, since a
        page switch can follow at once and the browser then sends its widgets' older values."""
        self.seed_state(state, overwrite=True)
        state[IMPOSED] = True

    # -- query params ------------------------------------------------------------------------
    def to_query_params(self) -> dict[str, str]:
        """Only the fields that differ from the defaults (within this server's limits), as
        strings (for ``st.query_params``)."""
        base = limit_settings(type(self)())
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v != getattr(base, f.name):
                out[f.name] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out

    @classmethod
    def from_query_params(cls, qp: Any, notes: list[str] | None = None) -> Settings:
        """Settings from a mapping of strings. Unknown keys are ignored; a value that does not
        parse keeps the default, a number out of range is clamped to the widget's range, and
        each such change adds one sentence to ``notes``."""
        kw = {}
        for f in fields(cls):
            if f.name not in qp:
                continue
            try:
                value, note = parse_value(
                    f.metadata["spec"], f.name, qp[f.name], clamp=True, app=True
                )
            except ValueError as exc:
                note, value = f"Ignored {exc}.", None
            else:
                kw[f.name] = value
            if note is not None and notes is not None:
                notes.append(note)
        return cls(**kw)


def _param_field(name: str) -> tuple[str, Any, Any]:
    """A ``Settings`` field for ``PruneParams.<name>``: its type, app default and metadata."""
    spec = SPECS[name]
    default = (
        spec.app_default if spec.default_in_app else PruneParams.__dataclass_fields__[name].default
    )
    ptype = PruneParams.__dataclass_fields__[name].type
    return name, ptype, field(default=default, metadata={"spec": spec})


Settings = make_dataclass(
    "Settings",
    [*_RUN_FIELDS, *(_param_field(n) for n in PARAM_FIELDS)],
    bases=(_RunSettings,),
    frozen=True,
)
Settings.__module__ = __name__
Settings.__doc__ = """The shared controls. Field names are the widget keys without the ``s_``
prefix: the run fields (``_RUN_FIELDS``), then every ``PruneParams`` field with an app
widget (``PARAM_FIELDS``)."""


@dataclass
class Link:
    """What the link that opened the session asked for, until the run has it."""

    read: bool = False  # the session's first page run has read the link
    step: int | None = None  # the step to select once the run has that many
    steps: int | None = None  # the run's length while it is being reproduced
    written: dict | None = None  # the query this session's pages last wrote (Back differs)


@dataclass
class SessionData:
    """What one browser session owns. Lives at ``st.session_state["semviz"]``.

    The run (``decoder``, ``branches``, ``ghost``, ``view``) changes only through
    ``ui.runner``; the pages' own results and caches have a field each.
    """

    # the run
    decoder: Any = None  # a semviz Decoder, or a ui.runner.TraceRun (a recording)
    run_key: tuple | None = None  # Settings.run_key() the decoder was built for
    branches: list = field(default_factory=list)  # ui.runner.Branch, the run itself first
    branch: int = 0  # the branch on show
    ghost: Any = None  # ui.runner.Ghost: the what-if continuation
    view: Any = None  # the trace as the run's task last kept it, while the task runs
    # what the user sees of it
    selected: int | None = None  # selected step index (None: the latest)
    error: str | None = None  # last user-facing error, shown until the next success
    notice: str | None = None  # shown once
    link: Link = field(default_factory=Link)
    rerun_app: bool = False  # a click inside the token strip: the whole page follows it
    step_clicks: int = 0  # Step clicks acted on (ui.clicks counts them in the browser)
    replay_memo: dict = field(default_factory=dict)  # semviz.analysis.replay.cached's store
    strip_cards: dict[int, dict] = field(default_factory=dict)  # hover cards by step
    # the pages' own work
    compare_sides: tuple[str, str] = (  # Compare's two specs, kept across pages
        "top_p=0.9",
        "top_p=0.9,gravity_lambda=0.5,gravity_mode=rerank",
    )
    tasks: dict = field(default_factory=dict)  # ui.work: the session's long work, by name
    report_trace: Any = None  # Report: the saved trace it read
    report_from: tuple | None = None  # ("upload", file id) or ("path", path, mtime) it came from
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)  # ui.runner

    @property
    def trace(self):
        """The run's trace as the pages draw it: while a task decodes the run, the copy the
        task kept after its last token (which no later token changes)."""
        if self.decoder is None:
            return None
        return self.view if self.view is not None else self.decoder.trace

    @property
    def job(self):
        """The run's task (``ui.runner.RunTask``) until the page has kept its end."""
        s = self.tasks.get("run")
        return None if s is None else s.task

    def selected_step(self) -> int | None:
        """The selected step clamped to the trace, or the latest step; None with no steps."""
        tr = self.trace
        if tr is None or not tr.steps:
            return None
        n = len(tr.steps)
        if self.selected is None:
            return n - 1
        return max(0, min(int(self.selected), n - 1))


SESSION_KEY = "semviz"


def session(state: Any) -> SessionData:
    """This browser session's ``SessionData`` (created on first use)."""
    if SESSION_KEY not in state:
        state[SESSION_KEY] = SessionData()
    return state[SESSION_KEY]


# -- what a link carries of its run beyond the settings ----------------------------------------
# ``rec.<field>``: the run's sliders where they differ from the link's (a what-if: the run was
# recorded at these, the page views it at the link's); ``take=k.t1.t2…``: a branch, whose
# tokens from step k on are taken as they were (the steps before k are the seed's).

REC = "rec."


def _as_query(v: Any) -> str:
    return ("1" if v else "0") if isinstance(v, bool) else str(v)


def run_query(recorded: PruneParams | None, viewing: PruneParams | None, take) -> dict[str, str]:
    """The query keys for a run recorded at ``recorded`` and viewed at ``viewing``, on the
    branch ``take`` ((k, tokens) or None)."""
    out = {}
    if recorded is not None and viewing is not None and recorded != viewing:
        for name in PARAM_FIELDS:
            if getattr(recorded, name) != getattr(viewing, name):
                out[REC + name] = _as_query(getattr(recorded, name))
    if take is not None and take[1]:
        out["take"] = ".".join(str(int(t)) for t in (take[0], *take[1]))
    return out


def read_run_query(
    qp: Any, viewing: Settings, vocab: int, notes: list[str]
) -> tuple[PruneParams | None, dict[int, int]]:
    """What :func:`run_query` wrote, read back: the recorded sliders (None: the link's own)
    and the tokens to take by step. A value it cannot use is dropped with a note."""
    rec = {k[len(REC) :]: qp[k] for k in qp if k.startswith(REC)}
    params = None
    if rec:
        unknown = sorted(set(rec) - set(PARAM_FIELDS))
        if unknown:
            notes.append(f"Ignored {', '.join(REC + u for u in unknown)}: not a slider.")
        known = {k: v for k, v in rec.items() if k in PARAM_FIELDS}
        got = Settings.from_query_params(known, notes)
        try:
            params = replace(viewing, **{k: getattr(got, k) for k in known}).prune_params()
        except ValueError as exc:
            notes.append(f"Ignored the run's recorded sliders: {exc}")
    takes: dict[int, int] = {}
    raw = str(qp.get("take") or "")
    if raw:
        try:
            k, *toks = (int(x) for x in raw.split("."))
            if k < 0 or not toks or any(not 0 <= t < vocab for t in toks):
                raise ValueError
            takes = {k + i: t for i, t in enumerate(toks)}
        except ValueError:
            notes.append(
                "Ignored take: expected a step and the token ids taken from it, as "
                "take=5.1234.42, each id below the model's vocabulary."
            )
    return params, takes
