"""Optical flow (OpenCV DIS or Farneback, or ours in torch), backward warping and the forward-backward check.

Flow convention: ``flow[:, 0]`` is the horizontal and ``flow[:, 1]`` the vertical displacement,
in pixels of the frames given, such that pixel ``(x, y)`` of ``src`` is found at
``(x + u, y + v)`` in ``dst`` (OpenCV's ``calc(prev, next)`` convention). Flow is computed on
the rounded BT.601 luma (8-bit), as OpenCV's ``cvtColor(RGB2GRAY)`` gives it.

Methods:

* ``"dis"`` -- Kroeger, Timofte, Dai, Van Gool, "Fast Optical Flow using Dense Inverse Search",
  ECCV 2016 (``cv2.DISOpticalFlow``), preset ``"ultrafast"``, ``"fast"`` (default) or
  ``"medium"``. Default ``"fast"``: at 1280x720 one flow costs about 25 ms on one CPU core
  (ultrafast about 14 ms, medium about 115 ms, Farneback about 370 ms), and the temporal
  metrics need four flows per frame pair (forward and backward on each clip), so 100 pairs/s
  at 720p needs about 400 flows/s: about 10 cores with ``"fast"``, about 45 with ``"medium"``.
  ``"fast"`` keeps DIS's variational refinement (``"ultrafast"`` drops it and gives blockier
  flow); ``"medium"`` and Farneback (TecoGAN's choice) stay available as options.
* ``"farneback"`` -- Farneback, "Two-Frame Motion Estimation Based on Polynomial Expansion",
  SCIA 2003 (``cv2.calcOpticalFlowFarneback``) with the parameters TecoGAN's tOF uses
  (pyr_scale 0.5, levels 3, winsize 15, iterations 3, poly_n 5, poly_sigma 1.2, flags 0).

* ``"torch"`` -- a coarse-to-fine combined local-global flow in torch (:mod:`evalkit.metrics.torchflow`,
  convention ``torch-clg-v2``), computed on the frames' device (CUDA or CPU), batched over
  frame pairs, float32, deterministic. On a GPU it takes the flow off the CPU, which otherwise
  bounds the temporal metrics; its end-point error on synthetic motion is lower than DIS
  ``fast``'s (figures in ``docs/metrics.md``). Opt-in: ``"dis"`` stays the default on every
  device, so recorded conventions do not change with the machine. ``preset`` is ignored.

``scale`` < 1 computes the flow on frames downscaled with area averaging and scales the
vectors back up (bilinear), which trades accuracy for speed on large frames.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor

import numpy as np
import torch
import torch.nn.functional as F

from ._common import luma_u8
from ._errors import MetricInputError

FLOW_METHODS = ("dis", "farneback", "torch")
DIS_PRESETS = ("ultrafast", "fast", "medium")
#: DIS preset used unless one is asked for (see the module docstring for the choice).
DEFAULT_PRESET = "fast"
# TecoGAN metrics.py (Chu et al., "Learning temporal coherence via self-supervision for
# GAN-based video generation", SIGGRAPH 2020): cv2.calcOpticalFlowFarneback(pre, cur, None,
# 0.5, 3, 15, 3, 5, 1.2, 0).
FARNEBACK_PARAMS = (0.5, 3, 15, 3, 5, 1.2, 0)
# Forward-backward consistency (Sundaram, Brox, Keutzer, "Dense point trajectories by
# GPU-accelerated large displacement optical flow", ECCV 2010), thresholds as in Ruder,
# Dosovitskiy, Brox, "Artistic style transfer for videos", GCPR 2016, eq. (6):
# |w + w~|^2 <= 0.01 (|w|^2 + |w~|^2) + 0.5.
FB_ALPHA = 0.01
FB_BETA = 0.5

_local = threading.local()


def resolve_flow(method: str, device) -> str:
    """``method``, with ``"auto"`` resolved for ``device``: the ``"torch"`` flow on a GPU (the
    full set is then not bound by the CPU), OpenCV DIS elsewhere (the CPU's fastest at its
    accuracy). Reports record the resolved method in their conventions."""
    if method != "auto":
        return method
    return "torch" if torch.device(device).type == "cuda" else "dis"


def check_flow_options(method: str, preset: str, scale: float) -> None:
    if method not in FLOW_METHODS:
        raise MetricInputError(f"flow method: expected one of {', '.join(FLOW_METHODS)}, found {method!r}")
    if method == "dis" and preset not in DIS_PRESETS:
        raise MetricInputError(f"flow preset: expected one of {', '.join(DIS_PRESETS)}, found {preset!r}")
    if not (isinstance(scale, (int, float)) and 0 < scale <= 1):
        raise MetricInputError(f"flow scale: expected a number in (0, 1], found {scale!r}")


def flow_convention(method: str = "dis", preset: str = DEFAULT_PRESET, scale: float = 1.0) -> str:
    if method == "torch":
        from .torchflow import CONVENTION as name
    else:
        name = f"dis-{preset}" if method == "dis" else "farneback-tecogan"
    return f"{name},luma8" + (f",scale{scale:g}" if scale != 1 else "")


def _dis(preset: str, shape: tuple):
    """This thread's DIS instance for ``preset`` and frame ``shape``. An instance is reused only
    for frames of the size it last saw: one that has computed flows of another size gives
    different flows (measured: warping errors 100x apart), so results would depend on what
    the thread computed before."""
    import cv2

    cache = getattr(_local, "dis", None)
    if cache is None:
        cache = _local.dis = {}
    key = (preset, shape)
    inst = cache.get(key)
    if inst is None:
        code = {
            "ultrafast": cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST,
            "fast": cv2.DISOPTICAL_FLOW_PRESET_FAST,
            "medium": cv2.DISOPTICAL_FLOW_PRESET_MEDIUM,
        }[preset]
        for k in [k for k in cache if k[0] == preset]:
            del cache[k]
        inst = cache[key] = cv2.DISOpticalFlow_create(code)
    return inst


def flow_u8(
    src: np.ndarray, dst: np.ndarray, method: str = "dis", preset: str = DEFAULT_PRESET, scale: float = 1.0
) -> np.ndarray:
    """Flow between two (H, W) uint8 grey images -> (H, W, 2) float32 (OpenCV convention)."""
    import cv2

    if method == "torch":
        f = device_flows(
            torch.from_numpy(np.ascontiguousarray(src))[None, None].float(),
            torch.from_numpy(np.ascontiguousarray(dst))[None, None].float(),
            scale,
        )
        return f[0].permute(1, 2, 0).numpy()
    h, w = src.shape
    if scale != 1:
        sw, sh = max(8, round(w * scale)), max(8, round(h * scale))
        src = cv2.resize(src, (sw, sh), interpolation=cv2.INTER_AREA)
        dst = cv2.resize(dst, (sw, sh), interpolation=cv2.INTER_AREA)
    try:
        if method == "dis":
            f = _dis(preset, src.shape).calc(src, dst, None)
        else:
            f = cv2.calcOpticalFlowFarneback(src, dst, None, *FARNEBACK_PARAMS)
    except cv2.error as e:  # frames too small or too thin for its pyramid (2x2, 2048x16)
        why = next((ln.strip() for ln in str(e).splitlines() if "error:" in ln), str(e))
        raise MetricInputError(
            f"frames: {w}x{h}: OpenCV's {method} optical flow (temporal "
            f"metrics) cannot take them ({why.split('error:')[-1].strip()[:120]}"
            "); try --no-temporal or --flow farneback"
        ) from None
    if scale != 1:
        f = cv2.resize(f, (w, h), interpolation=cv2.INTER_LINEAR)
        f[..., 0] *= w / sw
        f[..., 1] *= h / sh
    return f


def flow_into(
    out: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    method: str = "dis",
    preset: str = DEFAULT_PRESET,
    scale: float = 1.0,
) -> None:
    """:func:`flow_u8` written into ``out`` ((H, W, 2) float32, e.g. a slice of a pinned buffer).

    OpenCV computes into a fresh array that is then copied: an array handed to DIS as its
    output may be taken as the initial flow by some OpenCV versions, which would change results.
    """
    np.copyto(out, flow_u8(src, dst, method, preset, scale))


def flows_u8(pairs, method="dis", preset=DEFAULT_PRESET, scale=1.0, executor: Executor | None = None):
    """Flows of a list of (src, dst) grey pairs, in parallel threads when ``executor`` is given.

    Returns a list (or, with an executor, a list of futures) of (H, W, 2) float32 arrays.
    """
    if executor is None:
        return [flow_u8(s, d, method, preset, scale) for s, d in pairs]
    return [executor.submit(flow_u8, s, d, method, preset, scale) for s, d in pairs]


def device_flows(src: torch.Tensor, dst: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``"torch"`` flows of rounded-luma planes ``(N, 1, H, W)`` (8-bit units) on their device
    -> ``(N, 2, H, W)`` float32. ``scale`` < 1: on frames area-downscaled there, vectors
    upscaled bilinearly (as :func:`flow_u8` does with OpenCV)."""
    from ._common import precise
    from .torchflow import torch_flow

    h, w = src.shape[2:]
    if scale == 1:
        return torch_flow(src, dst)
    sw, sh = max(8, round(w * scale)), max(8, round(h * scale))
    with precise():
        small = F.interpolate(torch.cat([src, dst]).float(), size=(sh, sw), mode="area")
    f = torch_flow(small[: src.shape[0]], small[src.shape[0] :])
    with precise():
        f = F.interpolate(f, size=(h, w), mode="bilinear", align_corners=False)
        f[:, 0] *= w / sw
        f[:, 1] *= h / sh
    return f


def to_tensor_flow(flows: list[np.ndarray], device) -> torch.Tensor:
    """List of (H, W, 2) arrays -> (N, 2, H, W) float32 tensor on ``device``."""
    return torch.from_numpy(np.stack(flows)).permute(0, 3, 1, 2).to(device).contiguous()


def optical_flow(
    src, dst, *, method: str = "dis", preset: str = DEFAULT_PRESET, scale: float = 1.0
) -> torch.Tensor:
    """Dense flow from each frame of ``src`` to the same frame of ``dst`` -> ``(N, 2, H, W)``.

    Inputs are batches ``(N, 3, H, W)`` (uint8 or float in [0, 1]); the flow is computed by
    OpenCV on the CPU (``"torch"``: on the inputs' device) and returned on the inputs' device,
    float32, in pixels.
    """
    from ._common import check_pair, luma

    check_flow_options(method, preset, scale)
    src, dst = check_pair(src, dst, names=("src", "dst"))
    if method == "torch":
        return device_flows(luma(src), luma(dst), scale)
    gs, gd = luma_u8(src), luma_u8(dst)
    return to_tensor_flow(flows_u8(list(zip(gs, gd)), method, preset, scale), src.device)


def flow_grid(flow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, _, h, w = flow.shape
    ys = torch.arange(h, device=flow.device, dtype=torch.float32).view(1, h, 1)
    xs = torch.arange(w, device=flow.device, dtype=torch.float32).view(1, 1, w)
    px = xs + flow[:, 0]
    py = ys + flow[:, 1]
    inside = (px >= 0) & (px <= w - 1) & (py >= 0) & (py <= h - 1)
    gx = px * (2.0 / max(w - 1, 1)) - 1.0
    gy = py * (2.0 / max(h - 1, 1)) - 1.0
    return torch.stack([gx, gy], -1), inside, (px, py)


def warp(img: torch.Tensor, flow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward warp: ``out(x) = img(x + flow(x))`` (bilinear).

    ``img`` (N, C, H, W) float, ``flow`` (N, 2, H, W). Returns ``(warped, inside)`` where
    ``inside`` (N, H, W) bool marks pixels whose source lies inside the frame.
    """
    grid, inside, _ = flow_grid(flow)
    out = F.grid_sample(img, grid, mode="bilinear", padding_mode="border", align_corners=True)
    return out, inside


def consistency_mask(
    bwd: torch.Tensor, fwd: torch.Tensor, *, alpha: float = FB_ALPHA, beta: float = FB_BETA
) -> torch.Tensor:
    """Forward-backward check for warping frame t-1 onto frame t -> (N, H, W) bool.

    ``bwd``: flow t -> t-1 (used to warp), ``fwd``: flow t-1 -> t. A pixel x of frame t is
    kept when its source lies inside frame t-1 and ``|b + f~|^2 <= alpha (|b|^2 + |f~|^2) + beta``
    with ``b = bwd(x)`` and ``f~ = fwd(x + b)`` (occlusions and flow errors fail it).
    """
    f_at, inside = warp(fwd, bwd)
    return fb_consistent(bwd, f_at, inside, alpha=alpha, beta=beta)


def fb_consistent(
    bwd: torch.Tensor,
    f_at: torch.Tensor,
    inside: torch.Tensor,
    *,
    alpha: float = FB_ALPHA,
    beta: float = FB_BETA,
) -> torch.Tensor:
    """:func:`consistency_mask` given ``f_at = fwd`` warped by ``bwd`` and its ``inside`` mask."""
    s = bwd + f_at
    lhs = (s * s).sum(1)
    rhs = alpha * ((bwd * bwd).sum(1) + (f_at * f_at).sum(1)) + beta
    return inside & (lhs <= rhs)
