"""Lossless trial media (``study create --delivery lossless``): each trial's tiled frames (the
same frames, layout, gutters and tile order as :mod:`.media`'s trial stream) as one animated
lossless WebP, ``MEDIA/<sha256>.webp``; the rater page decodes it with WebCodecs'
``ImageDecoder`` and paints every box from one decoded frame on a canvas: raters see the
rendered pixels, exact (tests/test_lossless_delivery.py reads them back in Chromium).

**Why WebP.** Measured on this project's 2-core CPU (``benchmarks/bench_lossless_delivery.py``):
a 720p ABX trial frame (3904x752, three tiles) encodes losslessly with Pillow in 146 ms to
1.36 MB as WebP (effort 0, method 0), in 165 ms to 2.13 MB as PNG (zlib level 1) and 567 ms
to 1.48 MB at PNG's default level; greater WebP effort saves 5-22% of the bytes for 6-9x the
time. APNG was also dropped for blindness: deflate's 32 kB window reaches across tiles of one
row, so the size of a PNG frame tells whether the two equal tiles of an ABX trial are
neighbours (+5% when they are not); WebP at effort 0 finds no such matches (its tiles' order
changes a frame's size by under 0.1%, as the attacker suite checks).

**The file.** Written here, not by Pillow's animation encoder (which drops a frame equal to the
previous one and codes sub-rectangles of what changed: the frame count and the rectangles would
depend on the content): ``RIFF``/``WEBP``, ``VP8X`` (animation, no alpha), ``ANIM`` (loop
forever), then one ``ANMF`` per frame, each the whole canvas, no blending, no disposal, its
duration the frame's (1000/fps ms, rounded), holding one ``VP8L`` bitstream (Pillow's lossless
still encoder, effort 0, method 0). Every file's structure is the same function of the canvas
size and frame count; only the VP8L chunks' lengths and bytes depend on the content (of every
tile together). The page paints frame ``k`` at ``k / fps`` from its own clock (the durations are
for other viewers).
"""

from __future__ import annotations

import io
import struct

import numpy as np

#: the file extension and HTTP type of each delivery's trial media
EXT = {"stream": ".mp4", "lossless": ".webp"}
MIME = {".mp4": "video/mp4", ".webp": "image/webp"}
DELIVERIES = tuple(EXT)
#: what raters see, by delivery (the verdict names it)
SEEN = {"stream": "as delivered: H.264 4:2:0 QP 12", "lossless": "lossless: the rendered pixels"}
#: Pillow's lossless WebP settings of every frame: effort 0 ("quality" is effort when lossless)
#: and method 0, the fastest (see the module's text)
WEBP_OPTIONS = {"lossless": True, "quality": 0, "method": 0, "exact": True}


def delivery_of(config: dict | None) -> str:
    """A study's delivery (``config["delivery_mode"]``; a study made before there was a choice
    was streamed)."""
    return (config or {}).get("delivery_mode") or "stream"


def ext_of(config: dict | None) -> str:
    """The extension of a study's media files (:data:`EXT`)."""
    return EXT[delivery_of(config)]


def _chunk(tag: bytes, data: bytes) -> bytes:
    return tag + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")


def _u24(v: int) -> bytes:
    return struct.pack("<I", v)[:3]


def vp8l(frame: np.ndarray) -> bytes:
    """One RGB frame (``(H, W, 3)`` uint8) as a lossless VP8L bitstream (no RIFF header)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame), "RGB").save(buf, "WEBP", **WEBP_OPTIONS)
    data = buf.getvalue()
    # RIFF size WEBP, then chunks: take the VP8L one (Pillow writes it alone for an RGB still)
    i = 12
    while i + 8 <= len(data):
        tag, n = data[i : i + 4], struct.unpack("<I", data[i + 4 : i + 8])[0]
        if tag == b"VP8L":
            return data[i + 8 : i + 8 + n]
        i += 8 + n + (n & 1)
    raise RuntimeError("Pillow's WebP encoder wrote no lossless (VP8L) chunk")


class AnimatedWebP:
    """Writes an animated lossless WebP frame by frame to a file object (see the module's text);
    :meth:`close` writes the RIFF size."""

    def __init__(self, f, width: int, height: int, fps):
        if not (1 <= width <= 16384 and 1 <= height <= 16384):
            raise ValueError(f"webp: canvas {width}x{height} is beyond WebP's 16384x16384")
        self.f, self.width, self.height, self.frames = f, width, height, 0
        self.duration = max(1, min(0xFFFFFF, round(1000 / float(fps))))
        f.write(b"RIFF\0\0\0\0WEBP")
        f.write(_chunk(b"VP8X", bytes([0x02, 0, 0, 0]) + _u24(width - 1) + _u24(height - 1)))
        f.write(_chunk(b"ANIM", b"\0\0\0\0" + struct.pack("<H", 0)))
        self.size = 4 + 18 + 14  # "WEBP" and the two chunks

    def add(self, frame: np.ndarray) -> None:
        if frame.shape != (self.height, self.width, 3) or frame.dtype != np.uint8:
            raise ValueError(
                f"webp frame: expected ({self.height}, {self.width}, 3) uint8, "
                f"found {frame.dtype} {frame.shape}"
            )
        head = (
            _u24(0)
            + _u24(0)
            + _u24(self.width - 1)
            + _u24(self.height - 1)
            + _u24(self.duration)
            + bytes([0x02])
        )  # no blending, no disposal
        c = _chunk(b"ANMF", head + _chunk(b"VP8L", vp8l(frame)))
        self.f.write(c)
        self.size += len(c)
        self.frames += 1

    def close(self) -> None:
        self.f.seek(4)
        self.f.write(struct.pack("<I", self.size))
        self.f.seek(0, 2)


def write_webp(path, frames, fps) -> int:
    """Write ``frames`` (an iterable of ``(H, W, 3)`` uint8) as one animated lossless WebP;
    returns the frame count."""
    with open(path, "wb") as f:
        w = None
        for fr in frames:
            if w is None:
                w = AnimatedWebP(f, fr.shape[1], fr.shape[0], fps)
            w.add(fr)
        if w is None:
            raise ValueError("webp: expected at least one frame, found none")
        w.close()
        return w.frames


def anmf_sizes(data: bytes) -> list[int]:
    """The length of each frame's ``VP8L`` bitstream in an animated WebP, in order (what a script
    reads of a lossless trial's file without decoding a picture)."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise ValueError("webp: expected RIFF....WEBP at the start")
    out, i = [], 12
    while i + 8 <= len(data):
        tag, n = data[i : i + 4], struct.unpack("<I", data[i + 4 : i + 8])[0]
        if tag == b"ANMF":
            j = i + 8 + 16
            if data[j : j + 4] != b"VP8L":
                raise ValueError(f"webp: frame at byte {i}: expected a VP8L bitstream")
            out.append(struct.unpack("<I", data[j + 4 : j + 8])[0])
        i += 8 + n + (n & 1)
    return out


def read_webp(path) -> np.ndarray:
    """Every frame of an animated WebP as ``(T, H, W, 3)`` uint8 RGB (Pillow's decoder)."""
    from PIL import Image, ImageSequence

    with Image.open(path) as im:
        return np.stack([np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)])


def exact_row(job: str, level) -> dict:
    """A lossless row's delivery record: exact by construction (nothing encoded lossily, so
    nothing measured; the fields of :func:`.delivery.judge` that a stream's row has)."""
    return {
        "job": job,
        "level": level,
        "exact": True,
        "ok": True,
        "identical": None,
        "headroom_db": None,
        "ab_lossless_db": None,
        "ab_delivered_db": None,
        "difference_error_db": None,
        "encode_db": None,
        "streams": None,
    }


def exact_summary(rows: list[dict]) -> dict:
    """A lossless study's delivery record (its config's ``delivery``): exact, every row."""
    return {
        "measure": "lossless delivery: raters see the rendered pixels, exact (animated "
        "lossless WebP painted on a canvas; nothing to measure)",
        "exact": True,
        "margin_db": None,
        "allow_masking": False,
        "masked": 0,
        "rows": rows,
        "worst": None,
    }
