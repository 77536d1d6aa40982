"""What every request of ``evalkit serve`` passes through, as one ASGI middleware (:class:`Guard`):

- **security headers** on every response (pages, API, media, Gradio's files): a
  Content-Security-Policy that allows only this server (Gradio's pages need inline scripts and
  ``new Function`` for their templates, so ``'unsafe-inline' 'unsafe-eval'`` stay), no framing
  (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``), ``nosniff``, ``no-referrer``;
- a **request body limit** (``MAX_BODY``): a larger ``Content-Length`` is refused with 413
  before anything is read, a chunked body is cut off at the limit (413);
- **back-off on authentication**: failed admin logins (Gradio's ``/admin/login``) and failed
  ``/export`` passwords are counted per client address; after ``FREE_FAILURES`` failures each
  further attempt must wait ``2**k`` seconds (``MAX_WAIT_S`` at most), answered 429 with
  ``Retry-After`` meanwhile; a success clears the count. The clock is injected (tests drive it).
"""
from __future__ import annotations

import time
from typing import Callable

MAX_BODY = 64 * 1024          # bytes; the largest legitimate body (a Gradio event) is ~1 KB
FREE_FAILURES = 5
MAX_WAIT_S = 300
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; "
       "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; media-src 'self' blob:; "
       "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
       "base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-frame-options", b"DENY"),
           (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]


class Throttle:
    """Failed attempts per client address, with exponential back-off after ``free`` failures."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, free: int = FREE_FAILURES,
                 max_wait: float = MAX_WAIT_S):
        self.clock, self.free, self.max_wait = clock, free, max_wait
        self._fails: dict[str, tuple[int, float]] = {}     # address -> (failures, locked until)

    def wait(self, who: str) -> float:
        """Seconds ``who`` must wait before the next attempt (0: go ahead)."""
        return max(0.0, self._fails.get(who, (0, 0.0))[1] - self.clock())

    def failed(self, who: str) -> None:
        n = self._fails.get(who, (0, 0.0))[0] + 1
        wait = 0.0 if n < self.free else min(self.max_wait, 2.0 ** (n - self.free))
        self._fails[who] = (n, self.clock() + wait)
        if len(self._fails) > 100_000:          # bounded: forget the oldest addresses
            for k in list(self._fails)[:50_000]:
                del self._fails[k]

    def succeeded(self, who: str) -> None:
        self._fails.pop(who, None)


class _TooLarge(Exception):
    pass


async def _plain(send, status: int, text: str, extra=()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *HEADERS, *extra]})
    await send({"type": "http.response.body", "body": body})


def _auth_kind(method: str, path: str) -> str | None:
    """Which authenticated route a request is: the admin login form or a CSV export."""
    if method == "POST" and path.rstrip("/") == "/admin/login":
        return "login"
    if path.startswith("/export/"):
        return "export"
    return None


class Guard:
    """The ASGI middleware of this module (``app`` wrapped; ``throttle`` shared by the routes)."""

    def __init__(self, app, throttle: Throttle | None = None, max_body: int = MAX_BODY):
        self.app = app
        self.throttle = throttle or Throttle()
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _plain(send, 413, f"request body: expected at most {self.max_body} "
                                           f"bytes, found {length.decode('latin-1')[:20]}")
        kind = _auth_kind(scope["method"], scope["path"])
        who = (scope.get("client") or ("?", 0))[0]
        if kind is not None:
            wait = self.throttle.wait(who)
            if wait > 0:
                return await _plain(send, 429, f"too many failed attempts: try again in "
                                               f"{int(wait) + 1} s",
                                    [(b"retry-after", str(int(wait) + 1).encode())])
        seen = 0
        started = False
        status = [0]

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_body:
                    raise _TooLarge()
            return msg

        async def guarded_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                status[0] = msg["status"]
                names = {k.lower() for k, _ in msg.get("headers", [])}
                msg = {**msg, "headers": [*msg.get("headers", []),
                                          *(h for h in HEADERS if h[0] not in names)]}
            await send(msg)

        try:
            await self.app(scope, limited, guarded_send)
        except _TooLarge:
            if not started:
                await _plain(send, 413, f"request body: expected at most {self.max_body} bytes")
            return
        if kind is not None:
            if status[0] in (400, 401, 403):
                self.throttle.failed(who)
            elif 200 <= status[0] < 300:
                self.throttle.succeeded(who)
