"""Video I/O: exact lossless round trips, browser copies, and bad input."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import DATASETS, assert_one_line_error
from PIL import Image

from evalkit import video
from evalkit.errors import VideoError


def random_frames(n=7, h=37, w=51, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def test_lossless_round_trip_random_frames_is_byte_identical(tmp_path):
    frames = random_frames()
    path = tmp_path / "r.mkv"
    assert video.write_lossless(path, frames, Fraction(30000, 1001)) == len(frames)
    reader = video.ClipReader(path)
    back = reader.read()
    assert back.dtype == np.uint8 and back.shape == frames.shape
    assert np.array_equal(back, frames)
    assert reader.info.codec == "ffv1"
    assert abs(float(reader.info.fps) - 30000 / 1001) < 1e-3


def test_lossless_round_trip_of_the_bundled_clips(tmp_path):
    # the committed clips (not those of the real-scale suites, made on demand)
    clips = sorted(p for s in ("smoke", "canary") for p in (DATASETS / s / "clips").glob("*.mkv"))
    assert len(clips) >= 10, "bundled smoke and canary clips are missing"
    for clip in clips:
        frames, fps = video.read_frames(clip)
        out = tmp_path / clip.name
        video.write_lossless(out, frames, fps)
        assert np.array_equal(video.read_frames(out)[0], frames), clip.name


def test_write_accepts_an_iterator_and_reads_in_chunks(tmp_path):
    frames = random_frames(n=10, h=16, w=16)
    path = tmp_path / "it.mkv"
    video.write_lossless(path, (f for f in frames), 24)
    chunks = list(video.ClipReader(path).chunks(4))
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert np.array_equal(np.concatenate(chunks), frames)


def test_browser_copy_is_h264_yuv420p_faststart_with_fixed_settings(tmp_path):
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    video.write_browser(a, random_frames(seed=1), 24)  # odd size: padded to even
    video.write_browser(b, random_frames(seed=2, h=38, w=52), 24)
    params = []
    for p in (a, b):
        data = p.read_bytes()
        assert data.find(b"moov") < data.find(b"mdat"), "moov atom must precede mdat (+faststart)"
        with av.open(str(p)) as c:
            s = c.streams.video[0]
            assert s.codec_context.name == "h264"
            assert s.codec_context.pix_fmt == "yuv420p"
            assert (s.codec_context.width, s.codec_context.height) == (52, 38)
            assert s.frames == 7
            assert not {k.lower() for k in c.metadata} & {"title", "comment", "description"}
            params.append((s.codec_context.profile, s.average_rate, s.codec_context.pix_fmt))
    assert params[0] == params[1]
    # near-transparent quality on a natural image: the encoder does not dominate the comparison
    from skimage import data

    photo = np.ascontiguousarray(data.astronaut()[::4, ::4][:96, :96])
    clip = np.repeat(photo[None], 3, 0)
    video.write_browser(tmp_path / "s.mp4", clip, 24)
    back = video.read_frames(tmp_path / "s.mp4")[0].astype(float)
    # the floor: what yuv420p chroma subsampling alone costs on this detailed image
    floor = av.VideoFrame.from_ndarray(photo, format="rgb24").reformat(format="yuv420p")
    floor = floor.reformat(format="rgb24").to_ndarray().astype(float)
    assert np.abs(back - clip).mean() < np.abs(floor - photo).mean() + 1.0


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    path = tmp_path / "x.mkv"
    video.write_lossless(path, random_frames(n=2), 24)
    before = path.read_bytes()

    def frames_then_crash():
        yield from random_frames(n=3, seed=5)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        video.write_lossless(path, frames_then_crash(), 24)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.mkv"]


def test_images_and_image_folders(tmp_path):
    frames = random_frames(n=3, h=20, w=30)
    folder = tmp_path / "seq"
    folder.mkdir()
    for i, f in enumerate(frames):  # natural order: 2 before 10
        Image.fromarray(f).save(folder / f"frame{[2, 10, 100][i]}.png")
    (folder / "notes.txt").write_text("ignored")
    r = video.ClipReader(folder)
    assert r.info.kind == "images" and r.info.fps == 24
    assert np.array_equal(r.read(), frames)
    single = tmp_path / "one.bmp"
    Image.fromarray(frames[0]).save(single)
    assert np.array_equal(video.read_frames(single)[0], frames[:1])
    jpg = tmp_path / "one.jpg"
    Image.fromarray(frames[0]).save(jpg)
    assert video.read_frames(jpg)[0].shape == (1, 20, 30, 3)


# -- bad input: one line naming the file and the problem, exit code 2 -------------------------


def _zero_frame_video(path: Path) -> None:
    with av.open(str(path), "w", format="matroska") as c:
        s = c.add_stream("ffv1", rate=24)
        s.width, s.height, s.pix_fmt = 16, 16, "bgr0"
        c.start_encoding()


def _truncated(tmp_path: Path, ext: str) -> Path:
    full = tmp_path / f"full.{ext}"
    writer = video.write_lossless if ext == "mkv" else video.write_browser
    writer(full, random_frames(n=24, h=32, w=32), 24)
    data = full.read_bytes()
    out = tmp_path / f"truncated.{ext}"
    out.write_bytes(data[: len(data) // 2])
    return out


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


BAD_INPUTS = {
    "empty file": (lambda t: _file(t / "empty.mp4", b""), "empty file"),
    "truncated mp4": (lambda t: _truncated(t, "mp4"), "truncated"),
    "truncated mkv": (lambda t: _truncated(t, "mkv"), "truncated"),
    "text named .mp4": (lambda t: _file(t / "notes.mp4", b"not a video\n"), "not a readable video"),
    "zero-frame video": (lambda t: _zero_frame_video(t / "zero.mkv") or t / "zero.mkv", "no frames"),
    "missing file": (lambda t: t / "missing.mkv", "file not found"),
    "unknown extension": (lambda t: _file(t / "clip.xyz", b"1"), "unsupported file type"),
}


def _mixed_size_folder(t: Path) -> Path:
    d = t / "mixed"
    d.mkdir()
    Image.fromarray(random_frames(n=1, h=8, w=8)[0]).save(d / "a.png")
    Image.fromarray(random_frames(n=1, h=9, w=8)[0]).save(d / "b.png")
    return d


BAD_INPUTS["frames of different sizes"] = (_mixed_size_folder, "'b.png' is 8x9, expected 8x8")


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_video_input_gives_one_line_error_and_exit_2(case, tmp_path, cli):
    make, needle = BAD_INPUTS[case]
    path = make(tmp_path)
    with pytest.raises(VideoError) as exc:
        video.describe(path)
    assert str(path) in str(exc.value) and needle in str(exc.value)
    code, out, err = cli("probe", path)
    assert code == 2
    assert_one_line_error(err, str(path), needle)


@pytest.mark.slow  # Chromium
def test_browser_copy_plays_in_chromium(tmp_path, browser):
    frames, fps = video.read_frames(DATASETS / "canary" / "clips" / "coffee_zoom.mkv")
    video.write_browser(tmp_path / "clip.mp4", frames, fps)
    (tmp_path / "index.html").write_text(
        "<!DOCTYPE html><video id=v src='clip.mp4' muted playsinline></video>"
    )
    page = browser.new_page()
    page.goto((tmp_path / "index.html").as_uri())
    page.wait_for_function("document.getElementById('v').readyState === 4", timeout=20000)
    info = page.evaluate("""async () => {
        const v = document.getElementById('v');
        await v.play();
        await new Promise(r => setTimeout(r, 400));
        return {w: v.videoWidth, h: v.videoHeight, t: v.currentTime, d: v.duration, err: v.error};
    }""")
    page.close()
    assert (info["w"], info["h"]) == (256, 256)
    assert info["err"] is None
    assert info["t"] > 0
    assert abs(info["d"] - len(frames) / float(fps)) < 0.1


def test_intra_clips_split_over_decoders_give_the_frames_of_one_decoder(tmp_path):
    """FFV1 and UT Video clips cut at key frames over several decoders: the same frames, in
    order, as one decoder without threads (bundled FFV1 clips, and a UT Video copy of one)."""
    clips = (
        sorted((DATASETS / "smoke" / "clips").glob("*.mkv"))[:2]
        + sorted((DATASETS / "canary" / "clips").glob("*.mkv"))[:2]
    )
    ut = tmp_path / "clip.nut"
    frames = video.ClipReader(clips[0]).read()
    video.write_lossless(ut, frames[:11], 24, codec="utvideo")
    for p in clips + [ut]:
        one = video.ClipReader(p, threads=1).read()
        for workers in (3, 0):
            split = video.ClipReader(p, threads=workers).read()
            assert split.shape == one.shape and np.array_equal(split, one), (p.name, workers)
    assert np.array_equal(video.ClipReader(ut, threads=2).read(), frames[:11])


def test_split_decoding_of_a_cut_clip_fails_like_one_decoder(tmp_path):
    good = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"
    bad = tmp_path / "cut.mkv"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    msgs = []
    for workers in (1, 3):
        with pytest.raises(VideoError) as e:
            video.ClipReader(bad, threads=workers).read()
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


def test_count_packets_gives_the_decoded_frame_count_without_decoding(tmp_path):
    """An intra-only clip (FFV1, UT Video) is counted from its packets; an H.264 clip and a
    folder of images are decoded: the same count as decoding every frame, for each."""
    src = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"
    frames = video.ClipReader(src).read()
    ut, h264, pngs = tmp_path / "clip.nut", tmp_path / "clip.mp4", tmp_path / "frames"
    video.write_lossless(ut, frames, 24, codec="utvideo")
    video.write_browser(h264, iter(frames), 24)
    pngs.mkdir()
    for i, f in enumerate(frames[:5]):
        Image.fromarray(f).save(pngs / f"{i:03d}.png")
    for p, n in ((src, len(frames)), (ut, len(frames)), (h264, len(frames)), (pngs, 5)):
        assert video.ClipReader(p).count_packets() == video.ClipReader(p).count_frames() == n


#: (file, container, encoder, options, pixel format): inter-coded clips with B-frames or
#: alt-ref frames in the containers whose packets are counted, and two AVIs, which are decoded
PACKET_CASES = [
    ("x264.mp4", "mp4", "libx264", {"bf": "3"}, "yuv420p"),
    ("x264.mkv", "matroska", "libx264", {"bf": "3"}, "yuv420p"),
    ("x265.mp4", "mp4", "libx265", {"x265-params": "log-level=none"}, "yuv420p"),
    ("vp9.webm", "webm", "libvpx-vp9", {}, "yuv420p"),
    ("vp8.webm", "webm", "libvpx", {"auto-alt-ref": "1", "lag-in-frames": "16"}, "yuv420p"),
    ("av1.mkv", "matroska", "libsvtav1", {}, "yuv420p"),
    ("mpeg4.mp4", "mp4", "mpeg4", {"bf": "2"}, "yuv420p"),
    ("prores.mov", "mov", "prores_ks", {}, "yuv422p10le"),
    ("x264.avi", "avi", "libx264", {"bf": "3"}, "yuv420p"),  # decoded
    ("mpeg4.avi", "avi", "mpeg4", {"bf": "2"}, "yuv420p"),  # decoded
]


def _encode(path, fmt, codec, options, pix_fmt, frames):
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=24)
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], pix_fmt
        s.options = options
        for f in frames:
            for pkt in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)


def test_count_packets_of_inter_coded_clips_without_decoding(tmp_path, monkeypatch):
    """H.264, HEVC, VP8/9, AV1, MPEG-4 and ProRes in MP4/MOV, Matroska and WebM are counted
    from their packets, none decoded (issue 48: an import counts its sources); AVI is decoded
    (packed B-frames there put two frames in a packet). Each count equals the decoded one."""
    clip = video.ClipReader(DATASETS / "smoke" / "clips" / "astronaut_pan.mkv").read()[:, :64, :96]
    frames = np.concatenate([clip, clip[::-1]] * 4)[:30]  # 30 frames: GOPs with B-frames
    paths = {}
    for name, fmt, codec, options, pix in PACKET_CASES:
        try:
            av.codec.Codec(codec, "w")
        except Exception:  # an encoder this build of PyAV lacks
            continue
        _encode(tmp_path / name, fmt, codec, options, pix, frames)
        paths[name] = tmp_path / name
    assert {"x264.mp4", "x264.mkv", "x264.avi", "mpeg4.avi"} <= set(paths)
    decoded = {name: video.ClipReader(p).count_frames() for name, p in paths.items()}
    assert all(n == 30 for n in decoded.values()), decoded

    def no_decoding(self):
        raise AssertionError(f"{self.path} decoded")
        yield

    counted = {}
    with monkeypatch.context() as m:
        m.setattr(video.ClipReader, "_decode_video", no_decoding)
        for name, p in paths.items():
            if name not in ("x264.avi", "mpeg4.avi"):
                counted[name] = video.ClipReader(p).count_packets()
    for name in ("x264.avi", "mpeg4.avi"):  # no packet count there: decoded
        counted[name] = video.ClipReader(paths[name]).count_packets()
    assert counted == decoded


def test_count_packets_of_an_empty_or_broken_file_is_one_line_error(tmp_path):
    empty = tmp_path / "empty.mkv"
    video.write_lossless(tmp_path / "one.mkv", np.zeros((1, 16, 16, 3), np.uint8), 24)
    empty.write_bytes((tmp_path / "one.mkv").read_bytes()[:200])
    junk = tmp_path / "junk.mkv"
    junk.write_bytes(b"not a video at all" * 10)
    for p in (empty, junk):
        with pytest.raises(VideoError) as e:
            video.ClipReader(p).count_packets()
        assert str(p) in str(e.value) and "\n" not in str(e.value)


#: (ss, t) of the cuts: between key frames (1.3 s), just before a key frame (1.45 s: an
#: open-GOP cut keeps a frame shown before the key frame that cannot be decoded), the first
#: 1.5 s, and both ends
EDIT_CUTS = [(1.3, None), (1.45, None), (None, 1.5), (0.7, 1.0)]


def test_edit_listed_cuts_read_and_count_as_a_player_shows_them(tmp_path, monkeypatch):
    """MP4/MOV renders cut without re-encoding (``ffmpeg -ss/-t ... -c copy``: an edit list
    hides the frames before the cut that the decoder still needs) are read and counted as
    ffmpeg shows them: the same frames byte for byte, the same count from the packets (none
    decoded but an open GOP's first one), the same declared count where one is declared. H.264
    (closed and open GOP), HEVC, MPEG-4 Part 2, VP9 in MP4 and MJPEG in MOV."""
    import cuts

    def no_decoding(self):
        raise AssertionError(f"{self.path} decoded")
        yield

    seen = {"cut off": 0, "never shown": 0, "declared": 0}
    names = [n for n in cuts.SOURCES if cuts.available(n)]
    assert {"x264", "x264open", "mpeg4", "mjpeg"} <= set(names)
    for name in names:
        src = cuts.encode(tmp_path / f"{name}.{cuts.SOURCES[name][0]}", name)
        mov = [(1.3, None, ".mov")] if name == "x264" else []  # the same cut in MOV
        for ss, t, ext in [(ss, t, src.suffix) for ss, t in EDIT_CUTS] + mov:
            out = cuts.cut(src, tmp_path / f"{name}_{ss}_{t}{ext}", ss, t)
            shown = cuts.player_frames(out)
            assert len(shown) > 0
            if ss is not None:  # nothing before the cut shows (frames are 1/24 s apart)
                assert cuts.number(shown[0]) >= round(ss * 24)
            with monkeypatch.context() as m:
                m.setattr(video.ClipReader, "_decode_video", no_decoding)
                counted = video.ClipReader(out).count_packets()
                declared = video.ClipReader(out).info.frames
            assert counted == len(shown), (out.name, counted, len(shown))
            assert declared in (None, len(shown)), (out.name, declared, len(shown))
            frames = video.ClipReader(out).read()
            assert frames.shape == shown.shape and np.array_equal(frames, shown), out.name
            assert video.ClipReader(out).count_frames() == len(shown)
            total, cut_off = cuts.packets(out)
            seen["cut off"] += cut_off > 0
            seen["never shown"] += total - cut_off != len(shown)
            seen["declared"] += declared is not None
    # the cases this is about did occur: edit lists that hide packets, open-GOP heads with a
    # frame the decoder cannot show, and declared counts checked
    assert seen["cut off"] >= len(names) and seen["never shown"] >= 2 and seen["declared"] >= len(names), seen


@pytest.mark.parametrize("name", ["x264", "x265"])
def test_a_truncated_edit_listed_clip_is_still_refused(tmp_path, name):
    """Bytes cut off the end of an edit-listed MP4 (its index at the front, ``+faststart``, so
    the file still opens) are refused by decoding and by counting alike, in one line naming the
    file; with the index at the end (ffmpeg's default) the index goes first and the file does
    not open at all."""
    import cuts

    if not cuts.available(name):
        pytest.skip(f"this PyAV has no {cuts.SOURCES[name][1]} encoder")
    src = cuts.encode(tmp_path / "src.mp4", name)
    front = cuts.cut(src, tmp_path / "front.mp4", 1.3, None, "-movflags", "+faststart")
    end = cuts.cut(src, tmp_path / "end.mp4", 1.3, None)
    assert video.ClipReader(front).count_packets() == len(cuts.player_frames(front)) == 40
    for whole, keep, needle in (
        (front, lambda d: d[:-30], ("truncated",)),
        (front, lambda d: d[: len(d) * 9 // 10], ("truncated",)),
        (end, lambda d: d[: len(d) * 9 // 10], ("not a readable video", "ends before its first frame")),
    ):
        bad = tmp_path / "bad.mp4"
        bad.write_bytes(keep(whole.read_bytes()))
        for how in ("read", "count_packets"):
            with pytest.raises(VideoError) as e:
                getattr(video.ClipReader(bad), how)()
            msg = str(e.value)
            assert str(bad) in msg and any(n in msg for n in needle) and "\n" not in msg, (how, msg)


def test_clips_that_start_off_a_key_frame_read_and_count_as_a_player_shows_them(tmp_path):
    """A trim that keeps the packets before the next key frame (``-copyinkf``), in MP4 and in
    Matroska: the frames before the key frame cannot be decoded and are not shown; H.264 and
    HEVC drop them, VP9 refuses them (skipped as ffmpeg does). Frames and counts as ffmpeg's."""
    import cuts

    names = [n for n in ("x264", "x265", "vp9") if cuts.available(n)]
    assert "x264" in names
    for name in names:
        src = cuts.encode(tmp_path / f"{name}.mp4", name)
        for ext in (".mp4", ".mkv"):
            out = cuts.trim(src, tmp_path / f"{name}_trim{ext}", 1.3)
            shown = cuts.player_frames(out)
            assert 0 < len(shown) < cuts.packets(out)[0] - cuts.packets(out)[1], out.name  # some never show
            assert video.ClipReader(out).count_packets() == len(shown), out.name
            assert video.ClipReader(out).info.frames in (None, len(shown)), out.name
            frames = video.ClipReader(out).read()
            assert frames.shape == shown.shape and np.array_equal(frames, shown), out.name
