"""Crash tests of ``render`` and ``compare``: SIGKILL a real ``evalkit`` process at a chosen
crash point (``EVALKIT_KILL_AT``, see :func:`evalkit.fsutil.crash_point`) or after a seeded
delay, then look at what it left on disk.

Used by ``tests/test_crash.py`` (a few kills at fixed points) and ``benchmarks/kill_loop.py``
(20 or more kills of each command at random moments).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from evalkit.fsutil import KILL_AT_ENV, dir_leftovers

#: what a complete compare report holds besides ``img/`` (whose files index.html names)
REPORT_FILES = ("frames.csv", "clips.csv", "summary.json", "index.html")


def evalkit_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "evalkit", *map(str, args)]


def run(
    cmd: list[str], *, kill_at: int | None = None, delay: float | None = None, cwd=None
) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end, or until it SIGKILLs itself at crash point ``kill_at``, or until
    it is SIGKILLed ``delay`` seconds after it started (-9 as the exit code when killed)."""
    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
    if kill_at is not None:
        env[KILL_AT_ENV] = str(kill_at)
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if delay is not None:
        try:
            out, err = proc.communicate(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
    else:
        out, err = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree(folder: Path) -> dict[str, tuple]:
    """Every entry under ``folder``: relative path -> (kind, size, mtime_ns, sha256 of a file)."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        kind = "dir" if p.is_dir() else "file"
        out[str(p.relative_to(folder))] = (
            kind,
            st.st_size if kind == "file" else 0,
            st.st_mtime_ns,
            sha(p) if kind == "file" else None,
        )
    return out


def temporaries(folder: Path) -> list[str]:
    """Temporary files or folders under ``folder`` (``.tmp-*``, a run's ``.work/``) and next to
    it (what a killed :func:`evalkit.fsutil.atomic_dir` leaves)."""
    folder = Path(folder)
    found = [str(p) for p in dir_leftovers(folder)]
    if folder.is_dir():
        found += [str(p) for p in folder.rglob("*") if p.name.startswith(".tmp-") or p.name == ".work"]
    return sorted(found)


# -- render ----------------------------------------------------------------------------------


def check_run(path: Path) -> dict:
    """A run folder after a kill: its manifest absent or valid, and every job it marks done has
    its clip in place with the recorded sha256. Returns counts: done, jobs, temporaries."""
    from evalkit.formats.run import RunDir

    path = Path(path)
    if not (path / "manifest.json").exists():
        return {"manifest": False, "done": 0, "jobs": 0, "temporaries": len(temporaries(path))}
    run = RunDir.open(path)  # raises on a half-written or invalid manifest
    done = [j["id"] for j in run.jobs if j["status"] == "done"]
    bad = [j for j in done if not run.is_done(j, verify=True)]
    if bad:
        raise AssertionError(f"{path}: jobs marked done without their clip: {bad}")
    return {"manifest": True, "done": len(done), "jobs": len(run.jobs), "temporaries": len(temporaries(path))}


def clips(path: Path) -> dict[str, str]:
    """A run folder's clips and previews: relative path -> sha256."""
    path = Path(path)
    return {
        str(p.relative_to(path)): sha(p)
        for sub in ("clips", "preview")
        for p in sorted((path / sub).glob("*"))
        if not p.name.startswith(".")
    }


# -- compare ---------------------------------------------------------------------------------


def report_digest(out: Path) -> dict[str, str] | None:
    """A complete report's files -> sha256 (summary.json without its ``created`` time), or None
    when ``out`` is not a complete report (a file missing, a temporary file inside, an image
    that index.html names missing, summary.json unreadable)."""
    import re

    out = Path(out)
    if not out.is_dir():
        return None
    if any(p.name.startswith(".") for p in out.rglob("*")):
        return None
    if not all((out / f).is_file() for f in REPORT_FILES):
        return None
    try:
        summary = json.loads((out / "summary.json").read_text())
    except ValueError:
        return None
    summary.pop("created", None)
    images = set(re.findall(r"""src=['"](img/[^'"]+)['"]""", (out / "index.html").read_text()))
    present = {str(p.relative_to(out)) for p in (out / "img").glob("*")} if (out / "img").is_dir() else set()
    if images - present or present - images:
        return None
    digest = {f: sha(out / f) for f in REPORT_FILES if f != "summary.json"}
    digest.update({f: sha(out / f) for f in sorted(present)})
    digest["summary.json"] = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()
    return digest


def report_state(out: Path, known: dict[str, dict]) -> str:
    """``missing``, the name in ``known`` (name -> :func:`report_digest`) of the complete report
    ``out`` is, ``complete-other`` (complete, but none of those) or ``incomplete``."""
    out = Path(out)
    if not os.path.lexists(out):
        return "missing"
    d = report_digest(out)
    if d is None:
        return "incomplete"
    for name, ref in known.items():
        if d == ref:
            return name
    return "complete-other"


def wait_for(predicate, timeout: float = 120.0, what: str = "a condition") -> None:
    """Poll ``predicate`` until it holds (a generous bound only against a hung test)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
