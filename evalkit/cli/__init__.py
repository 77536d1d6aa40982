"""The ``evalkit`` command line: argument parsing only; each command calls one library function.
One module per command group (:mod:`.setup`, :mod:`.render`, :mod:`.compare`, :mod:`.study`,
:mod:`.serve`), each with its ``add_<command>(sub, common)`` and ``cmd_*`` functions.

User errors (:class:`evalkit.errors.UserError`, bad paths, invalid files) print one line
``error: ...`` on stderr and exit with 2; ``--verbose`` adds the traceback.
"""
from __future__ import annotations

import argparse
import errno
import sys
import traceback

from evalkit.cli import compare, render, serve, setup, study
from evalkit.errors import EvalkitError, UserError
from evalkit.fsutil import no_room

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
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and more detail")
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
    except SystemExit as e:          # --help (0) or a bad option (2, one line already printed)
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
        line = storage_error(e)
        if line is None:             # a bug or a fault of the system: its traceback
            raise
        if args.verbose:             # a write outside evalkit's atomic ones: no room, read-only
            traceback.print_exc()
        print(f"error: {_one_line(line)}", file=sys.stderr)
        return 2


#: errnos of a place that cannot be written at all: a read-only file system, no permission
NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def storage_error(e: BaseException) -> str | None:
    """The one line for a failure of the storage under the command (None: something else): a
    write refused for want of room or on a read-only file system or without permission (an
    OSError, or SQLite's own error, anywhere in the exception's chain)."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            where = str(seen.filename or "a file")
            name = where.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(".") and ".tmp-" in name:     # an atomic write's temporary:
                where = where.rstrip("/").rsplit("/", 1)[0] or "."   # its folder is the place
            if no_room(seen):
                return (f"{where}: could not be written ({seen.strerror}); make room and run "
                        "the command again")
            if seen.errno in NOT_WRITABLE:
                return (f"{where}: cannot be written ({seen.strerror}); write somewhere "
                        "writable (what the command wrote before this is kept)")
        text = str(seen).lower()
        if type(seen).__module__.startswith(("sqlite3", "sqlalchemy")):
            if "readonly database" in text or "read-only" in text:
                return ("the study database cannot be written (read-only: its file or its "
                        "folder); copy it somewhere writable")
            if "database or disk is full" in text or "disk i/o error" in text:
                return ("the study database could not be written (no space left on its disk, "
                        "or a disk I/O error); make room and run the command again")
        seen = seen.__cause__ or seen.__context__
    return None


def _one_line(e: Exception) -> str:
    """The error's message on one line, at most :data:`MAX_ERROR_CHARS` characters."""
    msg = " ".join(str(e).split("\n"))
    if len(msg) > MAX_ERROR_CHARS:
        msg = msg[:MAX_ERROR_CHARS - 60] + f"... ({len(msg) - MAX_ERROR_CHARS + 60:,} more characters)"
    return msg


def _metrics_user_errors():
    from evalkit.metrics import MetricsError

    return MetricsError


if __name__ == "__main__":
    sys.exit(main())
