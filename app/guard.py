"""What every request of ``evalkit serve`` passes through, as one ASGI middleware (:class:`Guard`):

- **security headers** on every response (pages, API, media, Gradio's files): a
  Content-Security-Policy that allows only this server (Gradio's pages need inline scripts and
  ``new Function`` for their templates, so ``'unsafe-inline' 'unsafe-eval'`` stay), no framing
  (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``), ``nosniff``, ``no-referrer``;
- **storage failures**: a request that fails because the database's disk is full or
  read-only is answered 503 (``UNAVAILABLE``, Retry-After) and logged in one line;
- **closed doors**: Gradio's upload and file routes (``CLOSED``) answer 404 (nothing of this app
  uploads a file; the admin's CSV downloads are ``/export``, behind the password);
- a **request body limit** (``MAX_BODY``) and **read timeout** (``BODY_TIMEOUT_S``): a larger
  ``Content-Length`` is refused with 413 before anything is read; any other body is read whole
  here before the app sees it (413 at the limit, 408 when it does not arrive in time);
- **back-off on password checks** (:class:`Throttle`): a failed admin login (Gradio's
  ``/admin/login``) or ``/export`` password counts per client address and the admin account's
  checks are rate-limited, handed out in turn (slowed, never locked); both are counted
  *before* the check, so parallel guesses gain nothing; a right password clears its address's
  count whatever the answer (a 404 for a missing study too). The clock is injected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from evalkit.fsutil import storage_error

LOG = logging.getLogger("evalkit.serve")
#: what a request gets while the database cannot be written (a full or read-only disk)
UNAVAILABLE = (
    "service unavailable: the server cannot store anything now (its disk is full or "
    "read-only); nothing was saved, try again later"
)
MAX_BODY = 64 * 1024  # bytes; the largest legitimate body (a Gradio event) is ~1 KB
BODY_TIMEOUT_S = 30.0  # a request body must have arrived whole within this
FREE_FAILURES = 5
MAX_WAIT_S = 300
ACCOUNT_RATE = 2.0  # password checks per second for the admin account, all clients
ACCOUNT_BURST = 20
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; media-src 'self' blob:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
# Gradio routes that read or write files (of either app); the rater page and the admin page use
# none of them
CLOSED = (
    "/gradio_api/file=",
    "/gradio_api/file/",
    "/gradio_api/upload",
    "/gradio_api/proxy=",
    "/gradio_api/stream/",
    "/gradio_api/process_recording",
    "/gradio_api/run-history",
    "/gradio_api/vibe-edit",
    "/gradio_api/undo-vibe-edit",
    "/gradio_api/vibe-code",
    "/file=",
)


class Throttle:
    """Password checks, each counted before it is made (:meth:`begin`).

    - per client address: ``free`` failures, then each further attempt waits ``2**k`` seconds
      (``max_wait`` at most); an attempt counts as a failure until :meth:`succeeded` clears the
      count, so attempts in flight at once are counted at once;
    - per account (the admin's: one password): ``rate`` checks a second (``burst`` at once)
      over every client, handed out in turn: a client refused for want of a check is given the
      next free one (a turn, kept for it ``TURN_S`` seconds) and told when it comes; others
      asking later queue behind it. Guessing from many addresses is slowed, and nobody is
      locked out: the admin waits at most one turn per other client waiting (each address
      holds one turn at a time, and an address that keeps failing is locked out by its own
      back-off), never forever.
    """

    TURN_S = 30.0  # a turn not taken this long after it came is given up

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        free: int = FREE_FAILURES,
        max_wait: float = MAX_WAIT_S,
        rate: float = ACCOUNT_RATE,
        burst: int = ACCOUNT_BURST,
    ):
        self.clock, self.free, self.max_wait = clock, free, max_wait
        self.rate, self.burst = float(rate), float(burst)
        self._fails: dict[str, tuple[int, float]] = {}  # address -> (failures, locked until)
        self._next: dict[str, float] = {}  # account -> when its next check is free
        self._turns: dict[tuple[str, str], float] = {}  # (account, address) -> its turn

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
        step = 1.0 / self.rate
        turn = self._turns.get((account, who))
        if turn is not None and t > turn + self.TURN_S:
            del self._turns[(account, who)]  # not taken in time: given up
            turn = None
        if turn is not None:
            if t < turn:
                return turn - t
            del self._turns[(account, who)]  # its turn: the check was kept for it
        else:
            # the account's checks, GCRA: ``_next`` runs ahead of the clock by one step per
            # check; up to ``burst`` steps ahead may go at once
            nxt = max(self._next.get(account, t), t - (self.burst - 1) * step)
            free_at = nxt - (self.burst - 1) * step  # when this check may go
            self._next[account] = max(nxt, t) + step if free_at <= t else nxt + step
            if free_at > t:  # none free now: the next is its turn
                self._turns[(account, who)] = free_at
                if len(self._turns) > 100_000:  # bounded: forget the oldest turns
                    for k in list(self._turns)[:50_000]:
                        del self._turns[k]
                return free_at - t
        self.failed(who)
        return 0.0

    def failed(self, who: str) -> None:
        n = self._fails.get(who, (0, 0.0))[0] + 1
        wait = 0.0 if n < self.free else min(self.max_wait, 2.0 ** (n - self.free))
        self._fails[who] = (n, self.clock() + wait)
        if len(self._fails) > 100_000:  # bounded: forget the oldest addresses
            for k in list(self._fails)[:50_000]:
                del self._fails[k]

    def succeeded(self, who: str) -> None:
        self._fails.pop(who, None)


async def _plain(send, status: int, text: str, extra=()) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *HEADERS,
                *extra,
            ],
        }
    )
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
        path = path[len("/admin") :]
    return path.startswith(CLOSED)


class Guard:
    """The ASGI middleware of this module (``app`` wrapped; ``throttle`` shared by the routes)."""

    def __init__(
        self,
        app,
        throttle: Throttle | None = None,
        max_body: int = MAX_BODY,
        body_timeout: float = BODY_TIMEOUT_S,
    ):
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
            return await _plain(
                send,
                413,
                f"request body: expected at most {self.max_body} "
                f"bytes, found {length.decode('latin-1')[:20]}",
            )
        if length not in (None, b"0") or b"transfer-encoding" in headers:
            status, body = await self._read_body(receive)
            if status == -1:
                return
            if status == 413:
                return await _plain(
                    send,
                    413,
                    f"request body: expected at most {self.max_body} bytes",
                    [(b"connection", b"close")],
                )
            if status == 408:
                return await _plain(
                    send,
                    408,
                    f"request body: not received within {self.body_timeout:g} s",
                    [(b"connection", b"close")],
                )
            receive = _replay(body, receive)
        kind = _auth_kind(scope["method"], scope["path"], headers)
        who = (scope.get("client") or ("?", 0))[0]
        if kind is not None:
            wait = self.throttle.begin(who)
            if wait > 0:
                return await _plain(
                    send,
                    429,
                    f"too many password attempts: try again in {int(wait) + 1} s",
                    [(b"retry-after", str(int(wait) + 1).encode())],
                )
        status = [0]

        async def guarded_send(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                names = {k.lower() for k, _ in msg.get("headers", [])}
                msg = {
                    **msg,
                    "headers": [*msg.get("headers", []), *(h for h in HEADERS if h[0] not in names)],
                }
            await send(msg)

        try:
            await self.app(scope, receive, guarded_send)
        except Exception as e:
            line = storage_error(e)
            if line is None:
                raise
            # the disk under the database is full or read-only: one log line, and a 503 that
            # says so (not a 500 and its traceback, for every request until it is fixed)
            LOG.warning("%s %s: 503 (%s)", scope.get("method"), scope.get("path", "")[:80], line)
            if status[0] == 0:
                await _plain(send, 503, UNAVAILABLE, [(b"retry-after", b"30")])
            return
        if kind is not None and password_passed(kind, status[0]):
            self.throttle.succeeded(who)


def password_passed(kind: str, status: int) -> bool:
    """Whether a checked request's answer says its password was right: a login is answered
    2xx; an export is refused 401 for a wrong password only, so any other answer (a missing
    study's 404 included) followed a right one and must not count as a failed guess."""
    if kind == "export":
        return status not in (0, 401) and status < 500
    return 200 <= status < 300


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
