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


def build_parser() -> argparse.ArgumentParser:
    # --verbose is accepted before or after the command; subcommands must not reset it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and more detail")
    p = argparse.ArgumentParser(
        prog="evalkit",
        description="Render, measure and human-evaluate generative video across hardware backends.",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="show tracebacks and more detail")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    setup.add_setup(sub, common)
    setup.add_info(sub, common)
    setup.add_probe(sub, common)
    render.add_render(sub, common)
    compare.add_compare(sub, common)
    study.add_study(sub, common)
    serve.add_serve(sub, common)
    render.add_suite(sub, common)
    compare.add_metrics(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EvalkitError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def _metrics_user_errors():
    from metrics import MetricsError

    return MetricsError


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
