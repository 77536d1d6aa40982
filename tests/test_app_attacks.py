"""Attacks on the web app through HTTP (issue 19's web part): malformed answers, body floods,
password guessing, formula injection in exports, links in the media folder, missing headers.
The real `evalkit serve` on loopback unless the case needs a clock (the back-off: the real app
object in process, with an injected clock)."""
from __future__ import annotations

import csv
import io
import os
import socket

import httpx
import pytest
from sqlalchemy import update

from evalkit import study
from evalkit.study import store

from app.guard import MAX_BODY, Throttle
from evalkit.study.live import FakeClock
from evalkit.testing import aio
from evalkit.testing.server import ADMIN_PASSWORD, Server
from evalkit.testing.studies import current


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("attacks")
    report = reports(fps=8)
    db = root / "s.db"
    sid = study.create_study(report, db, protocol="preference", clips_spec="worst:3",
                             seed=4)["study"]
    (root / "secret.mp4").write_bytes(b"not for raters")
    server = Server(db).start()
    yield {"db": db, "sid": sid, "root": root, "server": server}
    server.stop()
    log = server.proc.stdout.read()
    assert "Traceback" not in log and "Exception" not in log, log[-3000:]   # no 500s, no crashes


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_malformed_answers_are_4xx_and_store_nothing(env):
    db, u = env["db"], env["server"].url
    tok = study.invite(db, env["sid"], 1)[0]["token"]
    tid = httpx.get(f"{u}/api/trial", params={"token": tok}).json()["trial"]["trial"]
    raw = lambda body, ctype="application/json": httpx.post(  # noqa: E731
        f"{u}/api/answer", content=body, headers={"content-type": ctype})
    cases = {
        "trial 1e30": (f'{{"token": "{tok}", "trial": 1e30, "answer": "left"}}', 404),
        "trial huge int": (f'{{"token": "{tok}", "trial": {10**30}, "answer": "left"}}', 404),
        "trial 1.9": (f'{{"token": "{tok}", "trial": {tid}.9, "answer": "left"}}', 404),
        "trial true": (f'{{"token": "{tok}", "trial": true, "answer": "left"}}', 404),
        "trial negative": (f'{{"token": "{tok}", "trial": -{tid}, "answer": "left"}}', 404),
        "response_ms Infinity": (f'{{"token": "{tok}", "trial": {tid}, "answer": "left",'
                                 f' "response_ms": Infinity}}', 400),
        "response_ms NaN": (f'{{"token": "{tok}", "trial": {tid}, "answer": "left",'
                            f' "response_ms": NaN}}', 400),
        "response_ms true": (f'{{"token": "{tok}", "trial": {tid}, "answer": "left",'
                             f' "response_ms": true}}', 400),
        "answer a list": (f'{{"token": "{tok}", "trial": {tid}, "answer": ["left"]}}', 400),
        "lone surrogate token": (f'{{"token": "\\ud800", "trial": {tid}, "answer": "left"}}', 403),
        "token a number": (f'{{"token": 5, "trial": {tid}, "answer": "left"}}', 403),
        "huge token": ('{"token": "' + "x" * 60000 + f'", "trial": {tid}, "answer": "left"}}', 403),
        "nested 20,000 deep": ("[" * 20000 + "]" * 20000, 400),
        "nested 100,000 deep": ("[" * 100000 + "]" * 100000, 413),
        "not JSON": ("{token", 400),
    }
    for what, (body, code) in cases.items():
        r = raw(body)
        assert r.status_code == code, (what, r.status_code, r.text[:200])
        assert "Traceback" not in r.text and len(r.text) < 400, what
    r = raw(f'{{"token": "{tok}", "trial": {tid}, "answer": "left"}}', "text/plain")
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    assert current(db, tok)["index"] == 1            # nothing was stored by any of them


def test_body_floods_are_cut_off_and_memory_stays_bounded(env):
    u, pid = env["server"].url, env["server"].proc.pid
    before = _rss_kb(pid)
    # announced as 300 MB: refused before a byte is read
    port = int(u.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /api/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n{" % (300 * 2**20))
        head = b""
        while str(MAX_BODY).encode() not in head:
            more = sock.recv(4096)
            if not more:
                break
            head += more
    assert head.startswith(b"HTTP/1.1 413") and str(MAX_BODY).encode() in head, head

    def chunks(n=40 * 2**20, size=2**20):      # 40 MB streamed without a length
        for _ in range(n // size):
            yield b" " * size
    for path in ("/api/answer", "/gradio_api/queue/join"):
        try:
            r = httpx.post(u + path, content=chunks(), headers={"content-type": "application/json"},
                           timeout=60)
            # Gradio's own body parser turns the cut-off into its 400; ours says 413
            assert r.status_code == (413 if path.startswith("/api") else 400), (path, r.status_code)
        except (httpx.RemoteProtocolError, httpx.WriteError):
            pass                               # the server answered 413 and closed mid-upload
    assert httpx.get(f"{u}/healthz").status_code == 200
    assert _rss_kb(pid) - before < 64 * 1024, (before, _rss_kb(pid))   # not the 40 MB bodies


def test_every_response_carries_the_security_headers(env):
    db, u = env["db"], env["server"].url
    tok = study.invite(db, env["sid"], 1)[0]["token"]
    t = httpx.get(f"{u}/api/trial", params={"token": tok}).json()["trial"]
    page = httpx.get(f"{u}/?token={tok}")
    asset = next(p for p in page.text.split('"') if p.startswith(("/assets/", "./assets/"))
                 and p.endswith(".js"))
    urls = [f"/?token={tok}", "/", "/admin/", "/healthz", f"/api/trial?token={tok}",
            f"/media/{t['media']['video']}?token={tok}", f"/media/{'0' * 40}.mp4",
            f"/export/{env['sid']}/ratings.csv", "/favicon.ico", "/nothing-here",
            "/" + asset.lstrip("./")]
    for path in urls:
        r = httpx.get(u + path)
        assert r.status_code < 500, path
        h = r.headers
        assert "frame-ancestors 'none'" in h.get("content-security-policy", ""), path
        assert h.get("x-frame-options") == "DENY" and h.get("x-content-type-options") == "nosniff"
        assert h.get("referrer-policy") == "no-referrer", path


def test_export_csv_cells_cannot_run_as_formulas(env):
    db, sid = env["db"], env["sid"]
    evil = ["=HYPERLINK(\"http://x\",\"y\")", "+cmd|' /C calc'!A0", "@SUM(1+1)", "-2+3"]
    with store.open_db(db).engine.begin() as conn:
        ids = [r[0] for r in conn.execute(store.clips.select().with_only_columns(store.clips.c.id)
                                          .where(store.clips.c.study_id == sid))]
        for i, cid in enumerate(ids):
            conn.execute(update(store.clips).where(store.clips.c.id == cid)
                         .values(prompt=evil[i % len(evil)]))
    from evalkit.testing.studies import answer
    answer(db, study.invite(db, sid, 1)[0]["token"], lambda t: "left", limit=len(ids) + 3)
    r = httpx.get(f"{env['server'].url}/export/{sid}/ratings.csv", auth=("admin", ADMIN_PASSWORD))
    rows = list(csv.DictReader(io.StringIO(r.text)))
    prompts = {row["prompt"] for row in rows}
    assert prompts and all(p[:1] not in "=+-@" for p in prompts), prompts
    assert {p.lstrip("'") for p in prompts} <= set(evil)
    for row in rows:                             # numbers stay numbers
        float(row["response_ms"])


def test_a_link_in_the_media_folder_is_not_followed(env, tmp_path):
    db, u = env["db"], env["server"].url
    tok = study.invite(db, env["sid"], 1)[0]["token"]
    t = httpx.get(f"{u}/api/trial", params={"token": tok}).json()["trial"]
    from evalkit.testing.studies import hidden
    with store.open_db(db).engine.connect() as conn:
        media_dir = conn.execute(store.studies.select().with_only_columns(store.studies.c.media_dir)
                                 .where(store.studies.c.id == env["sid"])).scalar_one()
    f = os.path.join(media_dir, hidden(db, t["trial"])["shown"]["media"] + ".mp4")
    saved = tmp_path / "saved.mp4"
    os.replace(f, saved)
    try:
        os.symlink(env["root"] / "secret.mp4", f)
        r = httpx.get(f"{u}/media/{t['media']['video']}", params={"token": tok})
        assert r.status_code == 404 and b"not for raters" not in r.content
    finally:
        os.unlink(f)
        os.replace(saved, f)


def test_password_guessing_backs_off(env):
    """Failed /export passwords and admin logins: 5 free, then 2**k s waits (429 with
    Retry-After); a success clears the count. The real app in process, clock injected."""
    from app.server import build_app

    clock = FakeClock()
    app = build_app(str(env["db"]), admin_password=ADMIN_PASSWORD, throttle=Throttle(clock=clock))

    async def go():
        t = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=t, base_url="http://test") as c:
            url = f"/export/{env['sid']}/ratings.csv"
            codes = [(await c.get(url, auth=("admin", f"guess{i}"))).status_code for i in range(5)]
            assert codes == [401] * 5
            r = await c.get(url, auth=("admin", ADMIN_PASSWORD))     # even the right one waits
            assert r.status_code == 429 and r.headers["retry-after"] == "2"
            r = await c.post("/admin/login", data={"username": "admin", "password": "x"})
            assert r.status_code == 429                               # the login form too
            clock.advance(1.5)
            assert (await c.post("/admin/login", data={"username": "admin",
                                                       "password": "x"})).status_code == 400
            r = await c.get(url, auth=("admin", ADMIN_PASSWORD))
            assert r.status_code == 429 and r.headers["retry-after"] == "3"   # now 2 s
            clock.advance(2.5)
            assert (await c.get(url, auth=("other", ADMIN_PASSWORD))).status_code == 401  # user
            clock.advance(4.5)
            assert (await c.get(url, auth=("admin", ADMIN_PASSWORD))).status_code == 200
            assert (await c.get(url, auth=("admin", "nope"))).status_code == 401  # count cleared
            assert (await c.get(url, auth=("admin", ADMIN_PASSWORD))).status_code == 200
    try:
        aio.run(go())
    finally:
        app.state.raters.close()


def test_server_killed_while_raters_answer_loses_nothing(tmp_path, reports):
    """The fast slice of benchmarks/bench_serve_kills.py: 6 raters, the server SIGKILLed once
    after the 20th acknowledged answer and restarted; every acknowledged rating is stored once,
    every trial is answered in the end, and the database is intact. The clips are 8 frames at
    24 fps: each rater waits a 0.35 s play-through (the server's bound: 7 frames, 0.29 s) per
    trial, not the seconds of slower clips (nothing here depends on the clips' length)."""
    from evalkit.testing import kills

    report = reports()
    db = tmp_path / "k.db"
    sid = study.create_study(report, db, protocol="preference", clips_spec="worst:3",
                             seed=6)["study"]
    tokens = [r["token"] for r in study.invite(db, sid, 6)]
    out = kills.run(db, tokens, [20], watch_s=0.35)
    assert out["kills"] == 1 and out["acknowledged"] >= 20, out
    assert out["lost"] == 0 and out["duplicates"] == 0 and out["integrity"] == "ok", out
    assert out["stored"] == study.list_studies(db)[0]["trials"], out
