"""Work spread over a few threads, results in order, memory bounded."""

from __future__ import annotations

import collections
import collections.abc
from concurrent.futures import ThreadPoolExecutor


def ordered_map(fn, items, workers: int, *, name: str = "evalkit-work"):
    """Yield ``fn(item)`` for each item, in order, computed in a pool of ``workers`` threads
    with at most ``workers`` items in flight (memory stays bounded). Meant for work that lets
    go of the GIL for its heavy parts (PyAV's codecs, x264, numpy, scipy). An exception of
    ``fn`` is raised when its item's turn comes; the items not started yet are cancelled (also
    when the caller stops iterating)."""
    workers = max(1, int(workers))
    if workers == 1:
        for item in items:
            yield fn(item)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
        futs: collections.deque = collections.deque()
        try:
            for item in items:
                futs.append(pool.submit(fn, item))
                if len(futs) >= workers:
                    yield futs.popleft().result()
            while futs:
                yield futs.popleft().result()
        finally:
            for f in futs:
                f.cancel()


#: items :func:`fan_out` holds between its producer and each consumer
FAN_OUT_DEPTH = 2
_END = object()
_ABORT = object()


class Aborted(Exception):
    """Raised in a :func:`fan_out` consumer when the producer (or another consumer) failed: the
    consumer stops (an atomic write then keeps nothing)."""


def _queued(q) -> collections.abc.Iterator:
    while True:
        item = q.get()
        if item is _END:
            return
        if item is _ABORT:
            raise Aborted
        yield item


def fan_out(items, consumers, *, depth: int = FAN_OUT_DEPTH, name: str = "evalkit-fan-out") -> list:
    """Hand every item of ``items`` to each of ``consumers`` (callables taking an iterator of
    the items, each run on a thread of its own), reading ``items`` once; return the consumers'
    results in order. Memory holds at most ``depth`` items per consumer (the items are shared,
    not copied), whatever their number. An error of the producer or of a consumer stops the
    rest (their iterators raise :class:`Aborted`) and is raised here; the producer's first."""
    import queue

    queues = [queue.Queue(maxsize=max(1, depth)) for _ in consumers]
    with ThreadPoolExecutor(max_workers=max(1, len(consumers)), thread_name_prefix=name) as pool:
        futures = [pool.submit(c, _queued(q)) for c, q in zip(consumers, queues)]

        def put(item) -> None:
            for q, f in zip(queues, futures):
                while not f.done():  # a consumer that ended takes no more
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue

        try:
            for item in items:
                put(item)
                if any(f.done() for f in futures):
                    break  # a consumer failed (or ended): raised below
        except BaseException:
            put(_ABORT)
            for f in futures:
                try:
                    f.result()
                except Exception:  # the producer's error is the one told
                    pass
            raise
        failed = [f for f in futures if f.done() and f.exception() is not None]
        put(_ABORT if failed else _END)
        results = []
        for f in futures:
            try:
                results.append(f.result())
            except Aborted:
                results.append(None)
        if failed:
            failed[0].result()  # the consumer's own error
    return results
