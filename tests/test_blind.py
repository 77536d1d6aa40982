"""Blindness as a security property, tested as an attacker would.

Everything a rater's browser receives in whole ABX, preference and threshold studies is collected: through
Debian's Chromium on the real `evalkit serve` (DOM at every trial, every URL, every response's
headers and bytes), and through the rater service the server uses (the same names and files a
scripted rater downloads). A trial is one stream whose tiles are its videos: no file, size or
byte belongs to one side. Here: names, headers and structure (nothing names a backend, run or
job; every file of a study has the same structure; no coded picture recurs across a rater's
trials). The statistics (every feature read from the files, as a predictor of the answer, the
backend or a catch trial, on held-out clips) are in tests/test_blind_attacker.py.

The boundary of the claim: inside the H.264 slices is the coded picture; decoding it compares
the videos, which is the raters' task.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections import Counter
from pathlib import Path

import av
import httpx
import pytest

from evalkit import study
from evalkit.study import design
from evalkit.testing.page import ENABLED, answer, open_page
from evalkit.testing.server import Server
from evalkit.testing.studies import hidden, leaked, secrets_of

pytestmark = pytest.mark.slow  # the real server and Chromium

VARYING_HEADERS = {"date"}  # the same for any two responses sent in the same second


@pytest.fixture(scope="module")
def env(tmp_path_factory, reports):
    root = tmp_path_factory.mktemp("blind")
    # 16 clips of 8 frames at 24 fps: the page waits a third of a second per trial (nothing
    # here depends on the frame rate; test_app runs the page at 12 fps, test_app_more at 8)
    report = reports(seeds=tuple(range(8)))
    db = root / "s.db"
    sids = {
        p: study.create_study(report, db, protocol=p, seed=11, allow_masking=True)["study"]
        for p in ("abx", "preference")
    }
    # the threshold protocol: ABX over amplified differences (4 clips x 3 levels)
    sids["threshold"] = study.create_study(
        report,
        db,
        protocol="threshold",
        seed=11,
        clips_spec="worst:4",
        levels="1,4,16",
        raters_planned=4,
        allow_masking=True,
    )["study"]
    # small studies: fewer clips than a rater's 8 easy catch trials (several catch versions
    # per clip, each with its own reference picture)
    for p in ("abx", "preference"):
        sids[f"{p}-small"] = study.create_study(
            report, db, protocol=p, seed=12, clips_spec="worst:3", raters_planned=4, allow_masking=True
        )["study"]
    secret = secrets_of(db, report)
    return {"db": db, "sids": sids, "secret": secret, "root": root}


@pytest.fixture(scope="module")
def server(env):
    """One real `evalkit serve` on the module's database for the browser tests (each test's
    rater has a token of their own; nothing a test checks depends on a fresh process)."""
    server = Server(env["db"]).start()
    yield server
    server.stop()


def recurring_pictures(trials) -> dict:
    """(rater, coded picture) -> the trials that show it, for pictures shown in several."""
    by_rater: dict = {}
    for t in trials:
        for b in t["bytes"].values():
            by_rater.setdefault((t["token"], hashlib.sha256(coded(b)).hexdigest()), set()).add(
                t["public"]["trial"]
            )
    return {k: v for k, v in by_rater.items() if len(v) > 1}


@pytest.mark.parametrize("protocol", ["abx", "preference"])
def test_a_small_study_never_shows_a_rater_the_same_catch_picture_twice(env, protocol):
    """3 clips, 5 easy catch trials per rater (the fewest the screening takes: over the catch
    share's bound, design.catch_counts): each clip needs several catch versions, and no two may
    share a reference picture (the side that recurs would be the reference)."""
    trials = collect(env["db"], env["sids"][f"{protocol}-small"], raters=4)
    catches = [t for t in trials if t["kind"] == "catch"]
    assert design.catch_counts(3) == (5, 0)
    assert len(catches) == 4 * 5
    assert not recurring_pictures(trials)


def coded(data: bytes) -> bytes:
    """The coded picture data of a file: every slice, without its padding."""
    from evalkit.study.media import avcc_nal_units

    out = []
    with av.open(io.BytesIO(data)) as c:
        for p in c.demux(video=0):
            for n in avcc_nal_units(bytes(p)) if p.size else []:
                if n[0] & 0x1F in (1, 5):
                    while n.endswith(b"\x00\x00\x03"):
                        n = n[:-3]
                    out.append(n)
    return b"".join(out)


def collect(db, sid, raters: int) -> list[dict]:
    """Every trial of ``raters`` new raters, as a scripted rater sees it: the public trial and
    the bytes behind each of its media names (through the service the server uses)."""
    out = []
    clock = study.FakeClock()
    with study.RaterService(db, clock=clock) as svc:
        for tok in (r["token"] for r in study.invite(db, sid, raters)):
            s = svc.state_sync(tok)
            while s["trial"] is not None:
                t = s["trial"]
                files = {slot: svc.media_sync(tok, name).read_bytes() for slot, name in t["media"].items()}
                out.append(
                    {
                        "token": tok,
                        "public": t,
                        "bytes": files,
                        **{
                            k: v
                            for k, v in hidden(db, t["trial"]).items()
                            if k in ("kind", "sources", "expected", "shown")
                        },
                    }
                )
                clock.advance(10)
                s = svc.answer_sync(tok, t["trial"], t["answers"][0])
    return out


#: test trials of 4 raters: every rater rates each of 16 clips (threshold: 4 clips x 3 levels)
TEST_TRIALS = {"abx": 64, "preference": 64, "threshold": 48}


@pytest.mark.parametrize("protocol", ["abx", "preference", "threshold"])
def test_what_a_scripted_rater_downloads_names_nothing_and_has_one_structure(env, protocol):
    trials = collect(env["db"], env["sids"][protocol], raters=4)
    tests = [t for t in trials if t["kind"] == "test"]
    assert len(tests) == TEST_TRIALS[protocol]
    # the page is told ABX for a threshold study: nothing says which level a trial shows
    assert {t["public"]["protocol"] for t in trials} == {"preference" if protocol == "preference" else "abx"}
    names = [n for t in trials for n in t["public"]["media"].values()]
    # names: unique to every trial of every rater; carry no content hash
    assert len(names) == len(set(names))
    shas = {t["shown"]["media"] for t in trials}
    assert not any(s[:40] in n for s in shas for n in names)
    # catch trials never reuse a test trial's file (they would tell which side is which)
    test_files = {hashlib.sha256(b).hexdigest() for t in tests for b in t["bytes"].values()}
    catch_files = {
        hashlib.sha256(b).hexdigest() for t in trials if t["kind"] == "catch" for b in t["bytes"].values()
    }
    assert not test_files & catch_files
    # within a rater no coded picture recurs across trials (a threshold study shows each clip
    # at several levels: its reference A, and X when X is A, would otherwise be the same coded
    # frames in each of them, and comparing files across trials would tell which X is A)
    assert not recurring_pictures(trials)
    # one stream per trial; each box its own tile of it, placed at random per trial
    for t in trials:
        assert list(t["public"]["media"]) == ["video"] and len(t["bytes"]) == 1
        tiles = t["public"]["tiles"]
        assert tiles == t["shown"]["tiles"] and set(tiles) == set(t["sources"])
        assert len({tuple(r) for r in tiles.values()}) == len(tiles)
    # the structure of every file is the same function of the tile size and frame count: the
    # MP4 sample count and key frames, the NAL unit types of every sample, the SPS/PPS
    shapes = Counter(structure(b) for t in trials for b in t["bytes"].values())
    assert len(shapes) == 1, shapes


def structure(data: bytes) -> tuple:
    """What a file's layout says beyond sizes: key frames, NAL unit types per sample, avcC."""
    from evalkit.study.media import avcc_nal_units

    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        avcc = bytes(s.codec_context.extradata or b"")
        pk = [p for p in c.demux(s) if p.size]
        return (
            avcc,
            tuple(bool(p.is_keyframe) for p in pk),
            tuple(tuple(n[0] & 0x1F for n in avcc_nal_units(bytes(p))) for p in pk),
        )


def _gradio_file(url: str) -> Path | None:
    """The installed Gradio file an /assets/ or /static/ URL serves, if there is one."""
    import gradio

    path = url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
    if not path.startswith(("assets/", "static/")):
        return None
    f = Path(gradio.__file__).parent / "templates" / "frontend" / path
    return f if f.is_file() else None


@pytest.mark.parametrize("protocol", ["abx", "preference"])
def test_browser_receives_nothing_that_names_or_separates_the_sides(env, server, browser, protocol):
    """A whole study through Chromium: every response (URL, status, headers, bytes) and the DOM
    at every trial. Nothing names a backend, run or job; each trial's one stream has a unique
    URL, and every media response has the same headers (lengths aside)."""
    db, sid = env["db"], env["sids"][protocol]
    token = study.invite(db, sid, 1)[0]["token"]
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    seen, dom = [], []

    def on_response(r):
        try:
            body = r.body()
        except Exception:  # noqa: BLE001 - a media response cut short by the next trial
            body = b""
        seen.append({"url": r.url, "status": r.status, "headers": dict(r.headers), "body": body})

    page.on("response", on_response)
    events = []  # Gradio's event streams (if an event is queued), read whole by a proxy

    def keep_stream(route):
        r = route.fetch()
        body = r.body()
        events.append(body)
        route.fulfill(response=r, body=body)

    page.route(re.compile(r"/gradio_api/queue/data"), keep_stream)
    try:
        state = open_page(page, server.url, token)
        trials = []
        while state["trial"] is not None:
            t = state["trial"]
            page.wait_for_function(ENABLED, timeout=30000)
            dom.append(page.content())
            trials.append(t)
            state = answer(page, t["answers"][0])
            assert "error" not in state, state
        page.wait_for_selector("#done:not([hidden])")
        dom.append(page.content())
    finally:
        ctx.close()
    # the replies of the Gradio events (the trials) are among what was collected: one POST per
    # event (/gradio_api/run/...), or their event streams if they are queued
    replies = [s["body"] for s in seen if "/gradio_api/run/" in s["url"]]
    events = b"".join([*events, *replies])
    assert len(replies) + events.count(b"process_completed") >= len(trials) + 1, events[:2000]
    for t in trials:
        assert all(n.encode() in events for n in t["media"].values())
    media = [s for s in seen if "/media/" in s["url"]]
    assert media and all(re.search(r"/media/[0-9a-f]{40}\.mp4\?token=", s["url"]) for s in media)
    # every text the browser got (video bytes aside: random coded data holds short strings like
    # "cpu" by chance; their structure is checked below and in the scripted test), with the
    # random media names and the token masked (hex and base64 hold "bf16" by chance too)
    # Gradio's own files (its JS bundle says "cpu-basic", HF hardware) are left out of the
    # search once shown to be byte for byte the installed package's: the same for any study
    packaged = [s for s in seen if _gradio_file(s["url"]) is not None]
    assert packaged and all(s["body"] == _gradio_file(s["url"]).read_bytes() for s in packaged)
    texts = [
        *dom,
        *(s["url"] for s in seen),
        *(json.dumps(s["headers"]) for s in seen),
        *(s["body"].decode("latin-1") for s in seen if "/media/" not in s["url"] and s not in packaged),
        events.decode("latin-1"),
    ]
    found = leaked(texts, env["secret"], token)
    assert found is None, found
    # every trial: one name, unique; every media response has the same headers but its length
    by_name = {}
    for s in media:
        name = s["url"].split("/media/")[1].split("?")[0]
        by_name.setdefault(name, []).append(s)
    all_names = [n for t in trials for n in t["media"].values()]
    assert len(all_names) == len(set(all_names))
    heads = []
    for t in trials:
        for slot, name in t["media"].items():
            assert name in by_name, (slot, name)
            r = by_name[name][0]
            h = {k: v for k, v in r["headers"].items() if k not in VARYING_HEADERS}
            assert "last-modified" not in h and "etag" not in h
            # a partial response names the full length in content-range
            total = h.get("content-range", "/" + h.get("content-length", "")).rsplit("/", 1)[1]
            heads.append(
                (
                    r["status"],
                    total,
                    tuple(
                        sorted((k, v) for k, v in h.items() if k not in ("content-range", "content-length"))
                    ),
                )
            )
    assert len({(status, tuple(h)) for status, _, h in heads}) == 1, heads
    # media cannot be had by anyone else, nor before a trial is handed out
    other = study.invite(db, sid, 1)[0]["token"]
    name = trials[0]["media"][next(iter(trials[0]["media"]))]
    assert httpx.get(f"{server.url}/media/{name}", params={"token": other}).status_code == 404
    assert httpx.get(f"{server.url}/media/{name}").status_code == 404
    nxt = httpx.get(f"{server.url}/api/trial", params={"token": other}).json()["trial"]
    assert (
        httpx.get(
            f"{server.url}/media/{nxt['media'][next(iter(nxt['media']))]}", params={"token": other}
        ).status_code
        == 200
    )
    assert Path(env["root"]).exists()


def test_the_leak_search_masks_random_ids_not_names():
    """A short secret inside a random hex identifier (a uuid, a media name) is chance; beside
    other text, in a label or a path, it is a leak, and the token is masked whatever it holds."""
    ids = ["event 3f2a9c1bbf16e0d4a7c2 done", "/media/" + "0" * 20 + "bf16" + "0" * 16 + ".mp4"]
    assert leaked(ids, {"bf16", "cpu"}, "tok") is None
    assert leaked(["run cpu_dtype-bf16 shown"], {"bf16"}, "tok").startswith("'bf16' in")
    assert "pan-a-s0-c89a3fad" in leaked(["job pan-a-s0-c89a3fad"], {"pan-a-s0-c89a3fad"}, "t")
    assert leaked(["?token=xbf16y"], {"bf16"}, "xbf16y") is None
