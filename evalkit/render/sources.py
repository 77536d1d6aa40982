"""The source clips of a render's jobs, each decoded once (:class:`SourceCache`)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from evalkit.formats.suite import Suite
from evalkit.video import ClipReader, shape_only


class SourceCache:
    """Decodes each source clip once and keeps the last one (jobs are grouped by clip).

    :meth:`prefetch` starts decoding the next job's clip on a background thread while the
    current job renders, so a pipeline never waits for its source (at most two decoded clips
    are held: the current one and the next). :meth:`get` returns the same frames either way; a
    decoding error is raised by the :meth:`get` that needs the clip, as without prefetching.
    """

    def __init__(self, suite: Suite, *, shape_only: bool = False):
        self.suite = suite
        #: the renderer needs the sources' size, rate and frame count, not their frames (one
        #: that streams them itself: ``import``, ``command``): each is counted, streaming, and stands as a frame-less
        #: (N, H, W, 3) view (:func:`evalkit.video.shape_only`), whatever the clip's length
        self.shape_only = shape_only
        self._key = None
        self._value = None
        self._next: tuple[str, Future] | None = None
        self._pool: ThreadPoolExecutor | None = None
        #: shape-only: every clip's count, once (several jobs adopted at once ask at once)
        self._shapes: dict[str, Future] = {}
        self._lock = threading.Lock()

    def _decode(self, clip_id: str):
        path = self.suite.clips[clip_id].path
        if self.shape_only:
            reader = ClipReader(path)
            n = reader.count_packets()
            return shape_only(n, reader.info.height, reader.info.width), reader.info.fps, path
        reader = ClipReader(path)
        return reader.read(), reader.info.fps, path

    def prefetch(self, clip_id: str | None) -> None:
        """Start decoding ``clip_id`` (the next job's clip) unless it is already at hand."""
        if (
            self.shape_only
            or clip_id is None
            or clip_id == self._key
            or (self._next and self._next[0] == clip_id)
        ):
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalkit-source")
        if self._next is not None:
            self._next[1].cancel()
        self._next = (clip_id, self._pool.submit(self._decode, clip_id))

    def get(self, clip_id: str):
        if self.shape_only:
            return self._shape(clip_id)
        if self._key != clip_id:
            ahead, self._next = self._next, None
            self._value = self._key = None  # let the previous clip go first
            if ahead is not None and ahead[0] == clip_id:
                self._value = ahead[1].result()
            else:
                if ahead is not None:
                    ahead[1].cancel()
                self._value = self._decode(clip_id)
            self._key = clip_id
        return self._value

    def _shape(self, clip_id: str):
        """A clip's frame-less view, counted once, safe to ask from several threads (each clip
        is counted by the first thread that asks; the others wait for that count)."""
        with self._lock:
            fut = self._shapes.get(clip_id)
            mine = fut is None
            if mine:
                fut = self._shapes[clip_id] = Future()
        if mine:
            try:
                fut.set_result(self._decode(clip_id))
            except BaseException as e:
                fut.set_exception(e)
        return fut.result()

    def close(self) -> None:
        """Stop the prefetch thread (a decode under way finishes; its result is dropped)."""
        if self._next is not None:
            self._next[1].cancel()
            self._next = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
