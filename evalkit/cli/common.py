"""Helpers shared by the command groups: argument types and the executor options."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from evalkit.errors import UserError


def existing_path(value: str) -> Path:
    p = Path(value)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{value}: file not found")
    return p


def renderer_options(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--renderer-opt: expected key=value, found {pair!r}")
        out[key.strip()] = value
    return out


def make_executor(args):
    """None (in this process) or a Ray executor (--executor ray)."""
    if args.executor == "local":
        for flag, value in (
            ("--ray-address", args.ray_address),
            ("--ray-workers", args.ray_workers),
            ("--ray-cpus", args.ray_cpus),
            ("--ray-retries", getattr(args, "ray_retries", None)),
        ):
            if value is not None:
                raise UserError(f"{flag}: only with --executor ray")
        return None
    from evalkit.executor.ray import RayExecutor, import_ray

    import_ray(local=args.ray_address is None)  # a missing Ray fails here, in one line
    kw = {}
    if getattr(args, "ray_retries", None) is not None:
        kw["max_retries"] = args.ray_retries
    if args.ray_cpus is not None:
        kw["cpus_per_worker"] = args.ray_cpus
    return RayExecutor(args.ray_address, max_workers=args.ray_workers, **kw)


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {value!r}")
    return n


def port_number(value: str) -> int:
    """A TCP port to listen on: 1-65535 (0, "any free port", would print a port nobody knows)."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, found {value!r}")
    return n


def output_folder(value: str) -> Path:
    """A folder to write into: not an existing file."""
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a folder, found an empty string")
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"expected a folder, found a file: {value}")
    return p


def output_file(value: str) -> Path:
    """A file to write: not an existing folder, and not empty."""
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a file name, found an empty string")
    p = Path(value)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file to write, found a folder: {value}")
    for folder in p.absolute().parents:  # the nearest one that exists must be a folder
        if folder.exists():
            if not folder.is_dir():
                raise argparse.ArgumentTypeError(
                    f"expected a file in a folder, found {folder} is not a folder"
                )
            if not os.access(folder, os.W_OK | os.X_OK):
                raise argparse.ArgumentTypeError(f"{folder}: cannot write there (permission denied)")
            break
    return p


def executor_args(s, retries: bool = False) -> None:
    s.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local: in this process (default); ray: on a Ray cluster (pip install 'evalkit[ray]')",
    )
    s.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="Ray cluster to join, e.g. 10.0.0.1:6379 or auto (default: start a local "
        "Ray instance on loopback)",
    )
    s.add_argument(
        "--ray-workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="at most N Ray workers per backend (default: one per GPU, or per CPU for "
        "CPU backends, of the matching nodes)",
    )
    s.add_argument(
        "--ray-cpus",
        type=positive_int,
        default=None,
        metavar="N",
        help="CPUs (and compute threads) per Ray worker of a CPU backend or CPU metrics (default 1)",
    )
    if retries:
        s.add_argument(
            "--ray-retries",
            type=int,
            default=None,
            metavar="N",
            help="retry a job whose worker died up to N times (default 2), then record it as failed",
        )
