"""Browser copies for raters, stored by content: ``MEDIA/<sha256>.mp4`` (or, for a study made with
``--delivery lossless``, the same tiled frames as an animated lossless WebP,
``MEDIA/<sha256>.webp``: :mod:`.lossless`).

**One stream per trial.** Every video of a trial (ABX: X, A and B; preference: left and right)
is a *tile* of one H.264 stream (:func:`store_tiled`): the tiles side by side in one row, each in
its own cell of a 16-pixel grid with a mid-grey 16-pixel gutter around it, so every tile starts
on a macroblock edge and has the same surroundings (its coding does not depend on its
neighbours; grey, the midpoint of the negative, so a negated tile meets the same edge contrast). Which tile goes where is drawn per trial (:func:`evalkit.study.design.assign`); the
page is told the rectangle of each box's tile and draws each box from the one decoded frame, so
sync is exact by construction. A file holds every pixel of every side: its size, its frame
sizes, its NAL and slice lengths and its byte runs belong to no side. One slice per frame (one
x264 thread), constant QP (no slice header field chosen from the content), no weighted
prediction, key frames every 12th frame (no scene cuts): the structure of every file is the same
function of the tile size and frame count.

**Size limits.** A stream stays within H.264 level 5.1 (at most :data:`MAX_MBS` macroblocks a
frame) and at most :data:`MAX_WIDTH` pixels wide (what phones' decoders take): three 1280-wide
tiles fit (3904 px); larger tiles are downscaled (area filter) to fit, and the layout says so
(``scale`` below 1).

**Catch trials** (:func:`degrade`): the easy degradation is the colour negative of the
reference (255 - value on every channel): plain to anyone, and its coded cost is the
reference's (the transform coefficients and motion-compensated residuals only change sign), so a
catch trial's file is as large as a test trial's of the same clip; the graded one is a 20 degree
hue rotation (the chroma vector turned: its energy, and so its coded cost, unchanged). (Blur, coarse compression and dropped frames, used before, changed the
coded size by 5-30%: a script told catch trials from test trials by the file size alone.)

Reproducible: the same tiles give the same file (on one kind of CPU: x264's SIMD code is not
bit-exact with its C code); see :data:`TILED_X264` for why MB-tree is off.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..concurrency import ordered_map as _ordered_map
from ..fsutil import hold, mkstemp, remove_stale_temporaries, sha256_file
from ..video import BROWSER_ENCODING, write_browser

#: x264 settings of every trial stream, on top of :data:`BROWSER_ENCODING` (``veryfast``, GOP
#: 12, no B-frames, High profile): ``qp=12`` (constant QP instead of CRF 12: every slice header
#: carries the same QP, so headers say nothing of the content), ``weightp=0`` (no weights chosen
#: from the content), ``scenecut=0`` (key frames exactly every 12th frame), ``no-mbtree=1``
#: (x264's MB-tree code on AVX-512 CPUs reads memory it never wrote for some frame widths: the
#: same frames then encode to different bytes now and then, which would break content
#: addressing) and one thread (x264's output depends on its thread count; one thread is also one
#: slice a frame, so slice lengths are frame sizes, never a tile's).
TILED_X264 = "scenecut=0:no-mbtree=1:qp=12:weightp=0"
#: the grid and gutter of a trial stream, in pixels (one macroblock), and the gutter's value
GUTTER = 16
GUTTER_GREY = 128
#: the widest stream (pixels) and the most macroblocks a frame (H.264 level 5.1: 36864, e.g.
#: 4096x2304) a trial stream may have; larger tiles are downscaled to fit
MAX_WIDTH = 4096
MAX_MBS = 36864
TILED_ENCODING = replace(
    BROWSER_ENCODING, options={**BROWSER_ENCODING.options, "threads": "1", "x264-params": TILED_X264}
)


def media_workers() -> int:
    """Clips whose media a study encodes at once: one per core, at most 4 (each holds a few
    windows of frames and the encoders of one pass, :mod:`.trialmedia`; each stream is encoded
    by one x264 thread)."""
    return max(1, min(4, os.cpu_count() or 1))


def ordered_map(fn, items, workers: int | None = None):
    """:func:`evalkit.concurrency.ordered_map` with ``workers`` defaulting to
    :func:`media_workers`."""
    return _ordered_map(fn, items, workers or media_workers(), name="evalkit-media")


def prepare_media_dir(media_dir) -> Path:
    """The study's media folder, made if needed, with what a killed create left removed (its
    ``.tmp-*`` files that no live process holds). Called once, before any stream is encoded:
    the encoders' own temporaries inside a ``.tmp-`` file's writing are not held, so a sweep
    beside running encoders would take them."""
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(media_dir)
    return media_dir


def _store(write, media_dir: Path, ext: str = ".mp4") -> str:
    """Run ``write(tmp_path)`` to a temporary name in ``media_dir``; rename the file to its
    sha256 (``<sha256>.mp4``, or ``ext``) and return that."""
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = mkstemp(prefix=".tmp-", suffix=ext, dir=media_dir)
    hold(fd)  # held while written: not stale to another create
    tmp = Path(tmp)
    try:
        write(tmp)
        digest = sha256_file(tmp)
        os.replace(tmp, media_dir / f"{digest}{ext}")
    finally:
        tmp.unlink(missing_ok=True)
        os.close(fd)
    return digest


def store_browser_copy(frames: np.ndarray, fps, media_dir: Path) -> str:
    """Encode ``frames`` as a single browser copy (:data:`BROWSER_ENCODING`) into
    ``media_dir``; return its sha256 (file name ``<sha256>.mp4``)."""
    return _store(lambda p: write_browser(p, frames, fps, BROWSER_ENCODING), media_dir)


def tile_layout(n: int, height: int, width: int) -> dict:
    """Where ``n`` tiles of ``height`` x ``width`` go in a trial stream: ``{"width", "height"``
    (the stream's), ``"scale"`` (1, or the downscale that keeps the stream within
    :data:`MAX_WIDTH` and :data:`MAX_MBS`), ``"tile"`` ([w, h] of each tile as stored),
    ``"rects"`` ([x, y, w, h] of tile 0, 1, ... in the stream)}."""
    if n < 1 or height < 1 or width < 1:
        raise ValueError(f"tiles: expected at least one of at least 1x1, found {n} of {width}x{height}")

    def cells(w, h):
        cw, ch = -(-w // GUTTER) * GUTTER, -(-h // GUTTER) * GUTTER
        return cw, ch, n * cw + (n + 1) * GUTTER, ch + 2 * GUTTER

    scale, w, h = 1.0, width, height
    while True:
        cw, ch, sw, sh = cells(w, h)
        if sw <= MAX_WIDTH and (sw // 16) * (sh // 16) <= MAX_MBS:
            break
        scale = min(
            scale * 0.98,
            (MAX_WIDTH - (n + 1) * GUTTER) / (n * width),
            math.sqrt(MAX_MBS * 256 / (n * width * height)) * 0.9,
        )
        w, h = max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)
    return {
        "width": sw,
        "height": sh,
        "scale": scale if (w, h) != (width, height) else 1.0,
        "tile": [w, h],
        "rects": [[GUTTER + i * (cw + GUTTER), GUTTER, w, h] for i in range(n)],
    }


def tile_frames(tiles: list[np.ndarray], layout: dict) -> np.ndarray:
    """The frames of a trial stream: each tile (resized to ``layout["tile"]`` if it differs) in
    its rectangle, mid-grey (:data:`GUTTER_GREY`) elsewhere."""
    t = tiles[0].shape[0]
    out = np.full((t, layout["height"], layout["width"], 3), GUTTER_GREY, np.uint8)
    w, h = layout["tile"]
    for frames, (x, y, _, _) in zip(tiles, layout["rects"]):
        if frames.shape[1:3] != (h, w):
            import cv2

            frames = np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA) for f in frames])
        out[:, y : y + h, x : x + w] = frames
    return out


def store_tiled(tiles: list[np.ndarray], fps, media_dir) -> tuple[str, dict]:
    """Encode ``tiles`` (each ``(T, H, W, 3)`` uint8 RGB, the same T, H and W) as the tiles of
    one trial stream (:data:`TILED_ENCODING`, layout :func:`tile_layout`), tile ``i`` in
    ``rects[i]``; returns ``(sha256, layout)``. The same tiles in the same order give the
    same file (that of :func:`store_tiled_streams` given them window by window)."""
    tiles = [np.asarray(f) for f in tiles]
    if not tiles:
        raise ValueError("tiles: expected at least one, found none")
    for k, f in enumerate(tiles):
        if f.dtype != np.uint8 or f.ndim != 4 or f.shape[3] != 3 or f.shape[0] == 0:
            raise ValueError(
                f"tiles[{k}]: expected (T, H, W, 3) uint8 RGB with T >= 1, found {f.dtype} {f.shape}"
            )
        if f.shape != tiles[0].shape:
            raise ValueError(
                f"tiles[{k}]: every tile of a stream has the same frame count, "
                f"height and width; found {f.shape[:3]}, tiles[0] "
                f"{tiles[0].shape[:3]}"
            )
    ((sha, layout, _),) = store_tiled_streams(
        [dict(enumerate(tiles))], [list(range(len(tiles)))], fps, media_dir
    )
    return sha, layout


def store_tiled_streams(
    windows, streams: list[list], fps, media_dir, delivery: str = "stream"
) -> list[tuple[str, dict, int]]:
    """Several trial streams encoded at once from one pass over ``windows``: an iterable of
    dicts, content name -> ``(n, H, W, 3)`` uint8 frames (every content of a window the same
    n, H and W); stream ``i`` shows content ``streams[i][j]`` in tile ``j``
    (:func:`tile_layout`). Each stream's encoder runs on a thread of its own and builds its
    frames one at a time (:func:`tile_frames`), at most two windows queued
    (:func:`evalkit.concurrency.fan_out`): memory holds a few windows and one frame per stream,
    whatever the clip's length. Returns ``(sha256, layout, frames)`` per stream; each file is
    that of :func:`store_tiled` given the whole contents. An error (of the windows' source or
    an encoder) is raised and no stream of the pass is kept. ``delivery="lossless"``: each
    stream is an animated lossless WebP of the same frames (:mod:`.lossless`), ``<sha256>.webp``."""
    from ..concurrency import fan_out
    from .lossless import EXT, write_webp

    ext = EXT[delivery]

    def write(path, frames):
        if delivery == "lossless":
            write_webp(path, frames, fps)
        else:
            write_browser(path, frames, fps, TILED_ENCODING)

    def encoder(names):
        def run(items) -> tuple[str, dict, int]:
            state = {"layout": None, "n": 0}

            def frames():
                for item in items:
                    tiles = [item[c] for c in names]
                    if state["layout"] is None:
                        state["layout"] = tile_layout(len(tiles), tiles[0].shape[1], tiles[0].shape[2])
                    for t in range(len(tiles[0])):
                        yield tile_frames([x[t : t + 1] for x in tiles], state["layout"])[0]
                        state["n"] += 1

            sha = _store(lambda p: write(p, frames()), media_dir, ext)
            return sha, state["layout"], state["n"]

        return run

    return fan_out(windows, [encoder(names) for names in streams], name="evalkit-media-encode")


def degrade(frames: np.ndarray, fps, kind: str) -> np.ndarray:
    """A degraded copy for catch trials (the kinds of :data:`.design.CATCH_KINDS` and
    :data:`.design.GRADED_KINDS`). ``negative`` (easy; screening uses it): 255 - value on every
    channel, plain to anyone, and it costs the encoder what the reference does. ``hue_mild``
    (graded, reported only): the hue turned by 20 degrees (BT.601 chroma rotated about grey;
    luma kept), a tint seen side by side or when flickering, at the reference's coded cost
    (within 1.5% in the tests; a 2-pixel shift cost +1..8% from its repeated edges, a blur -13%
    and more)."""
    if kind == "negative":
        return 255 - frames
    if kind == "hue_mild":
        c, s = np.cos(np.radians(20.0)), np.sin(np.radians(20.0))
        rot = np.array([[1, 0, 0], [0, c, -s], [0, s, c]], np.float32)
        m = (np.linalg.inv(_YCC) @ rot @ _YCC).astype(np.float32)
        out = np.empty_like(frames)
        for i in range(0, len(frames), 8):  # a few frames at a time: float32 memory bounded
            out[i : i + 8] = np.clip(frames[i : i + 8].astype(np.float32) @ m.T + 0.5, 0, 255)
        return out
    raise ValueError(f"kind: expected negative or hue_mild, found {kind!r}")


#: RGB -> (Y, Cb, Cr) of BT.601 (offsets aside: the rotation is about grey)
_YCC = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]], np.float32)


def avcc_nal_units(sample: bytes) -> list[bytes]:
    """Split an MP4 (AVCC, 4-byte length prefixed) H.264 sample into its NAL units."""
    nals, i = [], 0
    while i < len(sample):
        if i + 4 > len(sample):
            raise ValueError(f"sample: truncated NAL length at byte {i}")
        n = int.from_bytes(sample[i : i + 4], "big")
        if n == 0 or i + 4 + n > len(sample):
            raise ValueError(f"sample: bad NAL length {n} at byte {i} of {len(sample)}")
        nals.append(sample[i + 4 : i + 4 + n])
        i += 4 + n
    return nals
