"""Work spread over a few threads, results in order, memory bounded."""
from __future__ import annotations

import collections
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
