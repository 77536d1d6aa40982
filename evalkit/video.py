"""Video I/O on PyAV: read clips as uint8 RGB frames, write lossless and browser copies.

Readers take video files (mp4, mkv, webm, avi, mov), single images (PNG/JPEG/BMP: a one-frame
clip) and folders of images (frames in natural sort order), and stream frames in chunks so
memory does not grow with the length of a clip.

Writers:
- :func:`write_lossless`: a lossless format of :data:`LOSSLESS_FORMATS`, chosen with ``codec``:
  ``ffv1`` (the default: FFV1 level 3 in Matroska ``.mkv``, packed RGB ``bgr0``; the smallest
  files) or ``utvideo`` (UT Video in NUT ``.nut``, planar RGB ``gbrp``, left prediction;
  1.15-1.5x larger, decodes 6-7x faster). Either way the frames read back are byte-identical to
  those written. This is what evaluation reads.
- :func:`write_browser`: H.264 High profile, ``yuv420p``, ``+faststart`` MP4 with settings fixed
  in :data:`BROWSER_ENCODING`, identical for any two clips shown side by side. Odd sizes are
  padded to even by repeating the last row/column. No metadata beyond the muxer's own.

Every write is atomic (temporary file, then rename).

Decoding uses FFmpeg's own threads (frame threads for intra-only codecs like FFV1, slice
threads where the encoder wrote slices, as UT Video's does); frames are converted to RGB by
FFmpeg whatever the stored pixel format (``bgr0``, ``gbrp``, ``yuv420p``...); :class:`Prefetch` runs a reader in a background
thread, a bounded number of chunks ahead (PyAV releases the GIL while it decodes and converts),
so several clips decode at once and alongside the metric work.
"""

from __future__ import annotations

import collections
import functools
import os
import queue
import re
import threading
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import VideoError
from .fsutil import atomic_path, file_kind
from .lossless import DEFAULT_LOSSLESS, LOSSLESS_FORMATS, LosslessFormat, lossless_format  # noqa: F401

VIDEO_EXTS = {".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".nut"}
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp"}
#: Frame rate given to single images and image folders unless the caller says otherwise.
DEFAULT_IMAGE_FPS = Fraction(24)
#: Largest image read, in pixels (8192 x 8192): a bigger one is refused from its header, before
#: it is decoded (a 20000 x 20000 PNG of a few hundred KB would take gigabytes).
MAX_IMAGE_PIXELS = 8192 * 8192


@dataclass(frozen=True)
class BrowserEncoding:
    """Settings of browser copies. Two clips shown side by side must use the same instance."""

    codec: str = "libx264"
    pix_fmt: str = "yuv420p"
    crf: int = 12  # near-transparent: raters judge the render, not our encoder
    preset: str = "veryfast"  # 2.5x faster than medium at the same CRF; size within 2%
    gop: int = 12  # short GOP: frame-accurate seeking and stepping in the player
    bframes: int = 0  # no reordering: simplest decode path, exact frame stepping
    options: dict = field(default_factory=dict)

    def codec_options(self) -> dict[str, str]:
        opts = {
            "crf": str(self.crf),
            "preset": self.preset,
            "g": str(self.gop),
            "bf": str(self.bframes),
            "profile": "high",
        }
        opts.update({k: str(v) for k, v in self.options.items()})
        return opts


BROWSER_ENCODING = BrowserEncoding()


@dataclass(frozen=True)
class ClipInfo:
    path: Path
    kind: str  # "video", "image" or "images" (a folder)
    width: int
    height: int
    fps: Fraction
    #: declared frame count where the container says (MP4/MOV: its index, less the frames an
    #: edit list hides); None if unknown, or where the first frames may never show
    frames: int | None
    codec: str | None
    duration: float | None = None  # seconds, where the container says
    pix_fmt: str | None = None  # the stream's pixel format, where the header says

    @property
    def frames_estimate(self) -> int | None:
        """The declared frame count, else duration x fps (Matroska declares no count): for
        progress bars, not for checks."""
        if self.frames:
            return self.frames
        return round(self.duration * float(self.fps)) if self.duration else None


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def _image_files(folder: Path) -> list[Path]:
    return sorted(
        (
            p
            for p in folder.iterdir()
            if p.is_file() and p.suffix.lower() in IMAGE_EXTS and not p.name.startswith(".")
        ),
        key=lambda p: _natural_key(p.name),
    )


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise VideoError(path, "file not found")
    if not (path.is_file() or path.is_dir()):  # a FIFO or a device: reading it may never end
        raise VideoError(
            path,
            "not a regular file (expected a video file, an image or a "
            f"folder of images, found {file_kind(path)})",
        )
    if path.is_file() and path.stat().st_size == 0:
        raise VideoError(path, "empty file (0 bytes)")


def _av_error_types():
    import av

    return (av.error.FFmpegError, OSError, ValueError, EOFError)


class _Packets:
    """A video stream's packets, tallied in decode order as the demuxer hands them over.

    An MP4/MOV cut without re-encoding (``ffmpeg -ss 1 -i in.mp4 -c copy out.mp4``, ``-t``, an
    editor's trim) keeps the packets a decoder needs before the cut and an edit list saying
    not to show them: the demuxer flags those packets as discarded and the decoder decodes
    them without returning a frame, as a player does. Every other packet is one frame, except
    in the *head*: a clip that starts on a non-key frame, or whose first key frame is followed
    by frames shown before it (HEVC's leading pictures after a CRA key frame, an open-GOP
    H.264 cut), may hold frames that cannot be decoded and are never shown. :attr:`leading`
    says so; those clips' head is decoded to be counted (:meth:`ClipReader.count_packets`).
    The head: the packets up to the first key frame and at most :data:`HEAD_PACKETS` after it,
    up to the second key frame (frames shown before a key frame follow it at once in decode
    order, before any frame shown after it).
    """

    def __init__(self, keep_head: bool = False):
        self.packets = 0  # non-empty packets
        self.corrupt = 0  # of them, flagged as corrupt (cut short: the file ends inside one)
        self.keys = 0
        self.in_head = True
        self.after_key = 0  # the head's packets after its key frame
        self.head: list | None = [] if keep_head else None  # the head's packets, where kept
        self.head_shown = 0  # the head's packets not discarded
        self.rest_shown = 0  # the other packets not discarded
        self.first_key_pts = None
        self.leading = False

    def add(self, p) -> None:
        if not p.size:  # the demuxer's end-of-stream packet
            return
        self.packets += 1
        self.corrupt += bool(p.is_corrupt)
        if p.is_keyframe:
            self.keys += 1
            if self.keys == 1:
                self.first_key_pts = p.pts
        if self.in_head and self.keys:
            self.after_key += 1
            self.in_head = self.keys == 1 and self.after_key <= HEAD_PACKETS
        if not self.in_head:
            self.rest_shown += not p.is_discard
            return
        if self.head is not None:
            if len(self.head) < MAX_HEAD_KEPT:
                self.head.append(p)
            else:
                self.head = None  # too many to keep: a leading head is decoded whole
        if not p.is_discard:
            self.head_shown += 1
            if (
                self.first_key_pts is None
                or p.pts is None
                or (not p.is_keyframe and p.pts < self.first_key_pts)
            ):
                self.leading = True

    @property
    def shown(self) -> int:
        """Packets not discarded: the frames shown, unless :attr:`leading`."""
        return self.head_shown + self.rest_shown

    @property
    def sure(self) -> int:
        """The frames that decode for certain (the head's left out where :attr:`leading`)."""
        return self.rest_shown + (0 if self.leading else self.head_shown)


#: packets after a clip's first key frame that may be frames shown before it (see
#: :class:`_Packets`): B-frame pyramids reorder at most 16
HEAD_PACKETS = 64
#: packets of a head kept to be decoded; a clip with more before its first key frame is
#: decoded whole where its head has frames that may never show
MAX_HEAD_KEPT = 1024


def _index_discarded(stream) -> int:
    """Samples an MP4/MOV edit list cuts off, from the container's index (none read); 0 where
    the index does not list every sample (Matroska's cues list key frames only)."""
    try:
        entries = stream.index_entries
        if not stream.frames or len(entries) != stream.frames:
            return 0
        return sum(1 for e in entries if e.is_discard)
    except (AttributeError, TypeError):  # a PyAV without index_entries
        return 0


def _head_leading(container, stream) -> bool:
    """Whether a clip's head may hold frames that are never shown (see :class:`_Packets`);
    demuxes the head's packets, decodes none."""
    tally = _Packets()
    for p in container.demux(stream):
        tally.add(p)
        if not tally.in_head:
            break
    return tally.leading


def _load_image(path: Path) -> np.ndarray:
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():  # PIL's own bomb warning: we say it in one line
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(path)
    except Image.DecompressionBombError as e:  # "Image size (N pixels) exceeds ..."
        n = re.search(r"\((\d+) pixels\)", str(e))
        raise VideoError(path, too_large(f"{int(n.group(1)):,} pixels" if n else "")) from None
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise VideoError(path, f"not a readable image ({e.__class__.__name__}: {e})") from None
    if im.width * im.height > MAX_IMAGE_PIXELS:
        im.close()
        raise VideoError(path, too_large(f"{im.width}x{im.height}"))
    if im.format == "PNG" and _png_bit_depth(path) == 16:
        im.close()
        return _load_deep_png(path)
    try:
        with im:
            im.load()
            if im.mode not in ("RGB", "L", "RGBA", "P", "LA"):
                raise VideoError(path, f"unsupported image mode {im.mode}")
            arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise VideoError(path, f"not a readable image ({e.__class__.__name__}: {e})") from None
    return np.ascontiguousarray(arr)


def transparency(path: os.PathLike | str) -> str | None:
    """Where a clip or a folder of frames is not opaque: ``"frame K (<pixel format or image
    mode>)"`` for the first frame with an alpha value below full, or None (no alpha channel,
    or one that is opaque everywhere). Frames are read as RGB, which drops alpha: a caller
    that adopts files says so instead of comparing what the alpha hid. Decodes only when the
    format carries alpha. A file that cannot be read is None here: the reader says why."""
    try:
        return _transparency(Path(path))
    except (OSError, ValueError, SyntaxError, *_image_errors()):
        return None


def _image_errors() -> tuple:
    from PIL import Image, UnidentifiedImageError

    return UnidentifiedImageError, Image.DecompressionBombError


def _transparency(path: Path) -> str | None:
    from PIL import Image

    if path.is_dir():
        for k, f in enumerate(_image_files(path)):
            with Image.open(f) as im:
                if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                    alpha = np.asarray(im.convert("RGBA"))[..., 3]
                    if alpha.min() < 255:
                        return f"frame {k} ({f.name}, {im.mode})"
        return None
    import av

    with av.open(str(path)) as c:
        if not c.streams.video:
            return None
        stream = c.streams.video[0]
        fmt = stream.codec_context.format
        if fmt is None or not any(comp.is_alpha for comp in fmt.components):
            return None
        for k, frame in enumerate(c.decode(stream)):
            if frame.to_ndarray(format="rgba")[..., 3].min() < 255:
                return f"frame {k} ({fmt.name})"
    return None


def _png_bit_depth(path: Path) -> int:
    """The bit depth in a PNG's header (byte 24: the signature, IHDR's length, type, size)."""
    with open(path, "rb") as f:
        head = f.read(25)
    return head[24] if len(head) == 25 else 8


def _load_deep_png(path: Path) -> np.ndarray:
    """A 16-bit PNG (Pillow truncates 16-bit RGB to its high bytes and clips 16-bit gray to
    white): decoded by FFmpeg at its full depth, then rounded to 8 bits (:func:`to_uint8`)."""
    import av

    try:
        with av.open(str(path)) as c:
            frame = next(c.decode(video=0))
            return np.ascontiguousarray(_rgb(frame))
    except (StopIteration, *_av_error_types()) as e:
        raise VideoError(path, f"not a readable image ({e.__class__.__name__}: {e})") from None


def too_large(found: str) -> str:
    return (
        f"frame too large: expected at most {MAX_IMAGE_PIXELS:,} pixels (8192x8192), found {found or 'more'}"
    )


class ClipReader:
    """A clip on disk, read lazily. ``iter(reader)`` yields ``(H, W, 3)`` uint8 RGB frames."""

    def __init__(self, path, *, image_fps: Fraction | float = DEFAULT_IMAGE_FPS, threads: int = 0):
        self.path = Path(path)
        #: decoding threads for videos (0: one per usable core, at most :data:`MAX_DECODERS`):
        #: clips whose frames decode independently (:data:`INDEPENDENT_FRAMES`: FFV1, UT Video)
        #: in this many independent decoders (:func:`_decode_parallel`), other codecs in
        #: FFmpeg's own threads; 1: one decoder, no threads
        self.threads = int(threads)
        self.image_fps = Fraction(image_fps).limit_denominator(1001 * 1000)
        _check_exists(self.path)
        if self.path.is_dir():
            self.kind = "images"
            self._images = _image_files(self.path)
            if not self._images:
                raise VideoError(self.path, "folder holds no PNG/JPEG/BMP frames")
        else:
            ext = self.path.suffix.lower()
            if ext in IMAGE_EXTS:
                self.kind = "image"
                self._images = [self.path]
            elif ext in VIDEO_EXTS:
                self.kind = "video"
                self._images = []
            else:
                raise VideoError(
                    self.path,
                    f"unsupported file type '{ext or '(none)'}' (expected a video "
                    f"{'/'.join(sorted(VIDEO_EXTS))}, an image {'/'.join(sorted(IMAGE_EXTS))} "
                    "or a folder of images)",
                )
        self._info: ClipInfo | None = None

    # -- probing ---------------------------------------------------------------------------
    @property
    def info(self) -> ClipInfo:
        if self._info is None:
            self._info = self._probe()
        return self._info

    def _probe(self) -> ClipInfo:
        if self.kind != "video":
            first = _load_image(self._images[0])
            return ClipInfo(
                self.path, self.kind, first.shape[1], first.shape[0], self.image_fps, len(self._images), None
            )
        import av

        try:
            with av.open(str(self.path)) as c:
                if not c.streams.video:
                    raise VideoError(self.path, "no video frames (the file has no video stream)")
                s = c.streams.video[0]
                fps = s.average_rate or s.guessed_rate or s.base_rate
                if not fps:
                    raise VideoError(self.path, "frame rate unknown")
                duration = c.duration / 1_000_000 if c.duration else None
                if duration is not None and c.format.name == "nut":
                    # NUT's demuxer gives the last frame's start time (no frame count, no
                    # duration in the file): the clip lasts one frame longer
                    duration += 1 / float(fps)
                ctx = s.codec_context
                # the frames a player shows: an edit list's cut-off samples are left out; a
                # clip whose head may hold frames that never show has no count declared
                frames = (s.frames - _index_discarded(s)) or None
                if frames and _head_leading(c, s):
                    frames = None
                return ClipInfo(
                    self.path,
                    "video",
                    ctx.width,
                    ctx.height,
                    Fraction(fps),
                    frames,
                    ctx.name,
                    duration,
                    ctx.format.name if ctx.format is not None else None,
                )
        except _av_error_types() as e:
            raise VideoError(self.path, f"not a readable video ({_short(e)})") from None

    # -- decoding --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[np.ndarray]:
        if self.kind == "video":
            yield from self._decode_video()
            return
        expected = None
        for p in self._images:
            frame = _load_image(p)
            if expected is None:
                expected = (frame.shape, p)
            elif frame.shape != expected[0]:
                h, w = frame.shape[:2]
                eh, ew = expected[0][:2]
                raise VideoError(
                    self.path,
                    f"frame '{p.name}' is {w}x{h}, expected {ew}x{eh} like '{expected[1].name}'",
                )
            yield frame

    def _decode_video(self) -> Iterator[np.ndarray]:
        import av

        n = 0
        size = None
        last_end = None
        try:
            with av.open(str(self.path)) as c:
                if not c.streams.video:
                    raise VideoError(self.path, "no video frames (the file has no video stream)")
                s = c.streams.video[0]
                w, h = s.codec_context.width, s.codec_context.height
                if w * h > MAX_IMAGE_PIXELS:
                    raise VideoError(self.path, too_large(f"{w}x{h}"))
                declared = s.frames or None  # samples in the index, cut-off ones included
                cut_off = _index_discarded(s)
                tally = None
                fps = s.average_rate or s.guessed_rate
                duration = c.duration / 1_000_000 if c.duration else None  # AV_TIME_BASE
                workers = self.threads or min(MAX_DECODERS, usable_cores())
                if s.codec_context.name in INDEPENDENT_FRAMES and workers > 1:
                    frames = _decode_parallel(c, s, workers)
                else:
                    s.codec_context.thread_type = "AUTO"  # frame and slice threads
                    s.codec_context.thread_count = self.threads
                    tally = _Packets()
                    frames = _decode_tallied(c, s, tally)
                try:
                    for time, arr in frames:
                        if size is None:
                            size = arr.shape
                        elif arr.shape != size:
                            raise VideoError(
                                self.path,
                                f"frame {n} is {arr.shape[1]}x{arr.shape[0]}, expected {size[1]}x{size[0]}",
                            )
                        if time is not None and fps:
                            last_end = time + 1 / float(fps)
                        n += 1
                        yield arr
                finally:
                    frames.close()
        except VideoError:
            raise
        except _av_error_types() as e:
            if n == 0 and isinstance(e, EOFError):
                raise VideoError(
                    self.path, "video has no frames (the file ends before its first frame)"
                ) from None
            where = f" at frame {n}" if n else ""
            raise VideoError(self.path, f"not a readable video{where} ({_short(e)})") from None
        if n == 0:
            raise VideoError(self.path, "video has no frames")
        if tally is None:  # decoded in parallel (intra-only codecs): every packet a frame
            short = declared and n < declared - cut_off
        else:
            # fewer packets than the index lists, one cut short, or fewer frames than the
            # packets that must decode (an edit list's cut-off packets show no frame)
            # (where the container declares a count: elsewhere, as in Matroska, a packet may
            # hold no frame, so the declared duration is what is checked)
            short = (declared and (tally.packets < declared or n < tally.sure)) or tally.corrupt
        if short:
            if declared and n < declared - cut_off:
                raise VideoError(
                    self.path,
                    f"truncated: the container declares {declared - cut_off} frames, only {n} could be decoded",
                )
            raise VideoError(
                self.path, f"truncated: the file ends inside its last frames ({n} frames decoded)"
            )
        if duration and fps and last_end is not None:
            missing = (duration - last_end) * float(fps)
            if missing > 1.5:
                raise VideoError(
                    self.path,
                    f"truncated: the container declares {duration:.3f} s, "
                    f"frames end at {last_end:.3f} s ({n} frames decoded)",
                )

    def chunks(self, size: int = 16) -> Iterator[np.ndarray]:
        """Yield ``(n, H, W, 3)`` uint8 arrays of at most ``size`` frames."""
        if size < 1:
            raise ValueError(f"size: expected a positive integer, found {size!r}")
        buf: list[np.ndarray] = []
        for frame in self:
            buf.append(frame)
            if len(buf) == size:
                yield np.stack(buf)
                buf = []
        if buf:
            yield np.stack(buf)

    def read(self) -> np.ndarray:
        """All frames as one ``(N, H, W, 3)`` uint8 array (for short clips)."""
        return np.concatenate(list(self.chunks(64)))

    def count_frames(self) -> int:
        """The clip's frames, each one decoded (a damaged or truncated clip raises)."""
        return sum(1 for _ in self)

    def count_packets(self) -> int:
        """The clip's frames counted from its packets, none decoded, where every packet is one
        frame: a codec of :data:`INDEPENDENT_FRAMES` in any container, or a codec of
        :data:`PACKET_FRAME_CODECS` in a container of :data:`PACKET_FRAME_FORMATS` (MP4/MOV,
        Matroska/WebM, NUT: one access unit a packet, B-frames included; the packets an MP4
        edit list cuts off are flagged as discarded and not counted, as the decoder drops
        them; a clip whose head may hold frames that never show, a cut that starts off a key
        frame or before an open GOP's leading frames, has its head decoded, :class:`_Packets`).
        Bytes missing at the end (fewer packets than the container's index lists, or the last
        one cut short) raise :class:`VideoError` ("truncated"). Other clips (MPEG-TS, raw
        streams, AVI's packed B-frames, image folders) are decoded (:meth:`count_frames`). What
        the frames hold is not checked: for a clip whose count is all that is needed (an
        import's or a ``command`` job's source)."""
        codec = self.info.codec
        if self.kind != "video" or (codec not in INDEPENDENT_FRAMES and codec not in PACKET_FRAME_CODECS):
            return self.count_frames()
        import av

        n = None
        try:
            with av.open(str(self.path)) as c:
                if codec in INDEPENDENT_FRAMES or c.format.name in PACKET_FRAME_FORMATS:
                    s = c.streams.video[0]
                    tally = _Packets(keep_head=True)
                    for p in c.demux(s):
                        tally.add(p)
                    declared = s.frames or None
                    if declared and tally.packets < declared:
                        raise VideoError(
                            self.path,
                            f"truncated: the container declares {declared - _index_discarded(s)} frames, "
                            f"only {tally.shown} are in the file",
                        )
                    if tally.corrupt:
                        raise VideoError(self.path, "truncated: the file ends inside its last frame's data")
                    n = tally.shown
                    if tally.leading and tally.head is not None:  # the head decoded: what shows of it
                        head, shown = _Packets(), 0
                        for p in tally.head:
                            head.add(p)
                            shown += len(_decode_packet(p, head, shown > 0))
                        n = tally.rest_shown + shown + len(s.codec_context.decode(None))
                    elif tally.leading:  # a head too long to keep: the whole clip decoded
                        n = None
        except VideoError:
            raise
        except _av_error_types() as e:
            raise VideoError(self.path, f"not a readable video ({_short(e)})") from None
        if n is None:
            return self.count_frames()
        if n == 0:
            raise VideoError(self.path, "video has no frames")
        return n


#: decoders' names (``codec_context.name``) whose every packet in the containers of
#: :data:`PACKET_FRAME_FORMATS` holds one displayed frame (tests/test_video.py encodes each
#: that this machine's PyAV can write, B-frames, alt-ref frames and an edit-list cut included,
#: and checks the packets against the decoded frames)
PACKET_FRAME_CODECS = frozenset(
    {
        "h264",
        "hevc",
        "vp8",
        "vp9",
        "av1",
        "libdav1d",
        "libaom-av1",
        "mpeg4",
        "prores",
        "mjpeg",
        "dnxhd",
        "rawvideo",
        "png",
        "qtrle",
        "ffv1",
        "utvideo",
    }
)
#: demuxers (``container.format.name``) that hand over one frame a packet
PACKET_FRAME_FORMATS = frozenset({"mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "nut"})


#: codecs whose key frames decode independently of each other and without reordering: a clip
#: in one of them is cut at its key frames (every frame of the lossless clips we write is one)
#: and decoded by several decoders at once (:func:`_decode_parallel`)
INDEPENDENT_FRAMES = frozenset({"ffv1", "utvideo"})
#: key frames per task of :func:`_decode_parallel` (fewer hand-offs for cheap frames)
GROUP_FRAMES = 4
#: decoders of one reader by default (``threads=0``): at most ``(MAX_DECODERS + 2) *
#: GROUP_FRAMES`` frames are in flight (40 frames: 240 MB at 1080p)
MAX_DECODERS = 8


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _rgb(frame) -> np.ndarray:
    """A decoded frame as (H, W, 3) uint8 RGB. ``threads=1``: FFmpeg would otherwise build a
    pool of one swscale thread per core for every frame (3.1 ms instead of 1.2 for a 720p
    frame, measured); the decoding threads are what use the cores. A frame of more than 8 bits
    a component (16-bit PNGs, ``rgb48``/``gray16``/``yuv*p16`` clips...) is converted to 16-bit
    RGB, then rounded to 8 bits by :func:`to_uint8` (FFmpeg's own 8-bit conversion truncates)."""
    if _deep(frame.format.name):
        return to_uint8(frame.to_ndarray(format="rgb48le", threads=1))
    return frame.to_ndarray(format="rgb24", threads=1)


@functools.lru_cache(maxsize=None)
def _deep(pix_fmt: str) -> bool:
    """Whether a pixel format holds more than 8 bits in a component."""
    import av

    return max(c.bits for c in av.VideoFormat(pix_fmt).components) > 8


def to_uint8(frames16: np.ndarray) -> np.ndarray:
    """16-bit values as 8-bit ones, each the nearest: ``round(v * 255 / 65535)``, exact in
    integers (``(v * 255 + 32767) // 65535``; ``v * 255 / 65535`` is never halfway between two
    integers, so there are no ties). The pipeline is 8-bit: a 16-bit input is measured and
    stored at the nearest 8-bit value, never clipped."""
    x = frames16.astype(np.uint32)
    return ((x * 255 + 32767) // 65535).astype(np.uint8)


def _decode_tallied(container, stream, tally: _Packets) -> Iterator[tuple[float | None, np.ndarray]]:
    """``(time, RGB frame)`` of ``stream`` with FFmpeg's decoder (as ``container.decode``; an
    edit list's cut-off packets show no frame), each packet tallied in ``tally``."""
    started = False
    for packet in container.demux(stream):
        tally.add(packet)
        for f in _decode_packet(packet, tally, started):
            started = True
            yield f.time, _rgb(f)


def _decode_packet(packet, tally: _Packets, started: bool) -> list:
    """A packet's frames. A clip that starts on frames its decoder refuses (a VP9 cut that
    starts after its key frame) shows nothing of them, as in ffmpeg: before the first frame,
    in a head that starts off a key frame (:attr:`_Packets.leading`), those errors are
    skipped (with frame threads they surface a few packets late)."""
    import av

    try:
        return packet.decode()
    except av.error.InvalidDataError:
        if started or not packet.size or not (tally.in_head and tally.leading):
            raise
        return []


def _decode_parallel(container, stream, workers: int) -> Iterator[tuple[float | None, np.ndarray]]:
    """``(time, RGB frame)`` of ``stream`` in order, decoded by ``workers`` decoders at once.

    Why: one decoder with FFmpeg's frame threads decodes one 720p UT Video clip at about 276
    frames/s on the H200's 16 cores, and four of them (both clips of a pair, the next pair
    ahead) about 406 frames/s in all, with most cores idle (``bench_scale.py --decode``). Here
    the demuxer (this thread) cuts the packets into groups of :data:`GROUP_FRAMES` key frames;
    a group goes to a pool thread whose own single-threaded decoder decodes it, drains it and
    is reset, so no decoder state crosses a group, and the frames come back in packet order,
    byte-identical to one decoder's. PyAV releases the GIL while it decodes and converts. At
    most ``workers + 2`` groups are in flight (memory stays bounded); every pool thread is
    joined before this returns.
    """
    from concurrent.futures import ThreadPoolExecutor

    import av

    cc = stream.codec_context
    local = threading.local()

    def decode(packets):
        ctx = getattr(local, "ctx", None)
        if ctx is None:
            ctx = local.ctx = av.CodecContext.create(cc.name, "r")
            ctx.extradata = cc.extradata
            ctx.width, ctx.height = cc.width, cc.height
            if cc.codec_tag:
                ctx.codec_tag = cc.codec_tag  # UT Video reads its planes' layout from it
            ctx.thread_count = 1
        out = []
        for p in packets + [None]:  # None: drain
            for f in ctx.decode(p):
                out.append((f.time, _rgb(f)))
        ctx.flush_buffers()
        return out

    pending: collections.deque = collections.deque()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="evalkit-decode")
    try:
        group: list = []
        keys = 0
        for packet in container.demux(stream):
            if packet.size == 0:  # the demuxer's end-of-stream packet
                continue
            if packet.is_keyframe:
                if keys == GROUP_FRAMES:
                    pending.append(pool.submit(decode, group))
                    group, keys = [], 0
                    while len(pending) > workers + 1:
                        yield from pending.popleft().result()
                keys += 1
            group.append(packet)
        if group:
            pending.append(pool.submit(decode, group))
        while pending:
            yield from pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)


class Prefetch:
    """Iterate ``items`` (an iterator, e.g. :meth:`ClipReader.chunks`) in a background thread
    that stays at most ``depth`` items ahead of the consumer, so memory stays bounded.

    The thread starts at construction: make one for the next clip while the current one is
    measured and its first chunks are ready when they are needed. An exception raised by the
    iterator is raised by the consumer's ``next`` (the same exception, with its message).
    :meth:`close` (or leaving a ``with`` block) stops the thread at its next item.
    """

    _DONE = object()

    def __init__(self, items, depth: int = 2, name: str = "evalkit-decode"):
        if depth < 1:
            raise ValueError(f"depth: expected a positive integer, found {depth!r}")
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._items = items
        self._finished = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for item in self._items:
                if not self._put(("ok", item)):
                    return
            self._put(("ok", self._DONE))
        except BaseException as e:  # handed to the consumer, raised there
            self._put(("err", e))
        finally:
            close = getattr(self._items, "close", None)
            if close is not None and self._stop.is_set():
                try:
                    close()
                except (ValueError, RuntimeError):  # a generator still running elsewhere
                    pass

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        kind, item = self._q.get()
        if kind == "err":
            self._finished = True
            raise item
        if item is self._DONE:
            self._finished = True
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()
        self._finished = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
    # PyAV errors repeat the file name at the end: "...: 'path'"; drop it, we name the file.
    msg = re.sub(r"^\[Errno -?\d+\]\s*", "", msg)
    return re.sub(r":\s*'[^']*'$", "", msg)


def open_clip(path, **kw) -> ClipReader:
    return ClipReader(path, **kw)


def read_frames(path, **kw) -> tuple[np.ndarray, Fraction]:
    """Read a whole clip: ``(frames (N, H, W, 3) uint8, fps)``."""
    r = ClipReader(path, **kw)
    frames = r.read()
    return frames, r.info.fps


def shape_only(frames: int, height: int, width: int) -> np.ndarray:
    """A read-only ``(frames, height, width, 3)`` uint8 array that holds no frames (one black
    pixel, broadcast: 3 bytes whatever the shape): a clip's shape where its pixels are not
    needed (the sources of an import, a clip already written)."""
    return np.broadcast_to(np.zeros((1, 1, 1, 3), np.uint8), (int(frames), int(height), int(width), 3))


# -- writing -------------------------------------------------------------------------------


def _as_frames(frames) -> Iterator[np.ndarray]:
    if isinstance(frames, np.ndarray):
        if frames.ndim == 3:
            frames = frames[None]
        if frames.ndim != 4:
            raise ValueError(f"frames: expected (N, H, W, 3) uint8, found shape {frames.shape}")
        frames = iter(frames)
    for i, f in enumerate(frames):
        f = np.asarray(f)
        if f.ndim != 3 or f.shape[2] != 3 or f.dtype != np.uint8:
            raise ValueError(f"frames[{i}]: expected (H, W, 3) uint8, found {f.dtype} {f.shape}")
        yield f


def frame_batch(frames) -> np.ndarray:
    """Frames handed to a writer as one contiguous ``(N, H, W, 3)`` uint8 array (one
    ``(H, W, 3)`` frame becomes a batch of one); a ValueError naming ``frames`` otherwise."""
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = frames[None]
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames: expected (N, H, W, 3) uint8, found {frames.dtype} {frames.shape}")
    return np.ascontiguousarray(frames)


def writer_fps(fps) -> Fraction:
    """A writer's frame rate: ``fps`` as a fraction (NTSC rates exact), a ValueError naming
    ``fps`` unless positive. Every writer of clips takes its rate from here."""
    fps = Fraction(fps).limit_denominator(1001 * 1000)
    if fps <= 0:
        raise ValueError(f"fps: expected a positive frame rate, found {fps}")
    return fps


def lossless_target(path, codec: str):
    """``(format, path)`` of a lossless clip to write: the :class:`LosslessFormat` named
    ``codec`` and ``path`` as a Path, a ValueError naming ``path`` unless its extension is the
    format's."""
    fmt = lossless_format(codec)
    path = Path(path)
    if path.suffix.lower() != fmt.ext:
        raise ValueError(f"path: lossless {fmt.name} clips are {fmt.ext} files, found {str(path)!r}")
    return fmt, path


def browser_target(path) -> Path:
    """``path`` of a browser copy to write, a ValueError naming ``path`` unless it is .mp4."""
    path = Path(path)
    if path.suffix.lower() != ".mp4":
        raise ValueError(f"path: browser copies are .mp4 files, found {path.name!r}")
    return path


def _encode(
    path: Path,
    frames,
    fps,
    *,
    fmt: str,
    codec: str,
    pix_fmt: str,
    options: dict,
    container_options: dict | None = None,
    pad_even: bool = False,
) -> int:
    import av

    fps = writer_fps(fps)
    n = 0
    # bitexact: no random segment ids, dates or encoder version strings in the file, so the
    # same frames always give the same bytes (and nothing in the file says where it was made)
    container_options = {"fflags": "+bitexact", **(container_options or {})}
    options = {"flags": "+bitexact", **options}
    with atomic_path(path) as tmp:
        with av.open(str(tmp), "w", format=fmt, options=container_options) as c:
            stream = None
            size = None
            for f in _as_frames(frames):
                if pad_even and (f.shape[0] % 2 or f.shape[1] % 2):
                    f = np.pad(f, ((0, f.shape[0] % 2), (0, f.shape[1] % 2), (0, 0)), mode="edge")
                if stream is None:
                    size = f.shape
                    stream = c.add_stream(codec, rate=fps, options=options)
                    stream.width, stream.height = f.shape[1], f.shape[0]
                    stream.pix_fmt = pix_fmt
                elif f.shape != size:
                    raise ValueError(
                        f"frames[{n}]: size {f.shape[1]}x{f.shape[0]} differs from "
                        f"frame 0 ({size[1]}x{size[0]})"
                    )
                vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
                vf.pts = n
                vf.time_base = 1 / fps
                for packet in stream.encode(vf):
                    c.mux(packet)
                n += 1
            if stream is None:
                raise ValueError("frames: expected at least one frame, found none")
            for packet in stream.encode():
                c.mux(packet)
    return n


def write_lossless(path, frames, fps, *, codec: str = DEFAULT_LOSSLESS) -> int:
    """Write frames losslessly in the format ``codec`` (:data:`LOSSLESS_FORMATS`: ``ffv1`` in
    ``.mkv``, ``utvideo`` in ``.nut``; the path's extension must be the format's). Returns the
    number of frames. Any size, odd included."""
    fmt, path = lossless_target(path, codec)
    return _encode(
        path, frames, fps, fmt=fmt.container, codec=fmt.codec, pix_fmt=fmt.pix_fmt, options=dict(fmt.options)
    )


def write_browser(path, frames, fps, encoding: BrowserEncoding = BROWSER_ENCODING) -> int:
    """Write a browser copy (H.264 yuv420p +faststart MP4). Returns the number of frames."""
    path = browser_target(path)
    return _encode(
        path,
        frames,
        fps,
        fmt="mp4",
        codec=encoding.codec,
        pix_fmt=encoding.pix_fmt,
        options=encoding.codec_options(),
        container_options={"movflags": "+faststart"},
        pad_even=True,
    )


def describe(path) -> dict:
    """Decode a whole clip and describe it (errors name the file and the problem)."""
    reader = ClipReader(path)
    n = reader.count_frames()
    info = reader.info
    return {
        "path": str(info.path),
        "kind": info.kind,
        "width": info.width,
        "height": info.height,
        "fps": str(info.fps),
        "frames": n,
        "codec": info.codec,
    }
