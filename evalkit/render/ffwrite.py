"""A job's lossless clip and browser copy encoded by FFmpeg programs, fed raw frames through a
pipe (``$EVALKIT_RENDER_ENCODER=ffmpeg``; :func:`encoder`).

Why: PyAV's encoding holds the interpreter lock between frames (its frame conversion and
packet muxing are Python). On the H200 (session 13) the 16 files of the canary render's burst
(``EVALKIT_RENDER_WRITES=batch``) took 0.31-0.37 s on 16 threads against 0.04-0.05 s for one
file alone: the threads took turns. Here a thread only writes the frames' bytes into the
program's standard input (the write lets go of the lock) and waits for it to end; the encoding
runs in another process. An FFmpeg program starts in a few milliseconds (no Python, no
imports), unlike a worker process of :mod:`evalkit.render.procwrite`.

The files are those of :func:`evalkit.video.write_lossless` and
:func:`evalkit.video.write_browser`: the same containers, codecs, pixel formats, codec options
and ``bitexact`` flags, the same frame rate; a lossless clip decodes to exactly the frames
given (the bytes may differ: another FFmpeg build), and a browser copy's odd sizes are padded
by repeating the last row or column, as there. ``tests/test_render_ffwrite.py`` checks both
against PyAV's files.

The program is imageio-ffmpeg's (which honours ``$IMAGEIO_FFMPEG_EXE``: a system FFmpeg with
libx264). Asking for it without one is a user error naming the variable.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np

from evalkit.errors import UserError
from evalkit.fsutil import atomic_path
from evalkit.video import browser_target, lossless_target, writer_fps

ENV = "EVALKIT_RENDER_ENCODER"
#: ``pyav``: encoders in this process (the default); ``ffmpeg``: FFmpeg programs
ENCODERS = ("pyav", "ffmpeg")


class FFmpegError(Exception):
    """An FFmpeg program failed: its last message line and exit status, in one line."""


def encoder() -> str:
    """``$EVALKIT_RENDER_ENCODER``: ``pyav`` (unset) or ``ffmpeg`` (which must be found);
    anything else is a one-line user error."""
    value = os.environ.get(ENV, "").strip() or "pyav"
    if value not in ENCODERS:
        raise UserError(f"{ENV}: expected one of {', '.join(ENCODERS)}, found {value!r}")
    if value == "ffmpeg":
        ffmpeg_exe()
    return value


def ffmpeg_exe() -> str:
    """The FFmpeg program (imageio-ffmpeg's, or ``$IMAGEIO_FFMPEG_EXE``); a user error when
    there is none."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as e:  # noqa: BLE001 - ImportError, or its RuntimeError: none found
        raise UserError(f"{ENV}=ffmpeg: no FFmpeg program found (pip install imageio-ffmpeg, "
                        f"or set IMAGEIO_FFMPEG_EXE): {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                        ) from None


def _frames(frames) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames: expected (N, H, W, 3) uint8, found {frames.shape} "
                         f"{frames.dtype}")
    if not len(frames):
        raise ValueError("frames: expected at least one frame, found none")
    return np.ascontiguousarray(frames)


def _options(options: dict) -> list[str]:
    return [a for k, v in options.items() for a in (f"-{k}", str(v))]


def _run(path: Path, frames: np.ndarray, fps: Fraction, output: list[str]) -> int:
    """Encode ``frames`` into ``path`` (atomically) with ``ffmpeg ... -i pipe:0 OUTPUT``."""
    h, w = frames.shape[1:3]
    with atomic_path(path) as tmp, tempfile.TemporaryFile() as log:
        cmd = [ffmpeg_exe(), "-nostats", "-hide_banner", "-loglevel", "error", "-f", "rawvideo",
               "-pix_fmt", "rgb24", "-video_size", f"{w}x{h}", "-framerate", str(fps),
               "-i", "pipe:0", "-map", "0:v", *output, "-y", str(tmp)]
        # a session of its own: a Ctrl-C at the terminal is the render's to handle (it lets
        # the files being written finish, as on PyAV's threads), not the program's
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=log, start_new_session=os.name == "posix")
        try:
            try:
                proc.stdin.write(memoryview(frames).cast("B"))   # the lock let go meanwhile
                proc.stdin.close()
            except BrokenPipeError:
                pass                                # it stopped reading: its status says why
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if rc != 0:
            log.seek(0)
            lines = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else "no message"
            raise FFmpegError(f"ffmpeg exited with status {rc} writing {path.name}: {why}")
    return len(frames)


def write_lossless(path, frames, fps, *, codec: str = "ffv1", threads: int = 0) -> int:
    """:func:`evalkit.video.write_lossless` by an FFmpeg program (``threads``: its encoder's,
    0: FFmpeg's choice). Returns the number of frames."""
    fmt, path = lossless_target(path, codec)
    output = ["-c:v", fmt.codec, *_options(fmt.options), "-pix_fmt", fmt.pix_fmt,
              "-threads", str(int(threads)), "-flags", "+bitexact", "-fflags", "+bitexact",
              "-f", fmt.container]
    return _run(path, _frames(frames), writer_fps(fps), output)


def write_browser(path, frames, fps, encoding=None) -> int:
    """:func:`evalkit.video.write_browser` by an FFmpeg program (H.264 yuv420p +faststart MP4,
    the same :class:`evalkit.video.BrowserEncoding`). Returns the number of frames."""
    from evalkit.video import BROWSER_ENCODING

    encoding = encoding or BROWSER_ENCODING
    path = browser_target(path)
    frames = _frames(frames)
    h, w = frames.shape[1:3]
    if h % 2 or w % 2:                              # as evalkit.video: edge rows repeated
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    opts = encoding.codec_options()
    profile = opts.pop("profile", None)
    output = ["-c:v", encoding.codec, *_options(opts),
              *(["-profile:v", profile] if profile else []), "-pix_fmt", encoding.pix_fmt,
              "-flags", "+bitexact", "-fflags", "+bitexact", "-movflags", "+faststart",
              "-f", "mp4"]
    return _run(path, frames, writer_fps(fps), output)


class ProgramWriter:
    """A render's writer (as :class:`evalkit.render.clipwriter.ClipWriter`): :meth:`write` a
    job's lossless clip (returns its sha256), :meth:`write_browser` its browser copy, each by
    an FFmpeg program."""

    def write(self, path, frames, fps, codec: str) -> str:
        from evalkit.fsutil import sha256_file

        write_lossless(path, frames, fps, codec=codec)
        return sha256_file(path)

    write_browser = staticmethod(write_browser)

    def close(self) -> None:
        """Nothing to stop: each program ends with its file."""
