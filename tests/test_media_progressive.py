"""Trial media against a slow link, in Chromium against the real app whose media route is
slowed on the server side. Since issue 44 (item 6) the page acknowledges every trial file it
received (POST /api/ack: size and CRC-32 of every byte) and the gate's clock starts at that
acknowledgement (the last byte received, not the first sent), which is accepted at its first
try; an answer before it is refused (not loaded) and kept one play-through after it.

Stream delivery (H.264, issue 45): the page fetches the stream once and feeds its bytes to the
video through MediaSource as they arrive (the index rewritten as a fragmented MP4's, the
samples' own bytes): the first frame is drawn while most of the file is still unsent, and the
acknowledgement still waits for the last byte. Trial streams put the MP4 index (moov) before
the media data (mdat), which this needs.

Lossless delivery (issue 45: an animated lossless WebP decoded as it streams in): the same.
Either way nothing is acknowledged and an answer is refused until the last byte arrived; the
acknowledgement's size and CRC-32 are counted over the bytes the fetch received."""

from __future__ import annotations

import asyncio
import struct
import threading
import time

import httpx
import pytest

from evalkit import study
from evalkit.study import media
from evalkit.testing import page as pg
from evalkit.testing.server import ADMIN_PASSWORD, COMPLETION_CODE, free_port
from evalkit.testing.studies import hidden, import_report, moving_texture

pytestmark = pytest.mark.slow  # Chromium against the real app

FPS = 24


def top_boxes(data: bytes) -> list[str]:
    """The top-level box types of an MP4 file, in order."""
    out, i = [], 0
    while i + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[i : i + 8])
        if size == 1:
            size = struct.unpack(">Q", data[i + 8 : i + 16])[0]
        elif size == 0:
            size = len(data) - i
        assert size >= 8, (i, size)
        out.append(kind.decode("latin-1"))
        i += size
    assert i == len(data)
    return out


def test_trial_streams_put_the_index_before_the_media_data(tmp_path):
    frames = moving_texture(24, 64, 96)
    sha, _ = media.store_tiled([frames, 255 - frames], FPS, tmp_path)
    boxes = top_boxes((tmp_path / f"{sha}.mp4").read_bytes())
    assert boxes[0] == "ftyp" and "moov" in boxes and "mdat" in boxes, boxes
    assert boxes.index("moov") < boxes.index("mdat"), boxes


class SlowMedia:
    """ASGI wrapper of the real app: the media route's body goes out in ``chunk``-byte pieces
    at ``rate`` bytes a second (a slow link on the server's side); ``sent`` counts the bytes
    passed on, ``done`` the media responses whose last piece is about to go out, ``first_at``
    and ``last_at`` when (``time.time()``, the rater service's clock) the first and last piece
    went out; ``acks`` the (arrival time, status) of every ``POST /api/ack``."""

    def __init__(self, app, rate: float, chunk: int = 4096):
        self.app, self.rate, self.chunk = app, rate, chunk
        self.sent, self.done, self.requests, self.totals = 0, 0, [], []
        self.first_at = self.last_at = None
        self.acks: list[tuple[float, int]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/api/ack":
            arrived, status = time.time(), []

            async def seen(msg):
                if msg["type"] == "http.response.start":
                    status.append(msg["status"])
                await send(msg)

            await self.app(scope, receive, seen)
            self.acks.append((arrived, status[0] if status else None))
            return
        if scope["type"] != "http" or not scope["path"].startswith("/media/"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        self.requests.append(headers.get(b"range", b"").decode())

        async def slow(msg):
            if msg["type"] == "http.response.start":  # the file's size, whole or ranged
                h = dict(msg.get("headers") or [])
                rng = h.get(b"content-range", b"").decode()
                self.totals.append(
                    int(rng.rsplit("/", 1)[1]) if "/" in rng else int(h.get(b"content-length", b"0"))
                )
            if msg["type"] != "http.response.body" or not msg.get("body"):
                await send(msg)
                if msg["type"] == "http.response.body" and not msg.get("more_body"):
                    self.done += 1
                return
            body, more = msg["body"], msg.get("more_body", False)
            for i in range(0, len(body), self.chunk):
                part = body[i : i + self.chunk]
                last = i + self.chunk >= len(body)
                await asyncio.sleep(len(part) / self.rate)  # paced before each piece: once
                if not more and last:  # the last is sent, the response
                    self.done += 1  # may be torn down at once
                    self.last_at = time.time()
                self.sent += len(part)
                self.first_at = self.first_at or time.time()
                await send({"type": "http.response.body", "body": part, "more_body": more or not last})

        await self.app(scope, receive, slow)


@pytest.fixture(params=["stream", "lossless"])
def slow_server(tmp_path, request):
    """The real app (evalkit.app.server.build_app) on loopback in this process, its media slowed to
    about 4 s a stream; a 2 s preference study of two clips, streamed (H.264, the <video> reads
    it by ranges) or lossless (an animated WebP the page decodes as it streams in)."""
    import uvicorn

    from evalkit.app.server import build_app

    pairs = {
        p: (f, f[:, :, ::-1].copy())
        for p, f in (("a", moving_texture(48, 96, 128, seed=3)), ("b", moving_texture(48, 96, 128, seed=4)))
    }
    report, _ = import_report(tmp_path / "r", pairs, FPS)
    db = tmp_path / "s.db"
    sid = study.create_study(report, db, protocol="preference", raters_planned=2, delivery=request.param)[
        "study"
    ]
    sizes = [
        p.stat().st_size
        for p in (tmp_path / "s.media").glob("*.webp" if request.param == "lossless" else "*.mp4")
    ]
    app = SlowMedia(build_app(str(db), ADMIN_PASSWORD, COMPLETION_CODE), rate=min(sizes) / 4)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield {
            "db": db,
            "sid": sid,
            "url": url,
            "slow": app,
            "media": tmp_path / "s.media",
            "delivery": request.param,
        }
    finally:
        server.should_exit = True
        thread.join(30)
        app.app.state.raters.close()


FIRST_FRAME = (
    "() => { const p = window.evalkitPlayers && window.evalkitPlayers();"
    " return !!(p && p.length && p.every(b => b.t === b.t)); }"
)


def test_first_frame_and_the_gate_from_the_acknowledgement(slow_server, browser):
    env, slow = slow_server, slow_server["slow"]
    token = study.invite(env["db"], env["sid"], 1)[0]["token"]
    page = browser.new_page()
    try:
        first = pg.open_page(page, env["url"], token)
        trial = first["trial"]
        # while the file is still being sent: nothing acknowledged, and an answer is refused as
        # not loaded; the first frame shows before most of its bytes were sent (the page is
        # read first, then the server's count: a frame seen while no response had reached its
        # last piece was drawn before it)
        checks, drawn_at = 0, None
        while True:
            drawn = page.evaluate(FIRST_FRAME)
            if slow.done:
                break
            if drawn and drawn_at is None:
                drawn_at = slow.sent
            assert slow.acks == [] and hidden(env["db"], trial["trial"])["fetched"] is None
            if checks % 5 == 0:
                r = httpx.post(
                    env["url"] + "/api/answer",
                    json={"token": token, "trial": trial["trial"], "answer": "left"},
                )
                if slow.acks:  # the last byte went and was acknowledged since the check
                    break  # above: then the answer meets the play-through wait
                assert r.status_code == 425 and "were not loaded" in r.json()["error"], r.text
            checks += 1
            time.sleep(0.1)
        assert checks >= 5, checks  # the file took seconds: the loop saw it loading
        size = slow.totals[0]  # the trial's one file
        assert set(slow.totals) == {size} and slow.requests == [""], (slow.totals, slow.requests)
        assert drawn_at is not None and drawn_at < 0.6 * size, (drawn_at, size)
        print(f"{env['delivery']}: first frame drawn after {drawn_at} of {size} bytes sent")
        # once the file arrived: acknowledged (accepted at the first try: the server had
        # recorded the bytes it sent before the acknowledgement could reach it), and drawn
        page.wait_for_function(FIRST_FRAME, timeout=60_000)
        for _ in range(600):  # the page sends it beside the drawing
            if slow.acks:
                break
            time.sleep(0.05)
        assert slow.sent == size and len(slow.acks) == 1 and slow.acks[0][1] == 200, slow.acks
        acked_at = slow.acks[0][0]
        # the gate's clock starts at the acknowledgement: after the last byte, not the first
        fetched = hidden(env["db"], trial["trial"])["fetched"]
        assert fetched is not None and slow.last_at <= acked_at <= fetched, (
            slow.first_at,
            slow.last_at,
            acked_at,
            fetched,
        )
        print(
            f"{size} bytes sent over {slow.last_at - slow.first_at:.2f} s; acknowledged "
            f"{fetched - slow.last_at:.3f} s after the last byte"
        )
        assert study.list_studies(env["db"])[0]["ratings"] == 0
        # one play-through after the acknowledgement, the page's answer is kept (an earlier
        # click is refused with the time to wait; the page offers the answers again)
        for _ in range(20):
            reply = pg.answer(page, "left")
            if "error" not in reply:
                break
        assert reply.get("trial") is None or reply["trial"]["trial"] != trial["trial"], reply
        assert study.list_studies(env["db"])[0]["ratings"] == 1
    finally:
        page.close()
