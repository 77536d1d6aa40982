"""Pixel-fidelity metrics: SSIM, PSNR and exactness (is the pair bit-identical, and if not, how far).

All functions take two batches ``(N, 3, H, W)`` (uint8 in [0, 255] or float in [0, 1]) on any
device and return one value per frame, shape ``(N,)``, on that device.

Default conventions are those of the original authors, as recomputed on the calibration set
(``tests/data/calibration/README.md``):

* SSIM -- Wang, Bovik, Sheikh, Simoncelli, "Image quality assessment: from error visibility to
  structural similarity", IEEE TIP 13(4), 2004, and the authors' MATLAB ``ssim_index.m``:
  luma ``round(0.299 R + 0.587 G + 0.114 B)`` in 8-bit units, 11x11 Gaussian window with
  sigma 1.5, K1 = 0.01, K2 = 0.03, L = 255, mean of the SSIM map over the 'valid' region (no
  padding: the output is (H - 10) x (W - 10)), no downsampling.
  To match scikit-image: ``structural_similarity(y_a, y_b, gaussian_weights=True, sigma=1.5,
  use_sample_covariance=False, data_range=255)`` on the same rounded luma as float64 -- its
  ``truncate=3.5`` gives the same 11 taps and it crops (11 - 1) // 2 = 5 pixels from each
  border before averaging, which is the valid region. ``channel="rgb"`` matches
  ``channel_axis=-1`` on the RGB planes (8-bit units).
* PSNR -- on the 8-bit RGB values, all three channels pooled into one MSE, peak 255.
  Identical frames give ``inf``. For uint8 input the squared error is summed exactly in int64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._common import LUMA_WEIGHTS, PEAK8, TritonFallback, check_pair, fast_path, luma, precise, to_8bit_scale
from ._errors import MetricInputError

# Constants of Wang et al. 2004, section III-C / ssim_index.m: K = [0.01 0.03], window
# fspecial('gaussian', 11, 1.5), L = 255.
SSIM_K1 = 0.01
SSIM_K2 = 0.03
SSIM_WIN = 11
SSIM_SIGMA = 1.5

SSIM_CHANNELS = ("luma", "rgb")


def ssim_convention(
    *,
    channel="luma",
    round_luma=True,
    win_size=SSIM_WIN,
    sigma=SSIM_SIGMA,
    data_range=None,
    k1=SSIM_K1,
    k2=SSIM_K2,
    border="valid",
) -> str:
    """The convention string reported next to SSIM values, e.g. ``luma-rounded,gaussian11,sigma1.5,valid``."""
    ch = "luma-rounded" if channel == "luma" and round_luma else channel
    parts = [ch, f"gaussian{win_size}", f"sigma{sigma:g}", border]
    if data_range is not None:
        parts.append(f"L={data_range:g}")
    if (k1, k2) != (SSIM_K1, SSIM_K2):
        parts.append(f"K1={k1:g},K2={k2:g}")
    return ",".join(parts)


def psnr_convention(*, data_range=None) -> str:
    return "rgb8,peak255" if data_range is None else f"rgb,peak={data_range:g}(input units)"


_WINDOWS: dict[tuple, torch.Tensor] = {}


def _gaussian_window(win_size: int, sigma: float, device) -> torch.Tensor:
    # Same construction as scipy.ndimage's _gaussian_kernel1d (normalised to sum 1) and
    # MATLAB's fspecial('gaussian') (separable; the 2-D product is normalised too).
    # Kept per device: a fresh host-to-GPU copy per call waits for the work queued before it.
    key = (win_size, float(sigma), str(torch.device(device)))
    g = _WINDOWS.get(key)
    if g is None:
        x = torch.arange(win_size, dtype=torch.float64) - (win_size - 1) / 2
        g = torch.exp(-0.5 * (x / sigma) ** 2)
        g = _WINDOWS[key] = (g / g.sum()).to(device=device, dtype=torch.float32)
    return g


def _filter_valid(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Separable 'valid' filtering of (M, 1, H, W)."""
    # As one depthwise convolution over M channels: same arithmetic as filtering each plane
    # with a (1, 1, 1, k) kernel, and ~10x faster on CPU back-ends.
    k = g.numel()
    m, _, h, w = x.shape
    y = x.reshape(1, m, h, w)
    y = F.conv2d(y, g.view(1, 1, 1, k).expand(m, 1, 1, k).contiguous(), groups=m)
    y = F.conv2d(y, g.view(1, 1, k, 1).expand(m, 1, k, 1).contiguous(), groups=m)
    return y.reshape(m, 1, h - k + 1, w - k + 1)


def _load_ssim():
    from ._triton_ssim import ssim_planes

    return ssim_planes


def _load_luma():
    from ._triton_pixels import luma_u8

    return luma_u8


def _load_pixels():
    from ._triton_pixels import mse_exactness_u8

    return mse_exactness_u8


#: The Triton kernel families of this module (each falls back to its torch code, once, with a
#: warning, if it fails before it ever ran here: :class:`evalkit.metrics._common.TritonFallback`).
TRITON_SSIM = TritonFallback("SSIM kernels (ssim_planes)", _load_ssim)
TRITON_LUMA = TritonFallback("luma kernel (luma_u8)", _load_luma)
TRITON_PIXELS = TritonFallback("MSE/exactness kernel (mse_exactness_u8)", _load_pixels)


def luma_kernel(x: torch.Tensor, *, rounded: bool = True) -> torch.Tensor:
    """:func:`evalkit.metrics._common.luma`; on CUDA, rounded luma of uint8 frames comes from one
    Triton pass (the same float64 arithmetic and rounding: the same numbers) unless turned off."""
    if rounded and x.device.type == "cuda" and x.dtype == torch.uint8 and fast_path("triton_luma"):
        fn = TRITON_LUMA.kernel()
        if fn is not None:
            return TRITON_LUMA.run(lambda: fn(x, LUMA_WEIGHTS), lambda: luma(x, rounded=rounded))
    return luma(x, rounded=rounded)


def _planes_fn(device: torch.device):
    """SSIM of plane pairs: the Triton kernels on CUDA (unless turned off), else torch."""
    if device.type == "cuda" and fast_path("triton_ssim"):
        fn = TRITON_SSIM.kernel()
        if fn is not None:
            return lambda *a: TRITON_SSIM.run(lambda: fn(*a), lambda: _ssim_planes(*a))
    return _ssim_planes


def _ssim_planes(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, c1: float, c2: float) -> torch.Tensor:
    """Mean SSIM of each plane pair of (M, 1, H, W) float32 planes in 8-bit units -> (M,)."""
    # Work on values centred on the pair's mean: the variance terms are shift invariant and
    # the float32 cancellation in E[x^2] - E[x]^2 shrinks; the means get the shift back.
    shift = ((x.mean((1, 2, 3), keepdim=True) + y.mean((1, 2, 3), keepdim=True)) / 2).round_()
    xs, ys = x - shift, y - shift
    m = xs.shape[0]
    stacked = torch.cat([xs, ys, xs * xs, ys * ys, xs * ys], 0)
    f = _filter_valid(stacked, g)
    mx, my, exx, eyy, exy = f[:m], f[m : 2 * m], f[2 * m : 3 * m], f[3 * m : 4 * m], f[4 * m :]
    vx = exx - mx * mx
    vy = eyy - my * my
    cxy = exy - mx * my
    mx = mx + shift
    my = my + shift
    num = (2 * mx * my + c1) * (2 * cxy + c2)
    den = (mx * mx + my * my + c1) * (vx + vy + c2)
    return (num / den).mean((1, 2, 3))


def ssim(
    a,
    b,
    *,
    channel: str = "luma",
    round_luma: bool = True,
    win_size: int = SSIM_WIN,
    sigma: float = SSIM_SIGMA,
    data_range: float | None = None,
    k1: float = SSIM_K1,
    k2: float = SSIM_K2,
    border: str = "valid",
) -> torch.Tensor:
    """Per-frame SSIM of two batches, shape ``(N,)`` float32.

    channel: ``"luma"`` (default, BT.601 luma as in the original code) or ``"rgb"`` (SSIM of
        each RGB plane, averaged over the three planes, as scikit-image with ``channel_axis``).
    round_luma: round luma to integers (the original convention; MATLAB's rgb2gray returns
        uint8). Ignored for ``"rgb"``.
    win_size, sigma: Gaussian window size and standard deviation (11, 1.5).
    data_range: L in C1 = (K1 L)^2, C2 = (K2 L)^2, in the units of the input (default: the
        full scale, 255 for uint8 and 1.0 for float). Frames are compared in 8-bit units; a
        float input with ``data_range=1.0`` gives the same value as its uint8 version.
    border: only ``"valid"`` (mean over the window positions fully inside the frame).
    """
    if channel not in SSIM_CHANNELS:
        raise MetricInputError(f"channel: expected one of {', '.join(SSIM_CHANNELS)}, found {channel!r}")
    if border != "valid":
        raise MetricInputError(f"border: expected 'valid', found {border!r}")
    if not (isinstance(win_size, int) and win_size >= 3 and win_size % 2 == 1):
        raise MetricInputError(f"win_size: expected an odd integer >= 3, found {win_size!r}")
    if not sigma > 0:
        raise MetricInputError(f"sigma: expected a positive number, found {sigma!r}")
    a, b = check_pair(a, b)
    return ssim_kernel(
        a,
        b,
        channel=channel,
        round_luma=round_luma,
        win_size=win_size,
        sigma=sigma,
        data_range=data_range,
        k1=k1,
        k2=k2,
    )


def ssim_kernel(
    a,
    b,
    *,
    channel="luma",
    round_luma=True,
    win_size=SSIM_WIN,
    sigma=SSIM_SIGMA,
    data_range=None,
    k1=SSIM_K1,
    k2=SSIM_K2,
    lumas=None,
) -> torch.Tensor:
    """:func:`ssim` on already checked inputs (``lumas``: their luma planes, if already made)."""
    if a.shape[2] < win_size or a.shape[3] < win_size:
        raise MetricInputError(
            f"frames are {a.shape[3]}x{a.shape[2]}, SSIM needs at least {win_size}x{win_size} (win_size)",
            field="a",
        )
    with precise():
        if data_range is None:
            L = PEAK8
        else:
            if not data_range > 0:
                raise MetricInputError(f"data_range: expected a positive number, found {data_range!r}")
            L = float(data_range) * (1.0 if a.dtype == torch.uint8 else PEAK8)
        c1, c2 = (k1 * L) ** 2, (k2 * L) ** 2
        g = _gaussian_window(win_size, sigma, a.device)
        planes = _planes_fn(a.device)
        n = a.shape[0]
        if channel == "luma":
            x, y = (
                lumas
                if lumas is not None
                else (luma_kernel(a, rounded=round_luma), luma_kernel(b, rounded=round_luma))
            )
            return planes(x, y, g, c1, c2)
        h, w = a.shape[2:]
        x = to_8bit_scale(a).reshape(n * 3, 1, h, w)
        y = to_8bit_scale(b).reshape(n * 3, 1, h, w)
        return planes(x, y, g, c1, c2).view(n, 3).mean(1)


def mse(a, b) -> torch.Tensor:
    """Per-frame mean squared error over all RGB values, in squared input units, float64 ``(N,)``."""
    a, b = check_pair(a, b)
    return mse_kernel(a, b)


def mse_kernel(a, b) -> torch.Tensor:
    with precise():
        if a.dtype == torch.uint8 and b.dtype == torch.uint8:
            d = a.to(torch.int32) - b.to(torch.int32)
            sq = (d * d).reshape(a.shape[0], -1).sum(1, dtype=torch.int64)  # exact
            return sq.double() / (a[0].numel())
        d = (
            to_8bit_scale(a) / PEAK8 - to_8bit_scale(b) / PEAK8
            if a.dtype != b.dtype
            else a.float() - b.float()
        )
        return (d * d).reshape(a.shape[0], -1).double().mean(1)


def mse_exactness_kernel(a, b) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`mse_kernel` and :func:`exactness_kernel` together; on CUDA, uint8 frames go
    through one Triton pass (the same numbers exactly) unless it is turned off."""
    if (
        a.device.type == "cuda"
        and a.dtype == torch.uint8
        and b.dtype == torch.uint8
        and fast_path("triton_pixels")
    ):
        fn = TRITON_PIXELS.kernel()
        if fn is not None:
            with precise():
                return TRITON_PIXELS.run(lambda: fn(a, b), lambda: (mse_kernel(a, b), exactness_kernel(a, b)))
    return mse_kernel(a, b), exactness_kernel(a, b)


def psnr(a, b, *, data_range: float | None = None) -> torch.Tensor:
    """Per-frame PSNR in dB, float64 ``(N,)``; ``inf`` for identical frames.

    ``10 log10(peak^2 / MSE)`` with the MSE pooled over the three RGB channels. ``data_range``
    is the peak in input units (default: 255 for uint8, 1.0 for float -- the same number for a
    float frame and its 8-bit version).
    """
    a, b = check_pair(a, b)
    return _psnr(a, b, data_range=data_range)


def _psnr(a, b, *, data_range=None) -> torch.Tensor:
    e = mse_kernel(a, b)
    if a.dtype == torch.uint8 and b.dtype == torch.uint8:
        peak = PEAK8 if data_range is None else float(data_range)
    else:  # compared in [0, 1] units
        peak = 1.0 if data_range is None else float(data_range)
    if not peak > 0:
        raise MetricInputError(f"data_range: expected a positive number, found {data_range!r}")
    with precise():
        return 10.0 * torch.log10(peak * peak / e)  # e == 0 -> inf


def psnr_from_mse(mse_value: float, peak: float = PEAK8) -> float:
    return math.inf if mse_value == 0 else 10.0 * math.log10(peak * peak / mse_value)


def exactness(a, b) -> dict[str, torch.Tensor]:
    """How far from bit-identical each frame pair is.

    Returns ``{"max_abs_diff": (N,) float32, "diff_fraction": (N,) float32}``:
    the largest absolute difference of any channel value, in 8-bit units (float inputs are
    multiplied by 255, not rounded), and the share of pixel positions where any channel
    differs at all (exact comparison). A bit-identical pair has 0 and 0.
    """
    a, b = check_pair(a, b)
    return exactness_kernel(a, b)


def exactness_kernel(a, b) -> dict[str, torch.Tensor]:
    with precise():
        n = a.shape[0]
        if a.dtype == torch.uint8 and b.dtype == torch.uint8:
            d = (a.to(torch.int16) - b.to(torch.int16)).abs_()
            mad = d.reshape(n, -1).amax(1).float()
            differs = d.amax(1) > 0
        else:
            d = (to_8bit_scale(a) - to_8bit_scale(b)).abs_()
            mad = d.reshape(n, -1).amax(1)
            differs = d.amax(1) > 0
        frac = differs.reshape(n, -1).float().mean(1)
    return {"max_abs_diff": mad, "diff_fraction": frac}
