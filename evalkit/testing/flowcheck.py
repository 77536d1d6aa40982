"""Synthetic motion with a known flow, and the end-point error of a flow against it.

Used to validate the optical-flow methods of :mod:`evalkit.metrics.flow` (tests and
``benchmarks/bench_flow.py``). A photograph (grey, area-downscaled by ``prescale`` so it does
not alias) is filmed twice by the same ``(h, w)`` window: ``src`` is the window itself (an
integer crop, no resampling) and ``dst`` is the photograph moved by a similarity transform
``T(x) = c + s R(angle) (x - c) + (tx, ty)`` about the window centre ``c`` (bicubic resampling),
so pixel ``x`` of ``src`` is at ``T(x)`` in ``dst`` and the true flow is ``T(x) - x``
(OpenCV's convention). The end-point error (Baker et al., "A Database and Evaluation
Methodology for Optical Flow", IJCV 2011) is ``|f - f_true|_2`` averaged over the pixels
whose destination lies at least ``margin`` pixels inside the frame.
"""

from __future__ import annotations

import math

import numpy as np


def photo_grey(rgb: np.ndarray, prescale: float = 0.5) -> np.ndarray:
    """(H, W, 3) or (H, W) uint8 -> rounded BT.601 luma resized by ``prescale`` (area averaging
    down, bicubic up), float32."""
    import cv2

    if rgb.ndim == 3:
        g = np.round(rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114)
    else:
        g = rgb.astype(np.float64)
    g = g.astype(np.float32)
    if prescale != 1:
        g = cv2.resize(
            g,
            (round(g.shape[1] * prescale), round(g.shape[0] * prescale)),
            interpolation=cv2.INTER_AREA if prescale < 1 else cv2.INTER_CUBIC,
        )
    return g


def synthetic_pair(
    photo: np.ndarray, size: tuple[int, int], *, shift=(0.0, 0.0), angle: float = 0.0, zoom: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, flow)`` for a grey photograph (float32, from :func:`photo_grey`).

    ``size``: window ``(h, w)``, centred in the photograph; ``shift`` (tx, ty) pixels,
    ``angle`` degrees (counter-clockwise on screen), ``zoom`` scale factor. ``src``/``dst`` are
    (h, w) uint8, ``flow`` (h, w, 2) float32.
    """
    import cv2

    h, w = size
    ph, pw = photo.shape
    if ph < h or pw < w:
        raise ValueError(f"photograph {pw}x{ph} is smaller than the window {w}x{h}")
    ox, oy = (pw - w) // 2, (ph - h) // 2
    src = np.clip(np.round(photo[oy : oy + h, ox : ox + w]), 0, 255).astype(np.uint8)
    c = np.array([(w - 1) / 2, (h - 1) / 2])
    th = math.radians(angle)
    a = zoom * np.array([[math.cos(th), math.sin(th)], [-math.sin(th), math.cos(th)]])
    t = c - a @ c + np.asarray(shift, dtype=np.float64)  # T(x) = a x + t (window coords)
    # dst(y) = photo(T^-1(y) + o): the map from dst pixels to photograph pixels
    ai = np.linalg.inv(a)
    m = np.hstack([ai, (-ai @ t + np.array([ox, oy]))[:, None]])
    dst = cv2.warpAffine(
        photo, m, (w, h), flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REFLECT
    )
    dst = np.clip(np.round(dst), 0, 255).astype(np.uint8)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    tx = a[0, 0] * xs + a[0, 1] * ys + t[0]
    ty = a[1, 0] * xs + a[1, 1] * ys + t[1]
    flow = np.stack([tx - xs, ty - ys], -1).astype(np.float32)
    return src, dst, flow


def endpoint_error(flow: np.ndarray, truth: np.ndarray, *, margin: int = 2) -> float:
    """Mean ``|flow - truth|_2`` over pixels whose true destination is ``margin`` px inside."""
    h, w = truth.shape[:2]
    ys, xs = np.mgrid[0:h, 0:w]
    px, py = xs + truth[..., 0], ys + truth[..., 1]
    keep = (px >= margin) & (px <= w - 1 - margin) & (py >= margin) & (py <= h - 1 - margin)
    d = np.sqrt(((np.asarray(flow, dtype=np.float64) - truth) ** 2).sum(-1))
    return float(d[keep].mean())
