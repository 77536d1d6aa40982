"""Attacks on the web app through HTTP (issues 19 and 35's web parts): malformed answers, body
floods, password guessing (in parallel, from several addresses), formula injection in exports,
links in the media folder, missing headers, Gradio's file and upload routes, requests that made
Gradio answer 500, slow clients, and the gate's count of bytes delivered (two servers).
The real `evalkit serve` on loopback unless the case needs a clock (the back-off: the real app
object in process, with an injected clock)."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import socket
import time

import httpx
import pytest
from sqlalchemy import update

from evalkit import study
from evalkit.app.guard import MAX_BODY, Throttle
from evalkit.study import store
from evalkit.study.live import FakeClock
from evalkit.testing import aio
from evalkit.testing.server import ADMIN_PASSWORD, Server
from evalkit.testing.studies import acknowledge, current, hidden

pytestmark = pytest.mark.slow  # real servers under attack, a killed server


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("attacks")
    report = reports(fps=8)
    db = root / "s.db"
    sid = study.create_study(
        report, db, protocol="preference", clips_spec="worst:3", seed=4, allow_masking=True
    )["study"]
    (root / "secret.mp4").write_bytes(b"not for raters")
    server = Server(db).start()
    yield {"db": db, "sid": sid, "root": root, "server": server, "report": report}
    server.stop()
    log = server.proc.stdout.read()
    assert "Traceback" not in log and "Exception" not in log, log[-3000:]  # no 500s, no crashes


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_malformed_answers_are_4xx_and_store_nothing(env):
    db, u = env["db"], env["server"].url
    tok = study.invite(db, env["sid"], 1)[0]["token"]
    tid = httpx.get(f"{u}/api/trial", params={"token": tok}).json()["trial"]["trial"]
    raw = lambda body, ctype="application/json": httpx.post(  # noqa: E731
        f"{u}/api/answer", content=body, headers={"content-type": ctype}
    )
    cases = {
        "trial 1e30": (f'{{"token": "{tok}", "trial": 1e30, "answer": "left"}}', 404),
        "trial huge int": (f'{{"token": "{tok}", "trial": {10**30}, "answer": "left"}}', 404),
        "trial 1.9": (f'{{"token": "{tok}", "trial": {tid}.9, "answer": "left"}}', 404),
        "trial true": (f'{{"token": "{tok}", "trial": true, "answer": "left"}}', 404),
        "trial negative": (f'{{"token": "{tok}", "trial": -{tid}, "answer": "left"}}', 404),
        "response_ms Infinity": (
            f'{{"token": "{tok}", "trial": {tid}, "answer": "left", "response_ms": Infinity}}',
            400,
        ),
        "response_ms NaN": (
            f'{{"token": "{tok}", "trial": {tid}, "answer": "left", "response_ms": NaN}}',
            400,
        ),
        "response_ms true": (
            f'{{"token": "{tok}", "trial": {tid}, "answer": "left", "response_ms": true}}',
            400,
        ),
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
    assert current(db, tok)["index"] == 1  # nothing was stored by any of them


def test_body_floods_are_cut_off_and_memory_stays_bounded(env):
    u, pid = env["server"].url, env["server"].proc.pid
    before = _rss_kb(pid)
    # announced as 300 MB: refused before a byte is read
    port = int(u.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /api/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n{" % (300 * 2**20)
        )
        head = b""
        while str(MAX_BODY).encode() not in head:
            more = sock.recv(4096)
            if not more:
                break
            head += more
    assert head.startswith(b"HTTP/1.1 413") and str(MAX_BODY).encode() in head, head

    def chunks(n=40 * 2**20, size=2**20):  # 40 MB streamed without a length
        for _ in range(n // size):
            yield b" " * size

    for path in ("/api/answer", "/gradio_api/queue/join"):
        try:
            r = httpx.post(
                u + path, content=chunks(), headers={"content-type": "application/json"}, timeout=60
            )
            # read whole by the guard before any app sees it: 413 for Gradio's routes too
            assert r.status_code == 413, (path, r.status_code)
        except (httpx.RemoteProtocolError, httpx.WriteError):
            pass  # the server answered 413 and closed mid-upload
    assert httpx.get(f"{u}/healthz").status_code == 200
    assert _rss_kb(pid) - before < 64 * 1024, (before, _rss_kb(pid))  # not the 40 MB bodies


def test_every_response_carries_the_security_headers(env):
    db, u = env["db"], env["server"].url
    tok = study.invite(db, env["sid"], 1)[0]["token"]
    t = httpx.get(f"{u}/api/trial", params={"token": tok}).json()["trial"]
    page = httpx.get(f"{u}/?token={tok}")
    asset = next(
        p for p in page.text.split('"') if p.startswith(("/assets/", "./assets/")) and p.endswith(".js")
    )
    urls = [
        f"/?token={tok}",
        "/",
        "/admin/",
        "/healthz",
        f"/api/trial?token={tok}",
        f"/media/{t['media']['video']}?token={tok}",
        f"/media/{'0' * 40}.mp4",
        f"/export/{env['sid']}/ratings.csv",
        "/favicon.ico",
        "/nothing-here",
        "/" + asset.lstrip("./"),
    ]
    for path in urls:
        r = httpx.get(u + path)
        assert r.status_code < 500, path
        h = r.headers
        assert "frame-ancestors 'none'" in h.get("content-security-policy", ""), path
        assert h.get("x-frame-options") == "DENY" and h.get("x-content-type-options") == "nosniff"
        assert h.get("referrer-policy") == "no-referrer", path


def test_export_csv_cells_cannot_run_as_formulas(env):
    db, sid = env["db"], env["sid"]
    evil = ['=HYPERLINK("http://x","y")', "+cmd|' /C calc'!A0", "@SUM(1+1)", "-2+3"]
    with store.open_db(db).engine.begin() as conn:
        ids = [
            r[0]
            for r in conn.execute(
                store.clips.select().with_only_columns(store.clips.c.id).where(store.clips.c.study_id == sid)
            )
        ]
        for i, cid in enumerate(ids):
            conn.execute(
                update(store.clips).where(store.clips.c.id == cid).values(prompt=evil[i % len(evil)])
            )
    from evalkit.testing.studies import answer

    answer(db, study.invite(db, sid, 1)[0]["token"], lambda t: "left", limit=len(ids) + 3)
    r = httpx.get(f"{env['server'].url}/export/{sid}/ratings.csv", auth=("admin", ADMIN_PASSWORD))
    rows = list(csv.DictReader(io.StringIO(r.text)))
    prompts = {row["prompt"] for row in rows}
    assert prompts and all(p[:1] not in "=+-@" for p in prompts), prompts
    assert {p.lstrip("'") for p in prompts} <= set(evil)
    for row in rows:  # numbers stay numbers
        float(row["response_ms"])


def test_a_link_in_the_media_folder_is_not_followed(env, tmp_path):
    db, u = env["db"], env["server"].url
    tok = study.invite(db, env["sid"], 1)[0]["token"]
    t = httpx.get(f"{u}/api/trial", params={"token": tok}).json()["trial"]
    from evalkit.testing.studies import hidden

    with store.open_db(db).engine.connect() as conn:
        media_dir = conn.execute(
            store.studies.select()
            .with_only_columns(store.studies.c.media_dir)
            .where(store.studies.c.id == env["sid"])
        ).scalar_one()
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
    from evalkit.app.server import build_app

    clock = FakeClock()
    app = build_app(str(env["db"]), admin_password=ADMIN_PASSWORD, throttle=Throttle(clock=clock))

    async def go():
        t = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=t, base_url="http://test") as c:
            url = f"/export/{env['sid']}/ratings.csv"
            codes = [(await c.get(url, auth=("admin", f"guess{i}"))).status_code for i in range(5)]
            assert codes == [401] * 5
            r = await c.get(url, auth=("admin", ADMIN_PASSWORD))  # even the right one waits
            assert r.status_code == 429 and r.headers["retry-after"] == "2"
            r = await c.post("/admin/login", data={"username": "admin", "password": "x"})
            assert r.status_code == 429  # the login form too
            clock.advance(1.5)
            assert (
                await c.post("/admin/login", data={"username": "admin", "password": "x"})
            ).status_code == 400
            r = await c.get(url, auth=("admin", ADMIN_PASSWORD))
            assert r.status_code == 429 and r.headers["retry-after"] == "3"  # now 2 s
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
    sid = study.create_study(
        report, db, protocol="preference", clips_spec="worst:3", seed=6, allow_masking=True
    )["study"]
    tokens = [r["token"] for r in study.invite(db, sid, 6)]
    out = kills.run(db, tokens, [20], watch_s=0.35)
    assert out["kills"] == 1 and out["acknowledged"] >= 20, out
    assert out["lost"] == 0 and out["duplicates"] == 0 and out["integrity"] == "ok", out
    assert out["stored"] == study.list_studies(db)[0]["trials"], out


# -- issue 35: doors, parallel guessing, uploads, 500s, slow clients; issue 34: bytes delivered --


def _client(address: str, **kw) -> httpx.AsyncClient:
    """An HTTP client whose connections come from ``address`` (any 127.x.y.z on Linux): one
    more client as the server's back-off tells them apart."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), **kw)


def _temp_dir(server) -> "os.PathLike":
    """The server's own temporary folder (Gradio's), ``<tmp>/evalkit-serve-<uid>-<pid>``."""
    import tempfile
    from pathlib import Path

    return Path(tempfile.gettempdir()) / f"evalkit-serve-{os.getuid()}-{server.proc.pid}"


def test_admin_downloads_need_the_password_and_leave_no_copies(env):
    """The admin page's CSV links are /export (the password, or the admin page's own login
    session); Gradio's file routes are closed on both apps, and the server writes no copy."""
    u, sid = env["server"].url, env["sid"]
    with httpx.Client(base_url=u) as admin:
        assert (
            admin.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD}).status_code
            == 200
        )
        assert any(c.startswith("access-token") for c in admin.cookies)
        r = admin.get(f"/export/{sid}/ratings.csv")  # the session cookie
        assert r.status_code == 200 and r.text.startswith(study.ratings_csv(env["db"], sid)[:20])
        assert r.headers["cache-control"] == "no-store"
    for path in (f"/export/{sid}/ratings.csv", f"/export/{sid}/summary.csv"):
        r = httpx.get(u + path)  # no password: nothing
        assert r.status_code == 401 and "rater" not in r.text, path
        r = httpx.get(u + path, cookies={"access-token-unsecure-x": "guess"})
        assert r.status_code == 401, path
    tmp = _temp_dir(env["server"])
    assert tmp.is_dir()
    files = [p for p in tmp.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix == ".csv"], files  # no copy anywhere
    for prefix in ("", "/admin"):
        for path in (
            f"/gradio_api/file={env['db']}",
            f"/gradio_api/file={tmp}/x.csv",
            f"/gradio_api/file/{env['db']}",
            f"/file={env['db']}",
            "/gradio_api/proxy=http://127.0.0.1/",
        ):
            r = httpx.get(u + prefix + path, auth=("admin", ADMIN_PASSWORD))
            assert r.status_code == 404 and len(r.text) < 50, (prefix + path, r.status_code)


def test_uploads_are_refused_and_nothing_is_kept(env):
    """Gradio's upload route on the rater app (and the admin app): refused before a byte is
    stored; 200 uploads write nothing."""
    u = env["server"].url
    tmp = _temp_dir(env["server"])
    before = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())

    async def go():
        async with httpx.AsyncClient(base_url=u, timeout=60) as c:
            rs = await asyncio.gather(
                *[
                    c.post(path, files={"files": ("a.bin", b"x" * 60000)})
                    for path in ["/gradio_api/upload"] * 190 + ["/admin/gradio_api/upload"] * 10
                ]
            )
            return [r.status_code for r in rs]

    assert set(aio.run(go())) == {404}
    r = httpx.get(u + "/gradio_api/upload_progress?upload_id=x")
    assert r.status_code == 404
    after = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
    assert after == before, (before, after)


def test_password_checks_are_counted_before_the_check(env):
    """60 wrong /export passwords and 60 wrong admin logins sent at once by one client: at most
    the free 5 of each are checked, the rest wait (429); the right password sent by another
    client among them works. (That the throttled client's own right password waits too, and
    for how long: test_password_guessing_backs_off, with the clock injected.)"""
    u, sid = env["server"].url, env["sid"]
    url = f"/export/{sid}/ratings.csv"

    async def go():
        limits = httpx.Limits(max_connections=100)
        async with (
            _client("127.0.0.2", base_url=u, limits=limits, timeout=60) as a,
            _client("127.0.0.3", base_url=u, limits=limits, timeout=60) as b,
            _client("127.0.0.4", base_url=u, timeout=60) as c,
        ):
            *wrong, right_c = await asyncio.gather(
                *[a.get(url, auth=("admin", f"guess{i}")) for i in range(60)],
                c.get(url, auth=("admin", ADMIN_PASSWORD)),
            )
            *logins, login_c = await asyncio.gather(
                *[
                    b.post("/admin/login", data={"username": "admin", "password": f"guess{i}"})
                    for i in range(60)
                ],
                c.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD}),
            )
            return ([r.status_code for r in wrong], [r.status_code for r in logins], right_c, login_c)

    wrong, logins, right_c, login_c = aio.run(go())
    assert wrong.count(401) <= 5 and wrong.count(429) >= 55, wrong
    assert logins.count(400) <= 5 and logins.count(429) >= 55, logins
    assert right_c.status_code == 200 and login_c.status_code == 200, (right_c, login_c)


def test_password_checks_of_many_clients_are_slowed_never_locked():
    """The admin account's checks over every client: a bucket of 20, then 2 a second, handed
    out in turn: a client refused is told when its turn comes (one step per client queued
    before it), and the turn is kept for it; a throttled client uses none (in process, the
    clock injected)."""
    from evalkit.app.guard import ACCOUNT_BURST, ACCOUNT_RATE

    step = 1 / ACCOUNT_RATE
    clock = FakeClock()
    th = Throttle(clock=clock)
    waits = [th.begin(f"10.0.0.{i}") for i in range(ACCOUNT_BURST + 5)]
    assert waits[:ACCOUNT_BURST] == [0.0] * ACCOUNT_BURST
    assert waits[ACCOUNT_BURST:] == pytest.approx([step * k for k in range(1, 6)]), waits
    assert th.begin(f"10.0.0.{ACCOUNT_BURST}") == pytest.approx(step)  # asking again: same turn
    clock.advance(step)
    assert th.begin(f"10.0.0.{ACCOUNT_BURST}") == 0.0  # its turn, kept for it
    assert th.begin("10.0.1.1") == pytest.approx(5 * step)  # behind the 4 still queued
    clock.advance(10 * step)
    for i in range(ACCOUNT_BURST + 1, ACCOUNT_BURST + 5):
        assert th.begin(f"10.0.0.{i}") == 0.0
    assert th.begin("10.0.1.1") == 0.0
    th2 = Throttle(clock=clock)
    for _ in range(4):  # one client burns its free failures
        assert th2.begin("10.0.9.9") == 0.0
    assert th2.begin("10.0.9.9") == 0.0  # the 5th: now locked for 1 s
    assert th2.begin("10.0.9.9") > 0  # locked: and it uses no check
    assert th2.begin("10.0.1.3") == 0.0  # another client's turn is not taken


def test_guessing_from_40_addresses_does_not_lock_the_admin_out():
    """The sweep's lock-out: 40 addresses guessing as fast as they are let (each retrying when
    told) kept the account's checks used up, and the real admin got 429 on 5 of 5 tries. Now the
    admin, arriving in the thick of it and retrying when told (Retry-After: whole seconds), is
    checked within one turn per address queued before it; the guessing stays slowed (the
    throttle itself, the clock injected: 120 simulated seconds of events)."""
    import math

    from evalkit.app.guard import ACCOUNT_BURST, ACCOUNT_RATE

    clock = FakeClock()
    th = Throttle(clock=clock)
    t0 = clock()
    due = {f"10.1.0.{i}": t0 for i in range(40)}  # who -> when it asks next
    due["admin"] = t0 + 5.0
    checked, admin_tries, admin_in = 0, 0, None
    while clock() - t0 < 120 and admin_in is None:
        now = clock()
        for who in sorted(due, key=due.get):
            if due[who] > now:
                continue
            wait = th.begin(who)
            if who == "admin":
                admin_tries += 1
                if wait == 0:
                    admin_in = now - t0
                    th.succeeded(who)
                    break
                due[who] = now + math.floor(wait) + 1  # what Retry-After says
            elif wait == 0:
                checked += 1  # a guess checked, wrong
                due[who] = now  # asks again at once
            else:
                due[who] = now + wait
        clock.advance(max(1e-3, min(due.values()) - clock()))
    assert admin_in is not None, admin_tries
    # one turn per other address at most (2 s of Retry-After rounding a try), from t = 5 s
    assert admin_in - 5.0 <= 40 / ACCOUNT_RATE + 2 * admin_tries, (admin_in, admin_tries)
    assert checked <= ACCOUNT_BURST + ACCOUNT_RATE * admin_in, (checked, admin_in)


def test_a_right_password_on_a_missing_study_is_no_failed_guess(env):
    """/export of a study that does not exist, with the right password, five times and more:
    404 each time, and the admin's address is not locked (the password was right)."""
    from evalkit.app.server import build_app

    clock = FakeClock()
    app = build_app(
        str(env["db"]), admin_password=ADMIN_PASSWORD, throttle=Throttle(clock=clock), with_admin=False
    )

    async def go():
        t = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=t, base_url="http://test") as c:
            codes = [
                (await c.get(f"/export/{n}/ratings.csv", auth=("admin", ADMIN_PASSWORD))).status_code
                for n in (999, 998, 997, 996, 995, 994, "x1", 0)
            ]
            ok = await c.get(f"/export/{env['sid']}/ratings.csv", auth=("admin", ADMIN_PASSWORD))
            wrong = [
                (await c.get(f"/export/{n}/ratings.csv", auth=("admin", "nope"))).status_code
                for n in (999, 998, 997, 996, 995, 994)
            ]
            return codes, ok.status_code, wrong

    try:
        codes, ok, wrong = aio.run(go())
    finally:
        app.state.raters.close()
    assert codes == [404] * 8 and ok == 200, (codes, ok)
    assert wrong == [401] * 5 + [429], wrong  # a wrong one still counts


def test_requests_that_made_500s_are_4xx_with_one_log_line(env, tmp_path):
    """Each request the sweep answered with a 500 and a 6.6 KB traceback: a 4xx with a short
    body, at most one log line, no traceback (a server of its own: its log is read)."""
    db = env["db"]
    server = Server(db).start()
    u = server.url
    try:
        tok = study.invite(db, env["sid"], 1)[0]["token"]
        tid = httpx.get(f"{u}/api/trial", params={"token": tok}).json()["trial"]["trial"]
        huge = "1" + "0" * 400
        cases = [
            ("POST", "/gradio_api/run/nosuch", '{"data": []}'),
            ("POST", "/gradio_api/api/nosuch", '{"data": []}'),
            *[
                ("POST", "/gradio_api/queue/join", f'{{"data": [], "fn_index": {i}, "session_hash": "s{i}"}}')
                for i in range(2, 8)
            ],
            (
                "POST",
                "/api/answer",
                f'{{"token": "{tok}", "trial": {tid}, "answer": "left", "response_ms": {huge}}}',
            ),
            (
                "POST",
                f"/gradio_api/run/answer?token={tok}",
                f'{{"data": [], "event_data": {{"trial": {tid}, "answer": "left", "response_ms": {huge}}}}}',
            ),
            ("GET", "/export/99999999999999999999999/ratings.csv", None),
            ("GET", "/export/-1/summary.csv", None),
        ]
        for method, path, body in cases:
            r = httpx.request(
                method,
                u + path,
                content=body,
                auth=("admin", ADMIN_PASSWORD),
                headers={"content-type": "application/json"},
            )
            # the response_ms cases reach the gate (videos not loaded): 425, not a 500
            assert 400 <= r.status_code < 500 or (
                path.startswith("/gradio_api/run/answer") and r.status_code == 200 and "not loaded" in r.text
            ), (path, r.status_code)
            assert len(r.text) < 400 and "Traceback" not in r.text, (path, r.text[:300])

        def chunks(n=200 * 1024, size=8192):  # 200 KB without a length
            for _ in range(n // size):
                yield b"x" * size

        for path in ("/gradio_api/upload", "/gradio_api/run/answer", "/api/answer"):
            try:
                r = httpx.post(
                    u + path, content=chunks(), timeout=60, headers={"content-type": "application/json"}
                )
                assert r.status_code in ((404,) if "upload" in path else (413,)), (path, r)
            except (httpx.RemoteProtocolError, httpx.WriteError):
                pass  # answered and closed mid-upload
    finally:
        server.stop()
    log = server.proc.stdout.read()
    assert "Traceback" not in log and "refused (KeyError" in log, log[-2000:]
    assert len(log.splitlines()) <= len(cases) + 3, log


def test_admin_address_printed_by_serve_answers(env):
    """`serve` prints the admin page's address; it answers (and /admin redirects to it)."""
    banner = env["server"].banner
    url = next(w for w in banner.split() if "/admin" in w)
    assert url == env["server"].url + "/admin/", banner
    assert "evalkit study admin" in httpx.get(url).text
    r = httpx.get(env["server"].url + "/admin")
    assert r.status_code == 307 and r.headers["location"] == "/admin/"


def test_slow_clients_are_cut_off_and_connections_capped(env):
    """Slow clients (a request head never finished, a body never finished, nothing sent) are
    closed by the server after its timeouts (shortened here to 1 s through the environment:
    nothing waits on the wall clock but the sockets' own generous timeouts), and beyond the
    connection cap a request is answered 503 instead of queueing forever."""
    server = Server(
        env["db"],
        env={
            "EVALKIT_SERVE_HEADER_TIMEOUT_S": "1",
            "EVALKIT_SERVE_BODY_TIMEOUT_S": "1",
            "EVALKIT_SERVE_MAX_CONNECTIONS": "40",
        },
    ).start()
    port = int(server.url.rsplit(":", 1)[1])
    socks: list[socket.socket] = []

    def drained(s: socket.socket) -> bytes:
        """All the server sends until it closes the connection (60 s: a timeout fails)."""
        got = b""
        while more := s.recv(4096):
            got += more
        return got

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # kept alive
            got = b""
            while b'{"ok":true}' not in got:
                got += s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a slow next head
            assert drained(s) == b""
        for i in range(60):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            if i % 2:  # a head never finished
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)  # else: nothing at all
        # every slow socket held: a new request finds the cap reached
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert drained(s).startswith(b"HTTP/1.1 503"), "cap not applied"
        for i, s in enumerate(socks):  # each is closed by the server
            assert drained(s) == b"", i
            s.close()
        socks = []
        for i in range(10):  # bodies never finished
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(
                b"POST /api/answer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b'application/json\r\nContent-Length: 100\r\n\r\n{"tok'
            )
            socks.append(s)
        for i, s in enumerate(socks):
            got = drained(s)
            assert got.startswith(b"HTTP/1.1 408") and b"not received within 1 s" in got, got
        assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    finally:
        for s in socks:
            s.close()
        server.stop()
    log = server.proc.stdout.read()
    assert "Traceback" not in log, log[-2000:]


def _media(client: httpx.Client, tok: str) -> tuple[int, dict]:
    t = client.get("/api/trial", params={"token": tok}).json()["trial"]
    return t["trial"], t["media"]


def _answer_when_played(client: httpx.Client, tok: str, tid: int, answer: str) -> httpx.Response:
    """POST the answer, waiting the play-through the server asks for (``wait_ms``) when the
    videos were delivered; any other refusal is returned at once."""
    for _ in range(20):
        r = client.post("/api/answer", json={"token": tok, "trial": tid, "answer": answer})
        if r.status_code != 425 or "not loaded" in r.text:
            return r
        time.sleep(r.json()["wait_ms"] / 1000 + 0.05)
    return r


def test_gate_counts_bytes_delivered_across_two_servers(env):
    """HEAD and a 1-byte Range GET of every video deliver 1 byte: the answer is refused (not
    loaded). Every byte fetched, half of each video from one server process and the rest from
    another on the same database: the answer is accepted (the bytes are counted in the
    database, not in one process's memory)."""
    db, sid = env["db"], env["sid"]
    one = env["server"]
    two = Server(db).start()
    try:
        tok, tok2 = (r["token"] for r in study.invite(db, sid, 2))
        with httpx.Client(base_url=one.url, timeout=30) as c1:
            tid, media = _media(c1, tok)
            for name in media.values():
                assert c1.head(f"/media/{name}", params={"token": tok}).status_code == 200
                r = c1.get(f"/media/{name}", params={"token": tok}, headers={"range": "bytes=0-0"})
                assert r.status_code == 206 and len(r.content) == 1
            r = _answer_when_played(c1, tok, tid, "left")
            assert r.status_code == 425 and "not loaded" in r.text, r.text
        with (
            httpx.Client(base_url=one.url, timeout=30) as c1,
            httpx.Client(base_url=two.url, timeout=30) as c2,
        ):
            tid, media = _media(c1, tok2)
            whole = {}
            for name in media.values():
                size = int(c1.head(f"/media/{name}", params={"token": tok2}).headers["content-length"])
                half = size // 2
                a = c1.get(f"/media/{name}", params={"token": tok2}, headers={"range": f"bytes=0-{half - 1}"})
                b = c2.get(f"/media/{name}", params={"token": tok2}, headers={"range": f"bytes={half}-"})
                assert a.status_code == b.status_code == 206
                whole[name] = a.content + b.content
                assert len(whole[name]) == size
            # every byte sent, none acknowledged: not loaded (the gate counts what the page
            # holds, issue 44)
            r = c2.post("/api/answer", json={"token": tok2, "trial": tid, "answer": "left"})
            assert r.status_code == 425 and "not loaded" in r.text, r.text
            # both processes report what they sent after sending it: the page's acknowledgement
            # is refused until they have, then accepted by either
            for _ in range(50):
                if all(acknowledge(c2, tok2, n, d).status_code == 200 for n, d in whole.items()):
                    break
                time.sleep(0.1)
            assert hidden(db, tid)["fetched"] is not None
            r = _answer_when_played(c2, tok2, tid, "left")
            assert r.status_code == 200 and r.json()["saved"] is True, r.text
            assert _answer_when_played(c1, tok2, tid, "left").json()["saved"] is False
    finally:
        two.stop()
    assert "Traceback" not in two.proc.stdout.read()


# -- issue 47: the admin page's events with bad study ids, free text on the admin page ---------


def test_admin_events_with_bad_study_ids_answer_in_one_line(env):
    """The admin page's show and export events (and invites) sent a study that is no number
    (text, NaN, infinity, a list, an object, nothing) by a logged-in admin: each answered with
    a one-line error on the page, no 500 and no traceback in the server's log (a server of its
    own: its log is read)."""
    server = Server(env["db"]).start()
    bad = ["abc", None, "NaN", "inf", 1e308, "1e999", [1], {"a": 1}, True, 1.5, -3, ""]
    try:
        with httpx.Client(base_url=server.url, timeout=60) as admin:
            assert (
                admin.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD}).status_code
                == 200
            )
            for event in ("show", "export", "make_invites"):
                for v in bad:
                    data = [v, 1, ""] if event == "make_invites" else [v]
                    r = admin.post(f"/admin/gradio_api/run/{event}", json={"data": data})
                    assert r.status_code == 200, (event, v, r.status_code, r.text[:300])
                    first = r.json()["data"][0]
                    assert "study: expected" in first and "\n" not in first, (event, v, first)
            r = admin.post("/admin/gradio_api/run/show", json={"data": [env["sid"]]})
            assert r.status_code == 200 and f"study {env['sid']}" in r.json()["data"][0]
    finally:
        server.stop()
    log = server.proc.stdout.read()
    assert "Traceback" not in log and "Error" not in log, log[-2000:]


def test_unblind_who_and_reason_are_shown_as_text_on_the_admin_page(env, browser):
    """``unblind --who/--reason`` holding HTML and Markdown (an image, a link, LaTeX): the
    admin page shows the characters as written; the browser's DOM of the verdict holds no
    element made of them."""
    from evalkit.testing.page import admin_results

    db = env["db"]
    sid = study.create_study(
        env["report"], db, protocol="abx", clips_spec="sample:1", seed=9, allow_masking=True
    )["study"]
    who = '<img src=x id=evil onerror="document.title=1"> <b id=bold>admin</b>'
    reason = "[a link](javascript:alert(1)) ![pic](/export/1/ratings.csv) $x^2$ `code`"
    study.unblind(db, sid, reason=reason, who=who)
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    try:
        page.goto(f"{env['server'].url}/admin/")
        page.wait_for_selector("input[type=password]", timeout=30000)
        text = admin_results(page, sid, ADMIN_PASSWORD, pattern="UNBLINDED")
        made = page.evaluate("""() => { const v = document.querySelector('#verdict');
            return {img: v.querySelectorAll('img').length, a: v.querySelectorAll('a').length,
                    b: v.querySelectorAll('b, #bold, #evil').length,
                    code: v.querySelectorAll('code').length,
                    math: v.querySelectorAll('.katex, math').length,
                    title: document.title}; }""")
    finally:
        ctx.close()
    assert (
        made == {"img": 0, "a": 0, "b": 0, "code": 0, "math": 0, "title": made["title"]}
        and made["title"] != "1"
    ), made
    assert who in text and reason in text, text
