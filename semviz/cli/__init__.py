"""Command line: ``python -m semviz trace|replay|kv-eval|bench|report|compare|frontier …``.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``.
Modules import torch and transformers inside ``run`` so ``--help`` stays instant.

Every failure is one line on stderr, never a traceback. Bad input (a bad flag value, an empty
or non-UTF-8 prompt, an unknown model, an unreadable trace, an output path that cannot be
written) is found before any decoding where it can be, and exits with code 2. Anything else
is a bug in semviz: it exits with code 1 and one line that says so; set ``SEMVIZ_DEBUG=1`` to
see its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import unicodedata

COMMANDS = ("trace", "replay", "kv_eval", "bench", "report", "compare", "frontier")


class UserError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean bad input rather than a bug.

    ``ValueError`` covers the core's argument validation (it names the argument), and with
    it ``TraceError``, ``FileError``, ``ModelLoadError`` and ``PromptError``; ``OSError`` is
    the machine saying no (a full disk, a permission) after the checks passed.
    """
    return (UserError, ValueError, OSError)


class Parser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line (``semviz trace: argument --steps: …``), exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        name = self.prog.replace("python -m ", "", 1)
        self.exit(2, one_line(f"{name}: {message}") + "\n")


def one_line(text: str) -> str:
    """``text`` as a single printable line: control characters (a newline in a file name)
    escaped, and text that no terminal encoding takes (lone surrogates) as escapes."""
    text = "".join(c if unicodedata.category(c) != "Cc" else repr(c)[1:-1] for c in text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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


# what a command that ran out of memory can be given less of
_MEMORY_HINT = {
    "": "try fewer tokens or a smaller model.",
    "replay": "the trace is too large to replay in this machine's memory; try a shorter run.",
    "report": "the trace is too large to report on here; try a shorter run or --no-png.",
    "kv-eval": "try fewer tokens, fewer budgets or a smaller model.",
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    name = f"semviz {args.command}"
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"{name}: stopped.", file=sys.stderr)
        return 130
    except MemoryError:
        print(
            f"{name}: out of memory; {_MEMORY_HINT.get(args.command, _MEMORY_HINT[''])}",
            file=sys.stderr,
        )
        return 2
    except user_errors() as exc:
        print(one_line(f"{name}: {_message(exc)}"), file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("SEMVIZ_DEBUG"):
            raise
        print(
            one_line(
                f"{name}: internal error, a bug in semviz ({type(exc).__name__}: {exc}); "
                "set SEMVIZ_DEBUG=1 to see where"
            ),
            file=sys.stderr,
        )
        return 1


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror.lower()}{where}"
    return str(exc) or type(exc).__name__
