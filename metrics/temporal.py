"""Temporal-consistency metrics of clips ``(T, 3, H, W)`` (uint8, or float in [0, 1]).

Each function returns one value per frame transition t = 1 .. T-1, shape ``(T-1,)``,
on the frames' device; the value at index i belongs to frame t = i + 1. Units:

* :func:`warping_error` -- Lai, Huang, Wang, Shechtman, Yumer, Yang, "Learning Blind Video
  Temporal Consistency", ECCV 2018, eq. (9): frame t-1 is warped onto frame t with the flow of
  the same clip (t -> t-1, see :mod:`evalkit.metrics.flow`), pixels failing the forward-backward check
  or whose source leaves the frame are masked out, and the error is the **mean squared
  difference over the kept pixels and the three RGB channels, in [0, 1] units** (as Lai et
  al.'s evaluation code, which reads frames as float in [0, 1]). Multiply by 255^2 = 65025
  for 8-bit units; some papers report it x 1000 or x 100. ``nan`` if no pixel is kept. The
  flow method changes the value (Lai et al. use FlowNet2; we use OpenCV DIS, preset "fast", by default;
  ``method="torch"`` computes the flows on the frames' device, see :mod:`evalkit.metrics.flow`).
* :func:`tlp` -- Chu, Xie, Mayer, Leal-Taixe, Thuerey, "Learning Temporal Coherence via
  Self-Supervision for GAN-based Video Generation" (TecoGAN), ACM TOG 2020:
  ``|LPIPS(a_t, a_t-1) - LPIPS(b_t, b_t-1)|``, in LPIPS units (TecoGAN tables show x 100).
* :func:`tof` -- same paper: mean over pixels of the end-point distance ``|f_a - f_b|_2``
  between the flows t-1 -> t of the two clips, in pixels of the frames' resolution (TecoGAN
  uses Farneback, ``method="farneback"``, and tables show x 10).
* :func:`flicker` -- mean absolute difference of the frame-to-frame changes of the two clips
  after a low-pass: ``mean |(La_t - La_t-1) - (Lb_t - Lb_t-1)|`` where ``L`` is the unrounded
  BT.601 luma in 8-bit units averaged over non-overlapping ``block`` x ``block`` squares
  (partial blocks at the right and bottom edges are dropped). 8-bit luma units; 0 for
  identical clips; a brightness flicker of amplitude ``k`` added to one clip raises it by
  about ``2k``. :func:`flicker_single` is the one-clip variant
  ``mean |(L_t - L_t-1) - (L_t-1 - L_t-2)|`` (second temporal difference, T-2 values).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ._common import (
    TritonFallback,
    as_frames,
    check_pair,
    fast_path,
    fast_path_forced,
    luma,
    luma_u8,
    precise,
    to_unit,
)
from ._errors import MetricInputError
from .flow import (
    DEFAULT_PRESET,
    check_flow_options,
    device_flows,
    fb_consistent,
    flow_grid,
    flows_u8,
    to_tensor_flow,
)

FLICKER_BLOCK = 16


def _need_two(x, name):
    if x.shape[0] < 2:
        raise MetricInputError(f"temporal metrics need at least 2 frames, found {x.shape[0]}", field=name)


def warping_error_from_flows(
    prev: torch.Tensor, cur: torch.Tensor, bwd: torch.Tensor, fwd: torch.Tensor
) -> torch.Tensor:
    """Warping error of ``prev`` onto ``cur`` (both (N, 3, H, W) float in [0, 1]) -> (N,).

    ``bwd``: flow cur -> prev, ``fwd``: flow prev -> cur, both (N, 2, H, W).
    """
    with precise():
        # one sampling grid for both the frame and the forward flow (as warp() and
        # consistency_mask() would each build it; grid_sample treats channels independently)
        grid, inside, _ = flow_grid(bwd)
        both = F.grid_sample(
            torch.cat([prev, fwd], 1), grid, mode="bilinear", padding_mode="border", align_corners=True
        )
        warped, f_at = both[:, : prev.shape[1]], both[:, prev.shape[1] :]
        mask = fb_consistent(bwd, f_at, inside).unsqueeze(1).float()
        d = (warped - cur) ** 2 * mask
        kept = mask.sum((1, 2, 3)) * 3
        err = d.sum((1, 2, 3)) / kept
        return torch.where(kept > 0, err, torch.full_like(err, float("nan")))


def _load_temporal():
    from ._triton_temporal import warp_errors_tof

    return warp_errors_tof


#: The Triton kernels of :func:`temporal_from_flows` as a family with a torch fallback (one
#: warning, then the torch path for the process: :class:`evalkit.metrics._common.TritonFallback`). Not
#: strict: a new frame size compiles new kernels, which may fail where others ran.
TRITON_TEMPORAL = TritonFallback("warping error/tOF kernels (warp_errors_tof)", _load_temporal, strict=False)


def _temporal_kernel(device: torch.device):
    """The Triton entry point when it is to be used on ``device`` (CUDA by default; any device
    inside a ``fast_paths(triton_temporal=True)`` block), else None."""
    forced = fast_path_forced("triton_temporal")
    on = forced if forced is not None else device.type == "cuda" and fast_path("triton_temporal")
    return TRITON_TEMPORAL.kernel() if on else None


def temporal_from_flows(
    pa: torch.Tensor,
    pb: torch.Tensor | None,
    fwd_a: torch.Tensor,
    bwd_a: torch.Tensor,
    fwd_b: torch.Tensor | None = None,
    bwd_b: torch.Tensor | None = None,
):
    """Warping errors of clip a (and b) and the tOF between them from their flows.

    ``pa``, ``pb``: (N+1, 3, H, W) float32 frames in [0, 1]; ``fwd_*`` (t-1 -> t) and ``bwd_*``
    (t -> t-1): (N, 2, H, W). Returns ``(warp_error_a, warp_error_b, tof)``, each (N,), the
    last two None without clip b. :func:`warping_error_from_flows` and :func:`tof_from_flows`,
    or on CUDA the Triton kernels of :mod:`evalkit.metrics._triton_temporal` in one pass per clip
    (the same numbers up to the order of float32 sums; ``fast_paths(triton_temporal=False)``
    or ``EVALKIT_TRITON=0`` keeps the torch path).
    """
    two = pb is not None

    def torch_path():  # each function runs in its own precise() block
        wa = warping_error_from_flows(pa[:-1], pa[1:], bwd_a, fwd_a)
        if not two:
            return wa, None, None
        return (wa, warping_error_from_flows(pb[:-1], pb[1:], bwd_b, fwd_b), tof_from_flows(fwd_a, fwd_b))

    fn = _temporal_kernel(pa.device)
    if fn is None:
        return torch_path()

    def triton_path():
        sides = [(pa[:-1], pa[1:], bwd_a, fwd_a)] + ([(pb[:-1], pb[1:], bwd_b, fwd_b)] if two else [])
        errs, t = fn(sides, (fwd_a, fwd_b) if two else None)
        return (errs[0], errs[1], t) if two else (errs[0], None, None)

    with precise():
        return TRITON_TEMPORAL.run(triton_path, torch_path)


def _pair_flows(srcs, dsts, clips, method, preset, scale) -> torch.Tensor:
    """Flows ``srcs[i] -> dsts[i]`` between frames of the ``clips`` (a list of (N, 3, H, W),
    frames numbered across the list) -> ``(len(srcs), 2, H, W)`` on the clips' device
    (``"torch"``: computed there)."""
    if method == "torch":
        y = torch.cat([luma(c) for c in clips])
        return device_flows(y[list(srcs)], y[list(dsts)], scale)
    g = np.concatenate([luma_u8(c) for c in clips])
    return to_tensor_flow(
        flows_u8([(g[s], g[d]) for s, d in zip(srcs, dsts)], method, preset, scale), clips[0].device
    )


def _flows(clip, method, preset, scale):
    t = clip.shape[0]
    prev, cur = list(range(t - 1)), list(range(1, t))
    fl = _pair_flows(prev + cur, cur + prev, [clip], method, preset, scale)
    return fl[: t - 1], fl[t - 1 :]  # forward (t-1 -> t), backward (t -> t-1)


def warping_error(
    clip, *, method: str = "dis", preset: str = DEFAULT_PRESET, scale: float = 1.0
) -> torch.Tensor:
    """Per-transition warping error of one clip, ``(T-1,)`` float32, [0, 1]-unit MSE (see module doc)."""
    check_flow_options(method, preset, scale)
    clip = as_frames(clip, "clip")
    _need_two(clip, "clip")
    fwd, bwd = _flows(clip, method, preset, scale)
    return temporal_from_flows(to_unit(clip), None, fwd, bwd)[0]


def tlp(a, b, *, net: str = "alex") -> torch.Tensor:
    """``|LPIPS(a_t, a_t-1) - LPIPS(b_t, b_t-1)|`` per transition, ``(T-1,)`` float32."""
    from .perceptual import get_model

    a, b = check_pair(a, b)
    _need_two(a, "a")
    m = get_model(net, a.device)
    norm = not m.fused()  # raw features for the Triton head (CUDA), as the stream
    fa, fb = m.features(a, normalised=norm), m.features(b, normalised=norm)
    da = m.distance([f[1:] for f in fa], [f[:-1] for f in fa], normalised=norm)
    db = m.distance([f[1:] for f in fb], [f[:-1] for f in fb], normalised=norm)
    return (da - db).abs()


def tof(a, b, *, method: str = "dis", preset: str = DEFAULT_PRESET, scale: float = 1.0) -> torch.Tensor:
    """Mean end-point distance between the t-1 -> t flows of ``a`` and ``b``, pixels, ``(T-1,)``."""
    check_flow_options(method, preset, scale)
    a, b = check_pair(a, b)
    _need_two(a, "a")
    n = a.shape[0]
    srcs = list(range(n - 1)) + list(range(n, 2 * n - 1))
    fl = _pair_flows(srcs, [i + 1 for i in srcs], [a, b], method, preset, scale)
    return tof_from_flows(fl[: n - 1], fl[n - 1 :])


def tof_from_flows(fa: torch.Tensor, fb: torch.Tensor) -> torch.Tensor:
    with precise():
        d = fa - fb
        return torch.sqrt((d * d).sum(1)).mean((1, 2))


def lowpass_luma(x: torch.Tensor, block: int = FLICKER_BLOCK) -> torch.Tensor:
    """Unrounded BT.601 luma (8-bit units) averaged over ``block`` x ``block`` squares -> (N, 1, h, w)."""
    if x.shape[2] < block or x.shape[3] < block:
        raise MetricInputError(
            f"flicker block: {block} is larger than the frames ({x.shape[3]}x{x.shape[2]})"
        )
    with precise():
        return F.avg_pool2d(luma(x, rounded=False), block, stride=block)


def flicker_from_lowpass(la: torch.Tensor, lb: torch.Tensor) -> torch.Tensor:
    """Pair flicker from low-passed clips (T, 1, h, w) -> (T-1,)."""
    with precise():
        return ((la[1:] - la[:-1]) - (lb[1:] - lb[:-1])).abs().mean((1, 2, 3))


def flicker(a, b, *, block: int = FLICKER_BLOCK) -> torch.Tensor:
    """Pair flicker ``mean |dLa_t - dLb_t|`` per transition, 8-bit luma units, ``(T-1,)``."""
    check_block(block)
    a, b = check_pair(a, b)
    _need_two(a, "a")
    return flicker_from_lowpass(lowpass_luma(a, block), lowpass_luma(b, block))


def flicker_single(clip, *, block: int = FLICKER_BLOCK) -> torch.Tensor:
    """One-clip flicker ``mean |dL_t - dL_t-1|`` for t = 2 .. T-1, 8-bit luma units, ``(T-2,)``."""
    check_block(block)
    clip = as_frames(clip, "clip")
    if clip.shape[0] < 3:
        raise MetricInputError(f"clip: one-clip flicker needs at least 3 frames, found {clip.shape[0]}")
    lo = lowpass_luma(clip, block)
    with precise():
        d = lo[1:] - lo[:-1]
        return (d[1:] - d[:-1]).abs().mean((1, 2, 3))


def check_block(block):
    if not (isinstance(block, int) and block >= 1):
        raise MetricInputError(f"block: expected a positive integer, found {block!r}")
