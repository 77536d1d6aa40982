"""The ``evalkit`` command line: argument parsing only; each command calls one library function.
One module per command group (:mod:`.setup`, :mod:`.render`, :mod:`.compare`, :mod:`.study`,
:mod:`.serve`), each with its ``add_<command>(sub, common)`` and ``cmd_*`` functions.

User errors (:class:`evalkit.errors.UserError`, bad paths, invalid files) print one line
``error: ...`` on stderr and exit with 2; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from evalkit.cli import compare, render, serve, setup, study
from evalkit.errors import EvalkitError, UserError
from evalkit.fsutil import storage_error

#: an error line longer than this is cut (a value echoed from a file can be anything)
MAX_ERROR_CHARS = 1000


class Parser(argparse.ArgumentParser):
    """argparse with evalkit's error format: a bad option or argument is one line
    ``error: argument --port: expected ..., found ...`` and exit code 2 (no usage block: the
    line says where ``--help`` is). Subcommand parsers are made of the same class."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    # --verbose is accepted before or after the command; subcommands must not reset it.
    common = Parser(add_help=False)
    common.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks and more detail",
    )
    p = Parser(
        prog="evalkit",
        description="Render, measure and human-evaluate generative video across hardware backends.",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="show tracebacks and more detail")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    setup.add_setup(sub, common)
    setup.add_info(sub, common)
    setup.add_fingerprint(sub, common)
    setup.add_probe(sub, common)
    render.add_render(sub, common)
    render.add_import(sub, common)
    compare.add_compare(sub, common)
    compare.add_gate(sub, common)
    compare.add_floor(sub, common)
    study.add_study(sub, common)
    serve.add_serve(sub, common)
    render.add_suite(sub, common)
    compare.add_metrics(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad option (2, one line already printed)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of our output went away (`evalkit ... | head`): stop quietly, as a shell
        # tool does; stdout is pointed at devnull so the interpreter's final flush cannot fail
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (UserError, _metrics_user_errors()) as e:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except EvalkitError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return e.exit_code
    except Exception as e:
        line = storage_error(e, getattr(args, "db", None))
        if line is None:  # a bug or a fault of the system: its traceback
            raise
        if args.verbose:  # a write outside evalkit's atomic ones: no room, read-only
            traceback.print_exc()
        print(f"error: {_one_line(line)}", file=sys.stderr)
        return 2


def _one_line(e: Exception) -> str:
    """The error's message on one line, at most :data:`MAX_ERROR_CHARS` characters."""
    msg = " ".join(str(e).split("\n"))
    if len(msg) > MAX_ERROR_CHARS:
        msg = msg[: MAX_ERROR_CHARS - 60] + f"... ({len(msg) - MAX_ERROR_CHARS + 60:,} more characters)"
    return msg


def _metrics_user_errors():
    from evalkit.metrics import MetricsError

    return MetricsError


if __name__ == "__main__":
    sys.exit(main())
