"""What raters use to inspect a difference (issue 46 item 7), in Debian's Chromium against the
real `evalkit serve`, real study databases and media (no mocks), for both deliveries (H.264
stream and lossless WebP): the magnifier (2x / 4x at one point, every box the same place of
the same frame, pixel-exact), flicker (two boxes' tiles alternated in one place), the phone
layout (390x844: boxes stacked, every control on screen) and clips of other aspect ratios
shown whole (each box at its tile's aspect, no bars, nothing stretched or cropped). What the
page shows is read back from its canvases (and, for the layout, from a screenshot) and compared
with the trial file's own pixels (lossless: decoded here by Pillow, exactly) or with the page's
own unmagnified boxes of the same frame (stream)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest

from evalkit import study
from evalkit.study import lossless
from evalkit.testing.page import ENABLED, answer, inside, layout, open_page
from evalkit.testing.server import ARTIFACTS, Server
from evalkit.testing.studies import import_report

pytestmark = pytest.mark.slow  # the real server and Chromium

FPS = 12
T = 6
CANARY = Path(__file__).resolve().parent.parent / "datasets" / "canary" / "clips"
# every canvas of the stage as base64 RGBA, with its slot (the flicker box: the slot it shows)
CANVASES = (
    "() => Array.from(document.querySelectorAll('.ek-stage canvas')).filter("
    " c => c.offsetParent !== null).map(c => {"
    " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
    " let s = ''; for (let i = 0; i < d.length; i += 8192)"
    "   s += String.fromCharCode.apply(null, d.subarray(i, i + 8192));"
    " return {slot: c.dataset.slot || null, showing: c.dataset.showing || null,"
    " w: c.width, h: c.height, rgba: btoa(s)}; })"
)
PHONE = dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, device_scale_factor=2)


def _footage(h: int, w: int, y: int, x: int) -> np.ndarray:
    """T frames of real footage (the canary's cat, filmed handheld), an h x w crop."""
    from evalkit.video import read_frames

    frames, _ = read_frames(CANARY / "chelsea_handheld.mkv")
    return np.ascontiguousarray(frames[:T, y : y + h, x : x + w])


def _pairs() -> dict:
    """A wide clip (3:1) and a tall one (1:2); B: A with a bright square (visible, so the
    stream delivery keeps it)."""
    out = {}
    for name, (h, w) in {"wide": (48, 144), "tall": (96, 48)}.items():
        a = _footage(h, w, 40, 60)
        b = a.copy()
        b[:, 8:24, 8:24] = np.minimum(255, b[:, 8:24, 8:24].astype(np.int16) + 60).astype(np.uint8)
        out[name] = (a, b)
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    reports = {
        shape: import_report(root / shape, {shape: pair}, FPS)[0] for shape, pair in _pairs().items()
    }  # one size a report
    out = {}
    for delivery in ("stream", "lossless"):
        db = root / f"{delivery}.db"
        out[delivery] = {
            "db": db,
            "sids": {
                shape: study.create_study(
                    report,
                    db,
                    protocol="abx",
                    seed=3,
                    raters_planned=4,
                    delivery=delivery,
                    allow_masking=True,
                    design_seed=11,
                )["study"]
                for shape, report in reports.items()
            },
        }
    servers = {d: Server(out[d]["db"]).start() for d in out}
    for d in out:
        out[d]["server"] = servers[d]
    yield out
    for s in servers.values():
        s.stop()


def _painted(page) -> list[dict]:
    out = []
    for c in page.evaluate(CANVASES):
        rgba = np.frombuffer(base64.b64decode(c["rgba"]), np.uint8).reshape(c["h"], c["w"], 4)
        assert (rgba[..., 3] == 255).all()
        out.append({**c, "rgb": rgba[..., :3].copy()})
    return out


def _boxes(page) -> dict:
    return {c["slot"]: c["rgb"] for c in _painted(page)}


def _players(page):
    return page.evaluate("window.evalkitPlayers()")


def _magnified(tile: np.ndarray, view: dict, zoom: int) -> np.ndarray:
    """What a box shows of ``tile`` magnified: its view's pixels, each zoom x zoom, cut to the
    tile's size."""
    part = tile[view["y"] : view["y"] + view["h"], view["x"] : view["x"] + view["w"]]
    big = np.repeat(np.repeat(part, zoom, 0), zoom, 1)
    return big[: tile.shape[0], : tile.shape[1]]


def _pause_on(page, k: int):
    """Pause and step to frame k (the page's own keys), every box on it."""
    page.keyboard.press(" ")
    for _ in range(T + 2):
        page.keyboard.press(",")
    for _ in range(k):
        page.keyboard.press(".")
    page.wait_for_function(
        f"window.evalkitPlayers().every(p => p.paused && p.ready >= 2 && "
        f"Math.floor(p.t * {FPS} + 1e-3) === {k})",
        timeout=10000,
    )
    page.wait_for_timeout(100)  # a paint after the frame


def _start(browser, env, delivery, view=None, shape="wide"):
    e = env[delivery]
    token = study.invite(e["db"], e["sids"][shape], 1)[0]["token"]
    ctx = browser.new_context(**(view or dict(viewport={"width": 1280, "height": 800})))
    page = ctx.new_page()
    state = open_page(page, e["server"].url, token)
    if page.is_visible("#instructions"):
        page.click("#btn-close-help") if not (view or {}).get("has_touch") else page.tap("#btn-close-help")
    page.wait_for_function(
        "window.evalkitPlayers().length === 3 && "
        "window.evalkitPlayers().every(p => p.ready >= 2 && p.t === p.t)",
        timeout=30000,
    )
    return ctx, page, state


@pytest.mark.parametrize("delivery", ["stream", "lossless"])
def test_magnifier_and_flicker_show_the_right_pixels(env, browser, delivery):
    """Paused on frame 2: at 2x and 4x every box shows the same part of its own tile, each
    pixel as a zoom x zoom square of the unmagnified tile's (lossless: the file's pixels
    exactly); a click aims every box at the pixel clicked, a drag pans them together; flicker
    shows the chosen pair's two tiles in turn in one place, each exactly (also magnified)."""
    ctx, page, state = _start(browser, env, delivery)
    try:
        trial = state["trial"]
        _pause_on(page, 2)
        base = _boxes(page)
        assert sorted(base) == sorted(trial["tiles"])
        if delivery == "lossless":  # the file's own pixels, decoded by Pillow
            with study.RaterService(env[delivery]["db"]) as svc:
                path = svc.media_sync(state_token(page), next(iter(trial["media"].values())))
            frame = lossless.read_webp(path)[2]
            for slot, (x, y, w, h) in trial["tiles"].items():
                assert np.array_equal(base[slot], frame[y : y + h, x : x + w]), slot
        boxes = {s: page.locator(f"canvas[data-slot='{s}']").bounding_box() for s in base}

        def check(zoom):
            ps = _players(page)
            assert all(p["zoom"] == zoom for p in ps)
            views = {p["slot"]: p["view"] for p in ps}
            assert len({tuple(v.values()) for v in views.values()}) == 1, views  # one place
            shown = _boxes(page)
            for slot, tile in base.items():
                assert np.array_equal(shown[slot], _magnified(tile, views[slot], zoom)), (zoom, slot)
            assert {s: page.locator(f"canvas[data-slot='{s}']").bounding_box() for s in base} == boxes
            return views[next(iter(views))]

        page.keyboard.press("z")
        v2 = check(2)
        w, h = base["X"].shape[1], base["X"].shape[0]
        assert (v2["w"], v2["h"]) == (w // 2, h // 2) and abs(v2["x"] - w / 4) <= 1  # centred
        # a click on B at 70 % across, 30 % down aims every box at that pixel of the view
        b = boxes["B"]
        page.mouse.click(b["x"] + 0.7 * b["width"], b["y"] + 0.3 * b["height"])
        page.wait_for_timeout(100)
        aimed = (v2["x"] + 0.7 * w / 2, v2["y"] + 0.3 * h / 2)
        v = check(2)
        want_x = min(w - v["w"], max(0, round(aimed[0] - w / 4)))
        want_y = min(h - v["h"], max(0, round(aimed[1] - h / 4)))
        assert abs(v["x"] - want_x) <= 1 and abs(v["y"] - want_y) <= 1, (v, aimed)
        page.keyboard.press("z")
        v4 = check(4)
        # a drag on A to the right pans every box left (towards lower x), together
        a = boxes["A"]
        page.mouse.move(a["x"] + a["width"] / 2, a["y"] + a["height"] / 2)
        page.mouse.down()
        page.mouse.move(a["x"] + a["width"] / 2 + 40, a["y"] + a["height"] / 2, steps=4)
        page.mouse.up()
        page.wait_for_timeout(100)
        vd = check(4)
        assert vd["x"] < v4["x"] or v4["x"] == 0, (vd, v4)
        page.keyboard.press("z")
        assert _players(page)[0]["zoom"] == 1
        # flicker: A / B, the fastest rate; both tiles seen in one place, each exact
        page.select_option("#flicker-pair", label="A / B")
        page.select_option("#flicker-rate", "8")
        for zoom in (1, 2):
            page.keyboard.press("k")
            assert page.get_attribute("#btn-flicker", "aria-pressed") == "true"
            where, seen = set(), {}
            for _ in range(200):
                shown = _painted(page)
                assert len(shown) == 1 and shown[0]["slot"] is None  # one box, no slot
                s = shown[0]
                view = _players(page)[0]["view"]
                assert np.array_equal(s["rgb"], _magnified(base[s["showing"]], view, zoom)), s["showing"]
                seen[s["showing"]] = seen.get(s["showing"], 0) + 1
                where.add(tuple(page.locator("canvas.flicker").bounding_box().values()))
                if len(seen) == 2 and min(seen.values()) >= 2:
                    break
                page.wait_for_timeout(40)
            assert set(seen) == {"A", "B"} and len(where) == 1, (seen, where)
            assert _players(page)[0]["flicker"] == ["A", "B"]
            page.keyboard.press("k")
            assert page.get_attribute("#btn-flicker", "aria-pressed") == "false"
            assert sorted(_boxes(page)) == sorted(base)
            page.keyboard.press("z")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"rater-magnifier-{delivery}.png"))
    finally:
        ctx.close()


def state_token(page) -> str:
    return page.evaluate("new URLSearchParams(location.search).get('token')")


def _controls_on_screen(page):
    sels = [
        "#controls button",
        "#controls select:not([hidden])",
        "#answers button",
        ".ek-head",
        ".ek-stage canvas",
    ]
    g = layout(page, sels)
    vw, vh = g["vw"], g["vh"]
    assert g["sw"] <= vw and g["sh"] <= vh, g  # no scrolling, either way
    for s in sels:
        visible = [b for b in g["boxes"][s] if b["w"] > 0]
        assert inside(visible, vw, vh), (s, g["boxes"][s])
    return g


def test_phone_layout_every_control_on_screen(env, browser):
    """At 390x844 (touch): a 3:1 clip's boxes are stacked, the whole trial and every control
    (buttons, flicker's lists, answers) on screen with no scrolling, in each mode (plain,
    magnified, flicker); a tap aims the magnifier."""
    ctx, page, state = _start(browser, env, "stream", PHONE)
    try:
        trial = state["trial"]
        assert trial["tiles"]["X"][2:] == [144, 48]
        page.wait_for_timeout(300)
        g = _controls_on_screen(page)
        cs = sorted(g["boxes"][".ek-stage canvas"], key=lambda b: b["y"])
        assert len(cs) == 3 and all(abs(c["x"] - cs[0]["x"]) < 1 for c in cs)  # one column
        assert all(c["y"] + c["h"] <= d["y"] for c, d in zip(cs, cs[1:]))  # stacked
        assert all(c["w"] >= 0.8 * g["vw"] for c in cs)  # full width
        page.screenshot(path=str(ARTIFACTS / "rater-phone.png"))
        page.tap("#btn-zoom")
        assert _players(page)[0]["zoom"] == 2
        before = _players(page)[0]["view"]
        x = page.locator("canvas[data-slot='A']").bounding_box()
        page.tap("canvas[data-slot='A']", position={"x": 0.9 * x["width"], "y": 0.5 * x["height"]})
        page.wait_for_timeout(100)
        after = _players(page)[0]["view"]
        assert after["x"] > before["x"], (before, after)  # aimed to the right
        _controls_on_screen(page)
        page.screenshot(path=str(ARTIFACTS / "rater-phone-zoom.png"))
        page.tap("#btn-flicker")
        page.wait_for_timeout(200)
        g = _controls_on_screen(page)
        assert len([b for b in g["boxes"][".ek-stage canvas"] if b["w"] > 0]) == 1
        page.tap("#btn-flicker")
        page.wait_for_function(ENABLED, timeout=30000)
        state = answer(page, "A", "tap")  # the answers work from here
        assert "error" not in state
    finally:
        ctx.close()


@pytest.mark.parametrize("delivery,view", [("stream", "desktop"), ("lossless", "phone")])
@pytest.mark.parametrize("shape", ["wide", "tall"])
def test_clips_of_other_aspects_are_shown_whole(env, browser, delivery, view, shape):
    """A 3:1 and a 1:2 clip: every box is its tile's aspect (to a pixel of rounding), lies on
    screen, and a screenshot of it, scaled back to the tile's size, is the tile (the box's
    edges are the clip's, not bars; a stretched or cropped picture would not match)."""
    from PIL import Image

    ctx, page, state = _start(browser, env, delivery, PHONE if view == "phone" else None, shape)
    try:
        tiles = state["trial"]["tiles"]
        w, h = tiles["X"][2], tiles["X"][3]
        assert (w, h) == {"wide": (144, 48), "tall": (48, 96)}[shape]
        _pause_on(page, 0)
        painted = _boxes(page)
        g = layout(page, [".ek-stage canvas"])
        for b in g["boxes"][".ek-stage canvas"]:
            assert abs(b["w"] / b["h"] - w / h) <= (w / h) * (1 / b["h"] + 1 / b["w"]), b
            assert inside([b], g["vw"], g["vh"]) and b["w"] >= w, b
            # the box less a CSS pixel all round (it may start between screen pixels)
            png = page.screenshot(
                clip={"x": b["x"] + 1, "y": b["y"] + 1, "width": b["w"] - 2, "height": b["h"] - 2}
            )
            shot = np.asarray(Image.open(io.BytesIO(png)).convert("RGB").resize((w, h), Image.BOX)).astype(
                np.float32
            )
            tile = painted[b["slot"]].astype(np.float32)
            err = np.abs(shot - tile)
            # the screen resamples (and the box filter here): a box placed between screen
            # pixels (x 199.28 on the phone) is up to half a pixel off, which costs about half
            # of a whole pixel's shift (one run: 3.47 against 6.88); a stretched or cropped
            # picture is several whole pixels off
            shifted = np.abs(tile[:, 1:] - tile[:, :-1]).mean()
            assert err.mean() < 0.75 * shifted, (b, err.mean(), shifted)
            for edge in (err[0], err[-1], err[:, 0], err[:, -1]):  # no bars
                assert edge.mean() < 2 * shifted, (b, edge.mean(), shifted)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"rater-aspect-{shape}-{view}.png"))
    finally:
        ctx.close()


# the trial's stream played the old way, whole from a Blob in a second <video>: frame k's
# tiles as base64 RGBA, slot by slot
BLOB_FRAME = """async ([k, fps]) => {
  const t = window.evalkitState().state.trial, name = Object.values(t.media)[0];
  const token = new URLSearchParams(location.search).get("token");
  if (!window._blobVideo) {
    const buf = await (await fetch("media/" + name + "?token=" + token)).arrayBuffer();
    const v = document.createElement("video");
    v.muted = true; v.src = URL.createObjectURL(new Blob([buf], {type: "video/mp4"}));
    await new Promise((res) => v.addEventListener("loadeddata", res, {once: true}));
    window._blobVideo = v;
  }
  const v = window._blobVideo;
  await new Promise((res) => { v.addEventListener("seeked", res, {once: true});
                               v.currentTime = k / fps + 0.001; });
  const out = {};
  for (const [slot, r] of Object.entries(t.tiles)) {
    const c = document.createElement("canvas"); c.width = r[2]; c.height = r[3];
    const g = c.getContext("2d"); g.drawImage(v, r[0], r[1], r[2], r[3], 0, 0, r[2], r[3]);
    const d = g.getImageData(0, 0, r[2], r[3]).data;
    let s = ""; for (let i = 0; i < d.length; i += 8192)
      s += String.fromCharCode.apply(null, d.subarray(i, i + 8192));
    out[slot] = btoa(s);
  }
  return out;
}"""


def test_stream_fed_through_mediasource_shows_the_files_frames(env, browser):
    """The stream trial's frames as the page plays them (its bytes fed to the video through
    MediaSource as they arrive, the index rewritten as a fragmented MP4's) equal, every frame
    and every box, the same file played whole from a Blob in the same browser (the design
    before issue 45's change): the rewriting passes the samples through untouched."""
    ctx, page, state = _start(browser, env, "stream")
    try:
        trial = state["trial"]
        page.wait_for_function("window.evalkitPlayers()[0].acked", timeout=30000)
        for k in range(T):
            _pause_on(page, k) if k == 0 else page.keyboard.press(".")
            page.wait_for_function(
                f"window.evalkitPlayers().every(p => Math.floor(p.t * {FPS} + 1e-3) === {k})", timeout=10000
            )
            page.wait_for_timeout(100)
            shown = _boxes(page)
            whole = page.evaluate(BLOB_FRAME, [k, FPS])
            for slot, (x, y, w, h) in trial["tiles"].items():
                rgba = np.frombuffer(base64.b64decode(whole[slot]), np.uint8).reshape(h, w, 4)
                assert np.array_equal(shown[slot], rgba[..., :3]), (k, slot)
    finally:
        ctx.close()
