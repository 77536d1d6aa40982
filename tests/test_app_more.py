"""The web app: refusals, resume after a server restart, the admin page (real server, Chromium)."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, assert_one_line_error, run_evalkit
from sqlalchemy import update
from test_app import export, hidden, rate  # noqa: F401

from evalkit import study
from evalkit.study import store
from evalkit.study.delivery import bytes_text
from evalkit.testing.page import ENABLED, admin_results, open_page
from evalkit.testing.page import answer as answer_in_page
from evalkit.testing.server import ADMIN_PASSWORD, ARTIFACTS, Server, free_port
from evalkit.testing.studies import acknowledge, answer, current, progress

pytestmark = pytest.mark.slow  # the real server and Chromium


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("appmore")
    report = reports(fps=8)  # 8 frames at 8 fps: a 1 s play-through
    db = root / "s.db"
    sid = study.create_study(
        report, db, protocol="preference", clips_spec="worst:3", seed=2, allow_masking=True
    )["study"]
    (root / "secret.mp4").write_bytes(b"not for raters")
    yield {"db": db, "sid": sid, "root": root, "report": report}


@pytest.fixture(scope="module")
def server(env):
    """One real `evalkit serve` on the module's database, shared by the tests that need no
    process of their own (each uses raters and studies of its own; the restart test stops and
    starts it, as a server restart is what it tests)."""
    server = Server(env["db"]).start()
    yield server
    server.stop()


def test_refusals(env, server):
    """Through the real server: answers out of order or before the videos were requested are
    refused and change nothing; tokens, trials and media names are checked; admin routes need
    the password. (The play-through timing itself is tested with a fake clock in
    test_study_db: no wall-clock bound here.)"""
    db, sid = env["db"], env["sid"]
    t1, t2 = (r["token"] for r in study.invite(db, sid, 2))
    u = server.url
    for tok in ("", "nope", t1[:-1] + ("A" if t1[-1] != "A" else "B")):
        r = httpx.get(f"{u}/api/trial", params={"token": tok})
        assert r.status_code == 403 and tok not in r.text if tok else r.status_code == 403
    first = httpx.get(f"{u}/api/trial", params={"token": t1}).json()
    mine = first["trial"]
    assert mine["fps"] == 8 and first["progress"] == {"done": 0, "total": mine["total"], "finished": False}
    post = lambda **b: httpx.post(f"{u}/api/answer", json=b)  # noqa: E731
    # t2's first trial was never handed out: refused (409), and that starts nothing
    other = _trials(db, t2)[0]
    r = post(token=t2, trial=other, answer="left", response_ms=5)
    assert r.status_code == 409 and "not the trial being shown" in r.json()["error"], r.text
    assert hidden(db, other)["served"] is None
    # handed out but its videos never requested: refused (425) however long one waits
    early = post(token=t1, trial=mine["trial"], answer="left", response_ms=5)
    assert early.status_code == 425, early.text
    assert "were not loaded" in early.json()["error"] and early.json()["wait_ms"] > 0
    later = _trials(db, t1)[1]
    assert post(token=t1, trial=later, answer="left").status_code == 409  # out of order
    assert post(token=t1, trial=10**6, answer="left", response_ms=5).status_code == 404
    assert post(token=t1, trial="1 or 1=1", answer="left", response_ms=5).status_code == 404
    assert post(token=t1, trial=other, answer="left", response_ms=5).status_code == 403
    assert post(token="bad", trial=mine["trial"], answer="left", response_ms=5).status_code == 403
    assert post(token=t1, trial=mine["trial"], answer="A", response_ms=5).status_code == 400
    assert (
        httpx.post(
            f"{u}/api/answer", content=b"[1]", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )
    assert progress(db, t1)["done"] == progress(db, t2)["done"] == 0
    # media: only by the opaque names of the rater's own handed-out trials
    name = mine["media"]["video"]
    # one byte (the trial's one stream, fetched whole, would open the gate here)
    r = httpx.get(f"{u}/media/{name}", params={"token": t1}, headers={"Range": "bytes=0-0"})
    assert r.status_code == 206 and r.headers["content-type"] == "video/mp4"
    assert "last-modified" not in r.headers and "etag" not in r.headers
    assert httpx.get(f"{u}/media/{name}").status_code == 404
    assert httpx.get(f"{u}/media/{name}", params={"token": "x"}).status_code == 404
    assert httpx.get(f"{u}/media/{name}", params={"token": t2}).status_code == 404
    sha = hidden(db, mine["trial"])["shown"]["media"]
    for bad in (
        "secret.mp4",
        "..%2Fsecret.mp4",
        "..%2Fs.db",
        "%2E%2E%2Fsecret.mp4",
        name.upper(),
        name + "x",
        "0" * 40 + ".mp4",
        f"{sha}.mp4",
        f"{sha[:40]}.mp4",
    ):
        r = httpx.get(f"{u}/media/{bad}", params={"token": t1})
        assert r.status_code == 404 and b"not for raters" not in r.content, bad
    assert httpx.get(f"{u}/media/../secret.mp4", params={"token": t1}).status_code == 404
    got = {}
    for n in mine["media"].values():  # the page loads the videos, in two ranges
        r = httpx.get(f"{u}/media/{n}", params={"token": t1}, headers={"Range": "bytes=0-99"})
        assert r.status_code == 206
        got[n] = r.content
    assert hidden(db, mine["trial"])["fetched"] is None  # 100 bytes are not the video
    for n in mine["media"].values():
        r = httpx.get(f"{u}/media/{n}", params={"token": t1}, headers={"Range": "bytes=100-"})
        assert r.status_code == 206
        got[n] += r.content
    # every byte sent, nothing acknowledged: not loaded (issue 44: bytes sent are not bytes
    # received; the page acknowledges the whole file, POST /api/ack)
    assert hidden(db, mine["trial"])["fetched"] is None
    early = post(token=t1, trial=mine["trial"], answer="left", response_ms=5)
    assert early.status_code == 425 and "were not loaded" in early.json()["error"], early.text
    with httpx.Client(base_url=u, timeout=30) as c:
        for n, data in got.items():  # a claim that is not the file's: refused
            for size, crc in ((len(data), zlib.crc32(data) ^ 1), (len(data) - 1, zlib.crc32(data[:-1]))):
                r = c.post("/api/ack", json={"token": t1, "media": n, "size": size, "crc32": crc})
                assert r.status_code == 409 and "acknowledgement" in r.json()["error"], r.text
            r = acknowledge(c, t2, n, data)  # another rater's token: no such media
            assert r.status_code == 404, r.text
        assert hidden(db, mine["trial"])["fetched"] is None
        # the whole file, acknowledged at once after its last byte: accepted, the clock starts
        for n, data in got.items():
            r = acknowledge(c, t1, n, data)
            assert r.status_code == 200 and r.json() == {"acknowledged": True}, r.text
    assert hidden(db, mine["trial"])["fetched"] is not None
    # admin: CSV export and Gradio admin refuse without the password
    for auth in (None, ("admin", "wrong")):
        r = httpx.get(f"{u}/export/{sid}/ratings.csv", auth=auth)
        assert r.status_code == 401 and "rater" not in r.text
    assert httpx.get(f"{u}/admin/config").status_code in (401, 403)
    r = httpx.post(f"{u}/admin/login", data={"username": "admin", "password": "wrong"})
    assert r.status_code in (400, 401)
    assert export(server, sid) == []


def _trials(db, tok):
    from sqlalchemy import select

    with store.open_db(db).engine.connect() as conn:
        return [
            r[0]
            for r in conn.execute(
                select(store.trials.c.id)
                .where(store.trials.c.rater_id == _rater(db, tok))
                .order_by(store.trials.c.ord)
            )
        ]


def test_resume_after_server_restart(env, server, browser, reports):
    """Two answers, then the server restarts under the open page: the page's next answer is
    taken by the new process without a reload, and after a reload the study goes on at the
    next unanswered trial; the export holds every answer once. (A study of its own at 24 fps:
    the page plays each trial through once, a third of a second, not the 1 s of the 8 fps
    clips; nothing here depends on the frame rate.)"""
    db = env["db"]
    sid = study.create_study(
        reports(), db, protocol="preference", clips_spec="worst:3", seed=2, allow_masking=True
    )["study"]
    token = study.invite(db, sid, 1)[0]["token"]
    ctx = browser.new_context()
    page = ctx.new_page()
    try:
        state = open_page(page, server.url, token)
        clicked = {}
        for _ in range(2):
            t = current(db, token)
            assert state["trial"]["trial"] == t["trial"]
            assert page.get_attribute("body", "data-trial-index") == str(t["index"])
            state = answer_in_page(page, "left")
            assert state["progress"]["done"] == len(clicked) + 1, state
            clicked[t["trial"]] = ("left", t["media"])
        page.wait_for_function(ENABLED, timeout=30000)  # trial 3 watched, answers enabled
        server.stop()
        assert server.proc.returncode is not None
        server.start()  # same port, new process
        t = current(db, token)
        state = answer_in_page(page, "right")  # the same page, no reload
        assert state["progress"]["done"] == 3 and "error" not in state, state
        clicked[t["trial"]] = ("right", t["media"])
        rest = rate(page, server, token)  # loads the page again; continues at #4
        assert not set(rest) & set(clicked)
        clicked.update(rest)
        assert len(clicked) == progress(db, token)["total"]
        rows = [r for r in opened_export(server, db, sid) if r["rater"] == str(_rater(db, token))]
        assert {int(r["trial"]): r["answer"] for r in rows} == {k: v[0] for k, v in clicked.items()}
    finally:
        ctx.close()
        if server.proc.poll() is not None:  # stopped by a failure above: for the others
            server.start()


def test_a_link_without_a_valid_token_shows_one_message_and_nothing_else(server, browser):
    ctx = browser.new_context()
    page = ctx.new_page()
    media = []
    page.on("request", lambda r: media.append(r.url) if "/media/" in r.url else None)
    try:
        for token, text in ((None, "needs the invite link"), ("not-a-token", "not valid")):
            state = open_page(page, server.url, token)
            assert set(state) == {"fatal"} and text in state["fatal"], state
            assert text in page.inner_text("#message")
            assert page.is_hidden("#trial") and page.locator("video").count() == 0
        assert media == []
    finally:
        ctx.close()


def test_a_stale_tab_goes_on_with_the_next_trial(env, server, browser):
    """Two tabs of one rater: the second answers a trial the first already answered and is
    shown the next unanswered trial (not an error); the first answer stands; no 404s."""
    db, sid = env["db"], env["sid"]
    token = study.invite(db, sid, 1)[0]["token"]
    ctx = browser.new_context()
    tabs = [ctx.new_page(), ctx.new_page()]
    missing = []
    for tab in tabs:
        tab.on("response", lambda r: missing.append(r.url) if r.status >= 400 else None)
    try:
        first = [open_page(tab, server.url, token)["trial"]["index"] for tab in tabs]
        assert first[0] == first[1] == 1
        done = answer_in_page(tabs[0], "left")
        assert done["progress"]["done"] == 1 and done["trial"]["index"] == 2
        stale = answer_in_page(tabs[1], "right")
        assert stale["trial"]["index"] == 2 and stale["progress"]["done"] == 1
        tabs[1].wait_for_function("document.body.dataset.trialIndex === '2'", timeout=30000)
        assert "already answered" in tabs[1].inner_text("#message")
        assert tabs[1].is_visible("#answers button") and tabs[1].is_hidden("#done")
        rows = [r for r in opened_export(server, db, sid) if r["rater"] == str(_rater(db, token))]
        assert [r["answer"] for r in rows] == ["left"]
        assert missing == []
    finally:
        ctx.close()


def opened_export(server, db, sid):
    """/export's raw ratings after a logged unblinding (the study is interim: sealed before)."""
    if not study.unblinding_log(db, sid):
        study.unblind(db, sid, reason="test: the export against the answers", who="test")
    return export(server, sid)


def _rater(db, token):
    from sqlalchemy import select

    from evalkit.study.live import token_hash

    with store.open_db(db).engine.connect() as conn:
        return conn.execute(
            select(store.raters.c.id).where(store.raters.c.token_sha256 == token_hash(token))
        ).scalar_one()


def test_admin_page(env, server, browser):
    db = env["db"]
    # a one-rater design (complete once that rater is done), a prompt with HTML in it
    sid = study.create_study(
        env["report"],
        db,
        protocol="preference",
        clips_spec="worst:3",
        seed=3,
        raters_planned=1,
        allow_masking=True,
    )["study"]
    html = '<img src=x onerror="window.__xss=1"><b>bold</b>'
    with store.open_db(db).engine.begin() as conn:
        conn.execute(update(store.clips).where(store.clips.c.study_id == sid).values(prompt=html))
    tok = study.invite(db, sid, 1)[0]["token"]
    answer(db, tok, lambda t: hidden(db, t["trial"])["expected"] or "left")  # pass the catches
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    try:
        page.goto(f"{server.url}/admin/")
        page.wait_for_selector("input[type=password]", timeout=30000)
        assert page.locator("#studies").count() == 0 and "verdict" not in page.content()
        r = httpx.post(f"{server.url}/admin/gradio_api/call/refresh", json={"data": []})
        assert r.status_code in (401, 403), r.text  # the data API is refused too
        text = admin_results(page, sid, ADMIN_PASSWORD)
        res = study.results(db, sid)
        assert res["status"] == "complete" and f"verdict: {res['verdict'].upper()}" in text
        assert "rule:" in text
        # what raters were sent (issue 34 item 9): this report's i.i.d. noise is finer than the
        # stream carries (created with --allow-masking), and the streams' bytes
        mb = res["media_bytes"]
        assert "DELIVERY MASKED: 3 of 3 rows" in text and "least kept: clip" in text
        assert (
            f"{mb['streams']} trial streams, {bytes_text(mb['total'])} in all; per trial "
            f"median {bytes_text(mb['median'])}, max {bytes_text(mb['max'])}"
        ) in text
        try:
            page.wait_for_function(
                "document.querySelector('#per-clip') && "
                "document.querySelector('#per-clip').innerText.includes('onerror')",
                timeout=30000,
            )
        except Exception:
            print("PERCLIP", page.inner_text("#per-clip")[:2000])
            raise
        assert page.evaluate("window.__xss") is None
        assert page.locator("#per-clip b").count() == 0 and page.locator("#per-clip img").count() == 0
        page.screenshot(path=str(ARTIFACTS / "admin-1280x800.png"), full_page=False)
    finally:
        ctx.close()


def test_admin_export_downloads_csv(env, server, browser):
    """The admin's Export tab in Chromium: pick a study, export, download both CSVs through
    its two links (/export, with the page's login session); the files hold exactly the
    ratings that were given."""
    report, db = env["report"], env["db"]
    study.create_study(report, db, protocol="preference", clips_spec="worst:2", seed=1, allow_masking=True)
    sid = study.create_study(report, db, protocol="abx", clips_spec="worst:3", seed=4, allow_masking=True)[
        "study"
    ]
    toks = [r["token"] for r in study.invite(db, sid, 2)]
    given = {}
    for tok, limit in zip(toks, (None, 2)):
        given.update(answer(db, tok, lambda t: ("A", "B")[t["trial"] % 2], limit))
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    page = ctx.new_page()

    def download(key):
        page.click("#export")
        page.wait_for_selector("#raw-csv:visible", timeout=60000)
        page.wait_for_function(
            "document.querySelector('#export-note') && "
            "document.querySelector('#export-note').innerText.includes("
            f"'Study {sid}:') && document.querySelector('#export-note')"
            f".innerText.includes('{key}')",
            timeout=60000,
        )
        files = {}
        for elem, name in (("#raw-csv", "ratings"), ("#summary-csv", "summary")):
            with page.expect_download(timeout=30000) as dl:
                page.click(elem)
            assert dl.value.suggested_filename == f"study{sid}-{name}.csv"
            files[name] = open(dl.value.path(), encoding="utf-8").read()
        return files

    try:
        page.goto(f"{server.url}/admin/")
        page.wait_for_selector("input[type=password]", timeout=30000)
        page.fill("input[type=text]", "admin")
        page.fill("input[type=password]", ADMIN_PASSWORD)
        page.keyboard.press("Enter")
        page.wait_for_selector("#studies", timeout=30000)
        page.fill("#study-id input", str(sid))
        page.get_by_role("tab", name="Export").click()
        # interim (2 raters of the planned 26): the downloads hold counts and timing, no key
        sealed = download("sealed until")
        rows = list(csv.DictReader(io.StringIO(sealed["ratings"])))
        assert {int(r["trial"]) for r in rows} == set(given)
        assert all(r[k] == "" for r in rows for k in study.export.KEY_COLUMNS if k in r)
        assert all(r["key"].startswith("sealed until") for r in rows)
        summ = list(csv.DictReader(io.StringIO(sealed["summary"])))
        assert [(r["scope"], r["status"], r["accuracy"]) for r in summ] == [("study", "interim", "")]
        study.unblind(db, sid, reason="test: the export against the answers", who="test")
        files = download("key opened early by test")
    finally:
        ctx.close()
    rows = list(csv.DictReader(io.StringIO(files["ratings"])))
    assert {int(r["trial"]): r["answer"] for r in rows} == given and len(rows) == len(given)
    assert files["ratings"] == study.ratings_csv(db, sid)
    for r in rows:  # the hidden mapping of what was shown
        h = hidden(db, int(r["trial"]))
        assert json.loads(r["positions"]) == h["shown"]
        assert json.loads(r["backend_per_side"]) == h["sources"]
    summary = list(csv.DictReader(io.StringIO(files["summary"])))
    assert summary[0]["scope"] == "study"
    assert files["summary"] == study.summary_csv(study.results(db, sid, reps=1000))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_cleanly_on_ctrl_c_and_sigterm(env, sig):
    """`evalkit serve` as a real process: Ctrl-C (SIGINT) or SIGTERM while a rater's keep-alive
    connection is open stops it with one line on stderr and exit code 0, no traceback."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evalkit",
            "serve",
            "--db",
            str(env["db"]),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-password",
            ADMIN_PASSWORD,
        ],
        cwd=ROOT,
        env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False"),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # as from a terminal: SIGINT not ignored, whatever the test runner's parent did
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    tok = study.invite(env["db"], env["sid"], 1)[0]["token"]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:  # keep-alive
            deadline = time.time() + 120
            while True:
                assert proc.poll() is None, proc.communicate()
                try:
                    if client.get("/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    assert time.time() < deadline, "server did not start"
                    time.sleep(0.3)
            assert client.get("/api/trial", params={"token": tok}).status_code == 200
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Traceback" not in err and "Error" not in err, err
    assert err.strip().splitlines() == [
        f"serve: stopped by {sig.name}; every acknowledged rating is stored"
    ], err
    assert out.startswith("rater page: http://127.0.0.1:")
    with pytest.raises(httpx.HTTPError):  # and the port is closed
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    import tempfile  # and it left no folder behind

    assert not list(Path(tempfile.gettempdir()).glob(f"evalkit-serve-*-{proc.pid}"))


def test_temp_folders_of_dead_servers_are_removed(tmp_path, monkeypatch):
    import tempfile

    from evalkit.app.server import temp_root

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    uid = os.getuid()
    stale = tmp_path / f"evalkit-serve-{uid}-{dead.pid}"
    (stale / "gradio").mkdir(parents=True)
    mine = tmp_path / f"evalkit-serve-{uid}-{os.getpid()}"
    assert temp_root() == mine and not stale.exists() and not mine.exists()


def test_serve_port_in_use_is_a_one_line_error(env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_evalkit(
            "serve", "--db", env["db"], "--port", port, env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False")
        )
    assert r.returncode == 2
    assert_one_line_error(r.stderr, "--port", f"127.0.0.1:{port}")


def test_admin_page_at_interim_shows_progress_not_empty_plots(env, server, browser):
    """Until the verdict the Results tab shows where the study stands (raters done of planned,
    trials answered, one row per rater under named columns) and no plot box or per-clip table;
    the figures come from study.study_progress, which holds counts only."""
    db = env["db"]
    sid = study.create_study(
        env["report"], db, protocol="abx", clips_spec="worst:3", seed=5, raters_planned=3, allow_masking=True
    )["study"]
    toks = [r["token"] for r in study.invite(db, sid, 3, "lab")]
    answer(db, toks[0], lambda t: hidden(db, t["trial"])["expected"] or "A")  # one done
    answer(db, toks[1], lambda t: "A", 2)  # two answers
    prog = study.study_progress(db, sid)
    per = {r["rater"]: r for r in prog["raters"]}
    assert [r["state"] for r in prog["raters"]] == ["complete", "rating", "not started"]
    first, second, _third = (per[k] for k in sorted(per))
    assert first["answered"] == first["trials"] and first["done"] == 100
    assert second["answered"] == 2 and 0 < second["done"] < 100
    assert prog["trials_answered"] == first["trials"] + 2
    assert prog["text"].startswith(
        "1 of 3 planned raters done (0 excluded by catch trials; 2 "
        "more needed for the verdict); 3 invited, 2 started; "
        f"{first['trials'] + 2} of {prog['trials_assigned']} assigned"
    )
    # counts only: nothing of the key or of a clip's figures
    assert not {"accuracy", "correct", "answer", "per_clip"} & {k for r in prog["raters"] for k in r}
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    try:
        page.goto(f"{server.url}/admin/")
        page.wait_for_selector("input[type=password]", timeout=30000)
        text = admin_results(page, sid, ADMIN_PASSWORD, pattern="INTERIM")
        assert "interim: 1 of 3 planned included raters" in text
        page.wait_for_function(
            "document.querySelector('#progress') && document.querySelector("
            "'#progress').innerText.includes('planned raters done')",
            timeout=30000,
        )
        assert prog["text"] in page.inner_text("#progress")
        page.wait_for_selector("#rater-progress table", timeout=30000)
        table = page.inner_text("#rater-progress")
        for col in ("rater", "label", "answered", "trials", "done", "state"):
            assert col in table
        assert "not started" in table and "complete" in table
        for hidden_id in ("#curve", "#clip-plot", "#lpips-plot", "#per-clip", "#excluded"):
            loc = page.locator(hidden_id)
            assert loc.count() == 0 or not loc.first.is_visible(), hidden_id
        page.screenshot(path=str(ARTIFACTS / "admin-interim-1280x900.png"), full_page=True)
        # a pilot look only through the logged unblinding: none before it, labelled after it
        assert "PILOT" not in text and "pilot:" not in text
        study.unblind(db, sid, reason="test: pilot look", who="owner")
        page.click("#show-results")
        page.wait_for_function(
            "/PILOT on 1 included raters of 3 planned, not a verdict/.test("
            "document.querySelector('#verdict').innerText)",
            timeout=60000,
        )
        text = page.inner_text("#verdict")
        assert "UNBLINDED: key opened early by owner" in text and "pilot: " in text
        assert prog["text"] in page.inner_text("#progress")  # progress unchanged by a look
    finally:
        ctx.close()
