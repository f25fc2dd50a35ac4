"""Every control the pages share, in one frozen dataclass, and the session's own state.

``Settings`` is the single source of truth for what the sidebar shows. Widgets are keyed
``s_<field>`` in ``st.session_state``; the sidebar is drawn by ``app.py`` on every rerun, so
its values survive page switches. ``Settings.to_query_params`` / ``from_query_params`` give a
shareable URL; ``Settings.prune_params`` builds the frozen core parameters.

``SessionData`` holds what one browser session owns: its decoder, the selected step, play
state, the last error and cached what-if results. The model itself is shared (see
``ui.model``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from semviz.pruning import PruneParams

KEY_PREFIX = "s_"

ADAPTIVE_MODES = ("none", "target", "edt", "dynatemp", "mirostat")
MASS_SOURCES = ("attention", "ema", "uniform", "idf", "norm", "info")
SIMILARITIES = ("cosine", "dot")
GRAVITY_SPACES = ("embedding", "hidden", "contextual")
GRAVITY_MODES = ("full", "rerank")
GRAVITY_KINDS = ("pull", "contrast")
CHOICES = {
    "adaptive": ADAPTIVE_MODES,
    "gravity_kind": GRAVITY_KINDS,
    "gravity_mass": MASS_SOURCES,
    "gravity_sim": SIMILARITIES,
    "gravity_space": GRAVITY_SPACES,
    "gravity_mode": GRAVITY_MODES,
}
DEFAULT_PROMPT = "Write one sentence about the sea."


def default_model_name() -> str:
    """The model the app opens with: ``$SEMVIZ_MODEL`` if set, else the offline default."""
    return os.environ.get("SEMVIZ_MODEL", "").strip()


@dataclass(frozen=True)
class Settings:
    """The shared controls. Field names are the widget keys without the ``s_`` prefix."""

    model: str = ""
    prompt: str = DEFAULT_PROMPT
    chat: bool = True
    preset: str = "custom"
    temperature: float = 0.8
    adaptive: str = "none"
    target_entropy: float = 2.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    gravity_lambda: float = 0.0
    # the other gravity controls start at the core's recommended gravity
    gravity_kind: str = PruneParams.gravity_kind
    gravity_mass: str = PruneParams.gravity_mass
    gravity_sim: str = PruneParams.gravity_sim
    gravity_space: str = PruneParams.gravity_space
    gravity_mode: str = PruneParams.gravity_mode
    free_energy: bool = False
    free_energy_kappa: float = 1.0
    fallback: bool = False
    kv_policy: str = "none"
    kv_budget: int = 256
    seed: int = 0
    run_n: int = 32
    max_new_tokens: int = 512

    # -- core parameters -------------------------------------------------------------------
    def prune_params(self) -> PruneParams:
        """The frozen core parameters; ``ValueError`` naming the field if out of range."""
        return PruneParams(
            temperature=float(self.temperature),
            top_k=int(self.top_k),
            top_p=float(self.top_p),
            min_p=float(self.min_p),
            typical_p=float(self.typical_p),
            gravity_lambda=float(self.gravity_lambda),
            gravity_kind=self.gravity_kind,
            gravity_mass=self.gravity_mass,
            gravity_sim=self.gravity_sim,
            gravity_space=self.gravity_space,
            gravity_mode=self.gravity_mode,
            free_energy=bool(self.free_energy),
            free_energy_kappa=float(self.free_energy_kappa),
            adaptive=self.adaptive,
            target_entropy=float(self.target_entropy),
            fallback=bool(self.fallback),
        )

    def model_name(self) -> str:
        """The name handed to ``load_model``: the typed name, else the app default."""
        return self.model.strip() or default_model_name()

    def run_key(self) -> tuple:
        """What a decoder is built from: changing any of these starts a new run."""
        return (
            self.model_name(),
            self.prompt,
            self.chat,
            int(self.seed),
            self.kv_policy,
            int(self.kv_budget) if self.kv_policy != "none" else 0,
            int(self.max_new_tokens),
        )

    def with_params(self, p: PruneParams) -> Settings:
        """These settings with the slider fields taken from ``p`` (used by presets)."""
        names = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in p.to_dict().items() if k in names})

    # -- session_state -----------------------------------------------------------------------
    @classmethod
    def from_state(cls, state: Any) -> Settings:
        """Read the widgets (``s_<field>``) from ``st.session_state``; defaults where unset."""
        base = cls()
        kw = {}
        for f in fields(cls):
            key = KEY_PREFIX + f.name
            if key in state:
                kw[f.name] = _coerce(getattr(base, f.name), state[key])
        return replace(base, **kw)

    def seed_state(self, state: Any, *, overwrite: bool = False) -> None:
        """Write these values into the widget keys (missing keys only unless ``overwrite``)."""
        for f in fields(self):
            key = KEY_PREFIX + f.name
            if overwrite or key not in state:
                state[key] = getattr(self, f.name)

    # -- query params ------------------------------------------------------------------------
    def to_query_params(self) -> dict[str, str]:
        """Only the fields that differ from the defaults, as strings (for ``st.query_params``)."""
        base = Settings()
        out = {}
        for k, v in asdict(self).items():
            if v != getattr(base, k):
                out[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out

    @classmethod
    def from_query_params(cls, qp: Any) -> Settings:
        """Settings from a mapping of strings; unknown keys and unparsable values are ignored."""
        base = cls()
        kw = {}
        for f in fields(cls):
            if f.name in qp:
                raw = qp[f.name]
                try:
                    v = _coerce(getattr(base, f.name), raw)
                except (TypeError, ValueError):
                    continue
                if f.name in CHOICES and v not in CHOICES[f.name]:
                    continue
                kw[f.name] = v
        return replace(base, **kw)


def _coerce(default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)
    if isinstance(default, int):
        return int(float(value))
    if isinstance(default, float):
        return float(value)
    return "" if value is None else str(value)


@dataclass
class SessionData:
    """What one browser session owns. Lives at ``st.session_state["semviz"]``."""

    decoder: Any = None  # semviz.decoding.Decoder
    run_key: tuple | None = None
    selected: int | None = None  # selected step index (None: the latest)
    playing: bool = False
    run_target: int | None = None  # stop playing when the trace reaches this many steps
    error: str | None = None  # last user-facing error, shown until the next success
    notice: str | None = None
    whatif: Any = None  # ui.whatif.WhatIf cache
    kv_eval: Any = None  # last kv-eval result
    prefill_scan: Any = None  # measured prefill time vs prompt length
    extra: dict = field(default_factory=dict)

    @property
    def trace(self):
        return None if self.decoder is None else self.decoder.trace

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
