"""A rater on the rater page's Gradio events, speaking the protocol of Gradio's own browser client
(``sse_v3``), without a browser: for tests and the load benchmark (``benchmarks/bench_app.py``).

What the page does, and so what :class:`GradioRater` does (Gradio 6, the page's config says
``"protocol": "sse_v3"``, ``"api_prefix": "/gradio_api"``):

- the page's config (``GET /config``, the same as ``window.gradio_config`` in the page) lists
  the events as ``dependencies``: the load event (``targets`` ``[[<blocks id>, "load"]]``) and
  the player's ``answer`` event (``[[<player id>, "answer"]]``); an event's ``id`` is its
  ``fn_index``, its target's id the ``trigger_id``;
- an event is ``POST /gradio_api/queue/join?<the page's query>`` (so ``?token=T``) with
  ``{"data": [], "event_data": ..., "fn_index", "trigger_id", "session_hash"}`` ->
  ``{"event_id"}``; then, unless one is open already, the client opens the session's stream
  ``GET /gradio_api/queue/data?session_hash=H`` (server-sent events, one ``data: {json}`` per
  message: ``estimation``, ``process_starts``, ``process_completed`` with ``output.data`` and
  ``success``, ``heartbeat``, ``unexpected_error``), which the server ends with
  ``close_stream`` once the session has no event left; one event at a time per rater, as here,
  means one stream per event, as in the browser;
- the event's reply is ``output["data"][0]``: the player's new value (the state dict);
- an event whose dependency says ``"queue": false`` skips all that, as in the browser: one
  ``POST /gradio_api/run/<api_name>?<query>`` with the same body, answered ``{"data": [...]}``.

Dependency-free on purpose: each connection is a plain keep-alive HTTP/1.1 connection on
asyncio streams (:class:`Connection`), one for requests and one for the event stream, like a
browser tab's. httpx would do, but on a 2-core machine its own per-request CPU (several ms under
load) costs more than the server's and would dominate what the benchmark measures; the JSON side
of the benchmark uses the same :class:`Connection`, so both sides pay the same client cost.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from typing import NamedTuple
from urllib.parse import quote, urlsplit

API_PREFIX = "/gradio_api"


class GradioError(Exception):
    """An event that brought no reply: the join refused (``kind`` ``"join HTTP 503"``), the
    stream refused or broken, an ``unexpected_error`` message, or the handler raised
    (``process_completed`` with ``success`` false)."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class Connection:
    """One keep-alive HTTP/1.1 connection to ``host:port`` (``Content-Length`` and chunked
    bodies; no redirects, no TLS). ``closed`` after the server said ``Connection: close`` or a
    transport error: :meth:`reopen` before the next request."""

    def __init__(self, host: str, port: int, user_agent: str = "evalkit-testing"):
        self.host, self.port, self.user_agent = host, port, user_agent
        self.r = self.w = None
        self.closed = True

    async def open(self) -> Connection:
        self.r, self.w = await asyncio.open_connection(self.host, self.port)
        self.closed = False
        return self

    async def reopen(self) -> Connection:
        self.close()
        return await self.open()

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None
        self.closed = True

    def send(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        if self.closed:
            raise ConnectionError("connection closed")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.w.write(
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"User-Agent: {self.user_agent}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def head(self) -> tuple[int, dict]:
        """The status and headers (lower-case names) of the next response."""
        try:
            line = await self.r.readline()
            if not line:
                raise ConnectionError("connection closed by the server")
            status, headers = int(line.split()[1]), {}
            while (line := await self.r.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.closed = True  # still readable: the body comes first
        return status, headers

    async def chunks(self, headers: dict):
        """The body of the response whose ``headers`` were just read, piece by piece."""
        try:
            if headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size = int((await self.r.readline()).split(b";")[0], 16)
                    data = await self.r.readexactly(size + 2)
                    if size == 0:
                        break
                    yield data[:-2]
            elif "content-length" in headers:
                yield await self.r.readexactly(int(headers["content-length"]))
            else:  # read to the end (the server closes)
                yield await self.r.read()
                self.closed = True
        except BaseException:
            self.close()
            raise
        if self.closed:
            self.close()

    async def request(
        self, method: str, path: str, body=None, headers: dict | None = None
    ) -> tuple[int, bytes]:
        """``body``: bytes, or anything else sent as JSON. Returns the status and the body."""
        h = dict(headers or {})
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        self.send(method, path, body or b"", h)
        status, headers = await self.head()
        return status, b"".join([c async for c in self.chunks(headers)])


async def ack(conn: Connection, token: str, name: str, data: bytes) -> None:
    """``POST /api/ack`` on ``conn`` as the page does once it holds the whole media file
    ``name`` (``data``): its size and CRC-32; :class:`GradioError` if refused."""
    status, body = await conn.request(
        "POST", "/api/ack", {"token": token, "media": name, "size": len(data), "crc32": zlib.crc32(data)}
    )
    if status != 200:
        raise GradioError(f"ack HTTP {status}", body.decode(errors="replace")[:200])


def endpoints(config: dict) -> dict:
    """From the page's config: ``{"load": Endpoint, "answer": Endpoint}``, the events whose
    target is the page (``"load"``) and the player component (``"answer"``, on the component
    with ``elem_id`` "player")."""
    player = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "player")
    out = {}
    for dep in config["dependencies"]:
        # as Gradio's client: an event skips the queue when its "queue" is false (or the app's
        # queue is off), and is then one request to /run/<api_name>
        queued = dep.get("queue")
        queued = config.get("enable_queue", True) if queued is None else queued
        for target, event in dep["targets"]:
            if event == "load" or (event == "answer" and target == player):
                out[event] = Endpoint(dep["id"], target, dep.get("api_name") or "predict", bool(queued))
    missing = {"load", "answer"} - set(out)
    if missing:
        raise ValueError(f"the page has no {', '.join(sorted(missing))} event")
    return out


class Endpoint(NamedTuple):
    """One event of the page: its ``fn_index``, ``trigger_id``, ``api_name`` and whether it
    goes through the queue (else ``POST /gradio_api/run/<api_name>``)."""

    fn_index: int
    trigger_id: int
    api_name: str
    queued: bool = True


class GradioRater:
    """One rater on the page ``url`` (``http://host:port``, the rater app at its root) with
    ``token``: a session of its own (``session_hash``) and two keep-alive connections, one for
    requests (events, media) and one for the event stream.

    ``await GradioRater(url, token).open()``; then ``await load()`` and
    ``await answer(trial, answer, response_ms)`` return the player's new value (the state
    dict: ``{"progress", "trial", ...}``, ``{"error", "wait_ms"}``, ``{"fatal"}``) and keep it
    in ``state``; ``await media()`` requests the current trial's videos like a browser starting
    to play them. ``last_ms``: the last event's time from sending its join to receiving its
    ``process_completed``; ``last_times``: when (ms after sending the join) its join was
    answered (``"join"``) and its first ``process_starts`` and ``process_completed`` arrived;
    ``last_messages``: the kinds of stream messages it got."""

    def __init__(
        self, url: str, token: str, *, session_hash: str | None = None, user_agent: str = "evalkit-testing"
    ):
        u = urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.token = token
        self.session_hash = session_hash or uuid.uuid4().hex[:11]
        self.http = Connection(self.host, self.port, user_agent)
        self.sse = Connection(self.host, self.port, user_agent)
        self.ids: dict | None = None
        self.state: dict | None = None
        self.nonce = 0
        self.last_ms: float | None = None
        self.last_times: dict[str, float] = {}
        self.last_messages: list[str] = []

    async def open(self, ids: dict | None = None) -> GradioRater:
        """Connect; ``ids``: the page's :func:`endpoints` if known (else read from its config)."""
        await self.http.open()
        await self.sse.open()
        self.ids = ids or endpoints(await self.config())
        return self

    async def reopen(self) -> GradioRater:
        """New connections (after a transport error), same session."""
        await self.http.reopen()
        await self.sse.reopen()
        return self

    def close(self) -> None:
        self.http.close()
        self.sse.close()

    async def __aenter__(self) -> GradioRater:
        return await self.open()

    async def __aexit__(self, *exc) -> None:
        self.close()

    async def _ready(self, conn: Connection) -> Connection:
        return await conn.open() if conn.closed else conn

    async def config(self) -> dict:
        """The page's Gradio config (``GET /config``)."""
        status, body = await (await self._ready(self.http)).request("GET", "/config")
        if status != 200:
            raise GradioError(f"config HTTP {status}", body[:200].decode("utf-8", "replace"))
        return json.loads(body)

    async def load(self) -> dict:
        """The page's load event: the rater's current view (hands out the current trial)."""
        return await self._event("load", None)

    async def answer(self, trial, answer, response_ms: int | None = None) -> dict:
        """The player's ``answer`` event for ``trial`` (an id) with ``answer``."""
        self.nonce += 1
        return await self._event(
            "answer", {"trial": trial, "answer": answer, "response_ms": response_ms, "nonce": self.nonce}
        )

    async def media(self, trial: dict | None = None, range_: str | None = None) -> list[int]:
        """GET every video of ``trial`` (default: the current state's) whole and acknowledge
        it, as the page does (the gate counts bytes the page acknowledged: POST /api/ack with
        their size and CRC-32; ``range_``: a ``Range`` header instead, acknowledging nothing);
        returns the statuses of the GETs. An acknowledgement the server refuses raises
        :class:`GradioError` (kind ``"ack HTTP <status>"``): a rater left unacknowledged would
        only see its answers refused later, as "not loaded")."""
        trial = trial if trial is not None else (self.state or {}).get("trial")
        out = []
        for name in (trial or {}).get("media", {}).values():
            conn = await self._ready(self.http)
            status, data = await conn.request(
                "GET",
                f"/media/{name}?token={quote(self.token)}",
                headers={"Range": range_} if range_ else None,
            )
            out.append(status)
            if status == 200 and not range_:
                conn = await self._ready(self.http)
                await ack(conn, self.token, name, data)
        return out

    async def _event(self, which: str, event_data) -> dict:
        ep = self.ids[which]
        body = {
            "data": [],
            "event_data": event_data,
            "fn_index": ep.fn_index,
            "trigger_id": ep.trigger_id,
            "session_hash": self.session_hash,
        }
        query = f"?token={quote(self.token)}"
        http = await self._ready(self.http)
        self.last_ms, self.last_messages = None, []
        t0 = time.perf_counter()
        if not ep.queued:  # one request, the reply in its response
            status, raw = await http.request("POST", f"{API_PREFIX}/run/{ep.api_name}{query}", body)
            self.last_ms = (time.perf_counter() - t0) * 1000
            self.last_times = {"join": self.last_ms, "process_completed": self.last_ms}
            if status != 200:
                raise GradioError(f"run HTTP {status}", raw[:200].decode("utf-8", "replace"))
            self.state = json.loads(raw)["data"][0]
            return self.state
        sse = await self._ready(self.sse)
        status, raw = await http.request("POST", f"{API_PREFIX}/queue/join{query}", body)
        if status != 200:
            raise GradioError(f"join HTTP {status}", raw[:200].decode("utf-8", "replace"))
        event_id = json.loads(raw)["event_id"]
        self.last_times = {"join": (time.perf_counter() - t0) * 1000}
        sse.send(
            "GET",
            f"{API_PREFIX}/queue/data?session_hash={self.session_hash}",
            headers={"Accept": "text/event-stream", "Cache-Control": "no-cache"},
        )
        status, headers = await sse.head()
        if status != 200:
            body = b"".join([c async for c in sse.chunks(headers)])
            raise GradioError(f"stream HTTP {status}", body[:200].decode("utf-8", "replace"))
        done, buf = None, b""
        async for chunk in sse.chunks(headers):  # read to the end: the connection is reused
            buf += chunk
            while b"\n\n" in buf:
                raw, buf = buf.split(b"\n\n", 1)
                if not raw.startswith(b"data:"):
                    continue
                m = json.loads(raw[5:])
                msg = m.get("msg")
                self.last_messages.append(msg)
                if msg in ("process_starts", "process_completed") and m.get("event_id") == event_id:
                    self.last_times.setdefault(msg, (time.perf_counter() - t0) * 1000)
                if msg == "process_completed" and m.get("event_id") == event_id:
                    self.last_ms = self.last_times[msg]
                    done = m
                elif msg == "unexpected_error":
                    done = done or m
        if done is None:
            raise GradioError("no reply", f"stream ended after {self.last_messages}")
        if done["msg"] == "unexpected_error":
            raise GradioError("unexpected_error", str(done.get("message")))
        if not done.get("success"):
            raise GradioError("process failed", str(done.get("output", {}).get("error")))
        self.state = done["output"]["data"][0]
        return self.state
