"""Matched sets of browser copies: equal lengths and sample sizes, unrelated variant bytes,
bit-exact decoding, playback in Chromium, determinism."""
from __future__ import annotations

import functools
from collections import Counter
import http.server
import threading
from pathlib import Path

import av
import numpy as np
import pytest
from scipy.ndimage import gaussian_filter

from evalkit.study import media
from evalkit.video import write_browser

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
        lum = tex[2 * i:2 * i + h, 3 * i:3 * i + w]
        out.append(np.stack([128 + lum + 40 * np.sin(xx / 20 + i / 5),
                             128 + lum + 30 * np.cos(yy / 15),
                             128 + lum - 30 * np.sin((xx + yy) / 25 - i / 7)], -1))
    sharp = np.stack(out)
    smooth = gaussian_filter(sharp, (0, 2.5, 2.5, 0))
    return (np.clip(sharp, 0, 255).astype(np.uint8), np.clip(smooth, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def clips():
    return backends()


@pytest.fixture(scope="module")
def abx(clips, tmp_path_factory):
    """An ABX set: A = sharp, B = smooth, and the alternates an X is made of."""
    sharp, smooth = clips
    items = [(sharp, 0), (smooth, 0), (sharp, 1), (smooth, 1), (sharp, 2), (smooth, 2)]
    d = tmp_path_factory.mktemp("media")
    digests = media.store_matched_set(items, FPS, d)
    return items, [d / f"{h}.mp4" for h in digests], d


def unpadded(frames, variant, path: Path) -> Path:
    """The plain encode of an item: same settings, SEI kept, no filler."""
    write_browser(path, frames, FPS, media.matched_encoding(variant))
    return path


def sample_sizes(path) -> list[int]:
    with av.open(str(path)) as c:
        return [p.size for p in c.demux(c.streams.video[0]) if p.size]


def samples(path) -> list[bytes]:
    with av.open(str(path)) as c:
        return [bytes(p) for p in c.demux(c.streams.video[0]) if p.size]


def decode(path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def mdat(path) -> bytes:
    data = Path(path).read_bytes()
    return data[len(media.mp4_header(path)):]


def psnr(a, b) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255 ** 2 / mse)


def test_a_set_has_one_length_one_layout_and_one_size_per_frame(abx, tmp_path):
    items, files, _ = abx
    plain = [unpadded(f, v, tmp_path / f"{k}.mp4") for k, (f, v) in enumerate(items)]
    plain_lengths = [p.stat().st_size for p in plain]
    plain_sizes = [sample_sizes(p) for p in plain]
    # what the set hides: the smooth clip's plain encode is much smaller, frame by frame too
    assert plain_lengths[1] < 0.9 * plain_lengths[0], plain_lengths
    assert len(set(map(tuple, plain_sizes))) == len(items)
    assert sum(a != b for a, b in zip(plain_sizes[0], plain_sizes[1])) >= 20

    assert len({f.stat().st_size for f in files}) == 1
    sizes = [sample_sizes(f) for f in files]
    assert all(s == sizes[0] for s in sizes) and len(sizes[0]) == 24
    # padding reaches the largest frame of the set plus 6-8 bytes (the filler unit)
    coded = [[sum(4 + len(n) for n in media.avcc_nal_units(s) if n[0] & 0x1F != 6)
              for s in samples(p)] for p in plain]   # x264's SEI (frame 0) is dropped
    for i, size in enumerate(sizes[0]):
        biggest = max(c[i] for c in coded)
        assert biggest + 6 <= size <= biggest + 8
    # ftyp + moov (sample table, key frames, time stamps, avcC) byte-identical
    assert len({media.mp4_header(f) for f in files}) == 1
    for f in files:
        data = f.read_bytes()
        assert data.find(b"moov") < data.find(b"mdat"), "+faststart"
        assert b"x264" not in data and b"Lavf" not in data and b"Lavc" not in data
        with av.open(str(f)) as c:
            s = c.streams.video[0]
            assert (s.codec_context.width, s.codec_context.height) == (96, 64)
            assert s.codec_context.pix_fmt == "yuv420p" and s.frames == 24
            assert c.metadata == {"major_brand": "isom", "minor_version": "512",
                                  "compatible_brands": "isomiso2avc1mp41"}
            keys = [p.is_keyframe for p in c.demux(s) if p.size]
        assert [i for i, k in enumerate(keys) if k] == [0, 12]
    print(f"\nplain {plain_lengths} -> padded {files[0].stat().st_size} each")


def strip_zero_words(nal: bytes) -> bytes:
    """A slice NAL unit without its trailing cabac_zero_words (00 00 03 each)."""
    while nal.endswith(b"\x00\x00\x03"):
        nal = nal[:-3]
    return nal


def test_padding_hides_the_coded_size_from_the_nal_lengths(abx):
    """Every sample: one slice grown by cabac_zero_words, then a 6-8 byte filler unit; the
    slice NAL lengths of a frame differ across the set by at most 2 bytes (the coded size
    modulo 3), whatever the coded sizes."""
    _, files, _ = abx
    per_frame = []
    for f in files:
        lens, coded = [], []
        for s in samples(f):
            nals = media.avcc_nal_units(s)
            assert all(n[0] & 0x1F != 6 for n in nals), "SEI left in"
            assert [n[0] & 0x1F for n in nals][1:] == [12] and nals[0][0] & 0x1F in (1, 5)
            fill = nals[1]
            assert fill[0] == 0x0C and fill[-1] == 0x80 and set(fill[1:-1]) <= {0xFF}
            assert 6 <= len(fill) + 4 <= 8
            lens.append(len(nals[0]))
            coded.append(len(strip_zero_words(nals[0])))
        per_frame.append((lens, coded))
    for i in range(len(per_frame[0][0])):
        lens = [p[0][i] for p in per_frame]
        coded = [p[1][i] for p in per_frame]
        assert max(lens) - min(lens) <= 2, lens
        assert max(coded) - min(coded) > 2 or len(set(coded)) == 1   # the sizes do differ
    assert any(len({p[1][i] for p in per_frame}) > 1 for i in range(len(per_frame[0][1])))


@pytest.mark.parametrize("pair", [(0, 2), (1, 3), (0, 4), (2, 4)])
def test_variants_of_the_same_frames_share_no_bytes(abx, pair):
    items, files, _ = abx
    i, j = pair
    assert np.array_equal(items[i][0], items[j][0]) and items[i][1] != items[j][1]
    a, b = mdat(files[i]), mdat(files[j])
    assert len(a) == len(b)
    # aligned: the same 64-byte chunk at the same offset (filler-only chunks aside)
    chunks = [(a[k:k + 64], b[k:k + 64]) for k in range(0, len(a) - 63, 64)]
    pad = {b"\x00\x00\x03" * 22, b"\x00\x03\x00" * 22, b"\x03\x00\x00" * 22}
    same = sum(x == y and set(x) != {0xFF} and x[:64] not in {p[:64] for p in pad}
               for x, y in chunks)
    assert same / len(chunks) < 0.05, same / len(chunks)
    # anywhere: no 64-byte run of one variant's coded frames occurs in the other's
    def coded(f):
        return b"".join(strip_zero_words(media.avcc_nal_units(s)[0]) for s in samples(f))
    ca, cb = coded(files[i]), coded(files[j])
    windows = {ca[k:k + 64] for k in range(len(ca) - 63)}
    runs = [cb[k:k + 64] for k in range(0, len(cb) - 63, 64)]
    assert sum(r in windows for r in runs) / len(runs) < 0.05
    # no frame of one is the same bytes as the same frame of the other, and each frame's bytes
    # part within the slice header (cabac_init_idc, or the I slice's QP), not after the first
    # macroblocks
    assert not any(x == y for x, y in zip(samples(files[i]), samples(files[j])))
    for x, y in zip(samples(files[i]), samples(files[j])):
        x, y = x[4:], y[4:]   # the slice NAL units, past their lengths (which may be equal)
        same = next(n for n in range(min(len(x), len(y)) + 1) if n == len(x) or x[n] != y[n])
        assert same <= 16, same


def test_no_two_items_give_the_same_file(abx):
    _, files, _ = abx
    assert len({f.read_bytes() for f in files}) == len(files)
    assert len({f.name for f in files}) == len(files)


def test_padded_files_decode_to_the_unpadded_encodes_frames(abx, tmp_path):
    items, files, _ = abx
    for k, ((frames, variant), f) in enumerate(zip(items, files)):
        ref = decode(unpadded(frames, variant, tmp_path / f"{k}.mp4"))
        got = decode(f)
        assert got.shape == frames.shape
        assert np.array_equal(got, ref), f"items[{k}]"
        assert psnr(got, frames) > 35, (k, psnr(got, frames))


def test_the_same_set_gives_the_same_files(clips, abx, tmp_path):
    items, files, _ = abx
    again = media.store_matched_set(items, FPS, tmp_path)
    assert again == [f.stem for f in files]
    assert all((tmp_path / f"{h}.mp4").read_bytes() == f.read_bytes()
               for h, f in zip(again, files))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{h}.mp4" for h in again), \
        "no temporary files left behind"


def test_odd_sizes_are_padded_to_even_and_still_matched(clips, tmp_path):
    sharp, smooth = clips
    items = [(sharp[:13, :63, :95], 0), (smooth[:13, :63, :95], 1)]
    files = [tmp_path / f"{h}.mp4" for h in media.store_matched_set(items, FPS, tmp_path)]
    assert files[0].stat().st_size == files[1].stat().st_size
    assert sample_sizes(files[0]) == sample_sizes(files[1])
    for (frames, _), f in zip(items, files):
        got = decode(f)
        assert got.shape == (13, 64, 96, 3)
        assert psnr(got[:, :63, :95], frames) > 35


def test_bad_sets_are_refused(clips, tmp_path):
    sharp, _ = clips
    with pytest.raises(ValueError, match=r"items\[1\].*height 62 \(items\[0\]: 64\)"):
        media.store_matched_set([(sharp, 0), (sharp[:, :62], 1)], FPS, tmp_path)
    with pytest.raises(ValueError, match=r"frame count 23 \(items\[0\]: 24\)"):
        media.store_matched_set([(sharp, 0), (sharp[:23], 1)], FPS, tmp_path)
    with pytest.raises(ValueError, match=r"width 94"):
        media.store_matched_set([(sharp, 0), (sharp[:, :, :94], 0)], FPS, tmp_path)
    with pytest.raises(ValueError, match="variant"):
        media.store_matched_set([(sharp, 3)], FPS, tmp_path)
    with pytest.raises(ValueError, match="uint8"):
        media.store_matched_set([(sharp.astype(np.float32), 0)], FPS, tmp_path)
    with pytest.raises(ValueError, match="at least one"):
        media.store_matched_set([], FPS, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_pad_target_leaves_room_for_the_smallest_filler_unit():
    # every sample gets a filler unit; 0-2 bytes more, drawn from the salt, evenly
    assert Counter(media._pad_target([100, 90, 100], i.to_bytes(2, "big")) for i in range(300)) \
        .keys() == {106, 107, 108}
    assert media._pad_target([7], b"x") in (13, 14, 15)
    for gap in range(6, 40):
        f = media._filler(gap)
        assert len(f) == gap and media.avcc_nal_units(f) == [f[4:]]


def test_chromium_plays_a_padded_file(abx, browser):
    _, files, d = abx
    (d / "page.html").write_text(
        "<!doctype html><body>" + "".join(
            f'<video id="v{k}" src="{f.name}" muted autoplay loop playsinline></video>'
            for k, f in enumerate(files)) + "</body>")
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
                arg=vid, timeout=20_000).json_value()
            assert state["error"] is None, state
            assert (state["w"], state["h"]) == (96, 64) and state["ready"] >= 2, state
            page.wait_for_function(
                "([id, t0]) => document.getElementById(id).currentTime != t0",
                arg=[vid, state["t"]], timeout=10_000)
    finally:
        page.close()
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_a_preset_that_ignores_the_deadzones_is_refused(clips, tmp_path, monkeypatch):
    """With trellis quantisation (``medium`` and slower) x264 ignores the deadzones: variants 1
    and 2 would be variant 0's bytes. x264's own options string says so; the set is refused."""
    from evalkit.video import BrowserEncoding

    monkeypatch.setattr(media, "BROWSER_ENCODING", BrowserEncoding(preset="medium"))
    sharp, smooth = clips
    with pytest.raises(RuntimeError, match=r"did not apply .*deadzone=18,9"):
        media.store_matched_set([(sharp[:4], 0), (smooth[:4], 1)], FPS, tmp_path)
    assert list(tmp_path.iterdir()) == []
