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


def hide_progress(args: argparse.Namespace) -> bool:
    """True (and transformers' weight-loading bars off) with ``--json`` or when stderr is not
    a terminal, so a log holds results and errors, not progress."""
    quiet = getattr(args, "json", False) or not sys.stderr.isatty()
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return quiet


def load(args: argparse.Namespace):
    """The model named by ``--model``; progress on stderr only for a person at a terminal."""
    from semviz.model import load_model

    quiet = hide_progress(args)

    def progress(msg: str, frac: float) -> None:
        if not quiet:
            print(f"[{frac:4.0%}] {msg}", file=sys.stderr)

    return load_model(args.model, device=args.device, dtype=args.dtype, progress=progress)


INT32 = 2**31 - 1


def int_arg(lo: int, hi: int = INT32):
    """An argparse ``type=``: an integer in ``[lo, hi]``, else one line naming the flag."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer from {lo} to {hi}, got {s}")
        return v

    parse.__name__ = "integer"
    return parse


def text_arg(s: str) -> str:
    """An argparse ``type=`` for free text: refuses bytes that are not UTF-8 (Python passes
    them on as lone surrogates, which no tokenizer takes)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("is not valid UTF-8 text") from None
    return s


SEED = int_arg(0, 2**63 - 1)


def add_force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="replace existing output files")


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=float))


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr (hidden with --json or when disabled)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, disable=not enabled, leave=False)


def add_prune_args(p: argparse.ArgumentParser) -> None:
    """One ``--flag`` per ``PruneParams`` field (``--top-p 0.9``), plus ``--preset NAME``."""
    import dataclasses
    import typing

    from semviz.pruning import PruneParams

    g = p.add_argument_group("pruning (defaults: plain sampling, or the preset's values)")
    g.add_argument("--preset", default=None, help="scenario preset: code, story, qa, brainstorm")
    hints = typing.get_type_hints(PruneParams)
    for f in dataclasses.fields(PruneParams):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        if hint is bool:
            g.add_argument(flag, dest=f.name, type=_parse_bool, default=None, metavar="{on,off}")
        elif hint in (int, float):
            g.add_argument(
                flag, dest=f.name, type=_flag_type(hint), default=None,
                metavar=hint.__name__.upper(),
            )  # fmt: skip
        elif typing.get_origin(hint) is typing.Literal:
            g.add_argument(flag, dest=f.name, choices=typing.get_args(hint), default=None)
        else:  # tuples of ints such as gravity_layers
            g.add_argument(flag, dest=f.name, type=_parse_ints, default=None, metavar="I,J,…")


def add_chat_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--chat",
        type=_parse_bool,
        default=None,
        metavar="{on,off}",
        help="use the chat template (default: on for models that have one)",
    )


def _flag_type(hint: type):
    """Integers bounded to int32, so a huge value is refused here, naming its flag, rather
    than overflowing inside torch; floats are checked by ``PruneParams``' own validation."""
    return int_arg(-INT32 - 1) if hint is int else float


def _parse_bool(s: str) -> bool:
    if s.lower() in ("1", "on", "true", "yes"):
        return True
    if s.lower() in ("0", "off", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {s!r}")


def _parse_ints(s: str) -> tuple[int, ...] | None:
    if s.lower() in ("", "all", "none"):
        return None
    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if any(abs(i) > INT32 for i in v):
        raise argparse.ArgumentTypeError(f"an index is out of range in {s!r}")
    return v


def params_from_args(args: argparse.Namespace, base=None):
    """``PruneParams`` from ``--preset`` (or ``base``) overridden by any flags given."""
    import dataclasses

    from semviz.pruning import PruneParams

    params = base if base is not None else PruneParams()
    if getattr(args, "preset", None) is not None:
        from semviz.presets import PRESETS

        if args.preset not in PRESETS:
            raise ValueError(f"unknown preset {args.preset!r}; choose from {', '.join(PRESETS)}")
        params = PRESETS[args.preset].params
    changes = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(PruneParams)
        if getattr(args, f.name, None) is not None
    }
    return dataclasses.replace(params, **changes) if changes else params
