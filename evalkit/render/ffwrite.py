"""A job's lossless clip and browser copy encoded by FFmpeg programs, fed raw frames through a
pipe, and exact-RGB sources decoded by them (:func:`read_exact`): a device render's default
unless ``$EVALKIT_RENDER_ENCODER`` (:func:`encoder`) says otherwise.

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

On the H200 (session 15) a burst of 16 files took 0.11-0.16 s this way against PyAV's
0.21-0.31 s, and the canary render's harness cost +12-16% of the pipeline's own time in
``auto`` windows against +37-40% with PyAV beside the calls (benchmarks/README.md, "Render
overhead"). The programs run :func:`nice` steps below the render.

The program is imageio-ffmpeg's (which honours ``$IMAGEIO_FFMPEG_EXE``: a system FFmpeg with
libx264). Asking for it without one is a user error naming the variable; ``auto`` without one
keeps PyAV.
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
from evalkit.video import browser_target, frame_batch, lossless_target, writer_fps

ENV = "EVALKIT_RENDER_ENCODER"
#: ``auto`` (unset): FFmpeg programs when a device renders and a program is found, else PyAV;
#: ``pyav``: encoders in this process; ``ffmpeg``: FFmpeg programs
ENCODERS = ("auto", "pyav", "ffmpeg")
#: how much lower the programs' CPU priority is than the render's (``nice``'s increment,
#: 0-19): the thread that feeds the device comes first when cores are short
NICE_ENV = "EVALKIT_FFMPEG_NICE"
DEFAULT_NICE = 10
#: (codec, pixel format) of sources whose RGB frames are their samples reordered: a program's
#: rgb24 output is exactly PyAV's frames (tests/test_render_ffwrite.py), so such a source is
#: decoded by a program too (evalkit's lossless clips are FFV1 bgr0 and UT Video gbrp)
EXACT_SOURCES = frozenset({("ffv1", "bgr0"), ("ffv1", "rgb24"), ("utvideo", "gbrp")})


class FFmpegError(Exception):
    """An FFmpeg program failed: its last message line and exit status, in one line."""


def encoder(device: bool = False) -> str:
    """``$EVALKIT_RENDER_ENCODER`` resolved: ``pyav`` or ``ffmpeg``. Unset or ``auto``: FFmpeg
    programs when ``device`` (a GPU renders: the lock is the feeding thread's) and one is
    found, else PyAV (on a few CPU cores the programs' start-up costs more than the lock).
    ``ffmpeg`` without a program, or any other value, is a one-line user error."""
    value = os.environ.get(ENV, "").strip() or "auto"
    if value not in ENCODERS:
        raise UserError(f"{ENV}: expected one of {', '.join(ENCODERS)}, found {value!r}")
    nice()
    if value == "auto":
        if not device:
            return "pyav"
        try:
            ffmpeg_exe()
        except UserError:
            return "pyav"
        return "ffmpeg"
    if value == "ffmpeg":
        ffmpeg_exe()
    return value


def nice() -> int:
    """``$EVALKIT_FFMPEG_NICE`` (default :data:`DEFAULT_NICE`); a user error unless 0-19."""
    raw = os.environ.get(NICE_ENV, "").strip()
    if not raw:
        return DEFAULT_NICE
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise UserError(f"{NICE_ENV}: expected a whole number from 0 to 19, found {raw!r}")
    return value


#: bytes a pipe to or from a program holds (Linux: at most /proc/sys/fs/pipe-max-size, 1 MiB
#: by default; 64 KiB otherwise): each system call moves more, so the thread that moves the
#: frames takes the interpreter lock back fewer times (about 5 instead of 72 for a 256x256
#: clip of 24 frames)
PIPE_BYTES = 1 << 20


def _widen(pipe) -> None:
    try:
        import fcntl
    except ImportError:                     # not on a POSIX system
        return
    if pipe is None or not hasattr(fcntl, "F_SETPIPE_SZ"):
        return
    for size in (PIPE_BYTES, PIPE_BYTES // 4):
        try:
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, size)
            return
        except OSError:                     # above this user's limit: try less, else keep it
            continue


def _start(cmd: list[str], **kw) -> subprocess.Popen:
    """Start a program in a session of its own (a Ctrl-C at the terminal is the render's to
    handle: it lets the files being written finish, as on PyAV's threads, not the program's),
    its CPU priority :func:`nice` lower than this process's. The program is still reading its
    input when the priority drops, before its codec threads start, which inherit it."""
    proc = subprocess.Popen(cmd, start_new_session=os.name == "posix", **kw)
    for pipe in (proc.stdin, proc.stdout):
        _widen(pipe)
    step = nice()
    if step and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid,
                           min(19, os.getpriority(os.PRIO_PROCESS, 0) + step))
        except OSError:                     # it ended already, or not allowed: no harm
            pass
    return proc


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
    frames = frame_batch(frames)
    if not len(frames):
        raise ValueError("frames: expected at least one frame, found none")
    return frames


def _options(options: dict) -> list[str]:
    return [a for k, v in options.items() for a in (f"-{k}", str(v))]


def _run(path: Path, frames: np.ndarray, fps: Fraction, output: list[str]) -> int:
    """Encode ``frames`` into ``path`` (atomically) with ``ffmpeg ... -i pipe:0 OUTPUT``."""
    h, w = frames.shape[1:3]
    with atomic_path(path) as tmp, tempfile.TemporaryFile() as log:
        cmd = [ffmpeg_exe(), "-nostats", "-hide_banner", "-loglevel", "error", "-f", "rawvideo",
               "-pix_fmt", "rgb24", "-video_size", f"{w}x{h}", "-framerate", str(fps),
               "-i", "pipe:0", "-map", "0:v", *output, "-y", str(tmp)]
        proc = _start(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
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


def write_browser(path, frames, fps, encoding=None, *, threads: int = 0) -> int:
    """:func:`evalkit.video.write_browser` by an FFmpeg program (H.264 yuv420p +faststart MP4,
    the same :class:`evalkit.video.BrowserEncoding`; ``threads``: the encoder's, 0: FFmpeg's
    choice). Returns the number of frames."""
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
              "-threads", str(int(threads)),
              "-flags", "+bitexact", "-fflags", "+bitexact", "-movflags", "+faststart",
              "-f", "mp4"]
    return _run(path, frames, writer_fps(fps), output)


class ProgramWriter:
    """A render's writer (as :class:`evalkit.render.clipwriter.ClipWriter`): :meth:`write` a
    job's lossless clip (returns its sha256), :meth:`write_browser` its browser copy, each by
    an FFmpeg program of ``threads`` codec threads (0: FFmpeg's choice: on the H200, codec
    threads shared out among the programs, the cores but one, made the bursts slower, 0.23-0.26
    s against 0.17-0.18 for 16 files, and the calls beside them no faster)."""

    def __init__(self, threads: int = 0):
        self.threads = int(threads)

    def write(self, path, frames, fps, codec: str) -> str:
        from evalkit.fsutil import sha256_file

        write_lossless(path, frames, fps, codec=codec, threads=self.threads)
        return sha256_file(path)

    def write_browser(self, path, frames, fps, encoding=None) -> int:
        return write_browser(path, frames, fps, encoding, threads=self.threads)

    def close(self) -> None:
        """Nothing to stop: each program ends with its file."""


def read_exact(path, threads: int = 0) -> tuple[np.ndarray, Fraction] | None:
    """A source clip's frames ``(N, H, W, 3)`` and frame rate, decoded by an FFmpeg program,
    when its codec and pixel format are in :data:`EXACT_SOURCES` and the program gives exactly
    the frames its header announces; None otherwise (decode it with
    :class:`evalkit.video.ClipReader`, as before). ``threads``: the decoder's (0: FFmpeg's
    choice). The read lets go of the lock."""
    from evalkit.video import ClipReader

    try:
        info = ClipReader(path).info
    except Exception:  # noqa: BLE001 - ClipReader's own decode will say what is wrong
        return None
    count = info.frames_estimate
    if info.kind != "video" or (info.codec, info.pix_fmt) not in EXACT_SOURCES or not count:
        return None
    frame = info.width * info.height * 3
    out = np.empty((count + 1) * frame, np.uint8)    # one frame more: an overrun shows
    cmd = [ffmpeg_exe(), "-nostdin", "-hide_banner", "-loglevel", "error",
           "-threads", str(int(threads)), "-i", str(path),
           "-map", "0:v:0", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    try:
        proc = _start(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                      stderr=subprocess.DEVNULL)
    except OSError:                          # the program would not start: PyAV decodes
        return None
    got = 0
    try:
        view = memoryview(out)
        while got < len(out):
            n = proc.stdout.readinto(view[got:])
            if not n:
                break
            got += n
        if got == len(out):                  # more frames than announced: not ours to trust
            proc.kill()
        proc.stdout.close()
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0 or got != count * frame:
        return None
    return out[:got].reshape(count, info.height, info.width, 3), info.fps
