"""Clips cut the way users cut renders: encoded with PyAV, then cut without re-encoding by the
ffmpeg program imageio-ffmpeg ships (``ffmpeg -ss 1.3 -i in.mp4 -c copy out.mp4``; in MP4/MOV
that writes an edit list), and what a player shows of them: ffmpeg's own decode to raw RGB,
every decoded frame passed through (``-fps_mode passthrough``: no frame repeated or dropped to
hold a constant rate).

Each frame carries its number in 7 black or white blocks (readable after lossy coding), so a
test can name the frames a file shows, besides comparing them byte for byte.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import av
import numpy as np

H, W = 64, 96

#: (name, container, encoder, options, pixel format): inter-coded clips with B-frames, GOPs of
#: 12 frames; the open-GOP ones (x264's ``open-gop``, x265's default CRA key frames) have
#: frames after a key frame that show before it and need the GOP before it
SOURCES = {
    "x264": ("mp4", "libx264", {"bf": "3", "g": "12"}, "yuv420p"),
    "x264open": ("mp4", "libx264", {"bf": "3", "g": "12", "x264-params": "open-gop=1"}, "yuv420p"),
    "x265": ("mp4", "libx265", {"x265-params": "log-level=none:keyint=12:bframes=3"}, "yuv420p"),
    "mpeg4": ("mp4", "mpeg4", {"bf": "2", "g": "12", "qscale": "3"}, "yuv420p"),
    "vp9": ("mp4", "libvpx-vp9", {"g": "12"}, "yuv420p"),
    "mjpeg": ("mov", "mjpeg", {}, "yuvj420p"),
}


def ffmpeg() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def numbered(i: int, shift: int = 0) -> np.ndarray:
    """Frame ``i``: its number in 7 blocks on the top half, a ramp moving ``5 + shift`` px a
    frame below (``shift`` makes another "render" of the same frames)."""
    f = np.full((H, W, 3), 128, np.uint8)
    for b in range(7):
        f[:32, b * 12 + 4 : (b + 1) * 12 + 4] = 255 if (i >> b) & 1 else 0
    f[32:, :, 0] = (np.arange(W) * 2 + i * (5 + shift)) % 256
    return f


def number(frame: np.ndarray) -> int:
    """The number :func:`numbered` wrote in a frame."""
    return sum(1 << b for b in range(7) if frame[4:28, b * 12 + 7 : (b + 1) * 12 + 1].mean() > 128)


def available(name: str) -> bool:
    try:
        av.codec.Codec(SOURCES[name][1], "w")
        return True
    except Exception:  # an encoder this build of PyAV lacks
        return False


def encode(path: Path, name: str, n: int = 72, shift: int = 0) -> Path:
    """Frames 0..n-1 at 24 frames/s in the codec and container of ``SOURCES[name]``."""
    fmt, codec, options, pix = SOURCES[name]
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=24)
        s.width, s.height, s.pix_fmt = W, H, pix
        s.options = options
        for i in range(n):
            for p in s.encode(av.VideoFrame.from_ndarray(numbered(i, shift), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def cut(src: Path, out: Path, ss: float | None = None, t: float | None = None, *flags: str) -> Path:
    """``src`` cut without re-encoding: from ``ss`` seconds (input seeking: the cut starts at
    the key frame before ``ss``; MP4/MOV get an edit list hiding the frames before ``ss``),
    ``t`` seconds long; ``flags``: more output options (``-movflags +faststart``)."""
    cmd = [ffmpeg(), "-v", "error", "-y"]
    cmd += ["-ss", str(ss)] if ss is not None else []
    cmd += ["-i", str(src)]
    cmd += ["-t", str(t)] if t is not None else []
    subprocess.run([*cmd, "-c", "copy", *flags, str(out)], check=True, capture_output=True)
    return out


def trim(src: Path, out: Path, ss: float) -> Path:
    """``src`` from the packet at ``ss`` seconds on, key frame or not (output seeking that keeps
    the frames before the next key frame, ``-copyinkf``: a naive editor's trim)."""
    cmd = [ffmpeg(), "-v", "error", "-y", "-i", str(src), "-ss", str(ss), "-c", "copy", "-copyinkf", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def player_frames(path: Path) -> np.ndarray:
    """What a player shows of a clip: ffmpeg's decode, every frame, as (N, H, W, 3) RGB."""
    out = subprocess.run(
        [ffmpeg(), "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24"]
        + ["-fps_mode", "passthrough", "-"],
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(out, np.uint8).reshape(-1, H, W, 3)


def packets(path: Path) -> tuple[int, int]:
    """``(packets, packets an edit list cuts off)`` of a clip's video stream."""
    with av.open(str(path)) as c:
        flags = [p.is_discard for p in c.demux(c.streams.video[0]) if p.size]
    return len(flags), sum(flags)
