"""The blind A/B web app, end to end: the real `evalkit serve` on loopback, Debian's Chromium
driven by Playwright, real study databases and media (no mocks)."""
from __future__ import annotations

import csv
import io
import json
import re

import httpx
import pytest
from sqlalchemy import select

from evalkit import study
from evalkit.study import store
from evalkit.study.live import media_name

from evalkit.testing.server import ADMIN_PASSWORD, ARTIFACTS, COMPLETION_CODE, Server
from evalkit.testing.studies import current, hidden, make_report, progress, secrets_of

FPS = 12                      # the studies here run at 12 fps (the page must not assume 24)
FRAME = 1 / FPS
KEYS = {"left": "1", "right": "2", "same": "3", "A": "a", "B": "b"}
ENABLED = ("document.body.dataset.finished === '1' || (document.querySelector('#answers button')"
           " && !document.querySelector('#answers button').disabled)")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("app")
    report = make_report(root, fps=FPS)
    db = root / "s.db"
    sids = {p: study.create_study(report, db, protocol=p, clips_spec="worst:3", seed=5)["study"]
            for p in ("preference", "abx")}
    secret = secrets_of(db, report)
    server = Server(db).start()
    yield {"db": db, "sids": sids, "server": server, "secret": secret}
    server.stop()


def key(db, sid):
    with store.open_db(db).engine.connect() as conn:
        return conn.execute(select(store.studies.c.config).where(store.studies.c.id == sid)
                            ).scalar_one()["media_key"]


def export(server, sid, which="ratings"):
    r = httpx.get(f"{server.url}/export/{sid}/{which}.csv", auth=("admin", ADMIN_PASSWORD))
    assert r.status_code == 200, r.text
    return list(csv.DictReader(io.StringIO(r.text)))


def rate(page, server, token, *, reload_after=None, keys_every=2, seen=None):
    """Answer every trial through the page; returns {trial id: (answer, media shown)}."""
    clicks = {}
    with page.expect_response(re.compile(r"/api/trial\?")) as resp:
        page.goto(f"{server.url}/?token={token}")
    state = resp.value.json()
    n = 0
    while state["trial"] is not None:
        t = state["trial"]
        assert t["index"] == state["progress"]["done"] + 1      # the next unanswered trial
        page.wait_for_function(ENABLED, timeout=30000)
        if seen is not None:
            seen.append(page.content())
        a = t["answers"][(t["index"] + t["trial"]) % len(t["answers"])]
        with page.expect_response(re.compile(r"/api/answer$")) as resp:
            if n % keys_every:
                page.keyboard.press(KEYS[a])
            else:
                page.click(f"#answers button[data-answer='{a}']")
        new = resp.value.json()
        assert resp.value.status == 200 and new["saved"] is True, new
        clicks[t["trial"]] = (a, t["media"])
        n += 1
        state = new
        if reload_after == n and state["trial"] is not None:
            with page.expect_response(re.compile(r"/api/trial\?")) as resp:
                page.reload()
            again = resp.value.json()
            assert again["trial"]["trial"] == state["trial"]["trial"]     # continues, nothing lost
            assert again["progress"]["done"] == n
            state = again
    page.wait_for_selector("#done:not([hidden])")
    return clicks


def check_csv(env, sid, clicks):
    rows = export(env["server"], sid)
    assert len(rows) == len(clicks)
    for r in rows:
        tid = int(r["trial"])
        answer, media = clicks[tid]
        h = hidden(env["db"], tid)
        assert r["answer"] == answer
        assert json.loads(r["positions"]) == h["shown"]
        assert media == {k: media_name(key(env["db"], sid), tid, k) for k in h["shown"]}
        assert json.loads(r["backend_per_side"]) == h["sources"]
        if h["expected"]:
            assert r["correct"] == str(int(answer == h["expected"]))
        assert int(r["response_ms"]) > 0


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_rater_completes_study_blind_reload_and_csv(env, browser, protocol):
    server, sid = env["server"], env["sids"][protocol]
    token = study.invite(env["db"], sid, 1)[0]["token"]
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    urls, dom = [], []
    page.on("request", lambda r: urls.append(r.url))
    try:
        clicks = rate(page, server, token, reload_after=2, seen=dom)
        assert page.inner_text("#code") == COMPLETION_CODE
        dom.append(page.content())
    finally:
        ctx.close()
    total = progress(env["db"], token)["total"]
    assert len(clicks) == total and current(env["db"], token) is None
    check_csv(env, sid, clicks)
    # blindness: DOM at every trial, every request URL, every served text file and API answer
    media = [u for u in urls if "/media/" in u]
    assert media and all(re.search(r"/media/[0-9a-f]{40}\.mp4\?token=", u) for u in media)
    texts = [httpx.get(server.url + p).text for p in ("/static/rater.js", "/static/rater.css")]
    texts.append(httpx.get(f"{server.url}/?token={token}").text)
    texts.append(httpx.get(f"{server.url}/api/trial?token={token}").text)
    texts += [json.dumps(m) for _, m in clicks.values()]
    # random media names and the token masked: hex and base64 hold "bf16" by chance
    haystack = re.sub(r"[0-9a-f]{40}\.mp4", "NAME.mp4", "\n".join([*dom, *urls, *texts]))
    haystack = haystack.replace(token, "TOKEN")
    for s in env["secret"]:
        assert s not in haystack, s
    # the positions shown are the server-side assignment's
    for tid, (_, m) in clicks.items():
        assert set(m) == ({"left", "right"} if protocol == "preference" else {"X", "A", "B"})


def test_players_play_in_sync_flicker_and_zoom(env, browser):
    server = env["server"]
    token = study.invite(env["db"], env["sids"]["preference"], 1)[0]["token"]
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    try:
        page.goto(f"{server.url}/?token={token}")
        page.wait_for_selector("#answers button")
        assert page.is_disabled("#answers button")          # not before one play-through
        page.wait_for_function("window.evalkitPlayers().length === 2 && "
                               "window.evalkitPlayers().every(p => p.ready === 4)", timeout=30000)
        players = lambda: page.evaluate("window.evalkitPlayers()")  # noqa: E731
        assert all(p["fps"] == FPS for p in players())              # the study's, from the server

        def spread(ps):
            d = ps[0]["duration"]
            x = abs(ps[0]["t"] - ps[1]["t"]) % d
            return min(x, d - x)
        t0 = players()[0]["t"]
        page.wait_for_timeout(150)
        samples = []
        for _ in range(5):
            samples.append(players())
            page.wait_for_timeout(70)
        assert any(abs(s[0]["t"] - t0) > 1e-3 for s in samples)          # time advances
        assert all(not p["paused"] for s in samples for p in s)
        assert max(spread(s) for s in samples) <= FRAME, samples          # playing: in sync
        page.wait_for_function(ENABLED, timeout=30000)
        page.keyboard.press(" ")                                         # pause
        page.wait_for_timeout(200)
        ps = players()
        last = round(ps[0]["duration"] / FRAME) - 1

        def frames(ps):                    # the frame each player shows
            return [min(last, int(p["t"] / FRAME + 1e-3)) for p in ps]
        assert all(p["paused"] for p in ps) and len(set(frames(ps))) == 1, ps

        def press(key, n=1):
            for _ in range(n):
                page.keyboard.press(key)
                page.wait_for_timeout(30)
            page.wait_for_timeout(250)
            return players()
        ps = press(",", last + 3)                   # step back past the start: frame 0
        assert frames(ps) == [0, 0] and all(p["paused"] for p in ps), ps
        page.click("#btn-fwd")
        ps = press(".")                             # button and key: two frames on, together
        assert frames(ps) == [2, 2] and all(abs(p["t"] - (2 * FRAME + 1e-3)) < 1e-4 for p in ps), ps
        ps = press(",")
        assert frames(ps) == [1, 1], ps
        ps = press(".", last + 3)                   # step past the end: stays on the last frame
        assert frames(ps) == [last, last] and all(p["paused"] for p in ps), ps
        page.click("#btn-play")                                           # play again
        page.wait_for_timeout(300)
        assert not any(p["paused"] for p in players())
        # flicker swaps the two videos in place
        box = lambda s: page.locator(f"video[data-slot='{s}']").bounding_box()["x"]  # noqa: E731
        l0, r0 = box("left"), box("right")
        assert l0 < r0
        page.keyboard.press("f")
        assert (box("left"), box("right")) == (r0, l0)
        page.click("#btn-flicker")
        assert (box("left"), box("right")) == (l0, r0)
        # zoom: full size (natural width)
        page.keyboard.press("z")
        w = page.evaluate("(() => { const v = document.querySelector('video');"
                          " return [v.getBoundingClientRect().width, v.videoWidth]; })()")
        assert abs(w[0] - w[1]) < 1, w
        page.keyboard.press("z")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "rater-1280x800.png"))
    finally:
        ctx.close()
