"""The play-through gate counts what the page received, not what the server wrote (issue 44
item 6): a trial is loaded once every byte of its stream was sent *and* the page acknowledged
the whole file (its size and CRC-32, POST /api/ack); the play-through clock starts from that
acknowledgement (the last byte), not from the first byte. The service with an injected clock,
then the real server against a client that reads 64 bytes and waits, and a real Chromium page
that plays the stream."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import httpx
import pytest

from evalkit import study
from evalkit.testing import page as pg
from evalkit.testing.server import Server
from evalkit.testing.studies import acknowledge, hidden

pytestmark = pytest.mark.slow  # a study, a real server and Chromium


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("gate")
    db = root / "s.db"
    sid = study.create_study(
        reports(fps=8), db, protocol="preference", clips_spec="worst:1", seed=2, allow_masking=True
    )["study"]
    return {"db": db, "sid": sid}


def _file(db, trial_id) -> bytes:
    from evalkit.study import store

    st = store.open_db(db)
    with st.engine.connect() as conn:
        media_dir = conn.execute(store.studies.select()).mappings().first()["media_dir"]
    return (Path(media_dir) / f"{hidden(db, trial_id)['shown']['media']}.mp4").read_bytes()


def test_the_clock_starts_at_the_acknowledgement_of_bytes_sent(env):
    db = env["db"]
    (tok,) = (r["token"] for r in study.invite(db, env["sid"], 1))
    clock = study.FakeClock()
    with study.RaterService(db, clock=clock) as svc:
        t = svc.state_sync(tok)["trial"]
        name, tid = t["media"]["video"], t["trial"]
        data = _file(db, tid)
        size, crc = len(data), zlib.crc32(data)
        # 64 bytes sent, then a long wait: not loaded
        svc.delivered(tok, name, 0, 64, clock()).result()
        clock.advance(600)
        with pytest.raises(study.NotLoaded):
            svc.answer_sync(tok, tid, "left")
        # an acknowledgement of bytes never sent is refused, whatever it claims
        with pytest.raises(study.BadAcknowledgement, match="never sent"):
            svc.acknowledge_sync(tok, name, size, crc)
        first = clock()
        svc.delivered(tok, name, 64, size, first).result()
        # every byte sent, nothing acknowledged: still not loaded
        clock.advance(600)
        with pytest.raises(study.NotLoaded):
            svc.answer_sync(tok, tid, "left")
        # a wrong size or CRC-32 (what a client that read 64 bytes could send) is refused
        for bad in (
            (size, crc ^ 1),
            (size - 1, crc),
            (64, zlib.crc32(data[:64])),
            (size, str(crc)),
            (True, crc),
        ):
            with pytest.raises(study.BadAcknowledgement):
                svc.acknowledge_sync(tok, name, *bad)
        assert hidden(db, tid)["fetched"] is None
        with pytest.raises(study.UnknownMedia):
            svc.acknowledge_sync(tok, "0" * 40 + ".mp4", size, crc)
        # the page holds it: the clock starts now (600 s after the last byte was sent), not at
        # the first byte: an answer a play-through after the first byte is too soon
        acked = clock()
        assert svc.acknowledge_sync(tok, name, size, crc) == {"acknowledged": True}
        assert hidden(db, tid)["fetched"] == pytest.approx(acked)
        assert acked - first >= 600
        clock.advance(0.01)
        with pytest.raises(study.TooSoon) as e:
            svc.answer_sync(tok, tid, "left")
        wait = e.value.wait_ms / 1000
        assert 0 < wait <= 60
        clock.advance(wait)
        out = svc.answer_sync(tok, tid, "left")
        assert out["saved"] is True
        # a second acknowledgement changes nothing
        assert svc.acknowledge_sync(tok, name, size, crc) == {"acknowledged": True}
        assert hidden(db, tid)["fetched"] == pytest.approx(acked)


@pytest.fixture(scope="module")
def server(env):
    s = Server(env["db"]).start()
    yield s
    s.stop()
    log = s.proc.stdout.read()
    assert "Traceback" not in log, log[-3000:]


def test_a_client_that_reads_64_bytes_and_waits_is_not_accepted(env, server):
    db = env["db"]
    (tok,) = (r["token"] for r in study.invite(db, env["sid"], 1))
    with httpx.Client(base_url=server.url, timeout=30) as c:
        t = c.get("/api/trial", params={"token": tok}).json()["trial"]
        name, tid = t["media"]["video"], t["trial"]
        with c.stream("GET", f"/media/{name}", params={"token": tok}) as r:
            assert r.status_code == 200
            size = int(r.headers["content-length"])
            got = b""
            for chunk in r.iter_raw(64):
                got += chunk
                if len(got) >= 64:
                    break
        got = got[:64]
        data = _file(db, tid)
        assert size == len(data) > 64
        time.sleep(2.5)  # longer than the stream plays (1 s at 8 fps)
        r = c.post("/api/answer", json={"token": tok, "trial": tid, "answer": "left"})
        assert r.status_code == 425 and "not loaded" in r.text, r.text
        # what it can claim without the bytes: the size it was told and a CRC of what it read
        for claim in (zlib.crc32(got), 0):
            r = c.post("/api/ack", json={"token": tok, "media": name, "size": size, "crc32": claim})
            assert r.status_code == 409 and "acknowledgement" in r.json()["error"], r.text
        r = c.post("/api/ack", json={"token": tok, "media": "x.mp4", "size": size, "crc32": 0})
        assert r.status_code == 404
        r = c.post("/api/answer", json={"token": tok, "trial": tid, "answer": "left"})
        assert r.status_code == 425 and "not loaded" in r.text, r.text
        assert hidden(db, tid)["fetched"] is None
        # the same client, once it has read every byte and acknowledged them: accepted after
        # a play-through from the acknowledgement
        whole = c.get(f"/media/{name}", params={"token": tok}).content
        for _ in range(50):  # the server records what it sent once it is sent
            if acknowledge(c, tok, name, whole).status_code == 200:
                break
            time.sleep(0.1)
        acked = time.time()
        for _ in range(40):
            r = c.post("/api/answer", json={"token": tok, "trial": tid, "answer": "left"})
            if r.status_code != 425:
                break
            assert "not loaded" not in r.text
            time.sleep(r.json()["wait_ms"] / 1000 + 0.02)
        assert r.status_code == 200 and r.json()["saved"] is True, r.text
        assert time.time() - acked >= 1.0 - 1 / 8 - 0.05


def test_an_acknowledgement_sent_at_once_after_the_last_byte_is_accepted(env, server):
    """The server queues what it sent before it can read the page's acknowledgement of it: a
    client that acknowledges the moment the last byte arrived is never told "never sent" (when
    the report came after the file response's clean-up, 6 of 60 such raters were refused)."""
    db = env["db"]
    toks = [r["token"] for r in study.invite(db, env["sid"], 30)]
    refused = []
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for tok in toks:
            t = c.get("/api/trial", params={"token": tok}).json()["trial"]
            for name in t["media"].values():
                data = c.get(f"/media/{name}", params={"token": tok}).content
                r = acknowledge(c, tok, name, data)
                if r.status_code != 200:
                    refused.append(r.text)
            assert hidden(db, t["trial"])["fetched"] is not None or refused
    assert refused == []


def test_a_real_chromium_page_that_plays_the_stream_is_accepted(env, server, browser):
    db = env["db"]
    (tok,) = (r["token"] for r in study.invite(db, env["sid"], 1))
    ctx = browser.new_context()
    acks = []
    try:
        p = ctx.new_page()
        p.on("request", lambda r: acks.append(r.post_data_json) if r.url.endswith("/api/ack") else None)
        first = pg.open_page(p, server.url, tok)["trial"]
        tid = first["trial"]
        state = pg.answer(p, "left")
        assert "error" not in state, state
        assert state["progress"]["done"] == 1
        row = hidden(db, tid)
        assert row["fetched"] is not None
        data = _file(db, tid)
        assert {
            "media": first["media"]["video"],
            "size": len(data),
            "crc32": zlib.crc32(data),
        }.items() <= acks[0].items()
    finally:
        ctx.close()
