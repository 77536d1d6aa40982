"""The rater page's Gradio events through the real server, spoken like Gradio's browser client
(queue/join + the session's event stream; evalkit.testing.gradio_client), without a browser:
load, media, an answer refused as too early, the answer accepted and stored, a bad token."""

from __future__ import annotations

import asyncio
import csv
import io

import pytest

from evalkit import study
from evalkit.testing import aio
from evalkit.testing.gradio_client import GradioRater
from evalkit.testing.server import Server

pytestmark = pytest.mark.slow  # the real server


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("gradio-events")
    report = reports(fps=8)  # 8 frames at 8 fps: a 1 s play-through
    db = root / "s.db"
    sid = study.create_study(
        report, db, protocol="preference", clips_spec="worst:2", seed=2, allow_masking=True
    )["study"]
    server = Server(db).start()
    try:
        yield {"db": db, "sid": sid, "url": server.url}
    finally:
        server.stop()


def _rows(db, sid) -> list[dict]:
    """The study's raw CSV with its key opened (a logged unblinding: the study is interim)."""
    if not study.unblinding_log(db, sid):
        study.unblind(db, sid, reason="test: the stored answers", who="test")
    return list(csv.DictReader(io.StringIO(study.ratings_csv(db, sid))))


def test_load_media_answer_through_gradio_events(env):
    db, sid = env["db"], env["sid"]
    token = study.invite(db, sid, 1)[0]["token"]

    async def flow():
        async with GradioRater(env["url"], token) as g:
            first = await g.load()
            t = first["trial"]
            assert t["index"] == 1 and first["progress"]["done"] == 0, first
            assert "left" in t["answers"] and set(t["tiles"]) == {"left", "right"}
            assert all(s in (200, 206) for s in await g.media()), "media refused"
            # at once: refused with the time left, the trial stays, nothing stored
            early = await g.answer(t["trial"], "left", 5)
            assert "trial" not in early and early["error"] and early["wait_ms"] > 0, early
            assert early["nonce"] == g.nonce
            assert _rows(db, sid) == []
            # wait what the server says is left (never a wall-clock bound here)
            reply = early
            for _ in range(20):
                await asyncio.sleep(reply["wait_ms"] / 1000 + 0.02)
                reply = await g.answer(t["trial"], "left", 1200)
                if "wait_ms" not in reply:
                    break
            assert reply.get("saved") is True and "error" not in reply, reply
            assert reply["trial"]["index"] == 2 and reply["progress"]["done"] == 1, reply
            assert reply["nonce"] == g.nonce
            # the events skip Gradio's queue (app/rater.py): one POST each, no event stream
            assert g.last_messages == []
            # the page reloaded: the same next trial, nothing more stored
            again = await g.load()
            assert again["trial"]["trial"] == reply["trial"]["trial"]
            return t

    t = aio.run(flow())
    rows = _rows(db, sid)
    assert len(rows) == 1, rows
    assert rows[0]["trial"] == str(t["trial"]) and rows[0]["answer"] == "left"
    assert rows[0]["client_ms"] == "1200"


def test_bad_token_is_fatal(env):
    db, sid = env["db"], env["sid"]

    async def flow():
        async with GradioRater(env["url"], "not-a-token") as g:
            loaded = await g.load()
            answered = await g.answer(1, "left", 5)
        async with GradioRater(env["url"], "") as g:
            no_token = await g.load()
        return loaded, answered, no_token

    before = len(_rows(db, sid))
    for reply in aio.run(flow()):
        assert set(reply) <= {"fatal", "nonce"} and reply["fatal"], reply
    assert len(_rows(db, sid)) == before
