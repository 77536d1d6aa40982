"""Lossless delivery (``study create --delivery lossless``) end to end: the real `evalkit serve`,
Debian's Chromium driven by Playwright, a real study database and its animated lossless WebP
trial files (no mocks). The rater page's painted canvases are read back, every box and every
frame, and must equal the lossless renders exactly."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from evalkit import study
from evalkit.study import lossless
from evalkit.testing.page import ENABLED, answer, open_page
from evalkit.testing.server import Server
from evalkit.testing.studies import import_report, moving_texture

pytestmark = pytest.mark.slow  # the real server and Chromium

FPS = 12
T, H, W = 6, 64, 64
# every canvas of the page as base64 RGBA, in the page's box order
CANVASES = (
    "() => Array.from(document.querySelectorAll('.ek-stage canvas')).map(c => {"
    " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
    " let s = ''; for (let i = 0; i < d.length; i += 8192)"
    "   s += String.fromCharCode.apply(null, d.subarray(i, i + 8192));"
    " return {slot: c.dataset.slot, w: c.width, h: c.height, rgba: btoa(s)}; })"
)


def _pair(seed: int):
    """A colour texture panning, and the same +-1 code value (a change no 8-bit 4:2:0 stream
    keeps: the stream delivery would refuse it as masked)."""
    a = moving_texture(T, H, W, seed=seed, grey=False).astype(np.int16)
    a[..., 1] = (a[..., 1] * 3 + 40) % 256  # colour: channels differ
    a[..., 2] = 255 - a[..., 2]
    rng = np.random.default_rng([seed, 7])
    b = np.clip(a + rng.integers(-1, 2, a.shape), 0, 255)
    return a.astype(np.uint8), b.astype(np.uint8)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless")
    pairs = {f"prompt {s}": _pair(s) for s in range(2)}
    report, jobs = import_report(root / "pair", pairs, FPS)
    db = root / "s.db"
    made = study.create_study(report, db, protocol="abx", seed=3, raters_planned=4, delivery="lossless")
    server = Server(db).start()
    yield {
        "db": db,
        "made": made,
        "server": server,
        "report": report,
        "renders": [f for p in pairs.values() for f in p],
    }
    server.stop()


def test_create_records_lossless_delivery(env):
    made = env["made"]
    assert made["delivery_mode"] == "lossless"
    assert made["seen"] == "lossless: the rendered pixels"
    assert made["delivery"]["exact"] and made["delivery"]["masked"] == 0
    files = sorted(p for p in __import__("pathlib").Path(made["media"]).iterdir())
    assert files and all(p.suffix == ".webp" for p in files)
    for p in files[:3]:  # every frame whole-canvas, the clip's count
        assert len(lossless.anmf_sizes(p.read_bytes())) == T


def _painted(page) -> dict:
    out = {}
    for c in page.evaluate(CANVASES):
        rgba = np.frombuffer(base64.b64decode(c["rgba"]), np.uint8).reshape(c["h"], c["w"], 4)
        assert (rgba[..., 3] == 255).all()
        out[c["slot"]] = rgba[..., :3].copy()
    return out


def test_painted_canvas_pixels_equal_the_lossless_renders(env, browser):
    """Each box of each trial, at every frame (stepped with the page's own frame-step key),
    reads back from its canvas equal to the trial file's tile (decoded here by Pillow), and on a
    test trial every tile is exactly one of the renders, both sides shown."""
    server, db = env["server"], env["db"]
    token = study.invite(db, env["made"]["study"], 1)[0]["token"]
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    media = env["made"]["media"]
    seen_test = 0
    try:
        state = open_page(page, server.url, token)
        page.click("#btn-close-help")
        for _ in range(40):  # every trial of the rater, catch trials too
            trial = state["trial"]
            if trial is None:
                break
            assert next(iter(trial["media"].values())).endswith(".webp")
            page.wait_for_function(ENABLED, timeout=30000)  # one play-through, played
            players = page.evaluate("window.evalkitPlayers()")
            assert all(p["lossless"] and p["complete"] and p["duration"] * FPS == T for p in players), players
            # the file behind this trial, as the server sent it, decoded by another decoder
            with study.RaterService(db) as svc:
                path = svc.media_sync(token, next(iter(trial["media"].values())))
            assert str(path).startswith(media)
            frames = lossless.read_webp(path)
            assert frames.shape[0] == T
            page.keyboard.press(" ")  # pause
            for _ in range(T + 2):
                page.keyboard.press(",")  # back to frame 0
            for k in range(T):
                page.wait_for_function(
                    f"window.evalkitPlayers().every(p => p.paused && p.ready >= 2 && "
                    f"Math.abs(p.t - {k} / {FPS}) < 1e-9)",
                    timeout=10000,
                )
                page.wait_for_timeout(50)  # a paint after the frame
                painted = _painted(page)
                assert set(painted) == set(trial["tiles"])
                sides = set()
                for slot, (x, y, w, h) in trial["tiles"].items():
                    tile = frames[k, y : y + h, x : x + w]
                    assert np.array_equal(painted[slot], tile), (trial["trial"], slot, k)
                    for i, r in enumerate(env["renders"]):
                        if np.array_equal(r[k], tile):
                            sides.add(i)
                if len(sides) == 2 and len(trial["tiles"]) == 3:
                    seen_test += k == T - 1  # a test trial: A and B shown
                page.keyboard.press(".")
            state = answer(page, trial["answers"][0])
        assert trial is None and seen_test == 2  # both clips' test trials seen
    finally:
        ctx.close()


def test_cli_option_and_the_verdict_names_the_delivery(env, cli, tmp_path):
    """`study create --delivery lossless` says what raters see; a complete study's verdict
    names it; a streamed study's results name H.264."""
    from evalkit.testing.studies import answer as answer_all
    from evalkit.testing.studies import hidden

    db = env["db"]
    sid = env["made"]["study"]
    for tok in study.invite(db, sid, 4):
        answer_all(db, tok["token"], lambda t: hidden(db, t["trial"])["expected"] or "A")
    res = study.results(db, sid, reps=200)
    assert res["status"] == "complete", res["verdict_text"]
    assert res["delivery_mode"] == "lossless"
    assert res["verdict_text"].startswith(f"{res['verdict']} lossless: the rendered pixels")
    code, out, err = cli("study", "results", "--db", str(db), "--study", str(sid))
    assert code == 0 and "lossless: the rendered pixels" in out, (out, err)
    code, out, err = cli(
        "study",
        "create",
        str(env["report"]),
        "--db",
        str(tmp_path / "c.db"),
        "--protocol",
        "abx",
        "--raters",
        "4",
        "--delivery",
        "lossless",
    )
    assert code == 0, err
    assert "raters see: lossless: the rendered pixels (--delivery lossless)" in out
    assert "delivery: lossless delivery: raters see the rendered pixels, exact" in out
    assert list((tmp_path / "c.media").glob("*.webp")) and not list((tmp_path / "c.media").glob("*.mp4"))
