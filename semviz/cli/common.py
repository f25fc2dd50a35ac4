"""Arguments and helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="model: empty for the offline default, a local dir, a .gguf path or a hub id",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def load(args: argparse.Namespace):
    from semviz.model import load_model

    def progress(msg: str, frac: float) -> None:
        if not getattr(args, "json", False):
            print(f"[{frac:4.0%}] {msg}", file=sys.stderr)

    return load_model(args.model, device=args.device, dtype=args.dtype, progress=progress)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=float))


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr (hidden with --json or when disabled)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, disable=not enabled, leave=False)
