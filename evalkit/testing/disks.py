"""Read-only and full file systems for tests, made for real and unprivileged: the command runs
in its own user and mount namespaces (``unshare --user --map-root-user --mount``), where

- ``readonly`` folders are bind-mounted read-only over themselves: writes fail with EROFS, as on
  a read-only mount (``chmod 0555`` would not stop root, which these tests run as);
- ``full`` folders get a small tmpfs over them, their files copied in, the rest of its room
  filled with one file: writes fail with ENOSPC, as on a full disk.

Nothing outside the command's namespace changes (the mounts vanish with it); the kernel does
the refusing, not a hook in evalkit. :func:`available` says whether this machine allows it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]
FULL_KB = 16384  # the tmpfs of a "full" folder: its files plus this much, then filled


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether unprivileged user and mount namespaces work here (a tmpfs mount inside one)."""
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run([*UNSHARE, "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"], capture_output=True)
    return r.returncode == 0


def _size_kb(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) // 1024 + 1


def script(argv, *, readonly=(), full=(), cwd=None, fill: bool = True) -> str:
    """The shell script that makes the mounts and then ``exec``s ``argv`` (``fill`` False: the
    ``full`` folders keep ``FULL_KB`` of room, to be filled later through
    ``/proc/<pid>/root``: :func:`fill_up`)."""
    lines = ["set -e"]
    for d in readonly:
        d = shlex.quote(str(Path(d).resolve()))
        lines.append(f"mount --bind {d} {d} && mount -o remount,bind,ro {d} {d}")
    for i, d in enumerate(full):
        d = Path(d).resolve()
        # an empty folder beside it (left behind, empty, when the namespace ends)
        keep = shlex.quote(str(d.parent / f".{d.name}.evalkit-full-{i}"))
        q = shlex.quote(str(d))
        size = _size_kb(d) + FULL_KB
        # the folder's files are reached through a second bind of it, taken before the tmpfs
        # hides them; then copied in, and the rest of the tmpfs filled
        lines += [
            f"mkdir -p {keep}",
            f"mount --bind {q} {keep}",
            f"mount -t tmpfs -o size={size}k none {q}",
            f"cp -a {keep}/. {q}/",
        ]
        if fill:
            lines += [f"dd if=/dev/zero of={q}/.fill bs=4k 2>/dev/null || true", "sync"]
    if cwd is not None:
        lines.append(f"cd {shlex.quote(str(cwd))}")
    lines.append("exec " + " ".join(shlex.quote(str(a)) for a in argv))
    return "\n".join(lines)


def command(argv, *, readonly=(), full=(), cwd=None, fill: bool = True) -> list[str]:
    """The command line that runs ``argv`` as :func:`run` does (for a Popen of one's own)."""
    return [*UNSHARE, "sh", "-c", script(argv, readonly=readonly, full=full, cwd=cwd, fill=fill)]


def fill_up(pid: int, folder) -> int:
    """Fill ``folder`` as the process ``pid`` (started by :func:`command` with ``fill=False``)
    sees it: its tmpfs, reached through ``/proc/<pid>/root``, written full. Bytes written."""
    path = Path(f"/proc/{pid}/root") / Path(folder).resolve().relative_to("/") / ".fill"
    n = 0
    with open(path, "ab") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                n += 65536
        except OSError:
            pass
    return n


def run(argv, *, readonly=(), full=(), cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """``argv`` with the folders in ``readonly`` read-only and those in ``full`` full (their
    files kept, no room left); text output captured."""
    return subprocess.run(
        [*UNSHARE, "sh", "-c", script(argv, readonly=readonly, full=full, cwd=cwd)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def evalkit(*args, readonly=(), full=(), cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """``python -m evalkit ARGS`` (this repository first on the path) under :func:`run`."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    return run(
        [sys.executable, "-m", "evalkit", *map(str, args)],
        readonly=readonly,
        full=full,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )
