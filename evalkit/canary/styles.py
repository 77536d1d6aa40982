"""Classical style operators: the training targets (and quality references) of the canary.

Each style is a deterministic function of one RGB uint8 frame (H, W, 3) -> RGB uint8 frame of
the same size, built from OpenCV's photo module (stylization, pencilSketch,
edgePreservingFilter, detailEnhance), per-pixel colour grading and colour maps. They are
per-frame operators: applied to a clip frame by frame they are the "classical baseline" whose
temporal stability the canary is compared with.

Spatial parameters (``sigma_s``) are in pixels, so a style looks the same at any frame size
only up to that scale; the canary was trained on 128x128 crops of photographs at random scales.
"""

from __future__ import annotations

import cv2
import numpy as np

__all__ = ["STYLES", "apply_style", "apply_style_frames"]


def _f(img: np.ndarray) -> np.ndarray:
    return img.astype(np.float32) / 255.0


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(x * 255.0 + 0.5, 0, 255).astype(np.uint8)


def _luma(x: np.ndarray) -> np.ndarray:
    return x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114


def pencil_sketch(img: np.ndarray) -> np.ndarray:
    gray, _ = cv2.pencilSketch(img, sigma_s=60, sigma_r=0.07, shade_factor=0.05)
    return np.repeat(gray[..., None], 3, axis=2)


def watercolor(img: np.ndarray) -> np.ndarray:
    return cv2.stylization(img, sigma_s=60, sigma_r=0.45)


def cartoon(img: np.ndarray) -> np.ndarray:
    smooth = cv2.edgePreservingFilter(img, flags=cv2.RECURS_FILTER, sigma_s=60, sigma_r=0.4)
    levels = 6.0
    q = np.floor(_f(smooth) * levels) / (levels - 1) * 0.85 + 0.075
    gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    gray = cv2.medianBlur(gray, 5)
    edges = cv2.adaptiveThreshold(gray, 255, cv2.ADAPTIVE_THRESH_MEAN_C, cv2.THRESH_BINARY, 9, 5)
    ink = _f(edges)[..., None]
    return _u8(np.clip(q, 0, 1) * ink)


def detail_enhanced(img: np.ndarray) -> np.ndarray:
    return cv2.detailEnhance(img, sigma_s=10, sigma_r=0.15)


def night(img: np.ndarray) -> np.ndarray:
    x = _f(img)
    lum = _luma(x)[..., None]
    x = 0.45 * x + 0.55 * lum  # desaturate
    x = np.power(x, 1.5) * 0.55  # darken, crush shadows
    x = x * np.array([0.70, 0.88, 1.35], np.float32) + np.array([0.0, 0.01, 0.04], np.float32)
    return _u8(x)


def golden_hour(img: np.ndarray) -> np.ndarray:
    x = _f(img)
    lum = _luma(x)[..., None]
    x = lum + 1.25 * (x - lum)  # more saturation
    x = x * np.array([1.18, 0.98, 0.68], np.float32) + np.array([0.06, 0.025, 0.0], np.float32)
    x = np.clip(x, 0, 1)
    x = 0.5 - 0.5 * np.cos(np.pi * np.clip(x, 0, 1)) * 0.9 + 0.05 * (x - 0.5)  # soft S-curve
    return _u8(x)


def black_and_white_film(img: np.ndarray) -> np.ndarray:
    x = _f(img)
    g = x[..., 0] * 0.45 + x[..., 1] * 0.45 + x[..., 2] * 0.10
    g = np.clip((g - 0.5) * 1.35 + 0.5, 0, 1)  # contrast
    g = 0.5 - 0.5 * np.cos(np.pi * g)  # S-curve
    g = 0.04 + 0.92 * g  # lifted blacks, soft whites
    return _u8(np.repeat(g[..., None], 3, axis=2))


def thermal_camera(img: np.ndarray) -> np.ndarray:
    gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    gray = cv2.GaussianBlur(gray, (0, 0), 1.5)
    gray = cv2.equalizeHist(gray) // 2 + gray // 2
    out = cv2.applyColorMap(gray, cv2.COLORMAP_INFERNO)
    return cv2.cvtColor(out, cv2.COLOR_BGR2RGB)


#: prompt -> operator, in the canonical style order (style index = position).
STYLES = {
    "pencil sketch": pencil_sketch,
    "watercolor": watercolor,
    "cartoon": cartoon,
    "detail enhanced": detail_enhanced,
    "night": night,
    "golden hour": golden_hour,
    "black and white film": black_and_white_film,
    "thermal camera": thermal_camera,
}


def apply_style(style: str, img: np.ndarray) -> np.ndarray:
    """Apply the classical operator of ``style`` to one RGB uint8 frame."""
    if style not in STYLES:
        raise KeyError(f"unknown style {style!r}; styles: {', '.join(STYLES)}")
    img = np.ascontiguousarray(img, dtype=np.uint8)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 frame, found shape {img.shape}")
    return STYLES[style](img)


def apply_style_frames(style: str, frames: np.ndarray) -> np.ndarray:
    """Frame-by-frame classical operator on an (N, H, W, 3) uint8 clip."""
    return np.stack([apply_style(style, f) for f in frames])
