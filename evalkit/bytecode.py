"""Start-up: keep the compiled bytecode of the libraries the ``evalkit`` command imports.

Python caches each module's compiled bytecode (``__pycache__/*.pyc`` beside the source) and
reuses it in the next process. Two settings together take that away, and then every process
compiles torch's Python from source again:

- the libraries were installed without their bytecode (uv's default, ``pip install
  --no-compile``, images built that way), and
- writing bytecode is turned off (``PYTHONDONTWRITEBYTECODE=1``, common in container images,
  or ``python -B``).

On the H200 machine of ``benchmarks/README.md`` (session 15) that made ``import torch`` take
3.8-5.4 s of every ``evalkit compare``'s start-up.

:func:`ensure`, the ``evalkit`` command's first step, turns bytecode writing back on for the
process in that case only, into a mirror tree inside evalkit's cache folder
(``<cache>/pycache``, Python's own :data:`sys.pycache_prefix` mechanism), so nothing is
written beside the installed sources. The first command compiles once; the next ones read.
The child processes it starts (decoders, writers) inherit ``PYTHONPYCACHEPREFIX`` and read
from the same tree. It changes nothing when bytecode may be written, when
``PYTHONPYCACHEPREFIX`` is set already, when the probed libraries have their bytecode beside
them, or when ``EVALKIT_BYTECODE=off``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

#: set to ``off`` to leave Python's bytecode settings as they are
ENV = "EVALKIT_BYTECODE"
#: the heavy libraries whose cached bytecode decides (the first one installed is probed)
PROBE = ("torch", "gradio")


def uncached(probe: tuple[str, ...]) -> str | None:
    """The first installed library of ``probe`` whose package bytecode is not cached where
    this interpreter looks for it, or None (none installed, or the first one's is)."""
    for name in probe:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        try:
            cached = importlib.util.cache_from_source(spec.origin)
        except NotImplementedError:          # no cache tag: nothing to do
            return None
        return None if os.path.exists(cached) else name
    return None


def ensure(probe: tuple[str, ...] | None = None) -> Path | None:
    """Turn bytecode writing on, into ``<cache>/pycache``, when it is off and the first
    installed library of ``probe`` has no cached bytecode; the folder used, or None when
    nothing changed. Call it before the heavy imports."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return None
    if not sys.dont_write_bytecode or sys.pycache_prefix is not None:
        return None
    if uncached(PROBE if probe is None else probe) is None:
        return None
    from metrics.weights import cache_dir    # neither numpy nor torch: safe this early

    folder = cache_dir() / "pycache"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:                          # a read-only home: leave the settings alone
        return None
    if not os.access(folder, os.W_OK):
        return None
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)   # children read what this one wrote
    return folder
