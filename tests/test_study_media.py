"""Trial streams: a trial's videos as tiles of one H.264 file (layout, level limits, decoding
each tile back, determinism, one slice a frame, constant QP), cost-neutral catch degradations,
playback in Chromium."""

from __future__ import annotations

import functools
import http.server
import threading

import av
import numpy as np
import pytest
from scipy.ndimage import gaussian_filter

from evalkit.study import media

FPS = 24


def backends(t=24, h=64, w=96, seed=0):
    """Two "backends" rendering the same moving scene: a sharp one (fine luminance texture that
    pans 3 px right and 2 px down a frame, over colour waves) and a smooth (blurred) one, whose
    plain encode is much smaller."""
    rng = np.random.default_rng(seed)
    tex = gaussian_filter(rng.standard_normal((h + 2 * t, w + 3 * t)), 1.0)
    tex *= 60 / tex.std()
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for i in range(t):
        lum = tex[2 * i : 2 * i + h, 3 * i : 3 * i + w]
        out.append(
            np.stack(
                [
                    128 + lum + 40 * np.sin(xx / 20 + i / 5),
                    128 + lum + 30 * np.cos(yy / 15),
                    128 + lum - 30 * np.sin((xx + yy) / 25 - i / 7),
                ],
                -1,
            )
        )
    sharp = np.stack(out)
    smooth = gaussian_filter(sharp, (0, 2.5, 2.5, 0))
    return (np.clip(sharp, 0, 255).astype(np.uint8), np.clip(smooth, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def clips():
    return backends()


@pytest.fixture(scope="module")
def abx(clips, tmp_path_factory):
    """An ABX stream: tiles sharp, sharp (X and its match), smooth."""
    sharp, smooth = clips
    d = tmp_path_factory.mktemp("media")
    sha, layout = media.store_tiled([sharp, sharp, smooth], FPS, d)
    return d / f"{sha}.mp4", layout, d


def decode(path):
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return np.inf if mse == 0 else 10 * np.log10(255**2 / mse)


def test_layout_keeps_tiles_on_the_macroblock_grid_and_within_the_level():
    lay = media.tile_layout(3, 64, 96)
    assert (lay["width"], lay["height"], lay["scale"]) == (3 * 96 + 4 * 16, 64 + 32, 1.0)
    assert lay["rects"] == [[16, 16, 96, 64], [128, 16, 96, 64], [240, 16, 96, 64]]
    odd = media.tile_layout(2, 45, 81)  # odd sizes: the cells round up to the grid
    assert odd["rects"] == [[16, 16, 81, 45], [128, 16, 81, 45]] and odd["width"] % 16 == 0
    for n, h, w in ((3, 720, 1280), (2, 1080, 1920), (3, 1080, 1920), (3, 2160, 3840)):
        lay = media.tile_layout(n, h, w)
        mbs = (lay["width"] // 16) * (lay["height"] // 16)
        assert lay["width"] <= media.MAX_WIDTH and mbs <= media.MAX_MBS, (n, h, w, lay)
        tw, th = lay["tile"]
        assert (lay["scale"] == 1.0) == ((tw, th) == (w, h)), lay
        assert abs(tw / th - w / h) < 0.02 and tw % 2 == 0 == th % 2
    assert media.tile_layout(3, 720, 1280)["scale"] == 1.0  # 3 x 1280 fits (3904 px)
    assert media.tile_layout(3, 1080, 1920)["scale"] < 1.0  # 3 x 1920 is downscaled


def test_each_tile_decodes_to_its_source_and_x_to_its_match(abx, clips):
    path, layout, _ = abx
    sharp, smooth = clips
    out = decode(path)
    assert out.shape == (len(sharp), layout["height"], layout["width"], 3)
    tiles = [out[:, y : y + h, x : x + w] for x, y, w, h in layout["rects"]]
    for tile, src in zip(tiles, (sharp, sharp, smooth)):
        assert psnr(tile, src) > 38
    # X and its match: the same pictures, coded in one frame: (almost) the same decoded pixels;
    # the other side differs by the backend difference
    assert psnr(tiles[0], tiles[1]) > 50 and psnr(tiles[0], tiles[2]) < 35
    # the gutter is mid-grey
    assert np.abs(out[:, :8].astype(int) - 128).max() <= 2  # (chroma deblocking reaches 8 px)


def test_one_slice_a_frame_constant_qp_fixed_key_frames(abx):
    path, _, _ = abx
    with av.open(str(path)) as c:
        pkts = [p for p in c.demux(video=0) if p.size]
        keys = [i for i, p in enumerate(pkts) if p.is_keyframe]
        slices = [sum(1 for n in media.avcc_nal_units(bytes(p)) if n[0] & 0x1F in (1, 5)) for p in pkts]
    assert keys == list(range(0, len(pkts), 12)) and set(slices) == {1}
    data = path.read_bytes()
    assert b"rc=cqp" in data and b"qp=12" in data and b"threads=1" in data


def test_the_same_tiles_give_the_same_file_and_order_matters(clips, abx, tmp_path):
    sharp, smooth = clips
    path, _, _ = abx
    again, _ = media.store_tiled([sharp, sharp, smooth], FPS, tmp_path)
    assert (tmp_path / f"{again}.mp4").read_bytes() == path.read_bytes()
    other, _ = media.store_tiled([sharp, smooth, sharp], FPS, tmp_path)
    assert other != again
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_catch_degradations_are_plain_and_cost_what_the_reference_costs(clips, tmp_path):
    """The negative is as far from the reference as a picture gets, yet its stream is within a
    percent of the reference's own (the coefficients only change sign); a blurred tile, the old
    degradation, made the stream far smaller."""
    from scipy.ndimage import gaussian_filter

    sharp, _ = clips
    neg = media.degrade(sharp, FPS, "negative")
    assert np.array_equal(neg, 255 - sharp)
    hue = media.degrade(sharp, FPS, "hue_mild")
    luma = np.array([0.299, 0.587, 0.114])
    assert np.abs(hue @ luma - sharp @ luma).mean() < 0.5 < 5 < np.abs(hue - sharp.astype(int)).mean()

    def size(tiles):
        sha, _ = media.store_tiled(tiles, FPS, tmp_path)
        return (tmp_path / f"{sha}.mp4").stat().st_size

    ref = size([sharp, sharp, sharp])
    assert abs(size([sharp, sharp, neg]) / ref - 1) < 0.01
    assert abs(size([sharp, sharp, hue]) / ref - 1) < 0.015
    blur = gaussian_filter(sharp, (0, 3, 3, 0))
    assert size([sharp, sharp, blur]) / ref < 0.9  # -13% here
    with pytest.raises(ValueError, match="kind: expected negative or hue_mild"):
        media.degrade(sharp, FPS, "blur")


def test_bad_tiles_are_refused(clips, tmp_path):
    sharp, smooth = clips
    with pytest.raises(ValueError, match="at least one"):
        media.store_tiled([], FPS, tmp_path)
    with pytest.raises(ValueError, match=r"tiles\[1\]: every tile"):
        media.store_tiled([sharp, smooth[:5]], FPS, tmp_path)
    with pytest.raises(ValueError, match=r"tiles\[0\]: expected \(T, H, W, 3\) uint8"):
        media.store_tiled([sharp.astype(np.float32)], FPS, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_large_tiles_are_downscaled_into_the_stream(tmp_path):
    big = np.full((2, 720, 1400, 3), 90, np.uint8)
    sha, lay = media.store_tiled([big, big, 255 - big], FPS, tmp_path)
    assert lay["scale"] < 1 and lay["width"] <= media.MAX_WIDTH
    out = decode(tmp_path / f"{sha}.mp4")
    x, y, w, h = lay["rects"][2]
    assert out.shape[1:3] == (lay["height"], lay["width"])
    assert abs(int(out[0, y + h // 2, x + w // 2, 0]) - 165) <= 3
    assert abs(int(out[0, y + h // 2, x - 8, 0]) - 128) <= 3  # the gutter


@pytest.mark.slow  # Chromium
def test_chromium_plays_a_trial_stream(abx, browser):
    path, layout, d = abx
    files = [path]
    (d / "page.html").write_text(
        "<!doctype html><body>"
        + "".join(
            f'<video id="v{k}" src="{f.name}" muted autoplay loop playsinline></video>'
            for k, f in enumerate(files)
        )
        + "</body>"
    )
    handler = functools.partial(_QuietHandler, directory=str(d))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/page.html")
        for k in range(len(files)):
            vid = f"v{k}"
            # the state is read in the same call that saw it playing: a looping video drops
            # back to readyState 1 for a moment when it restarts
            state = page.wait_for_function(
                "id => { const v = document.getElementById(id);"
                " if (!(v.error || (v.readyState >= 2 && v.currentTime > 0.1))) return false;"
                " return { error: v.error && v.error.code, w: v.videoWidth, h: v.videoHeight,"
                " ready: v.readyState, t: v.currentTime }; }",
                arg=vid,
                timeout=20_000,
            ).json_value()
            assert state["error"] is None, state
            assert (state["w"], state["h"]) == (layout["width"], layout["height"]) and state["ready"] >= 2, (
                state
            )
            page.wait_for_function(
                "([id, t0]) => document.getElementById(id).currentTime != t0",
                arg=[vid, state["t"]],
                timeout=10_000,
            )
    finally:
        page.close()
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
