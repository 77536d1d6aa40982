"""Clips decoded in worker processes, their frames handed over in shared memory.

Why: in one process the decoder threads and the thread that feeds the metrics share one
interpreter lock. On the H200's 16 cores ``compare`` of two UT Video runs measured 175-183
pairs/s from files against 480-518 on frames already in memory, while decoding alone ran at 765
frames/s (``benchmarks/bench_scale.py``): neither the decoders nor the GPU set the pace, their
hand-offs did. Here each clip decodes in a worker process of its own (with its own decoder
threads, :class:`evalkit.video.ClipReader`), which writes chunks of frames into a ring of slots
in shared memory; the consumer reads them in place (no copy) and hands a slot back once it is
done with it.

:class:`DecoderPool` keeps its worker processes (``spawn``) for the whole comparison and starts
one more whenever every worker is busy (a fresh interpreter started with ``subprocess``, talking over a pipe: nothing of the parent's ``__main__`` runs in it, unlike multiprocessing's ``spawn``); :class:`ProcessChunks` is one clip's iterator of
``(n, H, W, 3)`` uint8 chunks, the same chunks :meth:`ClipReader.chunks` gives, errors
included (the same :class:`evalkit.errors.VideoError` messages, raised at the same point).

Handing over without copying has one rule: a chunk stays valid until ``hold`` more chunks of
the same clip have been taken (then its slot is written again). :func:`evalkit.metrics.stream.stream_pair`
copies each chunk into its staging buffer when it takes it; ``compare`` looks back at most one
chunk (the worst frame of the records of the chunk before the one just read). The default
``hold=2`` covers both.

Workers ignore Ctrl-C (the parent stops them), end when their parent dies, and a worker that
dies mid-clip (a decoder crash) is reported as that clip's :class:`VideoError`. The shared
memory is created and unlinked by the parent only.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import weakref
from multiprocessing import shared_memory

import numpy as np

from evalkit.errors import InputFileError, UserError, VideoError

#: readers decode in worker processes where there are at least this many usable cores, else in
#: threads of this process (tests and benchmarks set it to choose: 0 processes, a large number
#: threads)
PROCESS_MIN_CORES = 8
#: seconds between liveness checks while waiting on a queue
_POLL = 0.5

_STOP = "stop"
_SLOT = "slot"


def use_processes() -> bool:
    """Whether readers decode in worker processes: where there are at least
    :data:`PROCESS_MIN_CORES` usable cores (on fewer, the processes' start-up and the
    shared-memory hand-off cost more than the lock they spare). POSIX only: workers get their
    pipe through ``pass_fds``."""
    from evalkit.video import usable_cores

    return os.name == "posix" and usable_cores() >= PROCESS_MIN_CORES


# -- the worker process -------------------------------------------------------------------------
def attach(name: str, size: int):
    """The parent's shared memory, mapped in a worker without registering it with a resource
    tracker (the parent alone unlinks it; SharedMemory(name) would register it, and a tracker
    of this process would unlink it when this process ends)."""
    import _posixshmem
    import mmap

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, max(size, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def _child_main(fd: int) -> None:
    """A worker process: ``python -c 'from evalkit.procdecode import _child_main; ...' FD``,
    ``FD`` its end of the parent's pipe. It ends at ``None`` or when the parent is gone."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(fd)
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                return
            if msg[0] == "clip":
                conn.send(_clip(conn, *msg[1:]))  # slot and stop messages of ended clips: dropped
    except (EOFError, OSError):  # the parent is gone
        return


#: the worker's mapping of its ring, ``(name, mmap)``: kept from clip to clip, so the pages
#: are mapped once (a fresh mapping faults in every page again)
_MAPPED: list = []


def _mapping(name: str, size: int):
    if _MAPPED and (_MAPPED[0] != name or len(_MAPPED[1]) < size):
        _MAPPED.pop(1).close()
        _MAPPED.clear()
    if not _MAPPED:
        _MAPPED.extend([name, attach(name, size)])
    return _MAPPED[1]


def _clip(conn, clip, path, threads, chunk, shm_name, slots, shape) -> tuple:
    size = slots * chunk * shape[0] * shape[1] * shape[2]
    ring = np.ndarray((slots, chunk, *shape), np.uint8, buffer=_mapping(shm_name, size))
    try:
        return _decode_clip(conn, clip, path, threads, chunk, shape, ring)
    except EOFError:
        raise  # the parent is gone or said stop: end (_child_main)
    except InputFileError as e:
        return ("err", clip, type(e).__name__, e.path, e.problem)
    except Exception as e:  # noqa: BLE001 - handed to the parent, raised there
        return ("err", clip, "", path, f"{type(e).__name__}: {e}")
    finally:
        del ring


def _decode_clip(conn, clip, path, threads, chunk, shape, ring) -> tuple:
    from evalkit.video import ClipReader

    slot, i, n = None, 0, 0
    for frame in ClipReader(path, threads=threads):
        while slot is None:  # a free slot of this clip, or its stop
            msg = conn.recv()
            if msg is None:
                raise EOFError
            kind, c, k = msg[:3]
            if c != clip:
                continue  # left over from an earlier clip
            if kind == _STOP:
                return ("stopped", clip, n)
            slot, i = k, 0
        if frame.shape != shape:
            raise VideoError(
                path,
                f"frame {n} is {frame.shape[1]}x{frame.shape[0]}, expected "
                f"{shape[1]}x{shape[0]} as the container declares",
            )
        ring[slot, i] = frame
        i += 1
        n += 1
        if i == chunk:
            conn.send(("chunk", clip, slot, i))
            slot = None
    if slot is not None:
        conn.send(("chunk", clip, slot, i))
    return ("done", clip, n)


# -- the parent's side ----------------------------------------------------------------------------
#: where POSIX shared memory lives on Linux
SHM_DIR = "/dev/shm"


class NoRoom(UserError):
    """The shared-memory filesystem has no room for a decoder's ring of frames."""


def shm_free() -> int | None:
    """Bytes free in :data:`SHM_DIR`, None where there is none (not Linux)."""
    try:
        st = os.statvfs(SHM_DIR)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def shm_written(names) -> int:
    """Bytes of the shared-memory segments ``names`` already counted as used by the filesystem
    (pages written): free space plus these is what the segments may take in all."""
    total = 0
    for name in names:
        try:
            total += os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
        except OSError:
            pass
    return total


def death_text(code: int | None) -> str:
    """How a worker process ended, from its return code: ``exit code N`` or ``killed by
    SIGNAL`` (SIGBUS: writing to a full :data:`SHM_DIR`)."""
    if code is None or code >= 0:
        return f"exit code {code}"
    how = f"killed by {signal.Signals(-code).name}"
    if -code == signal.SIGBUS:
        how += f": {SHM_DIR} full?"
    return how


def start_worker(module: str, function: str):
    """A worker process: a fresh interpreter (nothing of the parent's ``__main__`` runs there,
    unlike multiprocessing's ``spawn``) calling ``module.function(FD)``, ``FD`` its end of a
    duplex :func:`multiprocessing.Pipe`. Returns ``(Popen, the parent's Connection)``. POSIX
    (``pass_fds``)."""
    import subprocess
    import sys
    from multiprocessing import Pipe
    from pathlib import Path

    import evalkit

    conn, child = Pipe(duplex=True)
    root = str(Path(evalkit.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import sys; from {module} import {function}; {function}(int(sys.argv[1]))",
                str(child.fileno()),
            ],
            pass_fds=[child.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        conn.close()
        raise
    finally:
        child.close()
    return process, conn


class WorkerProcess:
    """A worker process started by :func:`start_worker` and the parent's end of its pipe; a
    worker ends when it receives ``None``."""

    def __init__(self, module: str, function: str):
        self.process, self.conn = start_worker(module, function)

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except OSError:  # it died: the next receive says so
            pass

    def ask_to_stop(self) -> None:
        if self.alive():
            self.send(None)

    def wait_stopped(self, timeout: float = 2.0) -> None:
        """Wait for it to end (killed after ``timeout`` seconds); close the pipe."""
        import subprocess

        if self.alive():
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.conn.close()

    def stop(self, timeout: float = 2.0) -> None:
        self.ask_to_stop()
        self.wait_stopped(timeout)


def stop_all(workers) -> None:
    """Stop ``workers`` side by side: all told first, then each waited for (an interpreter
    takes about 0.1 s to end: four one after the other added 0.3 s to the end of a render)."""
    for w in workers:
        w.ask_to_stop()
    for w in workers:
        w.wait_stopped()


class _Worker(WorkerProcess):
    """A decoding worker (a fresh interpreter: nothing of the parent's ``__main__`` runs there)
    and its ring."""

    def __init__(self):
        #: this worker's ring (shared memory), reused from clip to clip while large enough
        self.segment: shared_memory.SharedMemory | None = None
        super().__init__("evalkit.procdecode", "_child_main")

    def receive(self, clip: int):
        """The next message about ``clip``; None when the worker has died."""
        while True:
            while not self.conn.poll(_POLL):
                if not self.alive():
                    return None
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.process.wait()
                return None
            if msg[1] == clip:
                return msg

    def wait_stopped(self, timeout: float = 2.0) -> None:
        super().wait_stopped(timeout)
        self.drop_segment()

    def ring_of(self, size: int) -> shared_memory.SharedMemory:
        """This worker's ring, at least ``size`` bytes (a larger one replaces a smaller)."""
        if self.segment is not None and self.segment.size < size:
            self.drop_segment()
        if self.segment is None:
            self.segment = shared_memory.SharedMemory(create=True, size=max(1, size))
        return self.segment

    def drop_segment(self) -> None:
        """Unlink the ring. Chunks still referenced keep their mapping: their base is its
        mmap, which is not closed here (that would unmap it under them) but left to go with
        the last of them."""
        shm, self.segment = self.segment, None
        if shm is not None:
            shm._buf = shm._mmap = None
            shm.close()
            shm.unlink()


class WorkerPoolBase:
    """A worker pool's common part (:class:`DecoderPool`'s): its workers (``_all``, ``_idle``) under
    ``_lock``, and closing, which stops them side by side (:func:`stop_all`); also a context
    manager. ``_worker_class``: the pool's kind of :class:`WorkerProcess`."""

    _worker_class: type  # each pool's own

    def start(self, n: int) -> None:
        """Start workers until there are ``n`` (they boot meanwhile: call it early)."""
        with self._lock:
            while len(self._all) < n and not self._closed:
                w = self._worker_class()
                self._all.append(w)
                self._idle.append(w)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all, self._idle = self._all, [], []
        stop_all(workers)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DecoderPool(WorkerPoolBase):
    """Worker processes decoding clips (:class:`ProcessChunks`); :meth:`close` stops them.

    ``threads``: decoding threads of each worker's :class:`evalkit.video.ClipReader`."""

    _worker_class = _Worker

    def __init__(self, threads: int = 0):
        self.threads = int(threads)
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._open: set[ProcessChunks] = set()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def workers(self) -> int:
        return len(self._all)

    def check_room(self, size: int) -> None:
        """Raise :class:`NoRoom` unless the shared-memory filesystem has room for a ring of
        ``size`` bytes besides the rings this pool has made (which may not be written yet: a
        ring larger than the room left would kill its worker with SIGBUS when written).
        Docker's default ``/dev/shm`` is 64 MB; a 720p ring needs about 180 MB."""
        free = shm_free()
        if free is None:
            return
        with self._lock:
            ours = sum(w.segment.size for w in self._all if w.segment is not None)
        if size + ours > free + shm_written(w.segment.name for w in self._all if w.segment is not None):
            raise NoRoom(
                f"{SHM_DIR}: {free / 2**20:.0f} MB free, the decoder processes need "
                f"{(size + ours) / 2**20:.0f} MB for their frames (in a container: "
                "--shm-size)"
            )

    def chunks(self, path, chunk: int, depth: int = 2, *, hold: int = 2) -> ProcessChunks:
        """One clip's chunks of ``chunk`` frames, decoded in a worker up to ``depth`` chunks
        ahead of the consumer; each chunk stays valid until ``hold`` more have been taken."""
        return ProcessChunks(self, path, chunk, depth, hold)

    def _acquire(self) -> tuple[_Worker, int]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the decoder pool is closed")
            w = self._idle.pop() if self._idle else None
            if w is None:
                w = _Worker()
                self._all.append(w)
            return w, next(self._ids)

    def _release(self, w: _Worker, reusable: bool) -> None:
        with self._lock:
            if reusable and not self._closed and w.alive():
                self._idle.append(w)
                return
            if w in self._all:
                self._all.remove(w)
        w.stop()

    def close(self) -> None:
        """Stop every clip still open, then every worker; unlink the shared memory."""
        for pc in list(self._open):
            pc.close()
        super().close()


class ProcessChunks:
    """One clip decoding in a :class:`DecoderPool` worker: an iterator of ``(n, H, W, 3)``
    uint8 chunks read in place from shared memory (see the module's note on ``hold``).
    :meth:`close` stops the worker's decoding and gives the worker back."""

    def __init__(self, pool: DecoderPool, path, chunk: int, depth: int, hold: int):
        from evalkit.video import MAX_IMAGE_PIXELS, ClipReader, too_large

        if chunk < 1 or depth < 1 or hold < 1:
            raise ValueError(
                f"chunk, depth, hold: expected positive integers, found {chunk!r}, {depth!r}, {hold!r}"
            )
        info = ClipReader(path).info  # the frame size sizes the ring (raises VideoError)
        if info.width * info.height > MAX_IMAGE_PIXELS:
            raise VideoError(path, too_large(f"{info.width}x{info.height}"))
        self.path, self.chunk, self.hold = str(path), int(chunk), int(hold)
        self.shape = (info.height, info.width, 3)
        slots = depth + hold
        size = slots * self.chunk * info.height * info.width * 3
        self._taken: list[int] = []  # slots handed out, oldest first
        self._finished = False
        self._closed = False
        self._pool = pool
        pool.check_room(size)  # before any worker is taken
        self._w, self._clip = pool._acquire()
        try:
            shm = self._w.ring_of(size)
        except BaseException:
            pool._release(self._w, True)
            raise
        pool._open.add(self)
        self._ring = np.ndarray((slots, self.chunk, *self.shape), np.uint8, buffer=shm.buf)
        # a chunk is a view of the ring and keeps it alive: at close, a live ring means a
        # chunk outlives the clip, and the worker's ring is replaced rather than written again
        self._ring_alive = weakref.ref(self._ring)
        self._w.send(("clip", self._clip, self.path, pool.threads, self.chunk, shm.name, slots, self.shape))
        for k in range(slots):  # a slot comes back once its chunk is done with
            self._w.send((_SLOT, self._clip, k))

    def __iter__(self):
        return self

    def _message(self):
        msg = self._w.receive(self._clip)
        if msg is None:
            self._finished = True
            raise VideoError(
                self.path,
                f"the decoder process died while decoding it ({death_text(self._w.process.returncode)})",
            )
        return msg

    def __next__(self) -> np.ndarray:
        if self._finished:
            raise StopIteration
        msg = self._message()
        kind = msg[0]
        if kind == "chunk":
            _, _, slot, n = msg
            self._taken.append(slot)
            if len(self._taken) > self.hold:  # the oldest chunk is no longer in use
                self._give(self._taken.pop(0))
            return self._ring[slot, :n]
        self._finished = True  # the worker waits for close(): the last chunks
        if kind == "err":  # are still in use
            _, _, cls, path, problem = msg
            raise (VideoError if cls == "VideoError" else InputFileError)(path, problem)
        raise StopIteration  # "done"

    def _give(self, slot: int) -> None:
        self._w.send((_SLOT, self._clip, slot))

    def close(self) -> None:
        """Stop decoding (if not finished) and give the worker back (the iterator's end does
        not: its last chunks are still in use). Chunks handed out stay readable: if one is
        still referenced, the worker's ring is unlinked and replaced rather than reused."""
        if self._closed:
            return
        self._closed = True
        reusable = True
        if not self._finished:
            self._w.send((_STOP, self._clip, None))
            try:
                while self._message()[0] not in ("done", "stopped", "err"):
                    pass
            except VideoError:  # the worker died
                reusable = False
        self._finished = True
        self._ring = None
        if self._ring_alive() is not None:  # a chunk of this clip is still referenced
            self._w.drop_segment()
        self._pool._open.discard(self)
        self._pool._release(self._w, reusable)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prefetch_chunks(
    path,
    chunk: int,
    depth: int,
    *,
    threads: int = 0,
    pool: DecoderPool | None = None,
    name: str = "evalkit-decode",
):
    """A clip's chunks of ``chunk`` frames decoded ahead of the consumer, at most ``depth``
    chunks: in a worker process of ``pool`` (a video, with a pool), else in a thread of this
    process (:class:`evalkit.video.Prefetch`). Either has ``close()``."""
    from evalkit.video import ClipReader, Prefetch

    reader = ClipReader(path, threads=threads)
    if pool is not None and reader.kind == "video":
        try:
            return pool.chunks(path, chunk, depth)
        except NoRoom as e:
            import warnings

            # the warnings module's default filter shows it once per place, not per clip
            warnings.warn(f"decoding in threads: {e}", RuntimeWarning, stacklevel=2)
    return Prefetch(reader.chunks(chunk), depth, name)
