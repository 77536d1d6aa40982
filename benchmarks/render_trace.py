"""``bench_render.py --trace``: a timeline of the harness's own work in one render, so the
stretches between the pipeline calls can be taken apart: which decodes, file writes and
manifest saves each one waits for, and how long each took. The ``quiet``/``ffwrite`` entries
time trees before issue 37 (their writer modes), as baselines.

:class:`Trace` wraps a few of evalkit's functions while a render runs (a diagnostic: nothing
in evalkit knows of it) and :meth:`Trace.report` prints one line per burst or gap between two
pipeline calls, e.g.::

    gap 1 (after call 1) 0.174 s: decode x7 0.121-0.160 s, ends +0.171; clip x1 0.052 s ...
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import time

#: (module, attribute path, kind) of what is timed; a missing one (an older tree) is skipped
TIMED = (
    ("evalkit.render.quiet", "QuietSources._decode", "decode"),
    ("evalkit.render.driver", "SourceCache._decode", "decode"),
    ("evalkit.render.sources", "SourceCache._decode", "decode"),
    ("evalkit.render.ffwrite", "write_lossless", "clip"),
    ("evalkit.render.ffwrite", "write_browser", "browser"),
    ("evalkit.render.clipwriter", "ClipWriter.write", "clip"),
    ("evalkit.render.clipwriter", "ClipWriter.write_browser", "browser"),
    ("evalkit.fsutil", "sha256_file", "sha256"),
    ("evalkit.render.driver", "_record", "record"),
    ("evalkit.formats.run.RunDir", "save", "save"),
)


def _owner(module: str, path: str):
    parts = path.split(".")
    try:
        obj = importlib.import_module(module)
    except ImportError:
        mod, _, cls = module.rpartition(".")
        obj = getattr(importlib.import_module(mod), cls)
    for p in parts[:-1]:
        obj = getattr(obj, p)
    return obj, parts[-1]


class Trace:
    """Events ``(kind, thread, start, end)`` of the wrapped functions while :meth:`on`."""

    def __init__(self):
        self.events: list[tuple[str, str, float, float]] = []
        self._undo: list = []

    def on(self) -> None:
        self.events.clear()
        for module, path, kind in TIMED:
            try:
                owner, name = _owner(module, path)
                raw = inspect.getattr_static(owner, name)
            except (ImportError, AttributeError):
                continue
            wrapped = (
                staticmethod(self._wrap(raw.__func__, kind))
                if isinstance(raw, staticmethod)
                else self._wrap(raw, kind)
            )
            setattr(owner, name, wrapped)
            self._undo.append((owner, name, raw))

    def off(self) -> None:
        while self._undo:
            owner, name, fn = self._undo.pop()
            setattr(owner, name, fn)

    def _wrap(self, fn, kind: str):
        events = self.events

        @functools.wraps(fn)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                events.append((kind, threading.current_thread().name, t, time.perf_counter()))

        return timed

    def report(self, t0: float, end: float, calls: list[tuple[float, float]]) -> list[str]:
        """A line per stretch outside the calls: before the first, each gap, after the last."""
        spans = [("head", t0, calls[0][0])]
        spans += [
            (f"gap after call {i + 1}", a[1], b[0])
            for i, (a, b) in enumerate(zip(calls, calls[1:]))
            if b[0] - a[1] > 0.005
        ]
        spans.append(("tail", calls[-1][1], end))
        lines = []
        for name, a, b in spans:
            parts = []
            for kind in ("decode", "clip", "browser", "sha256", "record", "save"):
                ev = [e for e in self.events if e[0] == kind and a - 0.001 <= e[2] < b]
                if not ev:
                    continue
                d = sorted(e[3] - e[2] for e in ev)
                parts.append(
                    f"{kind} x{len(ev)} {d[0]:.3f}-{d[-1]:.3f} s (sum {sum(d):.3f}), "
                    f"first starts +{min(e[2] for e in ev) - a:.3f}, last ends "
                    f"+{max(e[3] for e in ev) - a:.3f}"
                )
            lines.append(f"{name} ({a - t0:.3f} s): {b - a:.3f} s" + ("".join(f"\n      {p}" for p in parts)))
        inside = [e for e in self.events if any(c0 <= e[2] < c1 for c0, c1 in calls)]
        if inside:
            kinds = sorted({e[0] for e in inside})
            lines.append(
                "started during a call: " + ", ".join(f"{k} x{sum(e[0] == k for e in inside)}" for k in kinds)
            )
        return lines
