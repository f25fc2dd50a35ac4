"""Command line: ``python -m semviz trace|replay|kv-eval|bench|report|compare|frontier …``.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``.
Modules import torch and transformers inside ``run`` so ``--help`` stays instant.
User errors (empty prompt, unknown model, over-long prompt, unreadable trace) print one line
to stderr and exit with code 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("trace", "replay", "kv_eval", "bench", "report", "compare", "frontier")


class UserError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean bad input rather than a bug."""
    from semviz.model import ModelLoadError
    from semviz.trace import TraceError

    errs: list[type[BaseException]] = [UserError, ModelLoadError, TraceError]
    try:
        from semviz.decoding import PromptError

        errs.append(PromptError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m semviz",
        description="Watch and steer a language model choosing its next token.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"semviz.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"semviz.cli.{name}":
                continue
            raise
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("semviz: stopped.", file=sys.stderr)
        return 130
    except user_errors() as exc:
        print(f"semviz {args.command}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # argument validation from the core (names the argument)
        print(f"semviz {args.command}: {exc}", file=sys.stderr)
        return 2
