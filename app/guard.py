"""What every request of ``evalkit serve`` passes through, as one ASGI middleware (:class:`Guard`):

- **security headers** on every response (pages, API, media, Gradio's files): a
  Content-Security-Policy that allows only this server (Gradio's pages need inline scripts and
  ``new Function`` for their templates, so ``'unsafe-inline' 'unsafe-eval'`` stay), no framing
  (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``), ``nosniff``, ``no-referrer``;
- **closed doors**: Gradio's upload and file routes (``CLOSED``) answer 404 (nothing of this app
  uploads a file; the admin's CSV downloads are ``/export``, behind the password);
- a **request body limit** (``MAX_BODY``) and **read timeout** (``BODY_TIMEOUT_S``): a larger
  ``Content-Length`` is refused with 413 before anything is read; any other body is read whole
  here before the app sees it (413 at the limit, 408 when it does not arrive in time);
- **back-off on password checks** (:class:`Throttle`): a failed admin login (Gradio's
  ``/admin/login``) or ``/export`` password counts per client address and the admin account's
  checks are rate-limited; both are counted *before* the check, so parallel guesses gain
  nothing. The clock is injected (tests drive it).
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

MAX_BODY = 64 * 1024          # bytes; the largest legitimate body (a Gradio event) is ~1 KB
BODY_TIMEOUT_S = 30.0         # a request body must have arrived whole within this
FREE_FAILURES = 5
MAX_WAIT_S = 300
ACCOUNT_RATE = 2.0            # password checks per second for the admin account, all clients
ACCOUNT_BURST = 20
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; "
       "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; media-src 'self' blob:; "
       "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
       "base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-frame-options", b"DENY"),
           (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
# Gradio routes that read or write files (of either app); the rater page and the admin page use
# none of them
CLOSED = ("/gradio_api/file=", "/gradio_api/file/", "/gradio_api/upload",
          "/gradio_api/proxy=", "/gradio_api/stream/", "/gradio_api/process_recording",
          "/gradio_api/run-history", "/gradio_api/vibe-edit", "/gradio_api/undo-vibe-edit",
          "/gradio_api/vibe-code", "/file=")


class Throttle:
    """Password checks, each counted before it is made (:meth:`begin`).

    - per client address: ``free`` failures, then each further attempt waits ``2**k`` seconds
      (``max_wait`` at most); an attempt counts as a failure until :meth:`succeeded` clears the
      count, so attempts in flight at once are counted at once;
    - per account (the admin's: one password): a token bucket of ``rate`` checks a second
      (``burst`` at once) over every client, so guessing from many addresses is slowed; it
      never locks: the wait is at most ``1/rate`` seconds, and a throttled client uses none.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, free: int = FREE_FAILURES,
                 max_wait: float = MAX_WAIT_S, rate: float = ACCOUNT_RATE,
                 burst: int = ACCOUNT_BURST):
        self.clock, self.free, self.max_wait = clock, free, max_wait
        self.rate, self.burst = float(rate), float(burst)
        self._fails: dict[str, tuple[int, float]] = {}     # address -> (failures, locked until)
        self._bucket: dict[str, tuple[float, float]] = {}  # account -> (tokens, at)

    def wait(self, who: str) -> float:
        """Seconds the client ``who`` must wait before the next attempt (0: go ahead)."""
        return max(0.0, self._fails.get(who, (0, 0.0))[1] - self.clock())

    def begin(self, who: str, account: str = "admin") -> float:
        """An attempt of ``who`` on ``account``: 0 and the attempt is counted as a failure
        (until :meth:`succeeded`), or the seconds to wait and nothing is counted. Atomic (no
        await inside): concurrent attempts are counted one by one."""
        wait = self.wait(who)
        if wait > 0:
            return wait
        t = self.clock()
        tokens, at = self._bucket.get(account, (self.burst, t))
        tokens = min(self.burst, tokens + (t - at) * self.rate)
        if tokens < 1.0:
            return (1.0 - tokens) / self.rate
        self._bucket[account] = (tokens - 1.0, t)
        self.failed(who)
        return 0.0

    def failed(self, who: str) -> None:
        n = self._fails.get(who, (0, 0.0))[0] + 1
        wait = 0.0 if n < self.free else min(self.max_wait, 2.0 ** (n - self.free))
        self._fails[who] = (n, self.clock() + wait)
        if len(self._fails) > 100_000:          # bounded: forget the oldest addresses
            for k in list(self._fails)[:50_000]:
                del self._fails[k]

    def succeeded(self, who: str) -> None:
        self._fails.pop(who, None)


async def _plain(send, status: int, text: str, extra=()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *HEADERS, *extra]})
    await send({"type": "http.response.body", "body": body})


def _auth_kind(method: str, path: str, headers: dict) -> str | None:
    """Which password check a request is: the admin login form, or a CSV export that carries
    a password (one without is refused without a check; the admin page's session cookie is
    no password)."""
    if method == "POST" and path.rstrip("/") == "/admin/login":
        return "login"
    if path.startswith("/export/") and b"authorization" in headers:
        return "export"
    return None


def closed(path: str) -> bool:
    """A Gradio file or upload route of either app (``/admin`` stripped)."""
    if path.startswith("/admin/"):
        path = path[len("/admin"):]
    return path.startswith(CLOSED)


class Guard:
    """The ASGI middleware of this module (``app`` wrapped; ``throttle`` shared by the routes)."""

    def __init__(self, app, throttle: Throttle | None = None, max_body: int = MAX_BODY,
                 body_timeout: float = BODY_TIMEOUT_S):
        self.app = app
        self.throttle = throttle or Throttle()
        self.max_body = max_body
        self.body_timeout = body_timeout

    async def _read_body(self, receive) -> tuple[int, bytes]:
        """The whole request body: (0, body), or (413 or 408 or -1 for a disconnect, b"")."""
        parts, seen = [], 0
        try:
            async with asyncio.timeout(self.body_timeout):
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return -1, b""
                    chunk = msg.get("body", b"")
                    seen += len(chunk)
                    if seen > self.max_body:
                        return 413, b""
                    parts.append(chunk)
                    if not msg.get("more_body", False):
                        return 0, b"".join(parts)
        except TimeoutError:
            return 408, b""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if closed(scope["path"]):
            return await _plain(send, 404, "not found")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _plain(send, 413, f"request body: expected at most {self.max_body} "
                                           f"bytes, found {length.decode('latin-1')[:20]}")
        if length not in (None, b"0") or b"transfer-encoding" in headers:
            status, body = await self._read_body(receive)
            if status == -1:
                return
            if status == 413:
                return await _plain(send, 413, f"request body: expected at most {self.max_body} "
                                               "bytes", [(b"connection", b"close")])
            if status == 408:
                return await _plain(send, 408, f"request body: not received within "
                                               f"{self.body_timeout:g} s", [(b"connection", b"close")])
            receive = _replay(body, receive)
        kind = _auth_kind(scope["method"], scope["path"], headers)
        who = (scope.get("client") or ("?", 0))[0]
        if kind is not None:
            wait = self.throttle.begin(who)
            if wait > 0:
                return await _plain(send, 429, f"too many password attempts: try again in "
                                               f"{int(wait) + 1} s",
                                    [(b"retry-after", str(int(wait) + 1).encode())])
        status = [0]

        async def guarded_send(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                names = {k.lower() for k, _ in msg.get("headers", [])}
                msg = {**msg, "headers": [*msg.get("headers", []),
                                          *(h for h in HEADERS if h[0] not in names)]}
            await send(msg)

        await self.app(scope, receive, guarded_send)
        if kind is not None and 200 <= status[0] < 300:
            self.throttle.succeeded(who)


def _replay(body: bytes, receive):
    """A ``receive`` that gives the body read already, then what the client sends next (its
    disconnect)."""
    sent = False

    async def again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return again
