"""Sessions decoding at once: each forward alone, against forwards shared as rows of one batch.

Runs ``--sessions`` decoders of the real default model with the load test's settings (each its
own seed and temperature), ``--tokens`` tokens each, on one thread per session, twice:

1. **alone**: every session steps by itself, its forwards one at a time in the model's line;
2. **shared**: every step goes through a ``Gather`` with ``feed_together``, as a server with
   ``SEMVIZ_BATCH_SESSIONS=1`` does: tokens that are wanted at the same moment are fed as
   rows of one forward.

Prints the wall time of each, their ratio, the mean rows per batch, and for every session
whether its tokens equal those it made alone, with the first step that differs. A batched row
equals a lone forward only to float rounding, so a sample in the far tail can differ; that is
why the server keeps sharing off by default.

    python benchmarks/bench_batch_sessions.py [--sessions 8] [--tokens 80] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from bench_load import settings_of

    import semviz
    from semviz import Decoder, DecodeSettings
    from semviz.decoding.together import feed_together
    from semviz.model.queue import ForwardQueue, Gather
    from ui.state import Settings

    lm = semviz.load_model(device="cpu")

    def make(i: int) -> Decoder:
        s = Settings.from_query_params(settings_of(i))
        return Decoder(
            lm,
            s.prompt,
            s.prune_params(),
            DecodeSettings(seed=s.seed, max_new_tokens=4096, chat=s.chat),
        )

    def phase(step_one) -> tuple[list[Decoder], float]:
        decs = [make(i) for i in range(args.sessions)]
        start = threading.Barrier(len(decs))

        def session(d: Decoder) -> None:
            start.wait()
            for _ in range(args.tokens):
                if step_one(d) is None:
                    break

        threads = [threading.Thread(target=session, args=(d,)) for d in decs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return decs, time.perf_counter() - t0

    line = ForwardQueue()

    def alone_step(d: Decoder):
        with line.turn():
            return d.step()

    gather = Gather(ForwardQueue(), feed_together)

    def shared_step(d: Decoder):
        gather.submit(d)
        return d.step()

    alone, t_alone = phase(alone_step)
    shared, t_shared = phase(shared_step)
    print(f"{args.sessions} sessions x {args.tokens} tokens, {args.threads} torch thread(s)")
    print(f"  alone  {t_alone:7.1f} s")
    print(f"  shared {t_shared:7.1f} s   ({gather.rows / max(gather.batches, 1):.1f} rows a batch)")
    print(f"  shared is {t_alone / t_shared:.2f}x as fast as alone")
    for i, (a, b) in enumerate(zip(alone, shared, strict=True)):
        ta, tb = a.trace.token_ids, b.trace.token_ids
        diff = next((k for k, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
        same = "same tokens" if ta == tb else f"differs from step {diff}"
        print(f"  session {i}: {same}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=8, help="1 to 16")
    ap.add_argument("--tokens", type=int, default=80, help="1 to 1024")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 1)))
    args = ap.parse_args()
    if not 1 <= args.sessions <= 16 or not 1 <= args.tokens <= 1024:
        ap.error("--sessions must be from 1 to 16 and --tokens from 1 to 1024")
    sys.path.insert(0, str(Path(__file__).parent))
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
