"""Backend differences of known kinds, made from one clip's frames, for the delivery rule
(:mod:`evalkit.study.delivery`) and its predictor: what a trial stream keeps of each.

- ``flicker``: brightness up and down by 3% on alternate frames (:mod:`.variants`): a
  structured difference people notice, several code values where the picture is bright;
- ``crf16``, ``crf32``: B is A through H.264 at that CRF (:mod:`.variants`): compression
  differences, fine (crf16) to coarse (crf32);
- ``bf16``: one filter (:func:`blur`) computed in float32 (A) and in bfloat16 (B): a rounding
  pattern, +-1 code value and noise-like, 45-53 dB, what a "nothing changed" precision
  migration gives;
- ``glitch``: a 32 x 32 pixel square (at the frame's centre) brighter by :data:`GLITCH_STEP`
  code values for 6 frames in the middle of the clip: a small, local difference of high
  global PSNR that a stream keeps.
"""

from __future__ import annotations

import numpy as np

from .variants import variant

CASES = ("flicker", "crf16", "crf32", "bf16", "glitch")
#: the glitch's brightness step (code values)
GLITCH_STEP = 12


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


#: the filter both backends of the ``bf16`` case compute (a 5 x 5 binomial blur)
KERNEL = np.outer([1, 4, 6, 4, 1], [1, 4, 6, 4, 1]).astype(np.float32) / 256


def blur(frames: np.ndarray, dtype: str) -> np.ndarray:
    """``frames`` (uint8 RGB) through :data:`KERNEL` (edges replicated), each product added in
    turn to the running sum, in float32 (``dtype="fp32"``) or with every product and partial
    sum rounded to bfloat16 (``"bf16"``); rounded to 8 bits."""
    rnd = bf16 if dtype == "bf16" else (lambda v: v)
    out = np.empty_like(frames)
    h, w = frames.shape[1:3]
    for i in range(len(frames)):
        k = len(KERNEL)
        x = np.pad(frames[i].astype(np.float32), ((k // 2,) * 2, (k // 2,) * 2, (0, 0)), mode="edge")
        acc = np.zeros((h, w, 3), np.float32)
        for dy in range(k):
            for dx in range(k):
                acc = rnd(acc + rnd(KERNEL[dy, dx] * x[dy : dy + h, dx : dx + w]))
        out[i] = np.clip(np.rint(acc), 0, 255).astype(np.uint8)
    return out


def case(frames: np.ndarray, fps, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Backends A's and B's frames for case ``name`` (one of :data:`CASES`) from a clip's:
    A is the clip (for ``bf16``: the clip through :func:`blur` in float32, B the same in
    bfloat16)."""
    if name in ("flicker", "crf16", "crf32"):
        return frames, variant(frames, fps, name)
    if name == "bf16":
        return blur(frames, "fp32"), blur(frames, "bf16")
    if name == "glitch":
        out = frames.copy()
        t0 = max(0, len(frames) // 2 - 3)
        h, w = frames.shape[1:3]
        y, x = h // 2 - 16, w // 2 - 16
        sl = out[t0 : t0 + 6, max(0, y) : y + 32, max(0, x) : x + 32]
        sl[...] = np.clip(sl.astype(np.int16) + GLITCH_STEP, 0, 255).astype(np.uint8)
        return frames, out
    raise ValueError(f"name: expected one of {CASES}, found {name!r}")


def frame_rows(a: np.ndarray, b: np.ndarray) -> list[dict]:
    """The figures a compare report's ``frames.csv`` holds for the pair that the predictor
    reads, frame by frame: ``psnr`` over every value (``inf`` for identical frames),
    ``max_abs_diff``, ``diff_fraction`` over pixel positions, and ``flicker``
    (:func:`evalkit.metrics.temporal.flicker`, None at frame 0)."""
    import torch

    from evalkit.metrics.temporal import flicker

    fl = (
        [None]
        + flicker(torch.from_numpy(a).permute(0, 3, 1, 2), torch.from_numpy(b).permute(0, 3, 1, 2)).tolist()
        if len(a) > 1
        else [None]
    )
    out = []
    for i in range(len(a)):
        d = b[i].astype(np.int32) - a[i]
        mse = float(np.square(d).mean())
        out.append(
            {
                "frame": i,
                "psnr": 10 * np.log10(255.0**2 / mse) if mse else float("inf"),
                "max_abs_diff": float(np.abs(d).max()),
                "diff_fraction": float((d != 0).any(axis=2).mean()),
                "flicker": fl[i],
            }
        )
    return out
