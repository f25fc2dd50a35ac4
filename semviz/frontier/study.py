"""The frontier study: does gravity help, and does min-p beat top-p, on the test half.

Two questions share one results file:

- **gravity**: plain sampling, the default gravity (contrast, λ 0.5) and the first gravity
  semviz shipped (:data:`~semviz.gravity.FIRST_GRAVITY`, λ 0.5) over T 0.7–1.6;
- **min-p**: min-p 0.1 and 0.05 (Nguyen et al. 2024) against top-p 0.9 and 0.95 and plain
  temperature over T 0.7–2.0 (the claim that "Turning Down the Heat", arXiv 2506.13681,
  re-examines), with the seed's adaptive temperature and free-energy window on the same chart.

Every arm is a :class:`~semviz.frontier.sweep.SweepConfig` over the whole test half, 4 seeds
and 128 new tokens; plain sampling's rows serve both questions (rows are keyed by setting,
so a row is generated once). Generation runs without the judge (``score=False``), in arm
order, so a machine without the judge (a GPU box) makes the rows and
``python -m semviz frontier --score`` fills the judge's columns where the judge is. The file
is written after every batch; at ``--budget`` seconds the batch in flight is dropped and no
other starts, so a run cut short keeps every finished batch, and rerunning the same command
resumes it. On CUDA the sampler runs over all of a batch's rows at once
(:func:`~semviz.frontier.batched.chain_rows`); gravity's per-row work stays on the CPU.

Run it (every arm; ``--device cpu --prompts 2 --tokens 8`` for a quick check)::

    python -m semviz.frontier.study --out out/study --model PATH.gguf --budget 320

Then score and summarise each question here (:func:`commands` prints the commands).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ARMS", "Arm", "commands", "configs", "main"]

T_GRAVITY = (0.7, 1.0, 1.3, 1.6)
T_MINP = (0.7, 1.0, 1.3, 1.6, 2.0)
FIRST = (
    "gravity_lambda=0.5,gravity_kind=pull,gravity_mass=attention,gravity_anchor=context,"
    "gravity_sinks=0,gravity_skip_template=false,gravity_ngram=0,gravity_copy_cos=0,"
    "gravity_attract_only=false,gravity_space=embedding,gravity_sim=cosine"
)
ADAPTIVE = "adaptive=target,target_entropy=2.5,controller_gain=0.1,controller_sign=-1"


@dataclass(frozen=True)
class Arm:
    """One setting of the study, swept over temperature."""

    name: str
    spec: str  # the compare syntax (semviz.analysis.compare.parse_side)
    values: tuple[float, ...]
    questions: tuple[str, ...]
    batch_rows: int | None = None  # None: a whole point per generate() call


# in the order they run: a run cut short keeps the arms each question needs most
ARMS: tuple[Arm, ...] = (
    Arm("plain", "plain", T_MINP, ("gravity", "min_p")),
    Arm("min-p 0.1", "min_p=0.1", T_MINP, ("min_p",)),
    Arm("top-p 0.9", "top_p=0.9", T_MINP, ("min_p",)),
    # gravity's per-row work runs on the CPU: the costliest arms come after the cheap ones
    Arm("contrast λ0.5", "gravity_lambda=0.5", T_GRAVITY, ("gravity",)),
    Arm("adaptive T (seed)", ADAPTIVE, T_MINP, ("min_p",)),
    Arm("free energy", "free_energy=true", T_MINP, ("min_p",)),
    # per-row gravity on the CPU: small batches keep a run cut short from losing much
    Arm("first gravity λ0.5", FIRST, T_GRAVITY, ("gravity",), batch_rows=96),
    # each paper's other setting: both sweep min-p 0.05 and top-p 0.95 too
    Arm("min-p 0.05", "min_p=0.05", T_MINP, ("min_p",)),
    Arm("top-p 0.95", "top_p=0.95", T_MINP, ("min_p",)),
)
QUESTIONS = ("gravity", "min_p")
RESULTS = "study.parquet"


def configs(
    *, n_prompts: int | None = None, seeds: int = 4, new_tokens: int = 128, arms=ARMS
) -> list:
    """One :class:`~semviz.frontier.sweep.SweepConfig` per arm, on the test half."""
    from semviz.analysis.compare import parse_side
    from semviz.frontier.sweep import SweepConfig

    return [
        SweepConfig(
            settings=(parse_side(a.spec, label=a.name),),
            knob="temperature",
            values=a.values,
            split="test",
            n_prompts=n_prompts,
            seeds=seeds,
            new_tokens=new_tokens,
            batch_rows=a.batch_rows,
        )
        for a in arms
    ]


def commands(
    out: str, *, prompts: int | None = None, seeds: int = 4, tokens: int = 128
) -> dict[str, str]:
    """Per question, the ``python -m semviz frontier`` command that scores and summarises it.

    ``--values`` are the temperatures every arm of the question has.
    """
    out_cmds = {}
    for q in QUESTIONS:
        arms = [a for a in ARMS if q in a.questions]
        values = sorted(set.intersection(*(set(a.values) for a in arms)))
        sides = " ".join(f'--side "{a.spec}"' for a in arms[2:])
        extra = (f" --prompts {prompts}" if prompts else "") + (
            f" --seeds {seeds}" if seeds != 4 else ""
        )
        out_cmds[q] = (
            f'python -m semviz frontier --score --out {out}/{RESULTS} --a "{arms[0].spec}" '
            f'--b "{arms[1].spec}" {sides} --values {",".join(f"{v:g}" for v in values)} '
            f"--tokens {tokens}{extra}"
        ).replace("  ", " ")
    return out_cmds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m semviz.frontier.study",
        description="Generate the frontier study's rows (no judge); score them with "
        "`python -m semviz frontier --score`.",
    )
    p.add_argument("--out", default=os.environ.get("OUT") or "out/study", help="output folder")
    p.add_argument("--model", default=None, help="model (default: the offline default)")
    p.add_argument("--device", default=None, help="cuda or cpu (default cuda when present)")
    p.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    p.add_argument("--prompts", type=int, default=None, help="first N test prompts (default all)")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument(
        "--budget",
        type=float,
        default=320.0,
        help="seconds from the start (model load included) after which no batch starts "
        "and the one running stops; default 320",
    )
    p.add_argument("--arms", default=None, help="comma-separated arm numbers (default all)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from semviz.frontier.sweep import Progress, run_sweep
    from semviz.model.load import DEFAULT_GGUF, DEFAULT_MODEL, load_model

    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = ARMS
    if args.arms:
        arms = tuple(ARMS[int(i)] for i in args.arms.split(","))
    cfgs = configs(
        n_prompts=args.prompts, seeds=args.seeds, new_tokens=args.tokens, arms=arms
    )  # every arm checked before the model loads

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    import torch

    torch.set_grad_enabled(False)
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    if args.model and Path(args.model).name == DEFAULT_GGUF:
        lm.name = DEFAULT_MODEL  # the default's file: its rows are the default model's
    say(f"model {lm.name} on {lm.device} ({lm.dtype}), loaded in {lm.load_seconds:.1f}s")
    deadline = t_start + args.budget
    meta = {
        "device": str(lm.device),
        "gpu": torch.cuda.get_device_name(0) if lm.device.type == "cuda" else None,
        "torch": torch.__version__,
        "dtype": str(lm.dtype),
        "model": lm.name,
        "arms": [],
    }
    path = out / RESULTS
    for arm, cfg in zip(arms, cfgs, strict=True):
        if time.perf_counter() > deadline:
            say(f"{arm.name}: skipped, the budget is spent")
            continue
        t0 = time.perf_counter()

        def progress(p: Progress, _name=arm.name, last=[0.0]) -> None:  # noqa: B006
            now = time.perf_counter()
            if now - last[0] > 10 or p.point == "done":
                last[0] = now
                say(f"{_name}: {p.rows_done:.0f}/{p.rows_total} rows ({p.point})")

        try:
            res = run_sweep(
                lm,
                cfg,
                path,
                score=False,
                on_progress=progress,
                should_stop=lambda: time.perf_counter() > deadline,
            )
        except Exception as exc:  # one arm failing must not lose the others
            say(f"{arm.name}: FAILED {type(exc).__name__}: {exc}")
            meta["arms"].append({"arm": arm.name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        secs = time.perf_counter() - t0
        toks = int(res.frame["n_tokens"].sum()) if len(res.frame) else 0
        new = res.frame.tail(res.new_rows) if res.new_rows else res.frame.iloc[:0]
        new_toks = int(new["n_tokens"].sum()) if len(new) else 0
        rate = new_toks / secs if secs > 0 else 0.0
        say(
            f"{arm.name}: {res.new_rows} new rows, {res.skipped_rows} already there, "
            f"{new_toks} new tokens in {secs:.1f}s ({rate:,.1f} tok/s)"
            + (" - stopped by the budget" if res.stopped else "")
        )
        meta["arms"].append(
            {
                "arm": arm.name,
                "spec": arm.spec,
                "rows": len(res.frame),
                "new_rows": res.new_rows,
                "tokens": toks,
                "new_tokens": new_toks,
                "seconds": round(secs, 2),
                "generate_seconds": round(res.timings.get("generate", 0.0), 2),
                "sampler_seconds": round(res.timings.get("sampler", 0.0), 2),
                "stopped": res.stopped,
            }
        )
        meta["wall_seconds"] = round(time.perf_counter() - t_start, 1)
        (out / "study.json").write_text(json.dumps(meta, indent=1))
    meta["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "study.json").write_text(json.dumps(meta, indent=1))
    say(f"done: {path} ({path.stat().st_size if path.exists() else 0} bytes)")
    for q, cmd in commands(
        str(out), prompts=args.prompts, seeds=args.seeds, tokens=args.tokens
    ).items():
        say(f"score and summarise {q}: {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
