"""Full-reference and temporal video metrics over batched frames (N, 3, H, W).

This package (the folder ``metrics/``, imported as ``evalkit.metrics``) knows nothing of runs,
suites or studies; it imports no other part of evalkit.

Frames are ``(N, 3, H, W)`` tensors (or numpy arrays), uint8 in [0, 255] or float in [0, 1],
on any torch device; metrics compute in float32 there (TF32 off, deterministic) and return one
value per frame. Conventions: see each module's docstring. Every metric key, with its unit,
direction (higher or lower is better), first frame, aggregate rules and noise-floor ratio, is
listed once in :mod:`evalkit.metrics.catalogue` (``METRICS``); :data:`evalkit.metrics.stream.UNITS` derives
from it.

Functional API::

    lpips(a, b, *, net="alex")                          evalkit.metrics.perceptual
    ssim(a, b, *, channel="luma", round_luma=True, win_size=11, sigma=1.5,
         data_range=None, k1=0.01, k2=0.03, border="valid")   evalkit.metrics.fidelity
    psnr(a, b, *, data_range=None); mse(a, b); exactness(a, b)
    optical_flow(src, dst, *, method="dis", preset="fast", scale=1.0)     evalkit.metrics.flow
        (method "dis", "farneback" on the CPU, or "torch" on the frames' device: evalkit.metrics.torchflow)
    warping_error(clip, ...); tlp(a, b, *, net); tof(a, b, ...);
    flicker(a, b, *, block=16); flicker_single(clip, *, block=16)        evalkit.metrics.temporal

VMAF (optional; an ffmpeg process with libvmaf, not torch): evalkit.metrics.vmaf.vmaf(a, b, *,
model="vmaf_v0.6.1", matrix="bt709", yuv_range="limited", n_threads=None).

Streaming API (evalkit.metrics.stream): PairEvaluator (update/compute/reset), stream_pair,
evaluate_pair, json_safe.
"""

from ._errors import MetricInputError, MetricsError, VmafUnavailable, WeightsUnavailable

# The public surface is imported lazily so that ``import evalkit.metrics`` (or evalkit.metrics.weights, which
# ``evalkit setup`` uses) does not pull torch in until a metric is used.
_LAZY = {
    "default_device": "._common",
    "exactness": ".fidelity",
    "mse": ".fidelity",
    "psnr": ".fidelity",
    "ssim": ".fidelity",
    "optical_flow": ".flow",
    "warp": ".flow",
    "LPIPS": ".perceptual",
    "lpips": ".perceptual",
    "METRICS": ".catalogue",
    "Metric": ".catalogue",
    "UNITS": ".stream",
    "PairEvaluator": ".stream",
    "evaluate_pair": ".stream",
    "json_safe": ".stream",
    "stream_pair": ".stream",
    "flicker": ".temporal",
    "flicker_single": ".temporal",
    "tlp": ".temporal",
    "tof": ".temporal",
    "warping_error": ".temporal",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "MetricsError",
    "MetricInputError",
    "WeightsUnavailable",
    "VmafUnavailable",
    "default_device",
    "lpips",
    "LPIPS",
    "ssim",
    "psnr",
    "mse",
    "exactness",
    "optical_flow",
    "warp",
    "warping_error",
    "tlp",
    "tof",
    "flicker",
    "flicker_single",
    "PairEvaluator",
    "stream_pair",
    "evaluate_pair",
    "json_safe",
    "UNITS",
    "METRICS",
    "Metric",
]
