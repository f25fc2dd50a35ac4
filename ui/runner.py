"""The session's decoder: build it from the settings, step it, rewind it.

Nothing here touches the shared model beyond reading it: every session's ``Decoder`` owns
its cache and seeded generator, so sessions stepping at once never see each other.
A failed build (empty prompt, unknown model, prompt too long) raises a user error and leaves
the session's current decoder and trace untouched. Model work takes its turn in the server's
one queue (``server.model_turn``), a token at a time, within the server's limits.
"""

from __future__ import annotations

import time

from semviz.decoding import Decoder, DecodeSettings, encode_prompt
from ui import kv, server
from ui.model import get_model
from ui.state import SessionData, Settings


def build_decoder(settings: Settings) -> Decoder:
    """A fresh decoder for ``settings`` (prefill included). Raises user errors."""
    lm = get_model(settings.model_name())
    params = settings.prune_params()
    policy = kv.make_policy(settings.kv_policy, settings.kv_budget)
    steps = server.config().cap_steps(settings.max_new_tokens)
    dec_settings = DecodeSettings(seed=int(settings.seed), max_new_tokens=steps, chat=settings.chat)
    ids = server.check_prompt(encode_prompt(lm, settings.prompt, settings.chat))
    with server.model_turn():
        return Decoder(lm, settings.prompt, params, dec_settings, eviction=policy, prompt_ids=ids)


def ensure_decoder(sess: SessionData, settings: Settings) -> Decoder:
    """The session's decoder, rebuilt when the prompt, model, seed or cache policy changed."""
    key = settings.run_key()
    if sess.decoder is None or sess.run_key != key:
        dec = build_decoder(settings)  # raises before anything is replaced
        sess.decoder, sess.run_key = dec, key
        sess.selected = None
        sess.extra.pop("whatif", None)
    return sess.decoder


def is_stale(sess: SessionData, settings: Settings) -> bool:
    """True when the next step would start a new run (prompt, model, seed… changed)."""
    return sess.decoder is not None and sess.run_key != settings.run_key()


def step(sess: SessionData, settings: Settings, n: int = 1) -> int:
    """Decode up to ``n`` tokens with the current sliders; returns how many were made."""
    dec = ensure_decoder(sess, settings)
    dec.params = settings.prune_params()
    with server.model_turn() as turn:
        made = len(dec.run(n, on_step=lambda _rec: turn.let_others()))
    sess.selected = None
    return made


def step_for(sess: SessionData, settings: Settings, seconds: float, limit: int) -> int:
    """Decode for about ``seconds`` (at least one token), at most ``limit`` tokens."""
    dec = ensure_decoder(sess, settings)
    dec.params = settings.prune_params()
    t0 = time.perf_counter()
    made = 0
    with server.model_turn() as turn:
        while made < limit and not dec.done:
            if dec.step() is None:
                break
            made += 1
            if time.perf_counter() - t0 >= seconds:
                break
            turn.let_others()
    sess.selected = None
    return made


def reset(sess: SessionData, settings: Settings) -> None:
    """Start over: a new decoder from the current settings (prefill only)."""
    dec = build_decoder(settings)
    sess.decoder, sess.run_key = dec, settings.run_key()
    sess.selected = None
    sess.playing = False
    sess.run_target = None
    sess.extra.pop("whatif", None)


def rewind(sess: SessionData, settings: Settings, k: int) -> None:
    """Keep the first ``k`` steps; the next step continues with the current sliders."""
    if sess.decoder is None:
        return
    with server.model_turn():  # with eviction, rewinding re-feeds the kept steps
        sess.decoder.rewind(int(k), settings.prune_params())
    sess.selected = None
    sess.playing = False


def regenerate_from(sess: SessionData, settings: Settings, k: int, n: int | None = None) -> int:
    """Rewind to step ``k`` with the current sliders and decode ``n`` steps (default: as many as
    were there before)."""
    dec = sess.decoder
    if dec is None:
        return 0
    total = dec.n_steps
    with server.model_turn() as turn:
        dec.rewind(int(k), settings.prune_params())
        made = len(
            dec.run(max(1, (total - k) if n is None else n), on_step=lambda _r: turn.let_others())
        )
    sess.selected = int(k) if k < dec.n_steps else None
    return made
