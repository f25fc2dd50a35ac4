"""``python -m semviz bench``: the instrumented decoder against plain ``generate()``, in one run.

Absolute times on a shared machine are noise, so every figure is printed next to the one it is
compared with, measured in the same process, interleaved, and summarised by the median.

- speed: decoder (capture on, greedy) vs ``model.generate(do_sample=False)`` in the same dtype,
  and the default dtype's decoder vs float32 ``generate()`` (what plain HF gives a user);
- memory (``--memory``): peak RSS added by a 2,048-token prefill with capture on, capture
  off, and eager attention with ``output_attentions`` (the usual way to get attention),
  each in a fresh subprocess whose peak is reset (``/proc/self/clear_refs``) after loading;
- cold start (``--cold-start``): first ``load_model()`` (conversion from GGUF, in a fresh
  cache) against a second one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from semviz.cli import common

PROSE = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was "
    "the season of Light, it was the season of Darkness, it was the spring of hope, it was the "
    "winter of despair, we had everything before us, we had nothing before us."
)


MEMORY_TOKENS = 4096  # the memory child repeats PROSE 64 times: about 6,000 tokens


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="decoder vs plain generate(): tokens/s, memory, cold start")
    p.add_argument(
        "--tokens",
        type=common.int_arg(1, 100_000),
        default=64,
        help="new tokens per run (default 64)",
    )
    p.add_argument(
        "--repeats", type=common.int_arg(1, 1000), default=3, help="interleaved repeats (median)"
    )
    p.add_argument("--prompt", default=PROSE, type=common.text_arg)
    p.add_argument("--memory", action="store_true", help="also measure 2,048-token prefill memory")
    p.add_argument(
        "--memory-tokens",
        type=common.int_arg(16, MEMORY_TOKENS),
        default=2048,
        help=f"prompt tokens of the memory measurement (16 to {MEMORY_TOKENS:,})",
    )
    p.add_argument("--cold-start", action="store_true", help="also time first vs second load")
    p.add_argument("--no-float32", action="store_true", help="skip the float32 generate() baseline")
    p.add_argument("--json", action="store_true")
    p.add_argument("--model", default=None)
    p.add_argument("--device", default=None)
    return p


def _time_generate(lm, ids, n: int) -> float:
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=lm.tokenizer.pad_token_id,
        )
    dt = time.perf_counter() - t0
    assert out.shape[1] - ids.shape[1] == n
    return n / dt


def _time_decoder(lm, ids, n: int, capture: bool = True) -> float:
    from semviz.decoding.decoder import Decoder, DecodeSettings
    from semviz.sampling import PruneParams

    t0 = time.perf_counter()
    dec = Decoder(
        lm,
        "",
        PruneParams(temperature=0.0),
        DecodeSettings(max_new_tokens=n, capture=capture),
        prompt_ids=ids[0].tolist(),
    )
    dec.eos_ids = set()  # run the full length, like min_new_tokens for generate()
    dec.run(n)
    dt = time.perf_counter() - t0
    assert dec.n_steps == n
    return n / dt


def forward_costs(lm, ids, n: int) -> dict[str, float]:
    """Median milliseconds of a one-token forward with the cache: plain, with the attention
    capture, and with the capture and the lens's recording (what the decoder runs).

    The three run interleaved, one forward each in turn on three caches fed the same
    tokens, so that a slower stretch of a shared machine slows all three alike. This is the
    decoder's instrumentation alone, apart from its sampling and step record.
    """
    import torch

    from semviz.model.forward import forward

    modes = {"plain": {}, "capture": {"capture": True}, "lens": {"capture": True, "lens": True}}
    n0 = ids.shape[1]
    caches = {k: lm.new_cache() for k in modes}
    for k, kw in modes.items():
        forward(lm.model, ids, torch.arange(n0, device=ids.device)[None], caches[k], **kw)
    times: dict[str, list[float]] = {k: [] for k in modes}
    tok = ids[:, -1:]
    for i in range(n):
        pos = torch.tensor([[n0 + i]], device=ids.device)
        for k, kw in modes.items():
            t0 = time.perf_counter()
            forward(lm.model, tok, pos, caches[k], **kw)
            times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def speed(args, progress=None) -> dict:
    from semviz.model.load import load_model

    common.hide_progress(args)
    lm = load_model(args.model, device=args.device)
    ids = lm.tokenizer(args.prompt, return_tensors="pt").input_ids.to(lm.device)
    if ids.shape[1] + args.tokens > lm.max_context:
        raise ValueError(
            f"--prompt ({ids.shape[1]:,} tokens) and --tokens {args.tokens:,} are more than "
            f"the {lm.max_context:,} tokens {lm.name} reads"
        )
    if args.memory and args.memory_tokens > lm.max_context:
        raise ValueError(f"--memory-tokens: {lm.name} reads at most {lm.max_context:,} tokens")
    lm32 = None
    if not args.no_float32 and lm.dtype != __import__("torch").float32:
        lm32 = load_model(args.model, device=args.device, dtype="float32")
    # warm-up: first calls pay for kernel selection and allocator growth
    _time_generate(lm, ids, 4)
    _time_decoder(lm, ids, 4)
    if lm32 is not None:
        _time_generate(lm32, ids, 4)
    gen, dec, gen32 = [], [], []
    for _ in range(args.repeats):
        gen.append(_time_generate(lm, ids, args.tokens))
        dec.append(_time_decoder(lm, ids, args.tokens))
        if lm32 is not None:
            gen32.append(_time_generate(lm32, ids, args.tokens))
        if progress:
            progress()
    g, d = statistics.median(gen), statistics.median(dec)
    out = {
        "model": lm.name,
        "dtype": str(lm.dtype).replace("torch.", ""),
        "prompt_tokens": int(ids.shape[1]),
        "new_tokens": args.tokens,
        "repeats": args.repeats,
        "generate_tok_s": g,
        "decoder_tok_s": d,
        "decoder_vs_generate": d / g,
    }
    if lm32 is not None:
        g32 = statistics.median(gen32)
        out["generate_float32_tok_s"] = g32
        out["decoder_vs_generate_float32"] = d / g32
        out["generate_vs_generate_float32"] = g / g32
    out["forward_ms"] = forward_costs(lm, ids, args.tokens)
    return out


_MEM_CHILD = r"""
import json, sys, torch
from semviz.model.load import load_model
from semviz.decoding.decoder import DecodeSettings, Decoder
from semviz.sampling import PruneParams
mode, n, name = sys.argv[1], int(sys.argv[2]), (sys.argv[3] or None)
lm = load_model(name, device="cpu")
ids = (lm.tokenizer(sys.argv[4]).input_ids * 64)[:n]
if mode == "eager":
    lm.model.set_attn_implementation("eager")
with torch.inference_mode():
    lm.model(torch.tensor([ids[:16]]))  # warm-up at a small size
def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
import gc; gc.collect()
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
base = rss_kib("VmRSS")
t = __import__("time").perf_counter()
if mode == "eager":
    with torch.inference_mode():
        out = lm.model(torch.tensor([ids]), output_attentions=True, logits_to_keep=1)
        last = [a[0, :, -1] for a in out.attentions]
else:
    on = mode == "capture"  # the decoder's default: the attention capture and the lens's record
    d = Decoder(lm, "", PruneParams(temperature=0), DecodeSettings(capture=on, lens=on),
                prompt_ids=ids)
secs = __import__("time").perf_counter() - t
peak = rss_kib("VmHWM")
print(json.dumps({"peak_added_mib": (peak - base) / 1024, "seconds": secs}))
"""


def memory(args) -> dict:
    out = {"prompt_tokens": args.memory_tokens}
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for mode in ("capture", "nocapture", "eager"):
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                _MEM_CHILD,
                mode,
                str(args.memory_tokens),
                args.model or "",
                PROSE,
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(f"memory child {mode} failed: {r.stderr.strip().splitlines()[-1:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        out[f"{mode}_peak_mib"] = res["peak_added_mib"]
        out[f"{mode}_prefill_s"] = res["seconds"]
    out["capture_vs_nocapture_memory"] = out["capture_peak_mib"] / max(
        out["nocapture_peak_mib"], 1e-9
    )
    out["eager_vs_capture_memory"] = out["eager_peak_mib"] / max(out["capture_peak_mib"], 1e-9)
    return out


_COLD_CHILD = r"""
import json, time
from semviz.model.load import load_model
t = time.perf_counter(); a = load_model(); t1 = time.perf_counter() - t
t = time.perf_counter(); b = load_model(); t2 = time.perf_counter() - t
print(json.dumps({"first_load_s": t1, "second_load_s": t2, "converted": a.converted}))
"""


def cold_start(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SEMVIZ_CACHE=tmp)
        env["PYTHONPATH"] = os.getcwd() + os.pathsep + env.get("PYTHONPATH", "")
        r = subprocess.run(
            [sys.executable, "-c", _COLD_CHILD], capture_output=True, text=True, env=env, check=True
        )
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["second_vs_first"] = res["second_load_s"] / res["first_load_s"]
    return res


def run(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        raise ValueError("--prompt is empty: give some text to time the decoder on")
    with common.progress_bar(args.repeats, "bench", enabled=not args.json) as bar:
        result = {"speed": speed(args, progress=lambda: bar.update(1))}
    if args.memory:
        result["memory"] = memory(args)
    if args.cold_start:
        result["cold_start"] = cold_start(args)
    if args.json:
        common.print_json(result)
        return 0
    s = result["speed"]
    print(
        f"model {s['model']} ({s['dtype']}), prompt {s['prompt_tokens']} tokens, "
        f"{s['new_tokens']} new tokens, median of {s['repeats']}"
    )
    print(f"  generate()          {s['generate_tok_s']:7.1f} tok/s")
    print(
        f"  semviz Decoder      {s['decoder_tok_s']:7.1f} tok/s   "
        f"ratio {s['decoder_vs_generate']:.2f}x (same dtype, capture on)"
    )
    if "generate_float32_tok_s" in s:
        print(
            f"  generate() float32  {s['generate_float32_tok_s']:7.1f} tok/s   "
            f"decoder/fp32 {s['decoder_vs_generate_float32']:.2f}x, "
            f"generate/fp32 {s['generate_vs_generate_float32']:.2f}x"
        )
    f = s["forward_ms"]
    print(
        f"  one forward: plain {f['plain']:.1f} ms, with capture {f['capture']:.1f} ms "
        f"({f['capture'] / f['plain']:.3f}x), with capture and lens {f['lens']:.1f} ms "
        f"({f['lens'] / f['plain']:.3f}x), interleaved"
    )
    if "memory" in result:
        m = result["memory"]
        print(f"prefill of {m['prompt_tokens']} tokens, peak memory added:")
        names = {"capture": "capture and lens", "nocapture": "neither", "eager": "eager attentions"}
        for mode, name in names.items():
            print(
                f"  {name:16s} {m[mode + '_peak_mib']:8.1f} MiB  ({m[mode + '_prefill_s']:.2f} s)"
            )
        print(
            f"  capture/no-capture {m['capture_vs_nocapture_memory']:.2f}x, "
            f"eager/capture {m['eager_vs_capture_memory']:.2f}x"
        )
    if "cold_start" in result:
        c = result["cold_start"]
        print(
            f"load_model(): first {c['first_load_s']:.1f} s (converted={c['converted']}), "
            f"second {c['second_load_s']:.2f} s, ratio {c['second_vs_first']:.3f}"
        )
    return 0
