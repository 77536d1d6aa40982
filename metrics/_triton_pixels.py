"""MSE and exactness of uint8 frame pairs in one Triton pass (CUDA).

One read of both batches gives, per frame, the sum of squared differences (integers, summed
exactly), the largest absolute difference and the number of pixel positions where any channel
differs: the numbers of ``fidelity.mse_kernel`` and ``fidelity.exactness_kernel`` for uint8
input, exactly (integer sums do not depend on their order). Any strides (the stream hands
channels-last views of its staging buffers).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

# Pixel positions per program: 3 x 4096 squared differences of at most 255^2 stay below 2^31.
_BLOCK = 4096
_WEIGHTS: dict[tuple, torch.Tensor] = {}  # luma weights as float64 tensors, per device


@triton.jit
def _pixels(
    a_ptr, b_ptr, sq_ptr, mx_ptr, cnt_ptr, HW, W, n_tiles, an, ac, ah, aw, bn, bc, bh, bw, BLOCK: tl.constexpr
):
    t = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    p = t * BLOCK + tl.arange(0, BLOCK)
    mask = p < HW
    r = (p // W).to(tl.int64)
    c = (p % W).to(tl.int64)
    oa = n * an + r * ah + c * aw
    ob = n * bn + r * bh + c * bw
    sq = tl.zeros([BLOCK], dtype=tl.int32)
    mx = tl.zeros([BLOCK], dtype=tl.int32)
    for ch in tl.static_range(3):
        va = tl.load(a_ptr + oa + ch * ac, mask=mask, other=0).to(tl.int32)
        vb = tl.load(b_ptr + ob + ch * bc, mask=mask, other=0).to(tl.int32)
        d = va - vb
        sq += d * d
        mx = tl.maximum(mx, tl.abs(d))
    i = n * n_tiles + t
    tl.store(sq_ptr + i, tl.sum(sq, axis=0).to(tl.int64))
    tl.store(mx_ptr + i, tl.max(mx, axis=0))
    tl.store(cnt_ptr + i, tl.sum((mx > 0).to(tl.int32), axis=0))


def mse_exactness_u8(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(mse float64 (N,), {"max_abs_diff", "diff_fraction"} float32 (N,)) of uint8 (N, 3, H, W)."""
    n, _, h, w = a.shape
    hw = h * w
    n_tiles = triton.cdiv(hw, _BLOCK)
    sq = torch.empty((n, n_tiles), dtype=torch.int64, device=a.device)
    mx = torch.empty((n, n_tiles), dtype=torch.int32, device=a.device)
    cnt = torch.empty((n, n_tiles), dtype=torch.int32, device=a.device)
    _pixels[(n_tiles, n)](a, b, sq, mx, cnt, hw, w, n_tiles, *a.stride(), *b.stride(), BLOCK=_BLOCK)
    mse = sq.sum(1).double() / (3 * hw)
    mad = mx.amax(1).float()
    # diff_fraction as torch's float32 mean over (N, H*W) computes it on CUDA: the count times
    # float32(N) / float32(N * H * W) (ATen's mean kernel), so the numbers are the same
    factor = float(np.float32(n) / np.float32(n * hw))
    frac = cnt.sum(1).float() * factor
    return mse, {"max_abs_diff": mad, "diff_fraction": frac}


@triton.jit
def _luma(x_ptr, w_ptr, out_ptr, HW, W, xn, xc, xh, xw, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    p = t * BLOCK + tl.arange(0, BLOCK)
    mask = p < HW
    o = n * xn + (p // W).to(tl.int64) * xh + (p % W).to(tl.int64) * xw
    r = tl.load(x_ptr + o, mask=mask, other=0).to(tl.float64)
    g = tl.load(x_ptr + o + xc, mask=mask, other=0).to(tl.float64)
    b = tl.load(x_ptr + o + 2 * xc, mask=mask, other=0).to(tl.float64)
    # the weights as float64 values (a Python float argument would reach the kernel as float32)
    w0 = tl.load(w_ptr)
    w1 = tl.load(w_ptr + 1)
    w2 = tl.load(w_ptr + 2)
    # (R w0 + G w1) + B w2, each product and sum rounded to float64 (launched without FMA
    # contraction), then rounded half to even: numpy.round's arithmetic. y - floor(y) is exact.
    y = (r * w0 + g * w1) + b * w2
    f = tl.floor(y)
    d = y - f
    half = f * 0.5
    odd = (half - tl.floor(half)) != 0.0
    y = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    tl.store(out_ptr + n * HW + p, y.to(tl.float32), mask=mask)


def luma_u8(x: torch.Tensor, weights: tuple[float, float, float]) -> torch.Tensor:
    """Rounded BT.601 luma of uint8 (N, 3, H, W) frames -> (N, 1, H, W) float32, the numbers of
    ``_common.luma(x, rounded=True)`` exactly."""
    n, _, h, w = x.shape
    out = torch.empty((n, 1, h, w), dtype=torch.float32, device=x.device)
    key = (str(x.device), tuple(weights))
    wt = _WEIGHTS.get(key)
    if wt is None:
        wt = _WEIGHTS[key] = torch.tensor(weights, dtype=torch.float64).to(x.device)
    hw = h * w
    _luma[(triton.cdiv(hw, _BLOCK), n)](x, wt, out, hw, w, *x.stride(), BLOCK=_BLOCK, enable_fp_fusion=False)
    return out
