"""How every ``slimrl`` command says bad input: one line ``<prog>: error: ...`` on stderr and exit status 2, never
argparse's usage block (the error itself is :class:`slimrl.errors.InputError`)."""

from __future__ import annotations

import argparse
import sys


def fail(prog: str, message: str) -> int:
    """Print ``<prog>: error: <message>`` on stderr; the exit status for it (2)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """``parser``'s arguments, or the exit status when it stopped: 0 after ``--help``, 2 after a one-line error."""

    def error(message: str):
        raise SystemExit(fail(parser.prog, message))

    parser.error = error
    try:
        return parser.parse_args(argv)
    except SystemExit as done:
        return int(done.code or 0)
