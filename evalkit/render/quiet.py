"""Quiet phases: a local render that does no CPU-heavy work while the pipeline calls run
(``$EVALKIT_RENDER_WRITES``: ``overlap``, ``batch`` or ``auto``; :func:`writes_mode`).

Why: on the H200 the canary pipeline's calls ran about 40% slower inside ``evalkit render``
than in a direct loop, and any CPU load beside its kernel-launching thread slowed it
(benchmarks/README.md, "Render overhead"). In windows they do run as fast as in the loop, but
so far the bursts between them cost about as much (:data:`DEVICE_DEFAULT`). The modes:

- ``overlap`` (the default; the driver's own way): the next job's source is decoded
  on a thread and the finished jobs' clips and browser copies are encoded while the next job
  renders.
- ``batch``: the jobs run in windows of consecutive jobs, and nothing runs beside the calls of a
  window: before a window, the sources of all its jobs are decoded at once (one thread per
  distinct clip, up to the usable cores); its results are held in memory; when it ends, one
  burst writes them all at once (the driver's writers: every clip and preview on threads sized
  to the cores, or in the writer processes) while the next window's sources are decoded, each
  job recorded in the manifest in job order as its files land.
- ``auto``: ``batch`` while the calls are short; as soon
  as their mean time reaches :data:`LONG_CALL_SECONDS` (GPU work that long hides the writers'
  CPU load, and a window of such jobs would make the device wait for each burst) the window
  ends and the jobs go as ``overlap`` does: the held results written in the background (one
  burst at a time, each waiting for the one before, so the recording order stays job order)
  while the next job renders, whose next source is decoded meanwhile. The first window is the
  first job alone (only its source decoded before it, as ``overlap`` does): its time decides.
  Should the mean fall below the limit again (a slow first call: warm-up, compilation),
  windows come back.

A window is bounded by the bytes it holds (its sources and results, :func:`held_budget`) and by
the pipeline time it holds unwritten (:data:`BATCH_SECONDS`: a crash or Ctrl-C loses about that
much rendering; the held jobs are simply not done, and a resumed render redoes them). The first
window of each backend's run takes up to :data:`FIRST_WINDOW_JOBS` jobs (``auto``: one), later
ones ``BATCH_SECONDS`` over the run's mean call time so far (at least one job); a job whose
own time exceeds that ends its window. A source that fails to decode ends the window before the
job that needs it; that job's ``get`` raises the error, as without windows.

:class:`QuietSources` is both sides' handle: the executor renders through :meth:`~QuietSources.run`
and reads sources with :meth:`~QuietSources.get` (as from a
:class:`evalkit.render.driver.SourceCache`); the driver hands each result to
:meth:`~QuietSources.hold` and sets :attr:`~QuietSources.flush`, which writes held results
(:meth:`~QuietSources.settle`: waits for a background burst).
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Iterator

from evalkit.errors import UserError
from evalkit.render import ffwrite

_ENV = "EVALKIT_RENDER_WRITES"
#: ``overlap``: write and decode beside the pipeline calls; ``batch``: in bursts between windows;
#: ``auto``: ``batch`` while the calls are short, then ``overlap``
MODES = ("overlap", "batch", "auto")
#: ``auto``: the mean call time (seconds) from which the rest of a run goes as ``overlap``
LONG_CALL_SECONDS = 2.0
#: the pipeline time a window holds unwritten, at most (seconds; a window has one job at least)
BATCH_SECONDS = 10.0
#: jobs of the first window (no call time measured yet), at most
FIRST_WINDOW_JOBS = 16
#: bytes a window holds (sources and results), at most; less with little memory available
MAX_HELD_BYTES = 2 * 2**30


#: the mode of a render on a device when ``$EVALKIT_RENDER_WRITES`` is unset. ``overlap``: on
#: the H200 the canary's calls ran at the direct loop's speed in ``batch``/``auto`` windows
#: (1.15-1.47 s against 1.71-1.77 s beside the writers), but the bursts (8 sources decoded,
#: 16 files written on threads: 0.5 s) took most of that back: ``auto`` 1.80 and 2.03 s against
#: ``overlap``'s 1.91 and 1.92 s in two runs, ``batch`` 1.70-1.98 s against 1.83-1.92 s
#: (benchmarks/README.md, "Render overhead"). No gain shown, so nothing is held by default
#: while PyAV writes.
DEVICE_DEFAULT = "overlap"
#: the same when FFmpeg programs write (``evalkit.render.ffwrite``, a device render's default
#: since session 15): on the H200 ``auto`` cost the canary +12.2% and +16.3% of the pipeline's
#: own time against ``overlap``'s +20.6% and +30.8% (two runs on one machine; +35.8% against
#: +44.1% on another), the bursts' 16 files taking 0.13-0.14 s instead of PyAV's 0.24-0.25
PROGRAMS_DEVICE_DEFAULT = "auto"


def writes_mode(on_device: bool = False, programs: bool = False) -> str:
    """``$EVALKIT_RENDER_WRITES``: ``overlap``, ``batch`` or ``auto``; when unset, for a
    render on a device (``on_device``) :data:`PROGRAMS_DEVICE_DEFAULT` if FFmpeg programs
    write its files (``programs``), else :data:`DEVICE_DEFAULT`; ``overlap`` on the CPU;
    anything else is a one-line user error."""
    default = ((PROGRAMS_DEVICE_DEFAULT if programs else DEVICE_DEFAULT) if on_device
               else "overlap")
    value = os.environ.get(_ENV, "").strip() or default
    if value not in MODES:
        raise UserError(f"{_ENV}: expected one of {', '.join(MODES)}, found {value!r}")
    return value


def held_budget() -> int:
    """Bytes a window may hold: :data:`MAX_HELD_BYTES`, or an eighth of the memory available
    (``MemAvailable``) where that is less."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return min(MAX_HELD_BYTES, int(line.split()[1]) * 1024 // 8)
    except (OSError, ValueError, IndexError):
        pass
    return MAX_HELD_BYTES


class Windows:
    """How many of the next jobs a window takes (:meth:`size`) and when a window is full
    (:meth:`full`), and whether the calls are :attr:`long`; told each job's call time and bytes
    (:meth:`ran`). Pure bookkeeping: the tests give it sizes and times. ``long_seconds``: see
    :attr:`long` (None: never long, ``batch``; else the first window is one job)."""

    def __init__(self, budget: int, seconds: float, first: int,
                 long_seconds: float | None = None):
        self.budget, self.seconds, self.first = int(budget), float(seconds), max(1, int(first))
        self.long_seconds = long_seconds
        self.calls = 0
        self.call_seconds = 0.0
        self._out = self._in = 0        # result bytes and their sources' bytes, so far

    def new_run(self) -> None:
        """Forget the call times (another backend's run: another pipeline); keep the ratio."""
        self.calls, self.call_seconds = 0, 0.0

    @property
    def long(self) -> bool:
        """Whether the mean call time so far reaches ``long_seconds`` (``auto``: the next job
        runs as ``overlap`` renders it, not in a window)."""
        return (self.long_seconds is not None and self.calls > 0
                and self.call_seconds / self.calls >= self.long_seconds)

    @property
    def ratio(self) -> float:
        """A result's bytes per byte of its source, as measured so far (1 before any)."""
        return self._out / self._in if self._in else 1.0

    def jobs_limit(self) -> int:
        if not self.calls:              # auto: the first job alone, to learn its time
            return self.first if self.long_seconds is None else 1
        return max(1, int(self.seconds / (self.call_seconds / self.calls)))

    def size(self, clips: list[str], clip_bytes: Callable[[str], int]) -> int:
        """Jobs to take from the next ones (their ``clips``, in order): within the job limit and
        the byte budget (each distinct source once, each result estimated from its source);
        at least one."""
        total, seen, n = 0, set(), 0
        for clip in clips[:self.jobs_limit()]:
            size = clip_bytes(clip)
            add = size * self.ratio + (0 if clip in seen else size)
            if n and total + add > self.budget:
                break
            total += add
            seen.add(clip)
            n += 1
        return max(1, n)

    def ran(self, seconds: float, result_bytes: int, source_bytes: int) -> None:
        self.calls += 1
        self.call_seconds += max(0.0, float(seconds))
        if result_bytes:
            self._out += result_bytes
            self._in += source_bytes

    def full(self, window_seconds: float, held_bytes: int, next_bytes: int = 0) -> bool:
        """Whether a window that holds ``window_seconds`` of calls and ``held_bytes`` ends now
        (``next_bytes``: what its next job would add)."""
        return window_seconds >= self.seconds or held_bytes + next_bytes > self.budget


class QuietSources:
    """A ``batch`` or ``auto`` render's sources and held results (see the module's note).
    ``budget``, ``seconds``, ``first``: :func:`held_budget`, :data:`BATCH_SECONDS`,
    :data:`FIRST_WINDOW_JOBS` when None; ``mode``: ``batch`` or ``auto``."""

    def __init__(self, suite, *, budget: int | None = None, seconds: float | None = None,
                 first: int | None = None, mode: str = "batch", programs: bool = False):
        if mode not in ("batch", "auto"):
            raise ValueError(f"QuietSources: mode {mode!r}")
        self.suite = suite
        #: exact-RGB lossless sources decoded by FFmpeg programs (ffwrite.read_exact)
        self.programs = programs
        self.windows = Windows(held_budget() if budget is None else budget,
                               BATCH_SECONDS if seconds is None else seconds,
                               FIRST_WINDOW_JOBS if first is None else first,
                               LONG_CALL_SECONDS if mode == "auto" else None)
        #: decoded sources at hand: clip id -> (frames, fps, path)
        self.frames: dict[str, tuple] = {}
        #: sources that failed to decode: clip id -> the exception (raised by :meth:`get`)
        self.failed: dict[str, BaseException] = {}
        #: results handed over by the driver, not yet written
        self.held: list = []
        #: the driver's writer: ``flush(held)`` writes and records the held results (in order)
        self.flush: Callable[[list], None] | None = None
        self._early: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        #: the background burst of long calls (one at a time) and its thread
        self._behind: Future | None = None
        self._behind_pool: ThreadPoolExecutor | None = None
        self._sizes: dict[str, int] = {}
        #: inside :meth:`run` (else the executor renders job by job on its own: each result
        #: is written when handed over, one source kept, as a plain SourceCache would)
        self._windows = False

    # -- as a SourceCache (the executor's and the driver's set-up) ------------------------------
    def prefetch(self, clip_id: str | None) -> None:
        """Start decoding ``clip_id`` now (the driver's set-up, before any call: the first
        window picks it up)."""
        if (clip_id is None or clip_id in self.frames or clip_id in self._early
                or clip_id in self.failed):
            return
        self._early[clip_id] = self._decoders().submit(self._decode, clip_id, 0)

    def get(self, clip_id: str):
        """A source of the window: ``(frames, fps, path)``; its decoding error if it failed
        (decoded here if not at hand: a caller outside :meth:`run`)."""
        if clip_id in self.failed:
            raise self.failed[clip_id]
        if clip_id not in self.frames:
            if not self._windows:
                self.frames.clear()
            early = self._early.pop(clip_id, None)
            self.frames[clip_id] = early.result() if early else self._decode(clip_id, 0)
        return self.frames[clip_id]

    def close(self) -> None:
        self.settle()
        if self._behind_pool is not None:
            self._behind_pool.shutdown(wait=True)
            self._behind_pool = None
        for f in self._early.values():
            f.cancel()
        self._early.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.frames.clear()
        self.held.clear()

    # -- the driver's side -------------------------------------------------------------------
    def hold(self, item) -> None:
        """Keep a rendered job (the driver's record of it) until the window's burst (outside
        :meth:`run`: written now)."""
        self.held.append(item)
        if not self._windows:
            self._burst(list(self.frames))

    def finish(self) -> None:
        """Write what is still held (the driver, after the last result)."""
        self._burst([])

    def settle(self) -> None:
        """Wait for the background burst, if any, to end (the driver, before its writers stop;
        its error, if any, was raised already or is dropped for the one being raised)."""
        if self._behind is not None:
            wait([self._behind])
            self._behind = None

    # -- the executor's side -----------------------------------------------------------------
    def run(self, jobs, render_one: Callable) -> Iterator:
        """Render ``jobs`` window by window with ``render_one(job) -> JobResult``, yielding each
        result; between windows, the burst; after the last one, its writes. While the calls are
        long (``auto``), job by job, the held results written in the background."""
        self._windows = True
        self.windows.new_run()
        try:
            yield from self._run(list(jobs), render_one)
        finally:
            self._windows = False
        self._burst([])

    def _run(self, jobs: list, render_one: Callable) -> Iterator:
        w = self.windows
        i = 0
        while i < len(jobs):
            if w.long:                  # a long job: as overlap
                yield self._ran(self._run_long(jobs[i], jobs[i + 1:i + 2], render_one))
                i += 1
                continue
            n = w.size([j.clip for j in jobs[i:]], self._clip_bytes)
            window = jobs[i:i + n]
            self._burst([j.clip for j in window])
            for k, job in enumerate(window):
                if k and job.clip in self.failed:   # its error raised alone, after a burst
                    window = window[:k]
                    break
            held_bytes = sum(self._clip_bytes(c) for c in {j.clip for j in window})
            seconds = 0.0
            for k, job in enumerate(window):
                result = self._ran(render_one(job))
                i += 1
                held_bytes += result.frames.nbytes if result.frames is not None else 0
                seconds += float(result.timing.get("seconds", 0.0))
                yield result
                if w.long:
                    break
                if k + 1 < len(window):
                    after = self._clip_bytes(window[k + 1].clip) * w.ratio
                    if w.full(seconds, held_bytes, int(after)):
                        break

    def _ran(self, result):
        """Tell the windows a result's call time and bytes; return it."""
        out = result.frames.nbytes if result.frames is not None else 0
        self.windows.ran(float(result.timing.get("seconds", 0.0)), out,
                         self._clip_bytes(result.job.clip))
        return result

    def _run_long(self, job, after: list, render_one: Callable):
        """A long job, as ``overlap`` renders it: the held results written in the background
        meanwhile, the next job's source (``after``: that job, or none) decoded; only these two
        sources kept."""
        self._write_behind()
        nxt = after[0].clip if after else None
        keep = {job.clip, nxt}
        for c in [c for c in self.frames if c not in keep]:
            del self.frames[c]
        for c in [c for c in self._early if c not in keep]:
            self._early.pop(c).cancel()
        self.failed = {c: e for c, e in self.failed.items() if c in keep}
        self.prefetch(nxt)
        return render_one(job)

    # -- inside --------------------------------------------------------------------------------
    def _decoders(self) -> ThreadPoolExecutor:
        from evalkit.video import usable_cores

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, usable_cores()),
                                            thread_name_prefix="evalkit-source")
        return self._pool

    def _decode(self, clip_id: str, threads: int):
        from evalkit.video import ClipReader

        path = self.suite.clips[clip_id].path
        # a program decodes with FFmpeg's own thread count, not ``threads``: on the H200 the
        # canary's 8 sources decoded at once in 0.142 s that way, in 0.235 s with 2 threads
        # each (benchmarks/bench_burst.py)
        got = ffwrite.read_exact(path) if self.programs else None
        if got is not None:
            return got[0], got[1], path
        reader = ClipReader(path, threads=threads)
        return reader.read(), reader.info.fps, path

    def _clip_bytes(self, clip_id: str) -> int:
        """A source's bytes: its frames' when decoded, else estimated from its header (0 when
        unknown: its decoding will say why)."""
        if clip_id in self.frames:
            return int(self.frames[clip_id][0].nbytes)
        if clip_id not in self._sizes:
            from evalkit.video import ClipReader

            try:
                info = ClipReader(self.suite.clips[clip_id].path).info
                self._sizes[clip_id] = info.width * info.height * 3 * (info.frames_estimate or 0)
            except Exception:  # noqa: BLE001 - the decode reports it, on the job that needs it
                self._sizes[clip_id] = 0
        return self._sizes[clip_id]

    def _wait_behind(self) -> None:
        """Wait for the background burst, if any; raise its error (kept for :meth:`settle` if
        the wait is interrupted)."""
        if self._behind is not None:
            try:
                self._behind.result()
            except Exception:
                self._behind = None
                raise
            self._behind = None

    def _write_behind(self) -> None:
        """Start writing the held results in the background, once the previous background burst
        has ended (its error raised here)."""
        self._wait_behind()
        held, self.held = self.held, []
        if held and self.flush is not None:
            if self._behind_pool is None:
                self._behind_pool = ThreadPoolExecutor(max_workers=1,
                                                       thread_name_prefix="evalkit-burst")
            self._behind = self._behind_pool.submit(self.flush, held)

    def _burst(self, clips: list[str]) -> None:
        """Write the held results (``flush``) while the sources of ``clips`` not at hand are
        decoded, all at once; the sources no longer needed are let go first (a background burst
        ends first)."""
        from evalkit.video import usable_cores

        self._wait_behind()
        keep = set(clips)
        for c in [c for c in self.frames if c not in keep]:
            del self.frames[c]
        self.failed = {c: e for c, e in self.failed.items() if c in keep}
        missing = [c for c in dict.fromkeys(clips) if c not in self.frames and c not in self.failed]
        cold = [c for c in missing if c not in self._early]
        threads = max(1, usable_cores() // max(1, len(cold)))   # each decoder's own share
        decodes = {c: self._early.pop(c) if c in self._early
                   else self._decoders().submit(self._decode, c, threads) for c in missing}
        held, self.held = self.held, []
        try:
            if held and self.flush is not None:
                self.flush(held)
        except BaseException:
            for f in decodes.values():
                f.cancel()
            raise
        del held
        for c, f in decodes.items():
            try:
                self.frames[c] = f.result()
            except Exception as e:  # noqa: BLE001 - raised by the get() of the job that needs it
                self.failed[c] = e
