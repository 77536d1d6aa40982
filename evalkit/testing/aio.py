"""``run(coro)``: :func:`asyncio.run` in a thread of its own, so async test code also works
where the calling thread already runs an event loop (Playwright's sync API keeps one running
while a browser fixture is alive)."""

from __future__ import annotations

import asyncio
import concurrent.futures


def run(coro):
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="evalkit-aio") as ex:
        return ex.submit(asyncio.run, coro).result()
