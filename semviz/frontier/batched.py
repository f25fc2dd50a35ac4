"""Batched generation through ``model.generate()`` with per-row seeds, and teacher forcing.

Many prompts and seeds run as the rows of one batch. HF samples with the process-wide RNG,
so the rows of a batch would share one random stream and a row's tokens would depend on
its neighbours. :class:`SeededSampler` fixes that: it is the last logits processor, runs
the semviz pruning core on each row (:func:`~semviz.sampling.prune`), draws one uniform from
that row's own ``torch.Generator`` and picks by inverse CDF (:func:`~semviz.sampling.choose`),
then returns a one-hot score row (0 at the pick, ``-inf`` elsewhere). ``do_sample=True``
can only take that token. A row's tokens therefore depend on its context and seed alone:
batched and one-at-a-time runs agree except where padding changes the logits' rounding
enough to move a pick across a CDF boundary, and a row matches what the semviz
:class:`~semviz.decoding.decoder.Decoder` draws with the same seed, which also takes one uniform
per step from a generator seeded the same way.

Gravity is added before the sampler by :class:`~semviz.processors.NarrativeGravityLogitsProcessor`,
with its own per-row state; the sampler then runs the core's chain with gravity off.

On a GPU a batch holds thousands of rows, and the core's chain one row at a time (on the CPU)
would cost more than the forward. For the stateless chains a frontier sweeps (temperature,
adaptive temperature ``target`` or ``edt``, top-p, min-p and the free-energy window,
intersected, stable ties) the sampler then runs :func:`chain_rows`: the same chain written
over the batch's rows at once, on the scores' device. It keeps the same sets and draws by the
same inverse CDF, so its picks equal the core's up to float rounding (tested pick for pick
on CPU, where ``rows="tensor"`` forces it).

Examples
--------
>>> import torch
>>> s = SeededSampler([0, 1])
>>> out = s(None, torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]])))
>>> (out == 0).sum(-1).tolist()  # one token left per row
[1, 1]
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria

from semviz.sampling import T_GREEDY, PruneParams, SamplerState, choose, prune
from semviz.sampling.filters import active_filters
from semviz.sampling.thermo import entropy_parts

__all__ = [
    "BatchOutput",
    "RawLogProb",
    "SeededSampler",
    "chain_rows",
    "choose_rows",
    "continuation_nll",
    "rows_supported",
    "cut_at_eos",
    "eos_ids",
    "generate_batch",
    "processor_chain",
]

NEG_INF = float("-inf")


class SeededSampler(LogitsProcessor):
    """The last processor: the core's chain per row, one seeded uniform per row, a one-hot pick.

    Parameters
    ----------
    seeds : one seed per batch row; row ``b`` draws from ``torch.Generator().manual_seed(seeds[b])``
    params : the chain after gravity (temperature, filters, adaptive temperature, …);
        default plain sampling at T = 1, i.e. sample from the scores it receives.
        Gravity must be off here (add it with ``NarrativeGravityLogitsProcessor`` first).
    eos_token_ids : rows that picked one of these are finished: later calls skip them
        (``generate`` overwrites a finished row's tokens with padding anyway).
    rows : ``"loop"`` runs the core (:func:`~semviz.sampling.prune`) row by row on the CPU;
        ``"tensor"`` runs :func:`chain_rows` over every row at once on the scores' device
        (chains :func:`rows_supported` only); ``"auto"``: tensor on a GPU, loop on the CPU.

    Attributes
    ----------
    uniforms : the draws of each row, in order; ``states``: each row's ``SamplerState``;
    seconds : time spent in calls (the pruning core's share of a batch).

    Examples
    --------
    >>> import torch
    >>> x = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    >>> SeededSampler([7])(None, x)
    tensor([[0., -inf, -inf]])
    """

    def __init__(
        self,
        seeds: Sequence[int],
        params: PruneParams | None = None,
        *,
        eos_token_ids: Sequence[int] = (),
        rows: str = "auto",
    ) -> None:
        seeds = list(seeds)
        if not seeds:
            raise ValueError("`seeds` must hold one seed per batch row, got none")
        if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
            raise ValueError(f"`seeds` must be ints, got {seeds!r}")
        params = params if params is not None else PruneParams()
        if not isinstance(params, PruneParams):
            raise ValueError(f"`params` must be a PruneParams, got {type(params).__name__}")
        if params.gravity_lambda != 0.0:
            raise ValueError(
                "`params` has gravity on: add gravity with NarrativeGravityLogitsProcessor "
                "before the sampler (processor_chain does) and pass the rest of the chain here"
            )
        if params.adaptive == "entropix":
            raise ValueError(
                "Adaptive temperature 'entropix' reads each step's attention, which a batched "
                "sweep does not capture: sweep another adaptive temperature, or decode with "
                "semviz.Decoder"
            )
        if rows not in ("auto", "loop", "tensor"):
            raise ValueError(f"`rows` must be auto, loop or tensor, got {rows!r}")
        if rows == "tensor" and not rows_supported(params):
            raise ValueError(
                "`rows`='tensor' runs temperature, adaptive target/edt, top-p, min-p and free "
                "energy (intersected, stable ties); this chain needs rows='loop'"
            )
        self.rows = rows
        self.params = params
        self.seeds = seeds
        self.eos_token_ids = {int(i) for i in eos_token_ids}
        self.generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
        self.states = [SamplerState() for _ in seeds]
        self.uniforms: list[list[float]] = [[] for _ in seeds]
        self.done = [False] * len(seeds)
        self.seconds = 0.0

    def __call__(self, input_ids: Tensor | None, scores: Tensor) -> Tensor:
        B = scores.shape[0]
        if B != len(self.generators):
            raise ValueError(
                f"scores have {B} rows but the sampler was given {len(self.seeds)} seeds"
            )
        t0 = time.perf_counter()
        tensor = self.rows == "tensor" or (
            self.rows == "auto" and scores.device.type != "cpu" and rows_supported(self.params)
        )
        picks = self._tensor(scores) if tensor else self._loop(scores)  # (B,) long, CPU
        out = torch.full_like(scores, NEG_INF)  # (B, V) a new tensor: scores stay as they were
        out[torch.arange(B, device=scores.device), picks.to(scores.device)] = 0.0
        self.seconds += time.perf_counter() - t0
        return out

    def _draw(self, b: int) -> float:
        u = float(torch.rand((), generator=self.generators[b]))
        self.uniforms[b].append(u)
        return u

    def _loop(self, scores: Tensor) -> Tensor:
        x = scores.detach().float().cpu()  # (B, V)
        picks = []
        for b in range(x.shape[0]):
            if self.done[b]:
                picks.append(0)  # generate() pads a finished row whatever we return
                continue
            res = prune(x[b], self.params, state=self.states[b])
            idx = choose(res, self._draw(b), state=self.states[b])
            self.done[b] = idx in self.eos_token_ids
            picks.append(idx)
        return torch.tensor(picks, dtype=torch.long)

    def _tensor(self, scores: Tensor) -> Tensor:
        B = scores.shape[0]
        u = torch.tensor(
            [0.0 if self.done[b] else self._draw(b) for b in range(B)], dtype=torch.float64
        )  # (B,) one draw per live row, in row order, as the loop draws them
        final, greedy, arg = chain_rows(scores.detach().float(), self.params)
        picks = torch.where(greedy, arg, choose_rows(final, u.to(final.device))).cpu()  # (B,)
        done = torch.tensor(self.done)
        picks = torch.where(done, torch.zeros_like(picks), picks)
        for b in torch.nonzero(~done).flatten().tolist():
            self.done[b] = int(picks[b]) in self.eos_token_ids
        return picks


def rows_supported(params: PruneParams) -> bool:
    """Whether :func:`chain_rows` runs ``params``' chain (with gravity already applied)."""
    p = params
    names = {f.name for f in active_filters(p)}
    return (
        p.order == "hf"
        and p.tie_rule == "stable"
        and p.min_tokens_to_keep == 1
        and not p.fallback
        and p.gravity_lambda == 0.0
        and p.temperature > 0.0
        and p.adaptive in ("none", "target", "edt")
        and names <= {"top_p", "min_p", "free_energy"}
        and (p.combine == "intersection" or len(names) <= 1)
    )


def _temperatures(p: PruneParams, h: Tensor | None, B: int, device) -> Tensor:
    """Each row's temperature (B,) float64, as :func:`~semviz.sampling.thermo.adaptive_temperature`."""
    t0 = torch.full((B,), p.temperature, dtype=torch.float64, device=device)
    if p.adaptive == "none":
        return t0
    h = h.double()  # (B,)
    if p.adaptive == "target":
        t = t0 + p.controller_sign * p.controller_gain * (h - p.target_entropy)
        return t.clamp(p.adaptive_t_min, p.adaptive_t_max)
    # edt: T0 · N^(θ/H); a certain step (H ≈ 0) is greedy
    t = t0 * torch.pow(torch.full_like(h, p.edt_n), p.edt_theta / h.clamp_min(1e-300))
    return torch.where(h <= 1e-12, torch.zeros_like(t), t)


def chain_rows(s: Tensor, params: PruneParams) -> tuple[Tensor, Tensor, Tensor]:
    """The core's chain over every row at once, for the chains of :func:`rows_supported`.

    Parameters
    ----------
    s : (B, V) float32 scores after gravity (the logits when gravity is off)

    Returns
    -------
    final : (B, V) the distribution each row samples from (softmax of ``s/T`` over the kept)
    greedy : (B,) bool, rows whose temperature is under ``T_GREEDY``
    argmax : (B,) long, the lowest index among each row's maxima of ``s``
    """
    p = params
    B = s.shape[0]
    names = {f.name for f in active_filters(p)}
    h = None
    if p.free_energy or p.adaptive != "none":
        h = entropy_parts(s)[0]  # (B,) entropy of softmax(s), nats
    t64 = _temperatures(p, h, B, s.device)  # (B,)
    greedy = t64 < T_GREEDY
    t = torch.where(greedy, torch.ones_like(t64), t64).float()[:, None]  # (B, 1)
    block = s / t  # (B, V) what the filters see (order "hf")
    arg = s.max(-1).indices  # (B,) first maximal index
    keep = torch.ones_like(s, dtype=torch.bool)  # (B, V)
    if names & {"top_p", "min_p"}:
        probs = torch.softmax(block, -1)  # (B, V)
        first = torch.zeros_like(keep).scatter_(-1, block.max(-1, keepdim=True).indices, True)
        if "top_p" in names:
            order = torch.sort(block, dim=-1, descending=True, stable=True).indices  # (B, V)
            q = probs.gather(-1, order)  # (B, V) descending
            inside = (q.cumsum(-1) - q) < p.top_p  # mass strictly ahead of each token
            inside[:, 0] = True
            keep &= torch.zeros_like(keep).scatter_(-1, order, inside)
        if "min_p" in names:
            keep &= ~(probs < p.min_p * probs.amax(-1, keepdim=True)) | first
    if "free_energy" in names:
        window = (p.free_energy_kappa * t64).float() * h  # (B,) kappa·T·H
        gap = s.amax(-1, keepdim=True) - s  # (B, V) U(w) - U_min
        top = torch.zeros_like(keep).scatter_(-1, arg[:, None], True)
        keep &= (gap <= window[:, None]) | top
    z = torch.where(keep, block, torch.full_like(block, NEG_INF))  # (B, V)
    final = torch.softmax(z, -1)  # (B, V)
    return final, greedy, arg


def choose_rows(final: Tensor, u: Tensor) -> Tensor:
    """Each row's pick by inverse CDF at ``u`` (B,), as :func:`~semviz.sampling.choose`.

    The CDF runs over each row's probabilities in stable descending order (ties by the
    lower index), in float64, at ``u`` times the row's total. ``(B, V), (B,) -> (B,)``
    """
    p = final.double()  # (B, V)
    target = (u.double() * p.sum(-1))[:, None]  # (B, 1)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices  # (B, V)
    cdf = p.gather(-1, order).cumsum(-1)  # (B, V)
    pos = torch.searchsorted(cdf, target, right=True)[:, 0]  # (B,)
    n = (p > 0).sum(-1).clamp_min(1)  # tokens that can be picked
    pos = torch.minimum(pos, n - 1)
    return order.gather(-1, pos[:, None])[:, 0]


class RawLogProb(LogitsProcessor):
    """First in the chain: keeps the LM's raw scores so the chosen token's log P at T = 1 can
    be read once it is known. Returns ``scores`` unchanged.

    These are the logits a teacher-forced pass over prompt + continuation computes, so the
    continuation's perplexity costs no second forward (:func:`continuation_nll` is the
    teacher-forced reference it is tested against).
    """

    def __init__(self) -> None:
        self._scores: Tensor | None = None  # (B, V) float32 of the latest call
        self._lse: Tensor | None = None  # (B,)
        self.logp: list[Tensor] = []  # per generated position, (B,) log P of the chosen token

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._scores = scores.detach().float()
        self._lse = torch.logsumexp(self._scores, -1)  # (B,)
        return scores

    def observe(self, chosen: Tensor) -> None:
        """Record log P of ``chosen`` (B,) under the latest scores."""
        if self._scores is None:
            return
        c = chosen.to(self._scores.device).long()[:, None]  # (B, 1)
        self.logp.append((self._scores.gather(-1, c)[:, 0] - self._lse).cpu())
        self._scores = self._lse = None

    def nll(self, lengths: Sequence[int]) -> list[float]:
        """Mean NLL (nats per token) of each row's first ``lengths[b]`` positions."""
        if not self.logp:
            return [math.nan] * len(lengths)
        lp = torch.stack(self.logp, 1).double()  # (B, T)
        return [float(-lp[b, :n].mean()) if n else math.nan for b, n in enumerate(lengths)]


class _Ticks(StoppingCriteria):
    """After every generated position: records log P, calls ``on_token``, stops on request."""

    def __init__(
        self, on_token: Callable[[int], None] | None, should_stop, recorder: RawLogProb
    ) -> None:
        self.on_token, self.should_stop, self.recorder = on_token, should_stop, recorder
        self.steps = 0
        self.stopped = False

    def __call__(self, input_ids: Tensor, scores, **kw) -> Tensor:
        self.steps += 1
        self.recorder.observe(input_ids[:, -1])
        if self.on_token is not None:
            self.on_token(self.steps)
        stop = self.should_stop is not None and bool(self.should_stop())
        self.stopped = self.stopped or stop
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def eos_ids(lm) -> list[int]:
    """The ids that end a continuation, as the ``Decoder`` takes them."""
    eos = getattr(lm.model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = lm.tokenizer.eos_token_id
    return sorted(
        {int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]) if i is not None}
    )


def _pad_id(lm, rows: Sequence[Sequence[int]]) -> int:
    """A padding id that occurs in no prompt, so processors that drop padding by id drop
    padding only (SmolLM2 pads with ``<|im_end|>``, which every chat prompt contains)."""
    used = {int(t) for r in rows for t in r}
    tok = lm.tokenizer
    cands = [tok.pad_token_id, *getattr(tok, "all_special_ids", []), 0]
    for c in cands:
        if c is not None and int(c) not in used:
            return int(c)
    return next(i for i in range(len(tok)) if i not in used)


def processor_chain(
    model: torch.nn.Module,
    params: PruneParams,
    seeds: Sequence[int],
    *,
    attention_sink=None,
    hidden_sink=None,
    pad_token_id: int | None = None,
    eos_token_ids: Sequence[int] = (),
    tokenizer=None,
    rows: str = "auto",
) -> LogitsProcessorList:
    """``[RawLogProb, NarrativeGravityLogitsProcessor (when λ ≠ 0), SeededSampler]``.

    The fallback's gravity rule reads gravity inside the core, which the processor has
    already applied, so ``fallback`` with gravity is refused rather than silently weakened.
    """
    procs: list[LogitsProcessor] = [RawLogProb()]
    if params.gravity_lambda != 0.0:
        if params.fallback:
            raise ValueError(
                "fallback=on with gravity is not available in batched generation: the gravity "
                "processor runs before the core, so the fallback could not turn it off"
            )
        from semviz.processors import NarrativeGravityLogitsProcessor

        procs.append(
            NarrativeGravityLogitsProcessor.from_params(
                model,
                params,
                tokenizer=tokenizer,
                attention_sink=attention_sink,
                hidden_sink=hidden_sink,
                pad_token_id=pad_token_id,
            )
        )
    rest = params.replace(gravity_lambda=0.0, gravity_mode="full")
    procs.append(SeededSampler(list(seeds), rest, eos_token_ids=eos_token_ids, rows=rows))
    return LogitsProcessorList(procs)


@dataclass
class BatchOutput:
    """What one batched ``generate`` made: per row, the new ids (through the first EOS)."""

    ids: list[list[int]]
    stop: list[str]  # "eos" or "length" per row
    nll: list[float]  # mean NLL per token of each row's ids under the LM at T = 1, nats
    seconds: float  # wall time of generate()
    sampler_seconds: float  # of which the pruning core and the draws
    uniforms: list[list[float]] = field(default_factory=list)
    stopped: bool = False  # should_stop ended it: the rows are incomplete


def cut_at_eos(rows: Sequence[Sequence[int]], eos: Sequence[int]) -> tuple[list, list]:
    """Each row through its first EOS (kept: the model chose it); what follows is padding.

    Examples
    --------
    >>> cut_at_eos([[5, 2, 0, 0], [5, 6, 7, 8]], eos=[2])
    ([[5, 2], [5, 6, 7, 8]], ['eos', 'length'])
    """
    ids, stops = [], []
    for r in rows:
        cut = next((i for i, t in enumerate(r) if t in eos), None)
        ids.append(list(r) if cut is None else list(r[: cut + 1]))
        stops.append("length" if cut is None else "eos")
    return ids, stops


def _left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[Tensor, Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (n - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask  # (B, N), (B, N)


def _sinks(model, params: PruneParams):
    """Context managers for what gravity needs from the forward (attention, hidden states)."""
    from semviz.gravity import reads_attention, reads_hidden
    from semviz.processors import capture_attention, capture_hidden

    stack = contextlib.ExitStack()
    att = hid = None
    if reads_attention(params):
        att = stack.enter_context(capture_attention(model))
    if reads_hidden(params):
        hid = stack.enter_context(capture_hidden(model))
    return stack, att, hid


def generate_batch(
    lm,
    prompt_ids: Sequence[Sequence[int]],
    seeds: Sequence[int],
    params: PruneParams,
    *,
    max_new_tokens: int,
    on_token: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    rows: str = "auto",
) -> BatchOutput:
    """Continue every prompt with its seed in ONE ``model.generate()`` call (left-padded).

    Parameters
    ----------
    lm : the shared ``LoadedModel``
    prompt_ids : B token-id lists (already through the chat template if wanted)
    seeds : B seeds, one per row
    on_token : called after every generated position with its 1-based count
    should_stop : polled after every position; True ends the call (``stopped`` is then set)
    rows : how the sampler runs the chain (:class:`SeededSampler`): auto, loop or tensor
    """
    if len(prompt_ids) != len(seeds) or not seeds:
        raise ValueError(f"give one seed per prompt: {len(prompt_ids)} prompts, {len(seeds)} seeds")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if any(len(r) == 0 for r in prompt_ids):
        raise ValueError("a prompt has no tokens")
    longest = max(len(r) for r in prompt_ids)
    if longest + max_new_tokens > lm.max_context:
        raise ValueError(
            f"a prompt of {longest} tokens plus {max_new_tokens} new ones is longer than "
            f"{lm.name}'s context of {lm.max_context}"
        )
    from semviz.model.capture import enable_capture

    model = lm.model
    enable_capture(model)  # plain sdpa unless gravity's sink asks; the Decoder uses the same
    pad, eos = _pad_id(lm, prompt_ids), eos_ids(lm)
    ids, mask = _left_pad(prompt_ids, pad)
    stack, att, hid = _sinks(model, params)
    t0 = time.perf_counter()
    with stack, torch.inference_mode():
        chain = processor_chain(
            model,
            params,
            seeds,
            attention_sink=att,
            hidden_sink=hid,
            pad_token_id=pad,
            eos_token_ids=eos,
            tokenizer=lm.tokenizer,
            rows=rows,
        )
        ticks = _Ticks(on_token, should_stop, chain[0])
        out = model.generate(
            ids.to(lm.device),
            attention_mask=mask.to(lm.device),
            do_sample=True,
            max_new_tokens=max_new_tokens,
            logits_processor=chain,
            stopping_criteria=[ticks],
            pad_token_id=pad,
            eos_token_id=eos,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
        )
    seconds = time.perf_counter() - t0
    rows, stops = cut_at_eos(out[:, ids.shape[1] :].cpu().tolist(), eos)
    sampler = chain[-1]
    return BatchOutput(
        ids=rows,
        stop=stops,
        nll=chain[0].nll([len(r) for r in rows]),
        seconds=seconds,
        sampler_seconds=sampler.seconds,
        uniforms=sampler.uniforms,
        stopped=ticks.stopped,
    )


@torch.inference_mode()
def continuation_nll(
    lm, prompt_ids: Sequence[Sequence[int]], cont_ids: Sequence[Sequence[int]]
) -> list[float]:
    """Mean negative log-likelihood (nats per token) of each continuation under the LM at T = 1.

    One teacher-forced forward of prompt + continuation for the whole batch. Rows are
    right-padded: attention is causal, so padding after a row's last token cannot change
    that row's hidden states, and no mask or position shift is needed. Only the
    continuation's positions go through the LM head, never a (B, N, V) tensor.
    ``exp`` of the result is the continuation's perplexity; NaN for an empty continuation.
    """
    if len(prompt_ids) != len(cont_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(cont_ids)} continuations")
    full = [list(p) + list(c) for p, c in zip(prompt_ids, cont_ids, strict=True)]
    n = max(len(r) for r in full)
    ids = torch.tensor([r + [0] * (n - len(r)) for r in full], dtype=torch.long)  # (B, N)
    h = lm.model.get_decoder()(input_ids=ids.to(lm.device), use_cache=False).last_hidden_state
    head = lm.model.get_output_embeddings()
    out = []
    for b, (p, c) in enumerate(zip(prompt_ids, cont_ids, strict=True)):
        if not c:
            out.append(float("nan"))
            continue
        pos = torch.arange(len(p) - 1, len(p) - 1 + len(c))  # (T,) positions that predict c
        logp = torch.log_softmax(head(h[b, pos]).float(), -1)  # (T, V)
        tgt = torch.tensor(c, dtype=torch.long, device=logp.device)  # (T,)
        out.append(float(-logp.gather(-1, tgt[:, None]).mean()))
    return out
