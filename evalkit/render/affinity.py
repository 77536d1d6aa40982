"""Which cores a render's writers may use: ``$EVALKIT_WRITER_CPUS`` (``off``, the default, or
``auto``).

Why: on the H200 machine (16 cores, session 10, ``benchmarks/bench_contention.py``) a
launch-bound pipeline (small CUDA kernels launched one after the other by one Python thread)
slowed with any CPU load on the machine, the render's own writers included (2 encoder processes:
1.35 -> 1.91 s for the canary's 8 jobs). ``auto`` keeps the writers (the encoder threads, the
recorder, the lossless clip's part encoders, the writer processes, and the FFmpeg threads they
start, which inherit their affinity) off the core the rendering thread is on when the render
starts and off that core's SMT siblings, so the pipeline's thread has a core of its own; the
rendering thread itself is not pinned. With fewer than :data:`MIN_WRITER_CPUS` cores left for
the writers, nothing is pinned. Linux only (elsewhere nothing is pinned).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from evalkit.errors import UserError

ENV = "EVALKIT_WRITER_CPUS"
#: the fewest cores the writers get; with fewer left, nothing is pinned
MIN_WRITER_CPUS = 2
_SYS_CPU = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list (``"0-3,8,10-11"``) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def siblings_map(cpus, root: Path = _SYS_CPU) -> dict[int, frozenset[int]]:
    """Each CPU of ``cpus``'s SMT siblings, itself included (sysfs ``thread_siblings_list``;
    a CPU whose list cannot be read: itself alone)."""
    out = {}
    for c in cpus:
        try:
            sib = parse_cpu_list((root / f"cpu{c}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            sib = set()
        out[c] = frozenset(sib | {c})
    return out


def current_cpu() -> int | None:
    """The CPU the calling thread is running on now (field 39 of its ``/proc`` stat), None
    where that cannot be read."""
    try:
        text = Path(f"/proc/self/task/{threading.get_native_id()}/stat").read_text()
        return int(text.rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def writer_cpus(allowed, siblings: dict[int, frozenset[int]], pipeline_cpu: int | None
                ) -> frozenset[int] | None:
    """The cores the writers may use: ``allowed`` less ``pipeline_cpu`` and its SMT siblings
    (``siblings``: CPU -> its siblings, itself included); None (pin nothing) when
    ``pipeline_cpu`` is unknown or not allowed, or fewer than :data:`MIN_WRITER_CPUS` remain."""
    allowed = frozenset(allowed)
    if pipeline_cpu is None or pipeline_cpu not in allowed:
        return None
    rest = allowed - siblings.get(pipeline_cpu, frozenset()) - {pipeline_cpu}
    return rest if len(rest) >= MIN_WRITER_CPUS else None


def setting() -> str:
    """``$EVALKIT_WRITER_CPUS``: ``off`` (also when unset) or ``auto``; anything else a one-line
    user error."""
    value = os.environ.get(ENV, "").strip().lower() or "off"
    if value not in ("off", "auto"):
        raise UserError(f"{ENV}: expected auto or off, found {os.environ[ENV]!r}")
    return value


def render_writer_cpus() -> frozenset[int] | None:
    """The writers' cores for a render whose rendering thread is the calling one (see the
    module's note); None: do not pin (``off``, not Linux, or too few cores)."""
    if setting() != "auto" or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        allowed = os.sched_getaffinity(0)
    except OSError:
        return None
    return writer_cpus(allowed, siblings_map(allowed), current_cpu())


def pin_thread(cpus) -> None:
    """Restrict the calling thread (and the threads and processes it starts from now on) to
    ``cpus``; nothing when ``cpus`` is None or the kernel refuses (a thread pool's
    initializer)."""
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
