"""A local render's writers in worker processes: each job's lossless clip and browser copy are
encoded outside the process that renders.

Why: PyAV's encode path holds the interpreter lock. On the H200 (session 9) a Python thread
launching small CUDA kernels, as a diffusers pipeline's thread does, ran at 0.50x its idle
speed while the writers (FFV1 clip, H.264 browser copy) encoded on threads of its process,
0.49x with those threads at nice +10, and at full speed with the same writers in another
process (the script that became ``benchmarks/bench_writer_gil.py``). Yet the canary render on
the H200 was slower with its writers in worker processes than on threads (:data:`DEVICE_DEFAULT`),
so they are used when asked for: ``$EVALKIT_WRITER_PROCESSES=1`` (``0``: threads, the default
on every device; :func:`use_processes`).

How: :meth:`WriterPool.submit` (on the rendering thread) only checks that ``/dev/shm`` has
room; on an encoder thread of the driver the job's frames are copied into a shared-memory
segment of their own, which two workers map: one writes the lossless clip (in parts at once
with many cores, :class:`evalkit.render.clipwriter.ClipWriter`: the same code and bytes as the
writer threads) and returns its sha256, the other writes the browser copy
(:func:`evalkit.video.write_browser`); then the parent unlinks the segment. The driver has at
most ``WRITE_AHEAD`` jobs being written, so at most that many segments exist. Files are
atomic as on threads (:func:`evalkit.fsutil.atomic_path`). A worker takes 0.2-0.5 s to start
(its imports: numpy, PyAV) and a canary job renders in 0.13 s: the jobs done before two
workers have started are written on the driver's threads (:class:`Booting`), unless
``$EVALKIT_WRITER_PROCESSES`` is ``1`` (then they wait for the workers).

Workers are fresh interpreters (:func:`evalkit.procdecode.start_worker`: ``subprocess`` and a
pipe, not multiprocessing's ``spawn``); they ignore Ctrl-C (the parent stops them) and end
when the parent dies (their pipe closes, or, mid-file, their parent process changes: a
temporary file may stay behind, removed by the next render of that run folder). A writer's
exception comes back as its one-line text (:class:`WriterError`), and a worker that dies
mid-file fails that job with a message naming the signal (its temporary file removed); the
next job gets a fresh worker.
The shared memory is created and unlinked by the parent only (its resource tracker unlinks it
if the parent is killed).
"""
from __future__ import annotations

import errno
import os
import signal
import threading
import traceback
from concurrent.futures import Executor, Future
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from evalkit.procdecode import (SHM_DIR, NoRoom, WorkerPoolBase, WorkerProcess, attach,
                                death_text, env_switch, shm_free, shm_written)
from evalkit.video import frame_batch

#: seconds between liveness checks while waiting for a worker (and the worker's checks of its
#: parent)
_POLL = 0.5
_ENV = "EVALKIT_WRITER_PROCESSES"
#: whether a render on a device writes in worker processes when ``$EVALKIT_WRITER_PROCESSES``
#: is unset. Off: on the H200 (session 9, ``bench_render.py --writer-processes 0 1 auto``) the
#: canary render took 2.27 s with them against 1.92 s on threads (its pipeline calls 1.90
#: against 1.79 s, and 0.31 s at the end stopping the workers one after the other, since made
#: parallel), although a thread launching CUDA kernels beside them kept 0.88x of its speed
#: against 0.21x beside writer threads (``bench_writer_gil.py``)
DEVICE_DEFAULT = False
#: a worker's first message: its imports are done
_READY = ("ready",)


def use_processes(tasks) -> bool:
    """Whether a local render of ``tasks`` (:class:`evalkit.render.driver.BackendTask`) writes
    in worker processes: ``$EVALKIT_WRITER_PROCESSES`` (``0``/``1``), else, if
    :data:`DEVICE_DEFAULT` (off), whether one of them renders jobs on a device other than the
    CPU (POSIX only: workers get their pipe through ``pass_fds``)."""
    value = forced()
    if value is not None:
        return value
    return DEVICE_DEFAULT and os.name == "posix" and on_device([t for t in tasks if t.jobs])


def on_device(runs) -> bool:
    """Whether one of ``runs`` (anything with ``spec`` and ``apply``: a
    :class:`evalkit.render.driver.BackendTask`, a :class:`evalkit.render.adopt.RunIdentity`)
    renders on a device other than the CPU (its spec applied)."""
    return any(r.apply and r.spec is not None and r.spec.device.split(":")[0] != "cpu"
               for r in runs)


def forced() -> bool | None:
    """``$EVALKIT_WRITER_PROCESSES`` as a bool, None when unset (a user error otherwise)."""
    return env_switch(_ENV)


def failure_text(e: BaseException) -> str:
    """A failure in one line: the exception and where it was raised (a job's error)."""
    tb = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__}: {e} (at {Path(tb.filename).name}:{tb.lineno})"


class Booting(Exception):
    """Fewer than two writer processes have started yet (:meth:`WriterPool.submit`)."""


class WriterError(Exception):
    """A writer process's failure, already in one line (:func:`failure_text` of the worker's
    exception, or how the worker died)."""


# -- the worker process -------------------------------------------------------------------------
def _child_main(fd: int) -> None:
    """A worker: ``python -c 'from evalkit.render.procwrite import _child_main; ...' FD``, ``FD``
    its end of the parent's pipe. It ends at ``None`` or when the parent is gone."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle
    parent = os.getppid()

    def orphaned() -> None:                         # mid-file the pipe is not read: watch
        while os.getppid() == parent:
            threading.Event().wait(_POLL)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    conn = Connection(fd)
    import av  # noqa: F401 - loaded while the first job renders, not when it is written

    from evalkit.render.clipwriter import ClipWriter
    from evalkit.video import write_browser  # noqa: F401 - as av

    clips: dict[int, ClipWriter] = {}               # by parts
    try:
        conn.send(_READY)
        while True:
            msg = conn.recv()
            if msg is None:
                return
            conn.send(_write(clips, *msg))
    except (EOFError, OSError):                     # the parent is gone
        return
    finally:
        for w in clips.values():
            w.close()


def _write(clips: dict, kind, name, shape, fps, path, codec=None, parts=1) -> tuple:
    """Write one file from the frames in shared memory ``name``: ``("ok", sha256 or frames)``
    or ``("err", one line)``."""
    from evalkit.render.clipwriter import ClipWriter
    from evalkit.video import write_browser

    try:
        mm = attach(name, int(np.prod(shape)))
    except OSError as e:
        return ("err", failure_text(e))
    try:
        frames = np.ndarray(shape, np.uint8, buffer=mm)
        try:
            if kind == "clip":
                if parts not in clips:
                    clips[parts] = ClipWriter(parts)
                return ("ok", clips[parts].write(Path(path), frames, fps, codec))
            return ("ok", write_browser(path, frames, fps))
        except Exception as e:  # noqa: BLE001 - handed to the parent, a job's error there
            return ("err", failure_text(e))
        finally:
            del frames
    finally:
        try:
            mm.close()
        except BufferError:                         # a view outlives the write: left to it
            pass


# -- the parent's side ----------------------------------------------------------------------------
class _Worker(WorkerProcess):
    def __init__(self):
        super().__init__("evalkit.render.procwrite", "_child_main")
        self.ready = False

    def started(self) -> bool:
        """Whether its imports are done (it said so; an idle worker's only message)."""
        if not self.ready:
            try:
                if self.conn.poll(0):
                    self.ready = self.conn.recv() == _READY
            except (EOFError, OSError):     # died: the next job's receive says so
                pass
        return self.ready

    def receive(self, path) -> tuple:
        """Its answer; a worker that died answers ``("err", how)``."""
        while True:
            if self.conn.poll(_POLL):
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    break
                if msg == _READY:
                    self.ready = True
                    continue
                return msg
            if not self.alive():
                break
        return ("died", f"the writer process died while writing {Path(path).name} "
                        f"({death_text(self.process.wait())})")


class WriterPool(WorkerPoolBase):
    """Worker processes writing a render's files (see the module's note); :meth:`close` stops
    them. ``parts``: parts each lossless clip is encoded in at once
    (:func:`evalkit.render.driver.clip_parts`). ``wait``: jobs submitted while the workers
    are still starting wait for them; else :meth:`submit` raises :class:`Booting` (the driver
    writes such a job on its threads: a worker takes 0.2-0.5 s to start, a canary job renders
    in 0.13 s)."""

    _worker_class = _Worker

    def __init__(self, parts: int = 1, *, wait: bool = False):
        self.parts = max(1, int(parts))
        self.wait = wait
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        #: bytes of frames reserved by submitted jobs (shared memory made or about to be)
        self._reserved: dict[int, int] = {}
        self._segments: dict[int, str] = {}
        self._ids = 0
        #: the most jobs' frames in shared memory at once, and the names of the segments made
        #: (tests: never more than the driver's WRITE_AHEAD, each unlinked)
        self.peak_segments = 0
        self.made: list[str] = []
        #: a fallback to threads was reported (the driver warns once per render)
        self.warned = False

    @property
    def workers(self) -> int:
        return len(self._all)

    def started(self) -> int:
        """Idle workers whose imports are done (one that died idle is replaced)."""
        with self._lock:
            for i, w in enumerate(self._idle):
                if not self._closed and not w.alive():
                    self._all.remove(w)
                    w.stop()
                    self._idle[i] = _Worker()
                    self._all.append(self._idle[i])
            return sum(w.started() for w in self._idle)

    def submit(self, encoders: Executor, clip: Path, preview: Path, frames: np.ndarray, fps,
               codec: str) -> list[Future]:
        """Write a job's lossless clip ``clip`` (in ``codec``) and browser copy ``preview``;
        its frames are copied into shared memory on a thread of ``encoders``. Returns the two
        files' futures, as the writer threads' (the clip's gives its sha256; a failure is a
        :class:`WriterError`). Raises :class:`evalkit.procdecode.NoRoom` (nothing started)
        when ``/dev/shm`` has no room for the frames, :class:`Booting` (nothing started) when
        not ``wait`` and fewer than two workers have started."""
        frames = frame_batch(frames)
        token = self._reserve(frames.nbytes)
        if not self.wait and self.started() < 2:
            self._unreserve(token)
            raise Booting("the writer processes are starting")
        futures = [Future(), Future()]
        try:
            encoders.submit(self._job, token, futures, clip, preview, frames, fps, codec)
        except BaseException:
            self._unreserve(token)
            raise
        return futures

    def _reserve(self, size: int) -> int:
        """Reserve room for ``size`` bytes of frames; raise :class:`NoRoom` without it. The
        reservations of the jobs in flight count, whether their pages are taken yet or not."""
        free = shm_free()
        with self._lock:
            if self._closed:
                raise RuntimeError("the writer pool is closed")
            if free is not None:
                ours = sum(self._reserved.values())
                if size + ours > free + shm_written(self._segments.values()):
                    raise NoRoom(f"{SHM_DIR}: {free / 2**20:.0f} MB free, the writer processes "
                                 f"need {(size + ours) / 2**20:.0f} MB for the frames of the "
                                 "jobs being written (in a container: --shm-size); or write in "
                                 f"threads: {_ENV}=0")
            self._ids += 1
            self._reserved[self._ids] = size
            return self._ids

    def _unreserve(self, token: int) -> None:
        with self._lock:
            self._reserved.pop(token, None)
            self._segments.pop(token, None)

    def _acquire(self) -> _Worker:
        with self._lock:
            while self._idle:
                w = self._idle.pop()
                if w.alive():
                    return w
                self._all.remove(w)         # died while idle: replaced
                w.stop()
            w = _Worker()
            self._all.append(w)
            return w

    def _release(self, w: _Worker) -> None:
        with self._lock:
            if not self._closed and w.alive():
                self._idle.append(w)
                return
            if w in self._all:
                self._all.remove(w)
        w.stop()

    def _job(self, token: int, futures: list[Future], clip, preview, frames, fps, codec) -> None:
        """On an encoder thread: frames into shared memory, both files written by two
        workers, the segment unlinked, then the futures set (the driver counts a job's memory
        as held until they are)."""
        answers = []
        try:
            shm = shared_memory.SharedMemory(create=True, size=max(1, frames.nbytes))
            try:
                with self._lock:
                    self._segments[token] = shm.name
                    self.made.append(shm.name)
                    self.peak_segments = max(self.peak_segments, len(self._segments))
                # its pages taken now: if /dev/shm filled up since submit, an OSError (the job's
                # error) rather than SIGBUS in this process while copying
                if hasattr(os, "posix_fallocate") and getattr(shm, "_fd", -1) >= 0:
                    try:
                        os.posix_fallocate(shm._fd, 0, shm.size)
                    except OSError as e:        # (not supported: pages taken as written)
                        if e.errno == errno.ENOSPC:
                            raise OSError(e.errno, f"{SHM_DIR}: no room for the frames of "
                                          f"{Path(clip).name} ({frames.nbytes / 2**20:.0f} "
                                          "MB)") from None
                view = np.ndarray(frames.shape, np.uint8, buffer=shm.buf)
                try:
                    view[...] = frames
                finally:
                    del view                        # (shm.close() refuses while it lives)
                shape, workers = tuple(frames.shape), []
                try:
                    for msg in (("clip", shm.name, shape, fps, str(clip), codec, self.parts),
                                ("preview", shm.name, shape, fps, str(preview))):
                        w = self._acquire()
                        workers.append(w)
                        w.send(msg)
                    answers = [w.receive(p) for w, p in zip(workers, (clip, preview))]
                finally:
                    for w in workers:
                        self._release(w)
            finally:
                shm.close()
                shm.unlink()
                self._unreserve(token)
        except BaseException as e:
            for f in futures:
                f.set_exception(e)
            return
        for f, (kind, value), path in zip(futures, answers, (clip, preview)):
            if kind == "ok":
                f.set_result(value)
                continue
            if kind == "died":              # its temporary file (fsutil.atomic_path's name)
                path = Path(path)
                for tmp in path.parent.glob(f".tmp-{path.stem}-*{path.suffix}"):
                    tmp.unlink(missing_ok=True)
            f.set_exception(WriterError(value))

    def close(self) -> None:
        """Stop every worker (call it once no job is being written)."""
        super().close()
