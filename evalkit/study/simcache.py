"""Simulated figures kept on disk: the planner's design and the achieved-design check.

Both are deterministic (fixed seeds) and take seconds to tens of seconds to simulate, so each
command that needs one (``study plan``, ``study create``, ``study results``) would pay for it
again. A figure is stored once per (what, its arguments, the source of :mod:`.stats`, :mod:`.simulate`,
:mod:`.planning` and :mod:`.protocols`: :func:`sources`) under
``$EVALKIT_CACHE_DIR/sims`` (or ``~/.cache/evalkit/sims``) as JSON, written atomically; a
change to the rules' code (or to ``stats.RULE_VERSION``) makes a new key, so a stale figure is
never read. A cache that cannot
be read or written (read-only home, full disk) is skipped: the figure is simulated.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..metrics.weights import cache_dir

_SOURCE: str | None = None


def sources() -> list[Path]:
    """The files whose source keys a figure: the rules, their simulation, the planner and the
    protocol objects (the planner's steps per protocol are theirs)."""
    here = Path(__file__).parent
    return [here / n for n in ("stats.py", "simulate.py", "planning.py")] + sorted(
        (here / "protocols").glob("*.py")
    )


def _source_hash() -> str:
    global _SOURCE
    if _SOURCE is None:
        h = hashlib.sha256()  # read, not imported
        for path in sources():
            h.update(path.read_bytes())
        _SOURCE = h.hexdigest()[:16]
    return _SOURCE


def path_for(what: str, args: dict) -> Path:
    """The cache file of ``what`` (``plan``, ``design_check``) with these arguments."""
    from . import stats

    # the rules' version as well as the source: a plan stays keyed to its rule when the code
    # that makes it moves to another module (the source hash then no longer covers it)
    key = json.dumps(
        {"what": what, "args": args, "stats": _source_hash(), "rule": stats.RULE_VERSION}, sort_keys=True
    )
    return cache_dir() / "sims" / f"{what}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def cached(what: str, args: dict, compute):
    """``compute()``'s JSON-able result for ``args``, from the disk cache when it is there."""
    path = path_for(what, args)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    text = json.dumps(compute(), allow_nan=False)
    try:  # not fsutil's atomic writes: those are the crash tests' kill points
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:  # a cache that cannot be written is only a slower command
        pass
    return json.loads(text)  # the same value whether it came from the cache or not
