"""Files written by FFmpeg programs (``EVALKIT_RENDER_ENCODER=ffmpeg``, evalkit.render.ffwrite):
the frames PyAV's writers store (lossless clips exactly, browser copies to within the encoder),
the same frame rate, size and count, a failing program as a one-line job error with no file
left, and a render's run folder that decodes like PyAV's."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from evalkit import video
from evalkit.errors import UserError
from evalkit.formats.run import read_manifest, sha256_file
from evalkit.render import ffwrite
from evalkit.render.driver import render_suite
from evalkit.testing.renderers import Invert

from conftest import DATASETS
from test_render_quiet import two_clip_suite

ROOT = Path(__file__).resolve().parents[1]
SMOOTH = DATASETS / "smoke" / "clips" / "astronaut_pan.mkv"


def noise(n=5, h=33, w=47, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255 ** 2 / mse)


@pytest.mark.parametrize("codec", ["ffv1", "utvideo"])
@pytest.mark.parametrize("fps", [Fraction(24000, 1001), Fraction(25)])
def test_a_lossless_clip_stores_exactly_the_frames_pyav_stores(codec, fps, tmp_path):
    """Odd sizes, NTSC rates: the frames back bit for bit, and the reader sees what it sees in
    PyAV's file (size, rate, codec, duration, frame count)."""
    frames = noise()
    ext = {"ffv1": ".mkv", "utvideo": ".nut"}[codec]
    assert ffwrite.write_lossless(tmp_path / f"f{ext}", frames, fps, codec=codec) == 5
    video.write_lossless(tmp_path / f"p{ext}", frames, fps, codec=codec)
    got, got_fps = video.read_frames(tmp_path / f"f{ext}")
    assert np.array_equal(got, frames) and got_fps == fps
    ours, theirs = video.ClipReader(tmp_path / f"f{ext}").info, video.ClipReader(tmp_path / f"p{ext}").info
    assert (ours.width, ours.height, ours.fps, ours.codec, ours.frames_estimate) == \
        (theirs.width, theirs.height, theirs.fps, theirs.codec, theirs.frames_estimate)
    assert not list(tmp_path.glob(".*"))                # no temporary file left behind


def test_a_browser_copy_matches_pyavs_copy(tmp_path):
    """An odd-sized smooth clip: padded to even sizes by repeating the edge, H.264 High
    yuv420p, the same rate and count as PyAV's copy and as close to the source."""
    frames, fps = video.read_frames(SMOOTH)
    frames = np.ascontiguousarray(frames[:, :63, :61])
    ffwrite.write_browser(tmp_path / "f.mp4", frames, fps)
    video.write_browser(tmp_path / "p.mp4", frames, fps)
    ours, ours_fps = video.read_frames(tmp_path / "f.mp4")
    theirs, theirs_fps = video.read_frames(tmp_path / "p.mp4")
    assert ours.shape == theirs.shape == (len(frames), 64, 62, 3)
    assert ours_fps == theirs_fps == fps
    import av

    with av.open(str(tmp_path / "f.mp4")) as c:
        cc = c.streams.video[0].codec_context
        assert (cc.name, cc.profile, cc.pix_fmt) == ("h264", "High", "yuv420p")
    assert psnr(ours[:, :63, :61], frames) > psnr(theirs[:, :63, :61], frames) - 1.5
    assert psnr(ours, theirs) > 35
    assert abs(ours.astype(np.float64).mean() - theirs.mean()) < 0.5   # no colour shift
    # the padding repeats the last column and row, as PyAV's path does
    assert psnr(ours[:, :, 61], ours[:, :, 60]) > 30 and psnr(ours[:, 63], ours[:, 62]) > 30


def failing_program(tmp_path: Path, after_bytes: int = 0) -> Path:
    """A stand-in FFmpeg that reads some input, says why it fails and exits 1."""
    exe = tmp_path / "ffmpeg"
    exe.write_text("#!/bin/sh\n"
                   f"head -c {after_bytes} >/dev/null\n"
                   "echo 'first line' >&2\n"
                   "echo 'Unknown encoder: simulated' >&2\n"
                   "exit 1\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.mark.parametrize("after_bytes", [0, 100_000])
def test_a_failing_program_is_one_line_and_leaves_no_file(after_bytes, tmp_path, monkeypatch):
    """It stops reading at once or halfway: its last line and status, the file named; nothing
    left where the file would be."""
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(failing_program(tmp_path, after_bytes)))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ffwrite.FFmpegError) as e:
        ffwrite.write_lossless(out / "c.mkv", noise(n=40, h=64, w=64), 24)
    assert str(e.value) == ("ffmpeg exited with status 1 writing c.mkv: Unknown encoder: "
                            "simulated")
    assert list(out.iterdir()) == []


def test_bad_arguments_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="path: lossless ffv1 clips are .mkv files"):
        ffwrite.write_lossless(tmp_path / "c.nut", noise(), 24)
    with pytest.raises(ValueError, match="path: browser copies are .mp4 files"):
        ffwrite.write_browser(tmp_path / "c.mkv", noise(), 24)
    with pytest.raises(ValueError, match="frames: expected at least one frame"):
        ffwrite.write_lossless(tmp_path / "c.mkv", noise(n=0), 24)
    with pytest.raises(ValueError, match=r"frames: expected \(N, H, W, 3\) uint8"):
        ffwrite.write_lossless(tmp_path / "c.mkv", noise().astype(np.float32), 24)
    with pytest.raises(ValueError, match="fps: expected a positive frame rate"):
        ffwrite.write_lossless(tmp_path / "c.mkv", noise(), 0)


def test_the_switch(monkeypatch, tmp_path):
    monkeypatch.delenv(ffwrite.ENV, raising=False)
    assert ffwrite.encoder() == "pyav"                  # the CPU renders: PyAV
    assert ffwrite.encoder(device=True) == "ffmpeg"     # a device renders: programs
    monkeypatch.setenv(ffwrite.ENV, "auto")
    assert (ffwrite.encoder(), ffwrite.encoder(True)) == ("pyav", "ffmpeg")
    monkeypatch.setenv(ffwrite.ENV, "pyav")
    assert ffwrite.encoder(True) == "pyav"
    monkeypatch.setenv(ffwrite.ENV, "ffmpeg")
    assert ffwrite.encoder() == "ffmpeg"
    monkeypatch.setenv(ffwrite.ENV, "gstreamer")
    with pytest.raises(UserError, match="EVALKIT_RENDER_ENCODER: expected one of auto, pyav, "
                                        "ffmpeg, found 'gstreamer'"):
        ffwrite.encoder()


def test_auto_without_a_program_keeps_pyav(monkeypatch):
    monkeypatch.delenv(ffwrite.ENV, raising=False)
    no_program(monkeypatch)
    assert ffwrite.encoder(device=True) == "pyav"


@pytest.mark.parametrize("value", ["-1", "20", "ten"])
def test_a_bad_nice_is_one_line(value, monkeypatch):
    monkeypatch.setenv(ffwrite.NICE_ENV, value)
    with pytest.raises(UserError, match=f"EVALKIT_FFMPEG_NICE: expected a whole number from 0 "
                                        f"to 19, found '{value}'"):
        ffwrite.encoder()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no CPU priorities")
@pytest.mark.parametrize("value", [None, "0", "3"])
def test_programs_run_at_a_lower_priority(value, monkeypatch):
    """The program (here a shell that waits for its input, then reports the priority its own
    children inherit) runs `nice` steps below the render."""
    if value is None:
        monkeypatch.delenv(ffwrite.NICE_ENV, raising=False)
    else:
        monkeypatch.setenv(ffwrite.NICE_ENV, value)
    step = ffwrite.DEFAULT_NICE if value is None else int(value)
    proc = ffwrite._start(["sh", "-c", "cat >/dev/null; cut -d' ' -f19 /proc/self/stat"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = proc.communicate(b"")
    assert int(out) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + step)


def yuv_ffv1(path: Path, frames: np.ndarray) -> Path:
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("ffv1", rate=24)
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for f in frames:
            c.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p")))
        c.mux(s.encode())
    return path


@pytest.mark.parametrize("codec", ["ffv1", "utvideo"])
@pytest.mark.parametrize("size", [(33, 47), (64, 80)])
def test_a_program_decodes_an_exact_rgb_source_to_pyavs_frames(codec, size, tmp_path):
    frames = noise(7, *size)
    path = tmp_path / ("s.mkv" if codec == "ffv1" else "s.nut")
    video.write_lossless(path, frames, Fraction(24000, 1001), codec=codec)
    got = ffwrite.read_exact(path)
    assert got is not None
    assert got[1] == Fraction(24000, 1001)
    assert np.array_equal(got[0], video.ClipReader(path).read())
    assert np.array_equal(got[0], frames)


def test_other_sources_are_left_to_pyav(tmp_path):
    frames = noise(4, 32, 48)
    assert ffwrite.read_exact(yuv_ffv1(tmp_path / "y.mkv", frames)) is None     # converted
    mp4 = tmp_path / "b.mp4"
    video.write_browser(mp4, frames, 24)
    assert ffwrite.read_exact(mp4) is None                                     # lossy
    assert ffwrite.read_exact(tmp_path / "missing.mkv") is None               # its error: PyAV's
    assert ffwrite.read_exact(SMOOTH) is not None


def test_a_source_with_more_frames_than_announced_is_left_to_pyav(tmp_path, monkeypatch):
    path = tmp_path / "s.mkv"
    video.write_lossless(path, noise(6, 16, 16), 24)
    assert ffwrite.read_exact(path) is not None
    real = video.ClipReader.info.fget

    def fewer(self):
        import dataclasses

        i = real(self)
        return dataclasses.replace(i, frames=i.frames_estimate - 1)

    monkeypatch.setattr(video.ClipReader, "info", property(fewer))
    assert ffwrite.read_exact(path) is None


@pytest.mark.parametrize("programs", [True, False])
def test_sources_decoded_by_programs_are_pyavs(programs, tmp_path):
    from evalkit.formats.suite import load_suite
    from evalkit.render.driver import SourceCache
    from evalkit.render.quiet import QuietSources

    suite = load_suite(two_clip_suite(tmp_path))
    for cache in (SourceCache(suite, programs=programs),
                  QuietSources(suite, programs=programs)):
        try:
            for clip in ("pan", "hub"):
                frames, fps, path = cache.get(clip) if isinstance(cache, SourceCache) \
                    else cache._decode(clip, 0)
                ref = video.ClipReader(path)
                assert fps == ref.info.fps and np.array_equal(frames, ref.read())
        finally:
            cache.close()


def runs_decode_alike(a: Path, b: Path) -> None:
    ja, jb = read_manifest(a)["jobs"], read_manifest(b)["jobs"]
    assert [(j["id"], j["status"]) for j in ja] == [(j["id"], j["status"]) for j in jb]
    for x, y in zip(ja, jb):
        if x["status"] != "done":
            continue
        assert x["output"]["sha256"] == sha256_file(a / x["output"]["path"])
        assert {k: v for k, v in x["output"].items() if k != "sha256"} == \
            {k: v for k, v in y["output"].items() if k != "sha256"}
        assert np.array_equal(video.read_frames(a / x["output"]["path"])[0],
                              video.read_frames(b / y["output"]["path"])[0])
        pa, pb = video.read_frames(a / x["preview"])[0], video.read_frames(b / y["preview"])[0]
        assert pa.shape == pb.shape and psnr(pa, pb) > 30


@pytest.mark.parametrize("mode", ["overlap", "batch"])
def test_a_render_with_programs_decodes_like_one_with_pyav(mode, tmp_path, monkeypatch):
    suite = two_clip_suite(tmp_path)
    monkeypatch.setenv("EVALKIT_RENDER_WRITES", mode)
    [a] = render_suite(suite, ["cpu"], tmp_path / "a", renderer=Invert(), progress=False)
    monkeypatch.setenv(ffwrite.ENV, "ffmpeg")
    [b] = render_suite(suite, ["cpu"], tmp_path / "b", renderer=Invert(), progress=False)
    assert (a.done, a.failed) == (b.done, b.failed) == (6, 0)
    runs_decode_alike(b.path, a.path)


def test_a_failing_program_fails_the_job_in_one_line(tmp_path, monkeypatch):
    """Every job fails with the program's reason; no clip or preview stays; a render with a
    working program then resumes them all."""
    suite = two_clip_suite(tmp_path)
    monkeypatch.setenv(ffwrite.ENV, "ffmpeg")
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(failing_program(tmp_path)))
    [s] = render_suite(suite, ["cpu"], tmp_path / "r", renderer=Invert(), progress=False)
    assert (s.done, s.failed) == (0, 6)
    for why in s.failures.values():
        assert why.startswith("writing the clip failed: ffmpeg exited with status 1 writing ")
        assert why.endswith(": Unknown encoder: simulated") and "\n" not in why
    assert [p for p in s.path.rglob("*") if p.suffix in (".mkv", ".mp4")] == []
    monkeypatch.delenv("IMAGEIO_FFMPEG_EXE")
    [again] = render_suite(suite, ["cpu"], tmp_path / "r", renderer=Invert(), progress=False)
    assert (again.done, again.failed) == (6, 0)


def no_program(monkeypatch):
    """imageio-ffmpeg finding no program (its own error, two lines)."""
    import imageio_ffmpeg

    def missing():
        raise RuntimeError("No ffmpeg exe could be found. Install ffmpeg on your system,\n"
                           "or set the IMAGEIO_FFMPEG_EXE environment variable.")

    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", missing)


def test_no_program_found_is_one_line(monkeypatch):
    no_program(monkeypatch)
    with pytest.raises(UserError) as e:
        ffwrite.ffmpeg_exe()
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("EVALKIT_RENDER_ENCODER=ffmpeg: no FFmpeg program found")
    assert "No ffmpeg exe could be found" in str(e.value)


def test_a_missing_program_is_a_user_error_before_anything(tmp_path, monkeypatch):
    suite = two_clip_suite(tmp_path)
    monkeypatch.setenv(ffwrite.ENV, "ffmpeg")
    no_program(monkeypatch)
    with pytest.raises(UserError, match="EVALKIT_RENDER_ENCODER=ffmpeg: no FFmpeg program"):
        render_suite(suite, ["cpu"], tmp_path / "r", renderer=Invert(), progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(os.name != "posix", reason="process groups")
def test_a_ctrl_c_at_the_terminal_lets_the_file_being_written_finish(tmp_path):
    """The terminal's SIGINT goes to the render's process group: the program writing a file
    is not in it (the render stops writing in its own time, as with PyAV's threads)."""
    program = tmp_path / "ffmpeg"
    program.write_text("#!/bin/sh\nsleep 1\nexec cat >/dev/null\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "write.py"
    script.write_text(textwrap.dedent(f"""\
        import signal, sys, threading, numpy as np
        from evalkit.render import ffwrite
        got = []
        signal.signal(signal.SIGINT, lambda *a: got.append("int"))
        print("ready", flush=True)
        ffwrite.write_lossless({str(tmp_path / "c.mkv")!r}, np.zeros((4, 8, 8, 3), np.uint8), 24)
        print("written", got, flush=True)
        """))
    env = {**os.environ, "IMAGEIO_FFMPEG_EXE": str(program), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)                         # the program started, sleeping
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.strip() == "written ['int']"
    assert (tmp_path / "c.mkv").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_SETPIPE_SZ")
def test_the_pipes_to_and_from_a_program_are_wide():
    import fcntl

    proc = ffwrite._start(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        for pipe in (proc.stdin, proc.stdout):
            assert fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ) == min(ffwrite.PIPE_BYTES, limit)
    finally:
        proc.communicate(b"")


def test_a_program_writer_passes_its_threads(tmp_path):
    w = ffwrite.ProgramWriter(threads=1)
    frames = noise(3, 16, 16)
    w.write(tmp_path / "c.mkv", frames, 24, "ffv1")
    assert w.write_browser(tmp_path / "c.mp4", frames, 24) == 3
    assert np.array_equal(video.ClipReader(tmp_path / "c.mkv").read(), frames)


def test_a_device_render_writes_with_programs_in_auto_windows_by_default(tmp_path, monkeypatch):
    """Nothing set: a render on a device (here the CPU taken for one) has FFmpeg programs
    write its files and decode its sources, in ``auto`` windows; the same run folder as a CPU
    render's (PyAV, overlap)."""
    from evalkit.render import driver, quiet

    for var in (ffwrite.ENV, "EVALKIT_RENDER_WRITES"):
        monkeypatch.delenv(var, raising=False)
    suite = two_clip_suite(tmp_path)
    # a device's new run is UT Video (lossless.DEVICE_LOSSLESS): the CPU's made alike by asking
    [a] = render_suite(suite, ["cpu"], tmp_path / "a", renderer=Invert(), progress=False,
                       lossless="utvideo")
    seen = {"modes": [], "writes": 0, "reads": 0}
    real_init, real_write, real_read = quiet.QuietSources.__init__, ffwrite.write_lossless, \
        ffwrite.read_exact

    def init(self, *args, **kw):
        seen["modes"].append((kw.get("mode"), kw.get("programs")))
        real_init(self, *args, **kw)

    def write(*args, **kw):
        seen["writes"] += 1
        return real_write(*args, **kw)

    def read(*args, **kw):
        seen["reads"] += 1
        return real_read(*args, **kw)

    monkeypatch.setattr(driver, "on_device", lambda idents: True)
    monkeypatch.setattr(quiet.QuietSources, "__init__", init)
    monkeypatch.setattr(ffwrite, "write_lossless", write)
    monkeypatch.setattr(ffwrite, "read_exact", read)
    [b] = render_suite(suite, ["cpu"], tmp_path / "b", renderer=Invert(), progress=False)
    assert seen["modes"] == [("auto", True)]
    assert seen["writes"] == 6 and seen["reads"] >= 2
    assert (a.done, b.done) == (6, 6)
    assert read_manifest(b.path)["lossless"]["codec"] == "utvideo"
    runs_decode_alike(b.path, a.path)
