"""The study web app: one FastAPI app holding two Gradio apps, the rater page at ``/``
(:mod:`evalkit.app.rater`, entered by the invite link) and the admin page at ``/admin`` (:mod:`evalkit.app.admin`,
behind a password), plus the media route and a small JSON API for scripts.

Thin layer: every decision (which trial is next, whether an answer is valid, who may answer
what) is made by :mod:`evalkit.study`; this module only maps HTTP to those calls.

Rater endpoints (the token comes in the query or the JSON body; nothing here names a backend,
run or job):
  GET  /?token=T                 the rater page (Gradio; its load and answer events call the
                                 same service as the JSON API below)
  GET  /api/trial?token=T        {"progress", "trial"} (trial None when finished) + completion code
  POST /api/answer               {"token", "trial", "answer"[, "response_ms"]} -> same as
                                 /api/trial plus "saved"; 409 out of order, 425 (and "wait_ms")
                                 before the videos were loaded and played through once; the
                                 response time is measured by the server ("response_ms" from the
                                 page is kept as client_ms)
  POST /api/ack                  {"token", "media": name, "size", "crc32"}: the page holds the
                                 whole file (its size and CRC-32 of every byte); the gate's clock
                                 starts here, once every byte was sent and every video of the
                                 trial acknowledged; 409 for a size or CRC-32 not the file's, or
                                 bytes never sent; 404 for a name not the rater's
  GET  /media/<name>.mp4?token=T one video of a handed-out trial, by its opaque per-trial name
       /media/<name>.webp?token=T (evalkit.study.live.media_name; .webp for a lossless study's
                                 animated WebP); every video is served with the
                                 same headers (no Last-Modified, no ETag), 404 for anything else
                                 (the bytes sent are reported to the service; the gate
                                 also waits for /api/ack; HEAD counts nothing)
Admin: /admin/ (Gradio, password; /admin redirects there), /export/<study>/ratings.csv and
/summary.csv (HTTP Basic, or the admin page's login session): the admin page's only downloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import (  # noqa: E402
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,  # noqa: E402
    Response,
)
from starlette.routing import Mount, Route  # noqa: E402
from uvicorn.protocols.http.h11_impl import H11Protocol  # noqa: E402

from evalkit import study  # noqa: E402
from evalkit.errors import UserError  # noqa: E402
from evalkit.study import store  # noqa: E402
from evalkit.study.live import MAX_ID, RaterService  # noqa: E402
from evalkit.study.lossless import MIME  # noqa: E402

from .guard import BODY_TIMEOUT_S, Guard, Throttle  # noqa: E402

MEDIA_NAME = re.compile(r"^[0-9a-f]{40}\.(mp4|webp)$")
STATUS = {
    study.UnknownToken: 403,
    study.TrialNotAssigned: 403,
    study.UnknownTrial: 404,
    study.UnknownStudy: 404,
    study.UnknownMedia: 404,
    study.BadAnswer: 400,
    study.RatingConflict: 409,
    study.OutOfOrder: 409,
    study.TooSoon: 425,
    study.NotLoaded: 425,
    study.BadAcknowledgement: 409,
}
# the same for every video; names are per trial and rater, so a browser may keep what it got
MEDIA_HEADERS = {
    "Cache-Control": "private, max-age=3600",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
BACKLOG = 4096  # listen queue: a burst of raters is queued, never refused
KEEP_ALIVE_S = 75  # idle keep-alive connections stay open longer than clients reuse them
GRACE_S = 3  # on SIGINT/SIGTERM, requests in flight get this long to finish
HEADER_TIMEOUT_S = 20  # a request's line and headers must have arrived within this
MAX_CONNECTIONS = 2048  # connections (or requests in flight) beyond this get 503
NO_STORE = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


class _BlindFile(FileResponse):
    """A file response whose headers are the same for every video of a trial: its length (equal
    within a trial by construction), no Last-Modified and no ETag (they would tell which file
    was written first)."""

    def set_stat_headers(self, stat_result) -> None:
        self.headers.setdefault("content-length", str(stat_result.st_size))


def _error(e: Exception) -> JSONResponse:
    code = next((c for t, c in STATUS.items() if isinstance(e, t)), 400)
    body = {"error": str(e)}
    if isinstance(e, (study.TooSoon, study.NotLoaded)):
        body["wait_ms"] = e.wait_ms
    return JSONResponse(body, status_code=code, headers=NO_STORE)


def build_app(
    db: str,
    admin_password: str | None = None,
    completion_code: str | None = None,
    with_admin: bool = True,
    max_batch: int = 512,
    throttle: Throttle | None = None,
    body_timeout: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """The whole app. ``admin_password`` None: a random one is made (and printed by ``serve``).
    Rater requests go through one :class:`evalkit.study.live.RaterService` (``app.state.raters``;
    ``serve`` closes it on the way out); every request through :class:`evalkit.app.guard.Guard`
    (security headers, closed file routes, body limit and ``body_timeout``, back-off on
    password checks: ``throttle``)."""
    store.open_db(db)  # fail early on a bad database
    study.check_keys(db)  # and on a missing or wrong study key file (one line naming it)
    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    api.add_middleware(Guard, throttle=throttle or Throttle(), body_timeout=body_timeout)
    api.state.admin_password = admin_password or secrets.token_urlsafe(12)
    svc = api.state.raters = RaterService(db, completion_code=completion_code, max_batch=max_batch)

    @api.get("/healthz")
    def healthz():
        return {"ok": True}

    @api.get("/favicon.ico")
    def favicon():  # no icon, and no 404 in every page load's log
        return Response(status_code=204)

    _add_rater_routes(api, svc)
    _add_export_routes(api, db)
    return _mount_pages(api, db, svc, with_admin)


def _add_rater_routes(api: FastAPI, svc: RaterService) -> None:
    """The rater's JSON routes (a trial, an answer) and the media route, first in the table.
    They are plain Starlette routes: FastAPI's per-request parameter machinery is about a third
    of a request's server time, and they need none of it."""

    async def get_trial(request: Request):
        try:
            return JSONResponse(await svc.state(request.query_params.get("token", "")), headers=NO_STORE)
        except UserError as e:
            return _error(e)

    async def json_body(request: Request):
        """The request's JSON object, or the error response to send."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return JSONResponse(
                {
                    "error": f"request body: expected Content-Type application/json, "
                    f"found {ctype[:40] or 'none'!r}"
                },
                status_code=415,
                headers=NO_STORE,
            )
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
            return JSONResponse(
                {"error": "request body: expected a JSON object"}, status_code=400, headers=NO_STORE
            )
        return body

    async def post_ack(request: Request):
        body = await json_body(request)
        if not isinstance(body, dict):
            return body
        name = body.get("media")
        try:
            if not isinstance(name, str) or not MEDIA_NAME.fullmatch(name):
                raise study.UnknownMedia()
            return JSONResponse(
                await svc.acknowledge(body.get("token", ""), name, body.get("size"), body.get("crc32")),
                headers=NO_STORE,
            )
        except UserError as e:
            return _error(e)

    async def post_answer(request: Request):
        body = await json_body(request)
        if not isinstance(body, dict):
            return body
        try:
            out = await svc.answer(
                body.get("token", ""),
                body.get("trial"),
                body.get("answer"),
                body.get("response_ms"),
                request.headers.get("user-agent"),
            )
            return JSONResponse(out, headers=NO_STORE)
        except UserError as e:
            return _error(e)

    async def media(request: Request):
        name = request.path_params["name"]
        not_found = PlainTextResponse("not found", status_code=404, headers=NO_STORE)
        if not MEDIA_NAME.fullmatch(name):
            return not_found
        token = request.query_params.get("token", "")
        try:  # the service maps the opaque name to the file
            path = await svc.open_media(token, name)
        except UserError:
            return not_found
        if path.is_symlink() or not path.is_file():  # a link in the media folder: refused
            return not_found
        began = svc.clock()
        return _Counted(
            _BlindFile(path, media_type=MIME[path.suffix], headers=MEDIA_HEADERS),
            lambda a, b: svc.delivered(token, name, a, b, began),
        )

    api.router.routes[:0] = [
        Route("/media/{name}", media, methods=["GET", "HEAD"]),
        Route("/api/trial", get_trial, methods=["GET"]),
        Route("/api/answer", post_answer, methods=["POST"]),
        Route("/api/ack", post_ack, methods=["POST"]),
    ]


def _admin_ok(api: FastAPI, request: Request) -> bool:
    """The admin password (HTTP Basic), or the admin page's login session (Gradio's cookie, a
    token that only a successful login makes)."""
    import base64

    h = request.headers.get("authorization", "")
    if not h.lower().startswith("basic "):
        return _admin_session(api, request)
    try:
        user, _, pw = base64.b64decode(h[6:], validate=True).decode().partition(":")
    except Exception:
        return False
    return user == "admin" and secrets.compare_digest(pw.encode(), api.state.admin_password.encode())


def _add_export_routes(api: FastAPI, db: str) -> None:
    """The admin's CSV downloads, behind the admin password or the admin page's session."""

    def export(request: Request, sid: str, which: str) -> Response:
        if not _admin_ok(api, request):
            return PlainTextResponse(
                "admin password required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="evalkit admin"'},
            )
        if not (sid.isascii() and sid.isdigit() and 0 < int(sid[:20]) <= MAX_ID):
            return PlainTextResponse(f"no study {sid[:30]!r}", status_code=404, headers=NO_STORE)
        try:
            text = (
                study.ratings_csv(db, int(sid))
                if which == "ratings"
                else study.summary_csv(study.results(db, int(sid), reps=1000))
            )
        except UserError as e:
            return _error(e)
        return Response(
            text,
            media_type="text/csv",
            headers={
                **NO_STORE,
                "Content-Disposition": f'attachment; filename="study{int(sid)}-{which}.csv"',
            },
        )

    @api.get("/export/{sid}/ratings.csv")
    def export_ratings(request: Request, sid: str):
        return export(request, sid, "ratings")

    @api.get("/export/{sid}/summary.csv")
    def export_summary(request: Request, sid: str):
        return export(request, sid, "summary")


def _mount_pages(api: FastAPI, db: str, svc: RaterService, with_admin: bool) -> FastAPI:
    """The Gradio pages: the admin page at /admin (its password, Gradio's login) and the rater
    page at the root, which answers every path not matched before it; each behind
    :class:`_Shield`."""
    import gradio as gr

    if with_admin:
        from .admin import build_admin

        api = gr.mount_gradio_app(
            api,
            build_admin(db),
            path="/admin",
            auth=("admin", api.state.admin_password),
            auth_message="evalkit study admin",
            footer_links=[],
        )
        api.state.admin_app = next(r.app for r in api.routes if isinstance(r, Mount) and r.path == "/admin")
        # the printed address: /admin alone would fall through to the rater app's 404
        api.router.routes.insert(
            0,
            Route(
                "/admin",
                lambda request: RedirectResponse("/admin/", status_code=307),
                methods=["GET", "HEAD"],
            ),
        )
    from .rater import SHELL_CSS, build_rater

    # last: the rater app at the root answers every path not matched above
    api = gr.mount_gradio_app(api, build_rater(svc), path="", footer_links=[], css=SHELL_CSS)
    for r in api.routes:
        if isinstance(r, Mount):
            r.app = _Shield(r.app)
    return api


LOG = logging.getLogger("evalkit.serve")


class _Shield:
    """A Gradio app whose failures on a request it cannot handle (an unknown event name or
    ``fn_index``, a malformed body) are answered 400 with a short body and logged as one line,
    instead of Gradio's 500 and a traceback in the log."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list = []

        async def holding(msg):
            if held or (msg["type"] == "http.response.start" and msg["status"] >= 500):
                held.append(msg)  # Gradio's 500, sent just before it raises
                return
            await send(msg)

        try:
            await self.app(scope, receive, holding)
        except Exception as e:  # noqa: BLE001 - every failure of Gradio on a request: a 400
            first = (str(e).strip().splitlines() or [""])[0][:120]
            LOG.warning(
                "%s %s: refused (%s: %s)",
                scope.get("method"),
                scope.get("path", "")[:80],
                type(e).__name__,
                first,
            )
            if held:
                body = b"bad request"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 400,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
            return
        for msg in held:
            await send(msg)


def _admin_session(api, request: Request) -> bool:
    """Whether the request carries the admin page's login cookie (a token Gradio made at a
    successful login, kept by the mounted admin app)."""
    gapp = getattr(api.state, "admin_app", None)
    if gapp is None:
        return False
    tok = request.cookies.get(f"access-token-{gapp.cookie_id}") or request.cookies.get(
        f"access-token-unsecure-{gapp.cookie_id}"
    )
    return bool(tok) and gapp.tokens.get(tok) == "admin"


class _Counted:
    """A file response that reports the bytes it sent, ``report(start, stop)``, once it ends
    (sent whole, or cut off: what went out so far). A 200 covers ``[0, n)``, a 206 its
    ``Content-Range`` start on; a HEAD or a multi-range answer reports nothing.

    A whole response is reported the moment its last body message was handed to the server,
    with no ``await`` in between: the report is queued to the service before this event loop
    can read the page's acknowledgement of those bytes (``POST /api/ack``, which the service
    handles after it, in order). Reported later (after the file response's own clean-up), an
    acknowledgement could overtake it and be refused as "never sent"."""

    def __init__(self, response, report):
        self.response, self.report = response, report

    async def __call__(self, scope, receive, send):
        start, sent, done = [None], [0], [False]

        def report():
            if not done[0] and start[0] is not None and sent[0] > 0 and scope.get("method") != "HEAD":
                done[0] = True
                self.report(start[0], start[0] + sent[0])

        async def counting(msg):
            if msg["type"] == "http.response.start":
                h = {k.lower(): v for k, v in msg.get("headers", [])}
                rng = h.get(b"content-range", b"")
                m = re.fullmatch(rb"bytes (\d+)-\d+/\d+", rng)
                start[0] = 0 if msg["status"] == 200 else int(m[1]) if m else None
            elif msg["type"] == "http.response.body":
                await send(msg)
                sent[0] += len(msg.get("body", b""))
                if not msg.get("more_body", False):
                    report()
                return
            await send(msg)

        try:
            await self.response(scope, receive, counting)
        finally:
            report()


class _QuietShutdown(logging.Filter):
    """Once shutdown has begun, drop uvicorn's tracebacks of requests cancelled on the way out
    (a browser still streaming a video, a second Ctrl-C): stopping is not an error."""

    def __init__(self, server):
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.server.should_exit:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        msg = record.getMessage()  # the lifespan's failure arrives as a formatted traceback
        return not (
            isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt))
            or "CancelledError" in msg
            or "timeout graceful shutdown" in msg
        )


class _TimedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request line and headers have
    not all arrived ``header_timeout`` seconds after it opened or after the first byte of a
    next request (uvicorn itself closes only idle keep-alive connections)."""

    header_timeout = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _waiting(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._waiting():  # a whole request head arrived
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
        elif self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if self._waiting() and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


def _limit(name: str, default: float) -> float:
    """A server limit, overridden by the environment variable ``name`` (tests shorten them)."""
    v = os.environ.get(name)
    try:
        return float(v) if v else default
    except ValueError:
        raise UserError(f"{name}: expected a number of seconds or connections, found {v!r}") from None


def temp_root() -> Path:
    """This process's temporary folder, ``<tmp>/evalkit-serve-<uid>-<pid>`` (Gradio's, through
    ``GRADIO_TEMP_DIR``): removed when the server stops; folders of processes no longer alive
    (a killed server) are removed here, so none pile up."""
    base = Path(tempfile.gettempdir())
    uid = os.getuid() if hasattr(os, "getuid") else 0
    for old in base.glob(f"evalkit-serve-{uid}-*"):
        pid = old.name.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return base / f"evalkit-serve-{uid}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(
    db: str,
    host: str = "127.0.0.1",
    port: int = 7860,
    admin_password: str | None = None,
    completion_code: str | None = None,
) -> str | None:
    """Serve until SIGINT (Ctrl-C) or SIGTERM; returns the name of the signal that stopped it.
    The first signal stops accepting connections and lets requests in flight finish (at most
    ``GRACE_S`` seconds); a second one stops at once. Every acknowledged rating is committed
    before its answer is sent, so stopping loses none. Slow clients: a request head must
    arrive within ``HEADER_TIMEOUT_S``, its body within ``BODY_TIMEOUT_S``; beyond
    ``MAX_CONNECTIONS`` connections requests get 503 (each overridden by the environment
    variable ``EVALKIT_SERVE_<NAME>``)."""
    import uvicorn

    header_timeout = _limit("EVALKIT_SERVE_HEADER_TIMEOUT_S", HEADER_TIMEOUT_S)
    body_timeout = _limit("EVALKIT_SERVE_BODY_TIMEOUT_S", BODY_TIMEOUT_S)
    max_conn = int(_limit("EVALKIT_SERVE_MAX_CONNECTIONS", MAX_CONNECTIONS))
    sock = _listen(host, port)
    tmp = temp_root()
    # a folder under our own pid can only be a killed earlier server's (a container's pid 1)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700, parents=True)
    os.environ["GRADIO_TEMP_DIR"] = str(tmp)  # read by Gradio when it is imported
    try:
        app = build_app(db, admin_password, completion_code, body_timeout=body_timeout)
    except BaseException:
        sock.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # the app's start-up objects (Gradio, torch, pandas: millions) never become garbage: moved
    # out of the collector's sight, a full collection during a burst of answers no longer walks
    # them (tens of milliseconds each time)
    gc.collect()
    gc.freeze()
    http = type("TimedH11", (_TimedH11,), {"header_timeout": header_timeout})
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        backlog=BACKLOG,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACE_S,
        lifespan="on",
        http=http,
        limit_concurrency=max_conn,
    )
    server = uvicorn.Server(config)
    got: list[int] = []

    def on_signal(sig, _frame):
        got.append(sig)
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True

    # our handlers, not uvicorn's: it would re-raise the signal after shutting down
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    main = threading.current_thread() is threading.main_thread()  # signals: main thread only
    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    quiet = _QuietShutdown(server)
    for name in ("uvicorn.error", "uvicorn"):
        logging.getLogger(name).addFilter(quiet)
    # listening on every address: links need a name raters can reach, the machine's
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    print(
        f"rater page: http://{shown}:{port}/?token=<token> (invite links: evalkit study invite "
        f"--base-url http://{shown}:{port})   admin: http://{shown}:{port}/admin/ "
        f"(user admin{'' if admin_password else ', password ' + app.state.admin_password})",
        flush=True,
    )
    try:
        server.run(sockets=[sock])
    finally:
        app.state.raters.close()
        sock.close()
        shutil.rmtree(tmp, ignore_errors=True)
        for sig, h in old.items():
            signal.signal(sig, h)
    return signal.Signals(got[0]).name if got else None


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket (bind errors are one-line user errors naming --host/--port)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError, OverflowError) as e:
        raise UserError(f"--host: cannot listen on {host!r}: {e}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise UserError(f"--port: cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock
