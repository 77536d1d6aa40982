"""Local and short-lived differences (pure numpy): the worst block of each frame's difference
map and the frames a burst spans.

A garbage block of 48x48 pixels on four frames of 64 moves a clip's mean metrics by a few
parts in a thousand; against the floor's own worst block it stands out by orders of magnitude.
Per frame, the squared RGB difference is averaged over square blocks (side
:func:`block_side`: an eighth of the shorter side, so a block covers the same share of any
frame; stride half a side) and the block with the largest mean is kept: ``block_psnr`` is its
PSNR in dB (peak 255; inf for identical blocks), with its place. A clip's worst block is the
frame with the lowest ``block_psnr``; its *burst* is the run of frames around it whose block
MSE stays above the midpoint between the clip's median and that peak (exact for a glitch that
comes and goes; a difference that lasts is "throughout").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the convention recorded in summary.json["conventions"]["block"]
BLOCK_CONVENTION = (
    "block_psnr: squared RGB difference, square blocks of min(H,W)//8 (>= 8) px, stride half a side, peak 255"
)


def block_side(height: int, width: int) -> int:
    """The side of a block in pixels: an eighth of the shorter side, at least 8 (or the
    shorter side itself when smaller)."""
    return max(min(8, height, width), min(height, width) // 8)


def _starts(n: int, side: int) -> np.ndarray:
    stride = max(1, side // 2)
    s = list(range(0, n - side + 1, stride))
    if s[-1] != n - side:
        s.append(n - side)  # the last block ends on the edge
    return np.asarray(s)


def worst_block(a: np.ndarray, b: np.ndarray) -> tuple[float, int, int, int, float]:
    """``(mse, x, y, side, frame_mse)``: the block of frames ``a`` and ``b`` (``(H, W, 3)``
    uint8) whose mean squared difference (8-bit units, over the block's pixels and channels) is
    largest, and the whole frame's mean squared difference."""
    h, w = a.shape[:2]
    side = block_side(h, w)
    d = a.astype(np.int32) - b.astype(np.int32)
    sq = (d * d).sum(axis=2, dtype=np.int64)  # exact integers: no rounding
    ii = np.zeros((h + 1, w + 1), dtype=np.int64)
    ii[1:, 1:] = sq.cumsum(0).cumsum(1)
    ys, xs = _starts(h, side), _starts(w, side)
    sums = (
        ii[ys[:, None] + side, xs[None, :] + side]
        - ii[ys[:, None], xs[None, :] + side]
        - ii[ys[:, None] + side, xs[None, :]]
        + ii[ys[:, None], xs[None, :]]
    )
    i, j = np.unravel_index(int(np.argmax(sums)), sums.shape)
    return (
        float(sums[i, j]) / (side * side * 3),
        int(xs[j]),
        int(ys[i]),
        side,
        float(ii[-1, -1]) / (h * w * 3),
    )


def psnr_of(mse: float) -> float:
    """PSNR in dB of an MSE in 8-bit units (inf for 0)."""
    return math.inf if mse <= 0 else 10 * math.log10(255.0**2 / mse)


def mse_of(psnr: float | None) -> float | None:
    return None if psnr is None else (0.0 if psnr == math.inf else 255.0**2 / 10 ** (psnr / 10))


@dataclass
class LocalTrack:
    """Each compared frame's worst block: A's frame number, the block's MSE and its place."""

    frames: list
    mse: list
    place: list  # (x, y, side)
    frame_mse: list  # the whole frame's

    @classmethod
    def empty(cls) -> "LocalTrack":
        return cls([], [], [], [])

    def add(self, frame: int, a: np.ndarray, b: np.ndarray) -> float:
        """Measure one pair of frames (A's frame number ``frame``); their ``block_psnr``."""
        mse, x, y, side, whole = worst_block(a, b)
        self.frames.append(int(frame))
        self.mse.append(mse)
        self.place.append((x, y, side))
        self.frame_mse.append(whole)
        return psnr_of(mse)

    def worst_mse(self) -> float | None:
        return max(self.mse) if self.mse else None

    def summary(self, width: int | None = None, height: int | None = None) -> dict | None:
        """The clip's worst block and its burst (``None`` without frames): ``frame``, ``x``,
        ``y``, ``side``, ``block_psnr`` and ``frame_psnr`` (dB, the block's and its whole
        frame's), ``burst`` ([first, last] frame, A's numbers), ``throughout`` (no burst:
        the peak is under :data:`BURST_RISE` times the clip's median, or the run spans half
        the clip), ``local`` (the block's MSE is :data:`LOCAL_RISE` times its frame's or more:
        the difference sits in one place), ``where`` (in words)."""
        if not self.mse:
            return None
        mse = np.asarray(self.mse, dtype=np.float64)
        k = int(np.argmax(mse))
        lo, hi = burst(mse, k)
        x, y, side = self.place[k]
        rises = mse[k] > 0 and mse[k] >= BURST_RISE * float(np.median(mse))
        return {
            "frame": self.frames[k],
            "x": x,
            "y": y,
            "side": side,
            "block_psnr": psnr_of(float(mse[k])),
            "frame_psnr": psnr_of(self.frame_mse[k]),
            "burst": [self.frames[lo], self.frames[hi]],
            "burst_frames": hi - lo + 1,
            "frames": len(mse),
            "throughout": bool(not rises or (hi - lo + 1) * 2 >= len(mse)),
            "local": bool(mse[k] > 0 and mse[k] >= LOCAL_RISE * self.frame_mse[k]),
            "where": where(x, y, side, width, height),
        }


#: a burst: the worst frame's block MSE at least this many times the clip's median (6 dB)
BURST_RISE = 4.0
#: a local difference: the worst block's MSE at least this many times its whole frame's (9 dB;
#: a difference spread evenly gives 1, one held in a single block of the 64 gives 64)
LOCAL_RISE = 8.0


def burst(mse: np.ndarray, k: int) -> tuple[int, int]:
    """[lo, hi] (inclusive indices) of the run of frames around ``k`` whose value stays above
    the midpoint between the median and the peak ``mse[k]``."""
    level = (float(np.median(mse)) + float(mse[k])) / 2
    lo = hi = k
    while lo > 0 and mse[lo - 1] > level:
        lo -= 1
    while hi < len(mse) - 1 and mse[hi + 1] > level:
        hi += 1
    return lo, hi


def where(x: int, y: int, side: int, width: int | None, height: int | None) -> str:
    """A block's place in words: ``"x 160-191, y 96-127 (upper right)"``."""
    box = f"x {x}-{x + side - 1}, y {y}-{y + side - 1}"
    if not width or not height:
        return box
    cx, cy = (x + side / 2) / width, (y + side / 2) / height
    col = "left" if cx < 1 / 3 else ("right" if cx > 2 / 3 else "")
    row = "upper" if cy < 1 / 3 else ("lower" if cy > 2 / 3 else "")
    name = f"{row} {col}".strip() if (row or col) else "centre"
    if row and not col:
        name = f"{row} middle"
    elif col and not row:
        name = f"middle {col}"
    return f"{box} ({name})"
