"""An instrumented decoder: prefill once, then one token per ``step()``, recording everything.

Each ``Decoder`` owns its KV cache, its seeded ``torch.Generator`` and its trace. The model is
shared and never modified beyond selecting the capturing sdpa implementation (which is plain
sdpa unless a per-call sink is passed), so decoders over one model can interleave freely.

Sampling draws exactly one uniform number per step from the decoder's generator and hands it
to the pruning core (``sampling.choose``). The draw is recorded, so a replay with other settings
uses the same randomness (common random numbers) and differences come from the settings alone.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from semviz import gravity, sampling
from semviz.model.capture import LensCapture, enable_capture
from semviz.model.forward import Forward, cache_nbytes, forward
from semviz.model.load import LoadedModel
from semviz.output.trace import ATTENTION_METRICS, StepRecord, Trace
from semviz.sampling.tail import summarize as summarize_tail

RECORD_K = 1024


class PromptError(ValueError):
    """A prompt the decoder cannot run; the message is one sentence for the user."""


@dataclass(frozen=True)
class DecodeSettings:
    """Run settings that are not pruning parameters."""

    seed: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    chat: bool | None = None  # None: use the chat template when the tokenizer has one
    system_prompt: str | None = None
    capture: bool = True  # record last-query attention
    record_k: int = RECORD_K
    # record what the logit lens, direct logit attribution and the attention metrics read
    # (semviz.analysis.lens): the residual stream and head outputs at the last position
    lens: bool = True
    # record every raw logit of each step (float32, 4 bytes a vocabulary entry: 196 KB a step
    # on the default model, about one step's attention), so that a replay with new settings
    # picks what a live decode picks even where the draw lands outside the candidates
    full_logits: bool = True

    def to_dict(self) -> dict:
        return {
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "stop": list(self.stop),
            "chat": self.chat,
            "system_prompt": self.system_prompt,
            "capture": self.capture,
            "record_k": self.record_k,
            "lens": self.lens,
            "full_logits": self.full_logits,
        }


CHARS_PER_TOKEN = 16  # a prompt's characters per token the model reads, checked before tokenising


def check_prompt_text(text: str, max_chars: int, what: str = "The prompt") -> None:
    """Refuse, in one sentence, text longer than ``max_chars`` characters (before it is
    tokenised, which costs time and memory by the character) or holding a lone surrogate
    (no tokenizer, UTF-8 file or browser takes one)."""
    if len(text) > max_chars:
        raise PromptError(
            f"{what} is {len(text):,} characters, more than the {max_chars:,} semviz reads: "
            "shorten it."
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PromptError(
                f"{what} holds a lone surrogate (U+{ord(text[exc.start]):04X} at character "
                f"{exc.start:,}), which is not text: remove it."
            ) from None


def encode_prompt(
    lm: LoadedModel, prompt: str, chat: bool | None = None, system_prompt: str | None = None
) -> list[int]:
    """Token ids for ``prompt``, through the chat template when ``chat`` (default: if present).

    The text is checked before it is tokenised (:func:`check_prompt_text`): at most
    ``CHARS_PER_TOKEN`` characters per token the model reads, and valid Unicode.
    """
    if prompt is None or not prompt.strip():
        raise PromptError("The prompt is empty: type some text for the model to continue.")
    check_prompt_text(prompt, CHARS_PER_TOKEN * lm.max_context, "The prompt")
    if system_prompt:
        check_prompt_text(system_prompt, CHARS_PER_TOKEN * lm.max_context, "The system prompt")
    tok = lm.tokenizer
    use_chat = lm.is_chat if chat is None else chat
    if use_chat and not lm.is_chat:
        raise PromptError(f"{lm.name} has no chat template: turn the chat template off.")
    if use_chat:
        msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
        msgs.append({"role": "user", "content": prompt})
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
    else:
        ids = tok(prompt, add_special_tokens=True)["input_ids"]
    if len(ids) + 1 > lm.max_context:
        raise PromptError(
            f"The prompt is {len(ids):,} tokens, and {lm.name} reads at most "
            f"{lm.max_context:,} with the token it writes: shorten it to "
            f"{lm.max_context - 1:,} tokens or fewer."
        )
    return list(ids)


@dataclass
class _Forward:
    logits: torch.Tensor  # (V,) float32
    hidden: torch.Tensor  # (T, d) final normed hidden states of the new positions
    attention: torch.Tensor | None  # (L, H, S) float32 last-query attention
    positions: list[torch.Tensor]  # per layer, the original positions this forward read
    seconds: float  # the model: base forward and LM head
    gravity: torch.Tensor | None = None  # (V,) normalised G for these logits
    semviz_seconds: float = 0.0  # gravity's own work inside the head (pull vector, z-score)
    lens: LensCapture | None = None  # a batch of one: what the logit lens reads


@dataclass
class _Snapshot:
    """Per-step state needed to rewind without re-running the model."""

    sampler: sampling.SamplerState
    ema: torch.Tensor | None
    n_positions: int = 0
    extra: dict = field(default_factory=dict)


class Decoder:
    """Prefill a prompt, then decode one token per ``step()``.

    Parameters
    ----------
    lm : a ``LoadedModel`` from ``semviz.load_model``
    prompt : the user's text
    params : pruning parameters (``sampling.PruneParams``), default plain sampling at T=1
    settings : seed, stop conditions, chat template, capture
    eviction : optional KV-cache policy (``semviz.eviction``) applied after every forward

    Examples
    --------
    >>> lm = load_model()  # doctest: +SKIP
    >>> d = Decoder(lm, "The capital of France is", PruneParams(temperature=0))  # doctest: +SKIP
    >>> d.run(8); d.trace.text  # doctest: +SKIP
    """

    def __init__(
        self,
        lm: LoadedModel,
        prompt: str,
        params: sampling.PruneParams | None = None,
        settings: DecodeSettings | None = None,
        *,
        eviction=None,
        prompt_ids: Sequence[int] | None = None,
    ) -> None:
        self.lm = lm
        self.params = params or sampling.PruneParams()
        self.settings = settings or DecodeSettings()
        if self.settings.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self._check_params(self.params)
        self.eviction = eviction
        self.prompt = prompt
        if prompt_ids is not None:
            if len(prompt_ids) == 0:
                raise PromptError("The prompt is empty: type some text for the model to continue.")
            self.prompt_ids = list(prompt_ids)
        else:
            self.prompt_ids = encode_prompt(
                lm, prompt, self.settings.chat, self.settings.system_prompt
            )
        enable_capture(lm.model)
        tok = lm.tokenizer
        # which prompt positions are template, system prompt or the user's text (gravity)
        self.prompt_roles = gravity.prompt_roles(tok, self.prompt_ids)
        eos = getattr(lm.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = tok.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._on_device = lm.device
        self._reset()

    # -- state ---------------------------------------------------------------------------
    def _reset(self) -> None:
        cfg = self.lm.model.config
        self.cache = self.lm.new_cache()  # every layer keeps every entry
        self.generator = torch.Generator(device="cpu").manual_seed(int(self.settings.seed))
        self.sampler = sampling.SamplerState()
        self.ids: list[int] = list(self.prompt_ids)
        n = len(self.ids)
        # original positions held by each layer's cache; _forward appends, eviction removes
        self.positions: list[torch.Tensor] = [
            torch.empty(0, dtype=torch.long) for _ in range(cfg.num_hidden_layers)
        ]
        self._hidden_buf: torch.Tensor | None = None  # (capacity, d), grown by doubling
        self._hidden_len = 0
        # (T,) gravity's attention EMA by absolute position (mass "ema"), kept by _head
        self.attn_ema: torch.Tensor | None = None
        self.done = False
        self.stop_reason: str | None = None
        self._snapshots: list[_Snapshot] = []
        # the batch this decoder last stepped in (semviz.decoding.together._SharedRows)
        self._rows = None
        tokens = [self.lm.tokenizer.decode([i]) for i in self.prompt_ids]
        self.trace = Trace(
            settings={"params": self.params.to_dict(), **self.settings.to_dict()},
            model=self.lm.summary(),
            prompt=self.prompt,
            prompt_ids=list(self.prompt_ids),
            prompt_tokens=tokens,
            prompt_hex={
                str(i): h
                for i, t in enumerate(self.prompt_ids)
                if (h := token_hex(self.lm.tokenizer, t)) is not None
            },
        )
        self.trace.extra["prompt_roles"] = self.prompt_roles.tolist()  # replay's gravity reads it
        if self.eviction is not None:
            self.eviction.reset(self)
            self.trace.settings["eviction"] = self.eviction.to_dict()
        fw = self._forward(self.prompt_ids, list(range(n)))
        self.trace.prefill_seconds = fw.seconds
        self._pending = fw
        self._after_forward(fw)

    @property
    def n_steps(self) -> int:
        return len(self.trace.steps)

    @property
    def fed(self) -> bool:
        """True when the next step's logits are ready (its token fed): ``step()`` runs no model."""
        return self._pending is not None

    @property
    def can_share(self) -> bool:
        """True when this decoder's next forward can be a row of a batch
        (:func:`feed_together`): not done, not yet fed, no eviction between tokens."""
        return not self.done and self._pending is None and self.eviction is None

    def _forward(
        self,
        token_ids: list[int],
        positions: list[int],
        *,
        shared: tuple[Forward, int] | None = None,
    ) -> _Forward:
        """Run the model on new tokens with this decoder's cache; capture the last query.

        ``shared`` is ``(forward, row)`` when the model already ran this decoder as a row of
        a batch (:func:`step_together`): only this row's head is left to compute, and the
        row's share of the batch's time counts as its forward time.
        """
        dev = self._on_device
        lens = self.settings.lens
        capture = self.settings.capture or self._needs_attention() or lens
        t0 = time.perf_counter()
        if shared is None:
            ids = torch.tensor([token_ids], dtype=torch.long, device=dev)  # (1, T)
            pos = torch.tensor([positions], dtype=torch.long, device=dev)  # (1, T)
            out = forward(self.lm.model, ids, pos, self.cache, capture=capture, lens=lens)
            row, share = 0, 0.0
        else:
            out, row = shared
            share = out.seconds / out.hidden.shape[0]
        h = out.hidden[row]  # (T, d)
        new = torch.tensor(positions, dtype=torch.long)
        self.positions = [torch.cat([p, new]) for p in self.positions]
        attn = out.attention[:, row] if capture and out.attention is not None else None  # (L, H, S)
        with torch.inference_mode():
            logits, g, t_sem = self._head(h, attn)  # (V,), (V,) or None
        # the sampling chain and the record work on the CPU, wherever the model runs
        logits, g = logits.cpu(), None if g is None else g.cpu()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return _Forward(
            logits=logits,
            hidden=h.float(),
            attention=attn,
            positions=list(self.positions),
            seconds=time.perf_counter() - t0 - t_sem + share,
            gravity=g,
            semviz_seconds=t_sem,
            lens=out.lens.row(row) if lens and out.lens is not None else None,
        )

    def _head(
        self, h: torch.Tensor, attention: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """Logits for the last position, gravity ``G`` when it is on, and the seconds spent
        on gravity's own work (everything but the LM head's share). (V,), (V,) or None, float

        The gravity kind computes the logits from the last hidden state itself, so a pull
        can share the LM head's pass over its weight (:func:`semviz.gravity.compute`).
        """
        model, p = self.lm.model, self.params
        if p.gravity_lambda == 0:
            return model.get_output_embeddings()(h[-1:])[0].float(), None, 0.0
        t0 = time.perf_counter()
        reads = gravity.reads(p)
        pos = self.union_positions()  # (S,) the context this query read
        hidden = None
        if "hidden" in reads:
            prev = self.hidden
            hidden = h.float() if prev is None else torch.cat([prev, h.float()])  # (T, d)
        att = None
        if "attention" in reads and attention is not None:
            att = self._attention_on(attention, pos)  # (L, H, S)
        ctx = gravity.GravityContext(
            ids=torch.tensor(self.ids, dtype=torch.long),
            positions=pos,
            roles=self.prompt_roles,
            attention=att,
            hidden=hidden,
            ema=self.attn_ema,
        )
        out = gravity.compute(model, p, [gravity.GravityStep(ctx=ctx, head=h[-1])])[0]
        if out.ema is not None:
            self.attn_ema = out.ema  # (T,) by absolute position, so eviction cannot misalign it
        return out.logits, out.gravity, time.perf_counter() - t0 - out.head_seconds

    @property
    def hidden(self) -> torch.Tensor | None:
        """Final normed hidden states of every fed position (T, d); None before the prefill."""
        return None if self._hidden_buf is None else self._hidden_buf[: self._hidden_len]

    def _append_hidden(self, h: torch.Tensor) -> None:
        # amortised O(d) per token: a per-step torch.cat would copy all T·d values each step
        n = self._hidden_len + h.shape[0]
        if self._hidden_buf is None or n > self._hidden_buf.shape[0]:
            cap = max(n, 2 * (0 if self._hidden_buf is None else self._hidden_buf.shape[0]), 64)
            buf = h.new_empty(cap, h.shape[1])
            if self._hidden_len:
                buf[: self._hidden_len] = self._hidden_buf[: self._hidden_len]
            self._hidden_buf = buf
        self._hidden_buf[self._hidden_len : n] = h
        self._hidden_len = n

    def _needs_attention(self) -> bool:
        p = self.params
        return self.eviction is not None or gravity.reads_attention(p)

    def _after_forward(self, fw: _Forward) -> None:
        """Bookkeeping after a forward: hidden states, eviction."""
        self._append_hidden(fw.hidden)
        if self.eviction is not None and fw.attention is not None:
            self._pending_eviction = self.eviction.after_forward(self, fw.attention)
        else:
            self._pending_eviction = None

    def union_positions(self, layer_positions: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Sorted original positions held by any layer (now, or in ``layer_positions``). (S,)"""
        lp = self.positions if layer_positions is None else layer_positions
        if all(p.numel() == lp[0].numel() for p in lp) and all(
            torch.equal(p, lp[0]) for p in lp[1:]
        ):
            return lp[0]
        return torch.unique(torch.cat(lp))

    # -- transactions ----------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """All or nothing: on any exception in the block (Streamlit's rerun and stop
        exceptions, KeyboardInterrupt included) the decoder is put back exactly as it was.

        ``step`` and ``rewind`` run inside one; callers may wrap several calls in another.
        """
        saved = self._checkpoint()
        try:
            yield
        except BaseException:
            self._restore(saved)
            raise

    def _checkpoint(self) -> dict:
        """References to every attribute (the decoder replaces tensors and objects, it does
        not write into old ones: cache layers get new tensors from ``torch.cat``, crop and
        eviction; the hidden buffer is only written past its length), plus copies of the
        few containers changed in place. O(layers) for a step without eviction."""
        gen = self.generator
        return {
            "self": dict(vars(self)),
            "lists": {k: list(getattr(self, k)) for k in ("ids", "positions", "_snapshots")},
            "sampler": self.sampler.copy(),
            "generator": (gen, gen.get_state()),
            "cache": (
                self.cache,
                dict(vars(self.cache)),
                [dict(vars(x)) for x in self.cache.layers],
            ),
            "trace": (
                self.trace,
                {
                    **vars(self.trace),
                    "steps": list(self.trace.steps),
                    "settings": dict(self.trace.settings),
                },
            ),
            "eviction": (self.eviction, _copy_state(vars(self.eviction)))
            if self.eviction is not None
            else None,
        }

    def _restore(self, saved: dict) -> None:
        vars(self).clear()
        vars(self).update(saved["self"])
        for k, v in saved["lists"].items():
            setattr(self, k, v)
        self.sampler = saved["sampler"]
        gen, state = saved["generator"]
        gen.set_state(state)
        cache, cvars, layers = saved["cache"]
        vars(cache).update(cvars)
        for layer, lvars in zip(cache.layers, layers, strict=True):
            vars(layer).clear()
            vars(layer).update(lvars)
        trace, tvars = saved["trace"]
        vars(trace).update(tvars)
        if saved["eviction"] is not None:
            policy, pvars = saved["eviction"]
            vars(policy).clear()
            vars(policy).update(pvars)

    def fork(self) -> Decoder:
        """An independent decoder at this decoder's current step, sharing the model.

        Cache tensors are shared, not copied (nothing writes into them, see ``_checkpoint``);
        the hidden states are copied, since a rewound fork overwrites them past its length.
        Stepping or rewinding either one never changes the other.
        """
        new = copy.copy(self)
        for k in ("ids", "positions", "_snapshots"):
            setattr(new, k, list(getattr(self, k)))
        new.sampler = self.sampler.copy()
        new.generator = torch.Generator(device="cpu")
        new.generator.set_state(self.generator.get_state())
        new.cache = copy.copy(self.cache)
        new.cache.layers = [copy.copy(x) for x in self.cache.layers]
        new.trace = copy.copy(self.trace)
        new.trace.steps = list(self.trace.steps)
        new.trace.settings = dict(self.trace.settings)
        new.trace.extra = dict(self.trace.extra)
        new.eviction = copy.deepcopy(self.eviction)
        if self._hidden_buf is not None:
            new._hidden_buf = self._hidden_buf[: self._hidden_len].clone()
        return new

    # -- stepping --------------------------------------------------------------------------
    def step(self, force_token: int | None = None) -> StepRecord | None:
        """Decode one token (or take ``force_token``) and record the step. None when done.

        Atomic: if anything raises, the decoder is left exactly as before the call."""
        with self.transaction():
            return self._step(force_token)

    def _step(self, force_token: int | None) -> StepRecord | None:
        if self.done:
            return None
        # State as it stands before this step's forward: what rewind(k) restores.
        snapshot = _Snapshot(
            sampler=self.sampler.copy(),
            ema=None if self.attn_ema is None else self.attn_ema.clone(),
            n_positions=len(self.ids),
        )
        fw = self._pending
        if fw is None:  # the previous token has not been fed yet
            nxt = self.ids[-1]
            fw = self._forward([nxt], [len(self.ids) - 1])
            self._after_forward(fw)
        t0 = time.perf_counter()
        logits = fw.logits  # (V,) float32
        gravity = fw.gravity
        entropix = self.params.adaptive == "entropix"  # the one rule that reads the attention
        result = sampling.prune(
            logits,
            self.params,
            gravity=gravity,
            state=self.sampler,
            attention=_reading(fw.lens) if entropix else None,
        )
        u = float(torch.rand((), generator=self.generator))
        if force_token is None:
            token = sampling.choose(result, u, state=self.sampler)
        else:
            token = int(force_token)
            self.sampler.observe(result, token)
        rec = self._record(fw, logits, result, gravity, token, u)
        rec.t_semviz = time.perf_counter() - t0 + fw.semviz_seconds
        self.trace.steps.append(rec)
        self._snapshots.append(snapshot)
        self.ids.append(token)
        self._pending = None
        self._check_stop(token)
        return rec

    def run(
        self,
        n: int,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[StepRecord]:
        """Decode up to ``n`` tokens; stop early on EOS, a stop string, the limit or request."""
        out: list[StepRecord] = []
        for _ in range(n):
            if self.done or (should_stop is not None and should_stop()):
                break
            rec = self.step()
            if rec is None:
                break
            out.append(rec)
            if on_step is not None:
                on_step(rec)
        return out

    def _check_stop(self, token: int) -> None:
        if token in self.eos_ids:
            self.done, self.stop_reason = True, "eos"
        elif self.n_steps >= self.settings.max_new_tokens:
            self.done, self.stop_reason = True, "max_new_tokens"
        elif len(self.ids) >= self.lm.max_context:
            self.done, self.stop_reason = True, "context_full"
        elif self.settings.stop:
            text = self.trace.text
            for s in self.settings.stop:
                if s and s in text:
                    self.done, self.stop_reason = True, f"stop:{s}"
                    break
        self.trace.stop_reason = self.stop_reason

    def _record(
        self,
        fw: _Forward,
        logits: torch.Tensor,
        result: sampling.PruneResult,
        gravity: torch.Tensor | None,
        token: int,
        u: float,
    ) -> StepRecord:
        final = result.index_probs["final"]  # (V,)
        kept = (final > 0).nonzero()[:, 0]  # (n_kept,)
        if kept.numel() > self.settings.record_k:  # a wide set: the raw top-K covers it
            kept = kept[:0]
        must = torch.cat([kept, torch.tensor([token])])  # the chosen token is always recorded
        cand, member = _top_set(logits, self.settings.record_k, include=must)  # (K',), (V,)
        lse = torch.logsumexp(logits, 0)
        outside = ~member
        rest = logits[outside]  # (V - K',) the unrecorded tail
        tail_lse = float(torch.logsumexp(rest, 0)) if rest.numel() else float("-inf")
        # the tail, summarised so that replay can bound it at any temperature; full-mode
        # gravity moves it too, so its range of G per bin comes along. Every raw logit, when
        # recorded, gives the summary on demand (StepRecord.tail_summary), but not the G.
        g_tail = (
            gravity[outside] if gravity is not None and self.params.gravity_mode == "full" else None
        )
        tail = (
            summarize_tail(rest, g_tail)
            if g_tail is not None or not self.settings.full_logits
            else None
        )
        hit = (cand == token).nonzero()
        stage_probs = {
            name: probs[cand].to(torch.float16).cpu() for name, probs in result.index_probs.items()
        }
        att = None
        # the cache as this step's query read it (eviction may have shrunk it since)
        positions = self.union_positions(fw.positions)
        if fw.attention is not None and self.settings.capture:
            att = self._attention_on(fw.attention, positions, fw.positions).to(torch.float16)
        return StepRecord(
            index=self.n_steps,
            position=len(self.ids),
            token_id=int(token),
            token_text=self.lm.tokenizer.decode([int(token)]),
            token_hex=token_hex(self.lm.tokenizer, int(token)),
            entropy=float(result.entropy_raw),
            varentropy=float(result.varentropy_raw),
            entropy_sampled=float(result.entropy_sampled),
            temperature=float(result.temperature),
            free_energy=float(result.free_energy),
            n_kept=int(result.n_kept),
            cand_ids=cand.to(torch.int32).cpu(),
            cand_logits=logits[cand].cpu(),
            tail_lse=tail_lse,
            lse=float(lse),
            stage_probs=stage_probs,
            waterfall=[
                {"name": s.name, "n_kept": int(s.n_kept), "mass_removed": float(s.mass_removed)}
                for s in result.waterfall
            ],
            u=u,
            chosen_rank=int(hit[0, 0]) if hit.numel() else -1,
            attention=att,
            cache_positions=positions.to(torch.int32),
            cache_len=int(positions.numel()),
            cache_bytes=cache_nbytes(self.cache),
            t_forward=fw.seconds,
            t_semviz=0.0,
            gravity=None if gravity is None else gravity[cand].float().cpu(),
            final_tail_mass=max(0.0, 1.0 - float(final[cand].double().sum())),
            tail=tail,
            full_logits=logits.float().cpu().clone() if self.settings.full_logits else None,
            fallback=result.fallback,
            eviction=self._pending_eviction,
            **_lens_fields(fw.lens),
        )

    def _attention_on(
        self,
        attention: torch.Tensor,
        positions: torch.Tensor,
        layer_positions: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Per-layer attention laid out on ``positions`` (0 where a layer evicted). (L, H, S)

        ``layer_positions`` are the positions each layer held when ``attention`` was
        computed (default: now)."""
        lp = self.positions if layer_positions is None else layer_positions
        if attention.shape[-1] == positions.numel() and all(
            p.numel() == positions.numel() for p in lp
        ):
            return attention.cpu()
        L, H, _ = attention.shape
        out = torch.zeros(L, H, positions.numel(), dtype=attention.dtype)
        for layer in range(L):
            pos = lp[layer]
            idx = torch.searchsorted(positions, pos)
            out[layer, :, idx] = attention[layer, :, : pos.numel()].cpu()
        return out

    def _check_params(self, params: sampling.PruneParams) -> None:
        """Refuse, before any step, settings this model or this recording cannot serve."""
        self.lm.check_params(params)
        if params.adaptive == "entropix" and not self.settings.lens:
            raise ValueError(
                "Adaptive temperature 'entropix' reads the attention metrics that the lens "
                "records, and this decoder does not record them (lens off): turn the lens on, "
                "or choose another adaptive temperature."
            )

    # -- rewind ----------------------------------------------------------------------------
    def rewind(self, k: int, params: sampling.PruneParams | None = None) -> None:
        """Keep the first ``k`` steps and continue from there, optionally with new params.

        Without eviction the cache is cropped in place. With eviction the kept steps are
        re-fed (teacher-forced) so the policy's state is rebuilt exactly. Atomic, like
        ``step``.
        """
        with self.transaction():
            self._rewind(k, params)

    def _rewind(self, k: int, params: sampling.PruneParams | None) -> None:
        k = max(0, min(int(k), self.n_steps))
        if params is not None:
            self._check_params(params)
            self.params = params
        kept = self.trace.steps[:k]
        if self.eviction is None and k > 0:
            snap = self._snapshots[k] if k < len(self._snapshots) else None
            n = len(self.prompt_ids) + k
            excess = self.cache.get_seq_length() - (n - 1)  # the k-th token is not fed yet
            if excess > 0:
                self.cache.crop(-excess)
            self.ids = self.ids[:n]
            self.positions = [torch.arange(n - 1, dtype=torch.long) for _ in self.positions]
            self._hidden_len = n - 1
            if snap is not None:
                self.sampler = snap.sampler.copy()
                self.attn_ema = None if snap.ema is None else snap.ema.clone()
            self.trace.steps = kept
            self._snapshots = self._snapshots[:k]
            self.generator = torch.Generator(device="cpu").manual_seed(int(self.settings.seed))
            torch.rand((k,), generator=self.generator)  # skip the k draws already used
            self._pending = None
            self.done = False
            self.stop_reason = self.trace.stop_reason = None
            self.trace.settings["params"] = self.params.to_dict()
            return
        self._reset()
        for rec in kept:
            self.step(force_token=rec.token_id)
        # keep the original records (timings, choices) for the steps that were kept
        self.trace.steps = kept


def _lens_fields(lens: LensCapture | None) -> dict:
    """A step's lens record from its forward's capture (a batch of one): the residual rows
    and head outputs in float16, the last residual also in float32 (the lens's last layer
    reproduces the model's own logits from it), the attention metrics in float32."""
    if lens is None:
        return {}
    resid = lens.residual[:, 0]  # (L+1, d)
    heads = lens.heads[:, 0]  # (L, H, D)
    return {
        "residual": _half(resid),
        "residual_last": resid[-1].float().clone(),
        "head_out": _half(heads),
        "attn_metrics": {n: lens.metrics[i, :, 0].clone() for i, n in enumerate(ATTENTION_METRICS)},
    }


def _reading(lens: LensCapture | None) -> sampling.AttentionReading | None:
    """What entropix's temperature reads: the last layer's attention, as entropix reads it."""
    if lens is None:
        return None
    m = lens.metrics[:, -1, 0]  # (4, H)
    names = ATTENTION_METRICS
    return sampling.attention_reading(m[names.index("entropy")], m[names.index("agreement")])


def _half(t: torch.Tensor) -> torch.Tensor:
    """float16, unless a value lies beyond float16's range (then float32, as it is)."""
    h = t.to(torch.float16)
    return h if bool(torch.isfinite(h).all()) or not bool(torch.isfinite(t).all()) else t.float()


def _copy_state(v):
    """Containers copied and tensors cloned, the rest shared: an eviction policy's state
    (per-layer lists and dicts of tensors, some updated in place) at a tenth of deepcopy's
    cost."""
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, list):
        return [_copy_state(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_copy_state(x) for x in v)
    if isinstance(v, dict):
        return {k: _copy_state(x) for k, x in v.items()}
    return v


@functools.cache
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def token_hex(tokenizer, token_id: int) -> str | None:
    """The token's bytes in hex when they are not UTF-8 alone (a piece of a character of a
    byte-level vocabulary), else None: the record's text then keeps every byte."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    table = _byte_decoder()
    if not isinstance(piece, str) or not piece or any(c not in table for c in piece):
        return None  # not a byte-level piece (a special token, or another tokenizer kind)
    raw = bytes(table[c] for c in piece)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.hex()
    return None


def top_candidates(
    logits: torch.Tensor, k: int, include: torch.Tensor | None = None
) -> tuple[torch.Tensor, float]:
    """The ``k`` largest logits' ids, descending, ties by lower id; and the rest's logsumexp.

    Equal to the first ``k`` of a stable descending sort, without sorting the vocabulary:
    a top-k finds the k-th value, every id above it is in, and ids equal to it fill the
    remaining places in id order.

    Parameters
    ----------
    logits : (V,) float32
    include : (E,) ids that must be in the set as well (tokens the final distribution kept
        that lie below the raw top-k, which strong gravity can promote); they sort in by
        their raw logit, so the set stays ordered by raw logit.

    Returns
    -------
    ids : (K',) long, K' = min(k, V) plus any ``include`` ids outside the top k
    tail_lse : logsumexp of the logits not in ``ids`` (-inf when there are none)
    """
    ids, member = _top_set(logits, k, include)
    if ids.numel() == logits.numel():
        return ids, float("-inf")
    return ids, float(torch.logsumexp(logits[~member], 0))


def _top_set(
    logits: torch.Tensor, k: int, include: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`top_candidates`' ids, and the (V,) bool mask of them."""
    V = logits.numel()
    k = min(k, V)
    kth = torch.topk(logits, k, sorted=False).values.min()
    above = (logits > kth).nonzero()[:, 0]  # (A,)
    ties = (logits == kth).nonzero()[:, 0][: k - above.numel()]  # ascending ids
    ids = torch.cat([above, ties])  # (K,)
    member = torch.zeros(V, dtype=torch.bool, device=logits.device)
    member[ids] = True
    if include is not None and include.numel():
        member[include] = True
        ids = member.nonzero()[:, 0]
    ids = ids[torch.sort(ids).indices]  # by id, so the stable sort below breaks ties by id
    ids = ids[torch.sort(logits[ids], descending=True, stable=True).indices]
    return ids, member
