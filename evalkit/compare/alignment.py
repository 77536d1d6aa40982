"""Temporal alignment of two clips: a constant frame offset, or a frame-rate mismatch.

A clip B one frame late, compared frame by frame with A, looks like a large quality loss that
is not one (LPIPS worst 0.66, VMAF worst 0 on real footage). Before measuring a pair,
``compare`` and ``evalkit metrics`` call :func:`probe_clips`:

- **frame rates**: clips (or manifests) of different frame rates do not pair frame by frame
  under any offset; such a pair is refused with one line (:func:`rate_mismatch`).
- **offset**: :func:`detect_offset` on small luma frames (:data:`WIDTH` pixels wide, area
  averaged) of the first :data:`WINDOW` frames of each clip (never more: memory is
  ``WINDOW x WIDTH^2`` floats, whatever the clip's size). For every offset ``k`` in
  ``[-MAX_OFFSET, MAX_OFFSET]`` it takes the mean absolute difference (grey levels 0..255)
  between A's frame ``i`` and B's frame ``i + k`` over their common frames. ``k > 0``: B is
  ``k`` frames late (B's frame ``i + k`` shows A's frame ``i``); ``k < 0``: B is early.

An offset is declared only when all of these hold (otherwise the pair is compared frame by
frame, as before, and the finding says why):

- both clips have at least ``MAX_OFFSET + MIN_PAIRS`` frames (else ``short``: not testable);
- A moves: the mean absolute difference between A's successive small frames is at least
  :data:`MIN_MOTION` grey levels (else ``static``: a still clip cannot show an offset);
- the best offset's difference is at most ``1 / FACTOR`` of offset 0's (it explains at least
  half of what frame by frame would call a difference), and lower by at least
  :data:`MIN_GAIN` grey levels.

The rule does not fire on identical clips (offset 0's difference is 0), on bf16-versus-fp32
or compression noise (every offset carries the noise; the shifted ones also carry the motion)
or on still clips; it fires on a one-frame shift of real footage (tests/test_alignment.py).

A pair with an offset is compared at it, on the frames the two clips share (A's frames
``max(0, -k)..``, B's ``max(0, k)..``, as many as the shorter side has), and the report says so
by name with the offset: never silently frame by frame. Frame numbers in the records stay A's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

#: offsets tested: -MAX_OFFSET..MAX_OFFSET frames
MAX_OFFSET = 3
#: frames read from the start of each clip (at most)
WINDOW = 16
#: width of the small luma frames (height in proportion, at least 1)
WIDTH = 64
#: pairs of frames an offset needs at the least (clips shorter than MAX_OFFSET + this: ``short``)
MIN_PAIRS = 4
#: the best offset's mean absolute difference must be at most offset 0's divided by this
FACTOR = 1.5
#: ... and lower than offset 0's by at least this many grey levels (0..255)
MIN_GAIN = 0.5
#: A's mean absolute difference between successive small frames below this: ``static``
MIN_MOTION = 0.5

#: the rule in words (summary.json's ``alignment.rule``)
RULE = (
    f"offsets -{MAX_OFFSET}..{MAX_OFFSET} tested on the first {WINDOW} frames at {WIDTH} px "
    f"wide luma; an offset k is declared when its mean absolute difference is at most 1/"
    f"{FACTOR:g} of offset 0's and {MIN_GAIN:g} grey level(s) lower, and A moves (at least "
    f"{MIN_MOTION:g} grey levels between frames); a pair with an offset is compared at it, "
    "on the frames both clips share"
)


@dataclass
class Alignment:
    """What :func:`detect_offset` (or :func:`probe_clips`) found for one pair.

    ``finding``: ``aligned`` (offset 0 fits best), ``shifted`` (``offset`` != 0, compared at
    it), ``static`` or ``short`` (not testable: compared frame by frame), ``rate`` (frame
    rates differ: refused)."""

    finding: str
    offset: int = 0
    mad: dict = field(default_factory=dict)  # offset -> mean absolute difference
    motion: float | None = None
    frames: int = 0  # frames read of the shorter clip
    reason: str = ""

    @property
    def skip_a(self) -> int:
        """A's frames before the first compared one."""
        return max(0, -self.offset)

    @property
    def skip_b(self) -> int:
        return max(0, self.offset)

    def text(self, compared: int | None = None) -> str:
        """The finding in words; ``compared``: frames compared at the offset."""
        if not self.offset:
            return self.reason
        n = abs(self.offset)
        side = "late" if self.offset > 0 else "early"
        where = ""
        if compared:
            where = (
                f": A frames {self.skip_a}-{self.skip_a + compared - 1} with B frames "
                f"{self.skip_b}-{self.skip_b + compared - 1}"
            )
        return (
            f"B is {n} frame{'s' if n > 1 else ''} {side} (offset {self.offset:+d}; "
            f"{self.reason}); compared at that offset{where}"
        )

    def as_dict(self, compared: int | None = None) -> dict:
        d = asdict(self)
        d["mad"] = {f"{k:+d}" if k else "0": v for k, v in self.mad.items()}
        d["text"] = self.text(compared)
        if compared is not None:
            d["compared"] = compared
        return d


def small_luma(frame: np.ndarray, width: int = WIDTH) -> np.ndarray:
    """An ``(H, W, 3)`` uint8 RGB frame as BT.601 luma, area-averaged to ``width`` pixels wide
    (float32, grey levels 0..255); frames narrower than ``width`` keep their size."""
    import cv2

    y = (
        frame[..., 0] * np.float32(0.299)
        + frame[..., 1] * np.float32(0.587)
        + frame[..., 2] * np.float32(0.114)
    )
    h, w = y.shape
    if w <= width:
        return y.astype(np.float32)
    height = max(1, round(h * width / w))
    return cv2.resize(y, (width, height), interpolation=cv2.INTER_AREA).astype(np.float32)


def detect_offset(
    luma_a: Sequence[np.ndarray], luma_b: Sequence[np.ndarray], *, max_offset: int = MAX_OFFSET
) -> Alignment:
    """The offset of B against A from their first small luma frames (:func:`small_luma`),
    by the rule of this module's doc. Pure: no files."""
    n = min(len(luma_a), len(luma_b))
    if n < max_offset + MIN_PAIRS:
        return Alignment(
            "short",
            frames=n,
            reason=(
                f"not tested for a temporal offset: {n} frame(s), the test needs {max_offset + MIN_PAIRS}"
            ),
        )
    a = np.stack([np.asarray(f, dtype=np.float32) for f in luma_a[:WINDOW]])
    b = np.stack([np.asarray(f, dtype=np.float32) for f in luma_b[:WINDOW]])
    if a.shape[1:] != b.shape[1:]:  # the clips' sizes differ: the measuring says so
        return Alignment(
            "short", frames=n, reason="not tested for a temporal offset: the clips' frames differ in size"
        )
    na, nb = len(a), len(b)
    mad = {}
    for k in range(-max_offset, max_offset + 1):
        lo, hi = max(0, -k), min(na, nb - k)  # A's frames i with B's i + k
        mad[k] = float(np.mean(np.abs(a[lo:hi] - b[lo + k : hi + k], dtype=np.float64)))
    motion = float(np.mean(np.abs(np.diff(a, axis=0)), dtype=np.float64))
    best = min(mad, key=lambda k: (mad[k], abs(k)))
    figures = f"mean luma difference {mad[best]:.3g} grey levels at the offset, {mad[0]:.3g} frame by frame"
    if motion < MIN_MOTION:
        return Alignment(
            "static",
            0,
            mad,
            motion,
            n,
            reason=(
                f"not tested for a temporal offset: A barely moves in its first {na} frames "
                f"({motion:.3g} grey levels between frames, the test needs {MIN_MOTION:g})"
            ),
        )
    if best != 0 and mad[best] * FACTOR <= mad[0] and mad[0] - mad[best] >= MIN_GAIN:
        return Alignment("shifted", best, mad, motion, n, reason=figures)
    return Alignment(
        "aligned",
        0,
        mad,
        motion,
        n,
        reason=(f"no temporal offset (offsets -{max_offset}..{max_offset} tested; offset 0 fits)"),
    )


def _video_luma(path: Path, n: int, width: int) -> list[np.ndarray]:
    """The first ``n`` frames of a video file, scaled by FFmpeg straight to small gray frames
    (area averaging; no full-size RGB frame is made)."""
    import av

    out: list[np.ndarray] = []
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.thread_type = "AUTO"
        w, h = s.codec_context.width, s.codec_context.height
        size = (width, max(1, round(h * width / w))) if w > width else (w, h)
        for frame in c.decode(s):
            g = frame.reformat(
                width=size[0], height=size[1], format="gray", interpolation="AREA"
            ).to_ndarray()
            out.append(g[:, : size[0]].astype(np.float32))
            if len(out) >= n:
                break
    return out


def _reader_luma(path: Path, n: int, width: int) -> list[np.ndarray]:
    from evalkit.video import ClipReader

    out: list[np.ndarray] = []
    frames = iter(ClipReader(path))
    try:
        for frame in frames:
            out.append(small_luma(frame, width))
            if len(out) >= n:
                break
    finally:
        close = getattr(frames, "close", None)
        if close is not None:
            close()
    return out


def read_small_luma(path, n: int = WINDOW, width: int = WIDTH) -> list[np.ndarray]:
    """The first ``n`` frames of a clip (video, image or folder of images) as small luma."""
    from evalkit.video import VIDEO_EXTS

    path = Path(path)
    if path.is_file() and path.suffix.lower() in VIDEO_EXTS:
        try:
            return _video_luma(path, n, width)
        except Exception:  # anything FFmpeg's scaler cannot do: the reader's frames
            pass
    return _reader_luma(path, n, width)


def rate_mismatch(fps_a, fps_b) -> str | None:
    """Why two frame rates do not pair frame by frame (None: they are equal or unknown)."""
    try:
        ra, rb = Fraction(str(fps_a)), Fraction(str(fps_b))
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    if ra == rb:
        return None
    return (
        f"frame-rate mismatch: A is {_rate(ra)} fps, B is {_rate(rb)} fps (frames do not pair "
        "one by one at any offset; resample one clip to the other's rate)"
    )


def _rate(r: Fraction) -> str:
    return str(r.numerator) if r.denominator == 1 else f"{float(r):.3f}".rstrip("0")


def probe_clips(path_a, path_b) -> Alignment:
    """Frame rates, then :func:`detect_offset` on the clips' first :data:`WINDOW` frames (the
    clips are read only that far). Frame rates are compared only between two video files
    (images and folders of images have no rate of their own)."""
    from evalkit.video import ClipReader

    ra, rb = ClipReader(path_a), ClipReader(path_b)
    if ra.kind == "video" and rb.kind == "video":
        why = rate_mismatch(ra.info.fps, rb.info.fps)
        if why:
            return Alignment("rate", reason=why)
    return detect_offset(read_small_luma(path_a), read_small_luma(path_b))


def resolve_offset(path_a, path_b, offset="auto") -> Alignment:
    """``offset="auto"``: :func:`probe_clips`; a whole number: that offset, untested
    (``given``). A ``rate`` finding is the caller's to refuse."""
    if offset != "auto":
        n = int(offset)
        return Alignment(
            "given",
            n,
            reason=(
                f"offset {n:+d} given (--offset), not tested"
                if n
                else "frame by frame (--offset 0), not tested"
            ),
        )
    return probe_clips(path_a, path_b)


def skip_frames(chunks: Iterable, n: int) -> Iterator:
    """``(k, H, W, 3)`` chunks with their first ``n`` frames left out (chunks are views, no copies)."""
    for c in chunks:
        if n >= len(c):
            n -= len(c)
            continue
        yield c[n:] if n else c
        n = 0
