"""Browser copies for raters, stored by content: ``MEDIA/<sha256>.mp4``.

Both sides and every degraded catch version are encoded with the one shared
:data:`evalkit.video.BROWSER_ENCODING` (bit-exact muxing, no metadata), so neither the file
name, the path nor the file's bytes say which backend, run or job a video comes from.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ..fsutil import sha256_file
from ..video import BROWSER_ENCODING, BrowserEncoding, read_frames, write_browser


def store_browser_copy(frames: np.ndarray, fps, media_dir: Path) -> str:
    """Encode ``frames`` as a browser copy into ``media_dir``; return its sha256 (file name
    ``<sha256>.mp4``). Writing the same frames twice gives the same file."""
    media_dir = Path(media_dir)
    media_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".mp4", dir=media_dir)
    os.close(fd)
    tmp = Path(tmp)
    try:
        write_browser(tmp, frames, fps, BROWSER_ENCODING)
        digest = sha256_file(tmp)
        os.replace(tmp, media_dir / f"{digest}.mp4")
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def degrade(frames: np.ndarray, fps, kind: str) -> np.ndarray:
    """A visibly degraded copy for catch trials: ``blur`` (Gaussian, sigma 1/20 of the short
    side, at least 2 px), ``compression`` (H.264 at CRF 51, decoded), ``dropped_frames``
    (only every third frame kept, each held three times)."""
    if kind == "blur":
        from scipy.ndimage import gaussian_filter

        s = max(2.0, min(frames.shape[1:3]) / 20)
        return np.clip(gaussian_filter(frames.astype(np.float32), sigma=(0, s, s, 0)) + 0.5,
                       0, 255).astype(np.uint8)
    if kind == "compression":
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "c.mp4"
            write_browser(p, frames, fps, BrowserEncoding(crf=51))
            out = read_frames(p)[0][:, :frames.shape[1], :frames.shape[2]]
        return np.ascontiguousarray(out)
    if kind == "dropped_frames":
        idx = np.arange(len(frames))
        return frames[idx - idx % 3]
    raise ValueError(f"kind: expected blur, compression or dropped_frames, found {kind!r}")
