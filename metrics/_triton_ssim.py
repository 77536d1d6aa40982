"""SSIM of plane pairs as Triton kernels (CUDA): the arithmetic of ``fidelity._ssim_planes``.

Same window (the separable Gaussian of ``fidelity._gaussian_window``), same shift of each pair
to its rounded mean, same C1/C2, float32 throughout; only the order of the float32 sums
differs from the torch path (depthwise convolutions), so values agree to float32 rounding.

Three launches per batch of planes:

1. ``_hpass``: per plane, shift, form x, y, x^2, y^2, xy and filter each along rows ('valid'
   columns) into a scratch buffer (5, M, H, W - k + 1);
2. ``_vpass``: filter the scratch along columns ('valid' rows), form the SSIM map and sum it
   per tile of the map (a fixed tile grid: it depends on the frame size only);
3. ``_reduce``: per plane, sum its tile sums in a fixed order and divide by the map's size.

Every number depends on its own plane only, in an order fixed by the frame size: the result
is deterministic and the same whatever else is in the batch. The shift is the plane pair's
mean rounded to an integer, summed in float64 (exact for integer-valued planes, the 8-bit
luma and RGB of the default conventions, so independent of the reduction order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tile of the filter passes: rows x columns of the output handled by one program.
_BR, _BC = 8, 128
_REDUCE_BLOCK = 256


@triton.jit
def _hpass(
    x_ptr,
    y_ptr,
    shift_ptr,
    g_ptr,
    out_ptr,
    H,
    W,
    WV,
    n_cb,
    q_stride,
    K: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
    pid = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = (pid // n_cb) * BR + tl.arange(0, BR)[:, None]
    cols = (pid % n_cb) * BC + tl.arange(0, BC)[None, :]
    mask = (rows < H) & (cols < WV)
    s = tl.load(shift_ptr + m)
    src = m * H * W + rows * W + cols
    ax = tl.zeros([BR, BC], dtype=tl.float32)
    ay = tl.zeros([BR, BC], dtype=tl.float32)
    axx = tl.zeros([BR, BC], dtype=tl.float32)
    ayy = tl.zeros([BR, BC], dtype=tl.float32)
    axy = tl.zeros([BR, BC], dtype=tl.float32)
    for j in tl.static_range(K):
        w = tl.load(g_ptr + j)
        xv = tl.load(x_ptr + src + j, mask=mask, other=0.0) - s
        yv = tl.load(y_ptr + src + j, mask=mask, other=0.0) - s
        ax += w * xv
        ay += w * yv
        axx += w * (xv * xv)
        ayy += w * (yv * yv)
        axy += w * (xv * yv)
    dst = m * H * WV + rows * WV + cols
    tl.store(out_ptr + dst, ax, mask=mask)
    tl.store(out_ptr + q_stride + dst, ay, mask=mask)
    tl.store(out_ptr + 2 * q_stride + dst, axx, mask=mask)
    tl.store(out_ptr + 3 * q_stride + dst, ayy, mask=mask)
    tl.store(out_ptr + 4 * q_stride + dst, axy, mask=mask)


@triton.jit
def _vpass(
    h_ptr,
    shift_ptr,
    g_ptr,
    part_ptr,
    H,
    HV,
    WV,
    n_cb,
    n_tiles,
    q_stride,
    c1,
    c2,
    K: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
    pid = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = (pid // n_cb) * BR + tl.arange(0, BR)[:, None]
    cols = (pid % n_cb) * BC + tl.arange(0, BC)[None, :]
    mask = (rows < HV) & (cols < WV)
    src = m * H * WV + rows * WV + cols
    mx = tl.zeros([BR, BC], dtype=tl.float32)
    my = tl.zeros([BR, BC], dtype=tl.float32)
    exx = tl.zeros([BR, BC], dtype=tl.float32)
    eyy = tl.zeros([BR, BC], dtype=tl.float32)
    exy = tl.zeros([BR, BC], dtype=tl.float32)
    for i in tl.static_range(K):
        w = tl.load(g_ptr + i)
        off = src + i * WV
        mx += w * tl.load(h_ptr + off, mask=mask, other=0.0)
        my += w * tl.load(h_ptr + q_stride + off, mask=mask, other=0.0)
        exx += w * tl.load(h_ptr + 2 * q_stride + off, mask=mask, other=0.0)
        eyy += w * tl.load(h_ptr + 3 * q_stride + off, mask=mask, other=0.0)
        exy += w * tl.load(h_ptr + 4 * q_stride + off, mask=mask, other=0.0)
    vx = exx - mx * mx
    vy = eyy - my * my
    cxy = exy - mx * my
    s = tl.load(shift_ptr + m)
    mx = mx + s
    my = my + s
    num = (2 * mx * my + c1) * (2 * cxy + c2)
    den = (mx * mx + my * my + c1) * (vx + vy + c2)
    v = tl.where(mask, num / den, 0.0)
    tl.store(part_ptr + m * n_tiles + pid, tl.sum(tl.sum(v, axis=1), axis=0))


@triton.jit
def _reduce(part_ptr, out_ptr, n_tiles, count, BLOCK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_tiles, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        acc += tl.load(part_ptr + m * n_tiles + idx, mask=idx < n_tiles, other=0.0)
    tl.store(out_ptr + m, tl.sum(acc, axis=0) / count)


def plane_shift(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The pair's mean rounded to an integer, per plane (M,) float32 (sums in float64)."""
    n = x[0].numel()
    total = x.sum((1, 2, 3), dtype=torch.float64) + y.sum((1, 2, 3), dtype=torch.float64)
    return (total / (2 * n)).round_().float()


def ssim_planes(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, c1: float, c2: float) -> torch.Tensor:
    """Mean SSIM of each plane pair of (M, 1, H, W) float32 planes in 8-bit units -> (M,) float32."""
    x = x.contiguous()
    y = y.contiguous()
    g = g.contiguous()
    m, _, h, w = x.shape
    k = g.numel()
    hv, wv = h - k + 1, w - k + 1
    shift = plane_shift(x, y).contiguous()
    scratch = torch.empty((5, m, h, wv), dtype=torch.float32, device=x.device)
    q_stride = m * h * wv
    n_cb = triton.cdiv(wv, _BC)
    _hpass[(triton.cdiv(h, _BR) * n_cb, m)](
        x, y, shift, g, scratch, h, w, wv, n_cb, q_stride, K=k, BR=_BR, BC=_BC
    )
    n_tiles = triton.cdiv(hv, _BR) * n_cb
    parts = torch.empty((m, n_tiles), dtype=torch.float32, device=x.device)
    _vpass[(n_tiles, m)](
        scratch,
        shift,
        g,
        parts,
        h,
        hv,
        wv,
        n_cb,
        n_tiles,
        q_stride,
        float(c1),
        float(c2),
        K=k,
        BR=_BR,
        BC=_BC,
    )
    out = torch.empty(m, dtype=torch.float32, device=x.device)
    _reduce[(m,)](parts, out, n_tiles, float(hv * wv), BLOCK=_REDUCE_BLOCK)
    return out
