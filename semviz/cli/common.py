"""Arguments and helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_model_args(p: argparse.ArgumentParser) -> None:
    add_run_args(p, ("model",), {"model": None})
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
    from semviz.model.load import load_model

    quiet = hide_progress(args)

    def progress(msg: str, frac: float) -> None:
        if not quiet:
            print(f"[{frac:4.0%}] {msg}", file=sys.stderr)

    name = args.model or None
    return load_model(name, device=args.device, dtype=args.dtype, progress=progress)


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


def ray_address(s: str) -> str:
    """An argparse ``type=`` for a Ray cluster: ``auto``, ``local`` or ``[ray://]host:port``,
    checked here so a typo is one line, not a wait for a cluster that is not there."""
    rest = s.removeprefix("ray://")
    if s in ("auto", "local"):
        return s
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected auto, local or host:port (port 1 to 65535), got {s!r}"
        )
    return s


def add_ray_args(p: argparse.ArgumentParser, what: str) -> None:
    """``--workers N`` and ``--address ADDR``: run ``what`` on Ray workers; without them no Ray
    is imported."""
    p.add_argument(
        "--workers",
        type=int_arg(1, 4096),
        default=None,
        help=f"run {what} on N Ray workers (a local Ray started here unless --address)",
    )
    p.add_argument(
        "--address",
        type=ray_address,
        default=None,
        help="join this Ray cluster (auto, local or host:port)",
    )


def add_force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="replace existing output files")


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=float))


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr (hidden with --json or when disabled)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, disable=not enabled, leave=False)


def add_prune_args(p: argparse.ArgumentParser) -> None:
    """One ``--flag`` per ``PruneParams`` field (``--top-p 0.9``), plus ``--preset NAME``.

    Each flag's type, choices and help come from the field's metadata; a value of the wrong
    type is refused by argparse, a number out of range by ``PruneParams`` (exit code 2).
    """
    import dataclasses

    from semviz.sampling import PruneParams

    g = p.add_argument_group("sampling (defaults: plain sampling, or the preset's values)")
    g.add_argument("--preset", default=None, help="scenario preset: code, story, qa, brainstorm")
    for f in dataclasses.fields(PruneParams):
        spec = f.metadata["spec"]
        kw: dict[str, Any] = {"dest": f.name, "default": None, "type": _typed(spec.coerce)}
        if spec.kind == "choice":
            kw["choices"] = spec.choices
        else:
            kw["metavar"] = _METAVAR[spec.kind]
        rng = spec.range_text() if spec.kind in ("int", "float") else ""
        kw["help"] = f"{spec.help} (must be {rng})" if rng else spec.help
        g.add_argument("--" + f.name.replace("_", "-"), **kw)


_METAVAR = {"bool": "{on,off}", "int": "INT", "float": "FLOAT", "indices": "I,J,…"}


def _typed(parse):
    """``parse`` as an argparse type: its ``ValueError`` becomes argparse's one-line error."""

    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def add_chat_arg(p: argparse.ArgumentParser) -> None:
    add_run_args(p, ("chat",))


def add_run_args(
    p: argparse.ArgumentParser, names: tuple[str, ...], defaults: dict[str, Any] | None = None
) -> None:
    """A flag for each named ``RunSettings`` field (``--seed``, ``--steps``, ``--kv-policy``…).

    Type, range, choices and help come from the field's metadata, so the CLI accepts what
    the app does; a value out of range is refused by argparse, naming the flag (exit 2).
    ``defaults`` replaces a field's default for this subcommand (``compare``'s 48 steps).
    """
    from semviz.decoding.settings import RUN_SPECS, RunSettings

    for name in names:
        spec = RUN_SPECS[name]
        flag = spec.flag or "--" + name.replace("_", "-")
        default = (defaults or {}).get(name, RunSettings.__dataclass_fields__[name].default)
        kw: dict[str, Any] = {"dest": flag[2:].replace("-", "_"), "default": default}
        kw["type"] = _typed(lambda text, spec=spec: _checked(spec, spec.coerce(text)))
        if spec.kind == "choice":
            kw["choices"] = spec.choices
        else:
            kw["metavar"] = "{on,off,auto}" if spec.optional else _METAVAR.get(spec.kind)
        if spec.kind == "bool":
            shown = {None: "auto", True: "on", False: "off"}[default]
        else:
            shown = None if default in (None, "") else default
        kw["help"] = spec.help if shown is None else f"{spec.help} (default {shown})"
        p.add_argument(flag, **kw)


def _checked(spec, value):
    """``value`` if ``spec`` accepts it; else ``ValueError`` saying what it must be."""
    why = spec.problem(value)
    if why is not None:
        raise ValueError(why)
    return value


def run_from_args(args: argparse.Namespace, **given: Any):
    """``RunSettings`` from the flags :func:`add_run_args` added (others at their default),
    and ``given`` for fields a subcommand fixes itself."""
    from semviz.decoding.settings import RUN_SPECS, RunSettings

    kw = dict(given)
    for name, spec in RUN_SPECS.items():
        dest = (spec.flag or "--" + name)[2:].replace("-", "_")
        if name not in kw and hasattr(args, dest):
            kw[name] = getattr(args, dest)
    kw["model"] = kw.get("model") or ""
    return RunSettings(**kw)


def params_from_args(args: argparse.Namespace, base=None):
    """``PruneParams`` from ``--preset`` (or ``base``) overridden by any flags given."""
    import dataclasses

    from semviz.sampling import PruneParams

    params = base if base is not None else PruneParams()
    if getattr(args, "preset", None) is not None:
        from semviz.sampling.presets import PRESETS

        if args.preset not in PRESETS:
            raise ValueError(f"unknown preset {args.preset!r}; choose from {', '.join(PRESETS)}")
        params = PRESETS[args.preset].params
    changes = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(PruneParams)
        if getattr(args, f.name, None) is not None
    }
    return params.replace(**changes) if changes else params
