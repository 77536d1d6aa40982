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
from evalkit.testing.page import ENABLED, answer, in_viewport, inside, layout, open_page
from evalkit.testing.server import ADMIN_PASSWORD, ARTIFACTS, COMPLETION_CODE, Server
from evalkit.testing.studies import current, hidden, leaked, progress, secrets_of

pytestmark = pytest.mark.slow  # the real server and Chromium

FPS = 12  # the studies here run at 12 fps (the page must not assume 24)
FRAME = 1 / FPS
VIEWPORTS = {
    "desktop": dict(viewport={"width": 1280, "height": 800}),
    "phone": dict(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, device_scale_factor=2
    ),
}


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("app")
    report = reports(fps=FPS)
    db = root / "s.db"
    sids = {
        p: study.create_study(report, db, protocol=p, clips_spec="worst:3", seed=5, allow_masking=True)[
            "study"
        ]
        for p in ("preference", "abx")
    }
    secret = secrets_of(db, report)
    server = Server(db).start()
    yield {"db": db, "sids": sids, "server": server, "secret": secret}
    server.stop()


def key(db, sid):
    with store.open_db(db).engine.connect() as conn:
        return conn.execute(select(store.studies.c.config).where(store.studies.c.id == sid)).scalar_one()[
            "media_key"
        ]


def export(server, sid, which="ratings"):
    r = httpx.get(f"{server.url}/export/{sid}/{which}.csv", auth=("admin", ADMIN_PASSWORD))
    assert r.status_code == 200, r.text
    return list(csv.DictReader(io.StringIO(r.text)))


def rate(page, server, token, *, reload_after=None, how=("click", "key"), seen=None, each=None):
    """Answer every trial through the page; returns {trial id: (answer, public trial)}.
    ``how``: the ways of answering, taken in turn; ``each(page, trial)`` runs at every trial
    once its answers are enabled."""
    clicks = {}
    state = open_page(page, server.url, token)
    n = 0
    while state["trial"] is not None:
        t = state["trial"]
        assert t["index"] == state["progress"]["done"] + 1  # the next unanswered trial
        page.wait_for_function(ENABLED, timeout=30000)
        assert page.get_attribute("body", "data-trial-index") == str(t["index"])
        if each is not None:
            each(page, t)
        if seen is not None:
            seen.append(page.content())
        a = t["answers"][(t["index"] + t["trial"]) % len(t["answers"])]
        new = answer(page, a, how[n % len(how)])
        assert "error" not in new and new["progress"]["done"] == t["index"], new
        clicks[t["trial"]] = (a, t)
        n += 1
        state = new
        if reload_after == n and state["trial"] is not None:
            again = open_page(page, server.url, token, reload=True)
            assert again["trial"]["trial"] == state["trial"]["trial"]  # continues, nothing lost
            assert again["progress"]["done"] == n
            state = again
    page.wait_for_selector("#done:not([hidden])")
    return clicks


def check_csv(env, sid, clicks):
    sealed = [r for r in export(env["server"], sid) if int(r["trial"]) in clicks]
    if sealed[0]["key"].startswith("sealed"):  # interim: no key through /export
        assert all(r[k] == "" for r in sealed for k in study.export.KEY_COLUMNS if k in r), sealed
        study.unblind(env["db"], sid, reason="test: the export against the answers", who="test")
    rows = [r for r in export(env["server"], sid) if int(r["trial"]) in clicks]
    assert all(r["key"].startswith("key opened early by test") for r in rows)
    assert len(rows) == len(clicks) and len({r["rater"] for r in rows}) == 1
    for r in rows:
        tid = int(r["trial"])
        answer, public = clicks[tid]
        h = hidden(env["db"], tid)
        assert r["answer"] == answer
        assert json.loads(r["positions"]) == h["shown"]
        # one stream per trial, under one opaque name; the page is told each box's tile
        assert public["media"] == {"video": media_name(key(env["db"], sid), tid, "video")}
        assert public["tiles"] == h["shown"]["tiles"]
        assert json.loads(r["backend_per_side"]) == h["sources"]
        if h["expected"]:
            assert r["correct"] == str(int(answer == h["expected"]))
        assert int(r["response_ms"]) > 0


def check_layout(page, view, trial):
    """The whole trial on one screen: at 1280x800 every box and answer button lies inside the
    viewport; on a phone the answers and controls do and nothing runs off the sides; the page
    never scrolls sideways, and a touch screen gets no keyboard hints."""
    g = layout(page, [".ek-stage canvas", "#answers button", "#controls button", ".ek-head"])
    vw, vh, sw, sh = g["vw"], g["vh"], g["sw"], g["sh"]
    assert sw <= vw, (sw, vw)
    videos = g["boxes"][".ek-stage canvas"]
    assert sorted(b["slot"] for b in videos) == sorted(trial["tiles"])
    assert all(b["w"] >= 100 and b["h"] >= 60 for b in videos), videos  # big enough to judge
    assert inside(g["boxes"]["#answers button"], vw, vh), g
    assert inside(g["boxes"]["#controls button"], vw, vh), g
    assert inside(g["boxes"][".ek-head"], vw, vh), g
    if view == "desktop":
        assert sh <= vh, (sh, vh)
        assert inside(videos, vw, vh), videos
    else:
        assert all(b["x"] >= 0 and b["x"] + b["w"] <= vw + 0.5 for b in videos), videos
    if page.is_hidden("#instructions"):  # open on a new rater's first trial
        page.click("#btn-help")
    assert page.is_visible("#instructions") and in_viewport(page, "#instructions")
    assert page.is_visible(".keys") == (view == "desktop")
    page.click("#btn-close-help")
    assert page.is_hidden("#instructions")


# each protocol and each view once (pairwise): ABX's three boxes on the phone, where space is
# short; preference's two on the desktop (about 13 s a case)
@pytest.mark.parametrize("protocol,view", [("preference", "desktop"), ("abx", "phone")])
def test_rater_completes_study_blind_reload_and_csv(env, browser, protocol, view):
    """A whole study through the Gradio page at 1280x800 (clicks and keys) and on a 390x844
    phone (taps), with a reload halfway; the export matches the answers given; nothing the
    browser got names a backend, run or job. Screenshots of a trial and of the end are kept."""
    server, sid = env["server"], env["sids"][protocol]
    token = study.invite(env["db"], sid, 1)[0]["token"]
    ctx = browser.new_context(**VIEWPORTS[view])
    page = ctx.new_page()
    urls, dom = [], []
    page.on("request", lambda r: urls.append(r.url))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"rater-{protocol}-{view}"

    def each(page, t):
        check_layout(page, view, t)
        if t["index"] == 1:
            page.screenshot(path=f"{shot}-trial.png")

    try:
        clicks = rate(
            page,
            server,
            token,
            reload_after=2,
            seen=dom,
            each=each,
            how=("tap",) if view == "phone" else ("click", "key"),
        )
        assert page.inner_text("#code") == COMPLETION_CODE
        page.screenshot(path=f"{shot}-done.png")
        dom.append(page.content())
    finally:
        ctx.close()
    total = progress(env["db"], token)["total"]
    assert len(clicks) == total and current(env["db"], token) is None
    check_csv(env, sid, clicks)
    # blindness: DOM at every trial, every request URL, every reply the page got
    media = [u for u in urls if "/media/" in u]
    assert media and all(re.search(r"/media/[0-9a-f]{40}\.mp4\?token=", u) for u in media)
    texts = [httpx.get(f"{server.url}/?token={token}").text]
    texts += [json.dumps(m["media"]) for _, m in clicks.values()]
    # random media names and the token masked: hex and base64 hold "bf16" by chance
    found = leaked([*dom, *urls, *texts], env["secret"], token)
    assert found is None, found
    # the boxes shown are the server-side assignment's, each its own tile of the one stream
    for tid, (_, m) in clicks.items():
        assert set(m["tiles"]) == ({"left", "right"} if protocol == "preference" else {"X", "A", "B"})
        assert len({tuple(r) for r in m["tiles"].values()}) == len(m["tiles"])


SWAPS = {"preference": {"f": ("left", "right")}, "abx": {"f": ("X", "A"), "g": ("X", "B"), "h": ("A", "B")}}


@pytest.mark.parametrize("protocol", ["preference", "abx"])
def test_players_play_in_sync_flicker_and_zoom(env, browser, protocol):
    """Every box of a trial shows its tile of the same decoded frame (one stream: the same
    stream time in every box, exactly) while playing, after pause, frame steps (buttons and keys)
    and play; each swap (X with A, X with B, A with B; left with right) exchanges two boxes in
    place and back; zoom magnifies every box alike, in place."""
    server = env["server"]
    token = study.invite(env["db"], env["sids"][protocol], 1)[0]["token"]
    n = 3 if protocol == "abx" else 2
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    try:
        open_page(page, server.url, token)
        # not before one play-through (read as the first trial is rendered: its 8 frames at
        # 12 fps play through in 0.67 s)
        assert page.is_disabled("#answers button")
        page.click("#btn-close-help")
        page.wait_for_function(
            f"window.evalkitPlayers().length === {n} && "
            "window.evalkitPlayers().every(p => p.ready === 4 && p.t >= 0)",
            timeout=30000,
        )
        players = lambda: page.evaluate("window.evalkitPlayers()")  # noqa: E731
        assert all(p["fps"] == FPS for p in players())  # the study's, from the server
        assert all(p["streams"] == 1 for p in players())  # one stream per trial

        def spread(ps):
            d = ps[0]["duration"]
            return max(min(abs(a["t"] - b["t"]) % d, d - abs(a["t"] - b["t"]) % d) for a in ps for b in ps)

        t0 = players()[0]["t"]
        page.wait_for_timeout(150)
        samples = []
        for _ in range(5):
            samples.append(players())
            page.wait_for_timeout(70)
        assert any(abs(s[0]["t"] - t0) > 1e-3 for s in samples)  # time advances
        assert all(not p["paused"] for s in samples for p in s)
        assert max(spread(s) for s in samples) == 0, samples  # playing: one frame
        page.wait_for_function(ENABLED, timeout=30000)
        page.keyboard.press(" ")  # pause
        page.wait_for_timeout(200)
        ps = players()
        last = round(ps[0]["duration"] / FRAME) - 1

        def frames(ps):  # the frame each player shows
            return [min(last, int(p["t"] / FRAME + 1e-3)) for p in ps]

        assert all(p["paused"] for p in ps) and len(set(frames(ps))) == 1, ps

        def press(key, n=1):
            for _ in range(n):
                page.keyboard.press(key)
                page.wait_for_timeout(30)
            page.wait_for_timeout(250)
            return players()

        ps = press(",", last + 3)  # step back past the start: frame 0
        assert frames(ps) == [0] * n and all(p["paused"] for p in ps), ps
        page.click("#btn-fwd")
        ps = press(".")  # button and key: two frames on, together
        assert frames(ps) == [2] * n and all(abs(p["t"] - (2 * FRAME + 1e-3)) < 1e-4 for p in ps), ps
        ps = press(",")
        assert frames(ps) == [1] * n, ps
        page.click("#btn-back")
        page.wait_for_timeout(250)
        assert frames(players()) == [0] * n
        ps = press(".", last + 3)  # step past the end: stays on the last frame
        assert frames(ps) == [last] * n and all(p["paused"] for p in ps), ps
        page.click("#btn-play")  # play again
        page.wait_for_timeout(300)
        assert not any(p["paused"] for p in players())
        ps = players()
        assert spread(ps) == 0, ps  # play again: one frame
        # each swap exchanges two videos in place (by key, then back by its button)
        box = lambda s: page.locator(f"canvas[data-slot='{s}']").bounding_box()  # noqa: E731
        home = {s: box(s) for pair in SWAPS[protocol].values() for s in pair}
        for k, (a, b) in SWAPS[protocol].items():
            page.keyboard.press(k)
            assert (box(a), box(b)) == (home[b], home[a]), (k, a, b)
            assert page.get_attribute(f"#swaps button[data-swap='{a}-{b}']", "aria-pressed") == "true"
            assert {s: box(s) for s in home if s not in (a, b)} == {
                s: home[s] for s in home if s not in (a, b)
            }
            page.click(f"#swaps button[data-swap='{a}-{b}']")
            assert {s: box(s) for s in home} == home
        page.keyboard.press("f")  # swapped, still in sync
        page.wait_for_timeout(200)
        assert spread(players()) == 0
        page.keyboard.press("f")
        # zoom: the magnifier, 2x then 4x then off, every box alike and in place (its pixels:
        # tests/test_player_inspect.py)
        before = {s: box(s) for s in home}
        for z in (2, 4, 1):
            page.keyboard.press("z")
            assert [p["zoom"] for p in players()] == [z] * n
            assert len({json.dumps(p["view"]) for p in players()}) == 1
            assert {s: box(s) for s in home} == before
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"rater-{protocol}-controls.png"))
    finally:
        ctx.close()
