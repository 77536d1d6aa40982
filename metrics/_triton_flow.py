"""Fused Triton kernels for one warp step of :mod:`evalkit.metrics.torchflow` (CUDA; CPU tensors only
under ``TRITON_INTERPRET=1``, for tests).

The same arithmetic as the torch path of ``torchflow._flow_batch`` (equal up to float32
rounding; the convention does not change), in four kinds of kernel instead of ~80 torch ops per
warp step:

1. :func:`_products_kernel` -- ``dst`` warped back by the flow (bilinear, border clamp, exactly
   ``F.grid_sample(..., padding_mode="border", align_corners=True)``'s formulas), the ``inside``
   mask, the 5-tap central differences of ``(src + warped) / 2`` with replicate borders (the
   warp is recomputed at the 8 neighbours: nothing is written in between) and the five
   products ``Ix^2, IxIy, Iy^2, IxIt, IyIt``.
2. :func:`_blur_x_kernel`, :func:`_blur_y_coef_kernel` -- the separable Gaussian window
   (replicate borders) of the five products; the second pass also forms the per-pixel
   coefficients of the Jacobi step (``1 / (J11 + alpha)``, ``1 / (J22 + alpha)``, ``J12`` and
   the constant term, which needs the 4-neighbour mean of the flow) and the first iterate.
3. :func:`_jacobi_kernel` -- one Jacobi iteration (4-neighbour mean with replicate borders,
   both components), ping-ponging two buffers; the last one adds the increment to the flow.

The products and row-pass (blur_x) kernels run on a 2-D grid (blocks of rows, blocks of x: no
per-lane division; blur_x programs whose window stays inside the row load at constant offsets,
without clamping), the column pass and the Jacobi kernels on the flattened batch (on one H200
the column pass on the 2-D grid took 0.31 ms a frame pair against 0.26: kept 1-D).
Every output pixel is computed by the same code from its own neighbourhood, with no reduction
across pixels or pairs: the result is deterministic and does not depend on the batch.
Sizes are not specialised on (one compilation per kernel and constant, whatever the pyramid
level). Indices are int32: callers keep ``pairs x 5 x H x W`` below 2**31 (:data:`MAX_ELEMENTS`).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

MAX_ELEMENTS = (1 << 31) - 1
BLOCK = 256
#: Under TRITON_INTERPRET=1 (tests on CPU tensors) one program per launch: the interpreter's cost
#: is per operation, not per element.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def pixel_index(total, H, W, BLOCK: tl.constexpr):
    """This program's BLOCK pixels of a (N, H, W) batch: ``live`` (inside ``total``), the plane
    size ``HW``, the image ``n``, the offset ``rem`` in its plane and the pixel (x, y). Lanes
    past ``total`` read pixel 0 (their stores are masked by ``live``)."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < total
    idx = tl.where(live, idx, 0)
    HW = H * W
    n = idx // HW
    rem = idx - n * HW
    y = rem // W
    x = rem - y * W
    return live, HW, n, rem, y, x


@triton.jit
def _avg4_pair(pu, pv, x, y, H, W):
    """Mean of the four neighbours (replicate borders) of pixel (x, y) in two planes."""
    xl = tl.maximum(x - 1, 0)
    xr = tl.minimum(x + 1, W - 1)
    yu = tl.maximum(y - 1, 0) * W
    yd = tl.minimum(y + 1, H - 1) * W
    yc = y * W
    nu = (tl.load(pu + yu + x) + tl.load(pu + yd + x) + tl.load(pu + yc + xl) + tl.load(pu + yc + xr)) * 0.25
    nv = (tl.load(pv + yu + x) + tl.load(pv + yd + x) + tl.load(pv + yc + xl) + tl.load(pv + yc + xr)) * 0.25
    return nu, nv


@triton.jit
def _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xq, W, H, HW, wm1, hm1, sx, sy):
    """(src + dst warped) / 2 at pixel (y, xq) of image ``img`` (xq, y already clamped)."""
    p = y * W + xq
    u = tl.load(fl_ptr + fimg + p)
    v = tl.load(fl_ptr + fimg + HW + p)
    px = xq.to(tl.float32) + u
    py = y.to(tl.float32) + v
    w1 = _sample(i1_ptr, img, px, py, W, H, wm1, hm1, sx, sy)
    return (tl.load(i0_ptr + img + p) + w1) * 0.5


@triton.jit
def _sample(i1_ptr, img, px, py, W, H, wm1, hm1, sx, sy):
    """F.grid_sample(bilinear, border, align_corners=True) at pixel coordinates (px, py)."""
    gx = px * sx - 1.0
    gy = py * sy - 1.0
    ix = ((gx + 1.0) / 2.0) * wm1
    iy = ((gy + 1.0) / 2.0) * hm1
    ix = tl.minimum(tl.maximum(ix, 0.0), wm1)
    iy = tl.minimum(tl.maximum(iy, 0.0), hm1)
    fx = tl.floor(ix)
    fy = tl.floor(iy)
    x0 = tl.minimum(tl.maximum(fx.to(tl.int32), 0), W - 1)  # (a no-op: never a stray address)
    y0 = tl.minimum(tl.maximum(fy.to(tl.int32), 0), H - 1)
    x1 = x0 + 1
    y1 = y0 + 1
    tx1 = (x0 + 1).to(tl.float32)
    ty1 = (y0 + 1).to(tl.float32)
    nw = (tx1 - ix) * (ty1 - iy)
    ne = (ix - fx) * (ty1 - iy)
    sw = (tx1 - ix) * (iy - fy)
    se = (ix - fx) * (iy - fy)
    okx1 = x1 < W
    oky1 = y1 < H
    v_nw = tl.load(i1_ptr + img + y0 * W + x0)
    v_ne = tl.load(i1_ptr + img + y0 * W + x1, mask=okx1, other=0.0)
    v_sw = tl.load(i1_ptr + img + y1 * W + x0, mask=oky1, other=0.0)
    v_se = tl.load(i1_ptr + img + y1 * W + x1, mask=okx1 & oky1, other=0.0)
    out = v_nw * nw
    out = out + v_ne * ne
    out = out + v_sw * sw
    out = out + v_se * se
    return out


@triton.jit
def _row_index(rows, W, ROWS: tl.constexpr, BX: tl.constexpr):
    """This program's (ROWS, BX) pixels of ``rows`` rows of W pixels (2-D grid: axis 0 over
    blocks of rows, axis 1 over blocks of x): the row ``r`` (ROWS, 1), its first pixel ``x0``
    (a scalar), ``x`` (1, BX) and ``live``. Lanes past the last row or past W read row
    ``rows - 1`` or pixel ``W - 1`` (their stores are masked by ``live``)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    x0 = tl.program_id(1) * BX
    x = x0 + tl.arange(0, BX)[None, :]
    live = (r < rows) & (x < W)
    return tl.minimum(r, rows - 1), x0, tl.minimum(x, W - 1), live


@triton.jit(do_not_specialize=["rows", "H", "W"])
def _products_kernel(
    i0_ptr, i1_ptr, fl_ptr, out_ptr, rows, H, W, sx, sy, ROWS: tl.constexpr, BX: tl.constexpr
):
    r, x0, x, live = _row_index(rows, W, ROWS, BX)  # rows: n * H + y
    n = r // H
    y = r - n * H
    HW = H * W
    rem = y * W + x
    img = n * HW
    fimg = n * (2 * HW)
    wm1 = (W - 1).to(tl.float32)
    hm1 = (H - 1).to(tl.float32)
    # the warp and the mask at the pixel itself
    u = tl.load(fl_ptr + fimg + rem)
    v = tl.load(fl_ptr + fimg + HW + rem)
    px = x.to(tl.float32) + u
    py = y.to(tl.float32) + v
    inside = (px >= 0.0) & (px <= wm1) & (py >= 0.0) & (py <= hm1)
    insf = tl.where(inside, 1.0, 0.0)
    w1 = _sample(i1_ptr, img, px, py, W, H, wm1, hm1, sx, sy)
    i0 = tl.load(i0_ptr + img + rem)
    it = (w1 - i0) * insf
    # 5-tap central differences (1, -8, 0, 8, -1) / 12 of the mean, replicate borders
    xa = tl.maximum(x - 2, 0)
    xb = tl.maximum(x - 1, 0)
    xc = tl.minimum(x + 1, W - 1)
    xd = tl.minimum(x + 2, W - 1)
    ya = tl.maximum(y - 2, 0)
    yb = tl.maximum(y - 1, 0)
    yc = tl.minimum(y + 1, H - 1)
    yd = tl.minimum(y + 2, H - 1)
    gx = (
        _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xa, W, H, HW, wm1, hm1, sx, sy) * (1.0 / 12)
        + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xb, W, H, HW, wm1, hm1, sx, sy) * (-8.0 / 12)
        + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xc, W, H, HW, wm1, hm1, sx, sy) * (8.0 / 12)
        + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, y, xd, W, H, HW, wm1, hm1, sx, sy) * (-1.0 / 12)
    )
    gy = (
        _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, ya, x, W, H, HW, wm1, hm1, sx, sy) * (1.0 / 12)
        + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, yb, x, W, H, HW, wm1, hm1, sx, sy) * (-8.0 / 12)
        + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, yc, x, W, H, HW, wm1, hm1, sx, sy) * (8.0 / 12)
        + _warp_mean(i0_ptr, i1_ptr, fl_ptr, img, fimg, yd, x, W, H, HW, wm1, hm1, sx, sy) * (-1.0 / 12)
    )
    gx = gx * insf
    gy = gy * insf
    o = n * (5 * HW) + rem
    tl.store(out_ptr + o, gx * gx, mask=live)
    tl.store(out_ptr + o + HW, gx * gy, mask=live)
    tl.store(out_ptr + o + 2 * HW, gy * gy, mask=live)
    tl.store(out_ptr + o + 3 * HW, gx * it, mask=live)
    tl.store(out_ptr + o + 4 * HW, gy * it, mask=live)


@triton.jit(do_not_specialize=["rows", "W"])
def _blur_x_kernel(in_ptr, g_ptr, out_ptr, rows, W, R: tl.constexpr, ROWS: tl.constexpr, BX: tl.constexpr):
    """Correlation of every row with the 2R+1 taps at ``g_ptr``, replicate borders. Programs
    whose pixels and R on either side lie inside the row load at constant offsets; the others
    clamp (x - k at 0, x + k at W - 1: x itself is in the row)."""
    r, x0, x, live = _row_index(rows, W, ROWS, BX)
    row = in_ptr + r * W
    acc = tl.zeros([ROWS, BX], dtype=tl.float32)
    if (x0 >= R) & (x0 + (BX + R) <= W):
        p = row + x0 + tl.arange(0, BX)[None, :]
        for j in tl.static_range(2 * R + 1):
            acc += tl.load(g_ptr + j) * tl.load(p + (j - R))
    else:
        for j in tl.static_range(2 * R + 1):
            if j < R:
                xq = tl.maximum(x + (j - R), 0)
            elif j > R:
                xq = tl.minimum(x + (j - R), W - 1)
            else:
                xq = x
            acc += tl.load(g_ptr + j) * tl.load(row + xq)
    tl.store(out_ptr + r * W + x, acc, mask=live)


@triton.jit(do_not_specialize=["total", "H", "W"])
def _blur_y_coef_kernel(
    in_ptr, g_ptr, fl_ptr, coef_ptr, d_ptr, total, H, W, alpha, R: tl.constexpr, BLOCK: tl.constexpr
):
    """Column pass of the window on the five products, then the Jacobi coefficients.

    coef channels: 1/(J11+a), 1/(J22+a), J12, cst_u, cst_v, with
    cst = (a (avg4(flow) - flow) - J13|J23) / (J11|J22 + a); d (first iterate) = cst.
    """
    live, HW, n, rem, y, x = pixel_index(total, H, W, BLOCK)
    src = n * (5 * HW) + x
    j11 = tl.zeros([BLOCK], dtype=tl.float32)
    j12 = tl.zeros([BLOCK], dtype=tl.float32)
    j22 = tl.zeros([BLOCK], dtype=tl.float32)
    j13 = tl.zeros([BLOCK], dtype=tl.float32)
    j23 = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(2 * R + 1):
        g = tl.load(g_ptr + j)
        p = src + tl.minimum(tl.maximum(y + (j - R), 0), H - 1) * W
        j11 += g * tl.load(in_ptr + p)
        j12 += g * tl.load(in_ptr + p + HW)
        j22 += g * tl.load(in_ptr + p + 2 * HW)
        j13 += g * tl.load(in_ptr + p + 3 * HW)
        j23 += g * tl.load(in_ptr + p + 4 * HW)
    inv_u = 1.0 / (j11 + alpha)
    inv_v = 1.0 / (j22 + alpha)
    f = n * (2 * HW)
    fu = fl_ptr + f
    fv = fl_ptr + f + HW
    nu, nv = _avg4_pair(fu, fv, x, y, H, W)
    cu = (alpha * (nu - tl.load(fu + rem)) - j13) * inv_u
    cv = (alpha * (nv - tl.load(fv + rem)) - j23) * inv_v
    o = n * (5 * HW) + rem
    tl.store(coef_ptr + o, inv_u, mask=live)
    tl.store(coef_ptr + o + HW, inv_v, mask=live)
    tl.store(coef_ptr + o + 2 * HW, j12, mask=live)
    tl.store(coef_ptr + o + 3 * HW, cu, mask=live)
    tl.store(coef_ptr + o + 4 * HW, cv, mask=live)
    tl.store(d_ptr + f + rem, cu, mask=live)
    tl.store(d_ptr + f + HW + rem, cv, mask=live)


@triton.jit(do_not_specialize=["total", "H", "W"])
def _jacobi_kernel(
    d_ptr, coef_ptr, fl_ptr, out_ptr, total, H, W, alpha, FINAL: tl.constexpr, BLOCK: tl.constexpr
):
    """d' = cst + a inv avg4(d) - J12 inv d_other (per component); FINAL: out = flow + d'."""
    live, HW, n, rem, y, x = pixel_index(total, H, W, BLOCK)
    f = n * (2 * HW)
    du = d_ptr + f
    dv = d_ptr + f + HW
    nu, nv = _avg4_pair(du, dv, x, y, H, W)
    o = n * (5 * HW) + rem
    inv_u = tl.load(coef_ptr + o)
    inv_v = tl.load(coef_ptr + o + HW)
    j12 = tl.load(coef_ptr + o + 2 * HW)
    cu = tl.load(coef_ptr + o + 3 * HW)
    cv = tl.load(coef_ptr + o + 4 * HW)
    d0u = tl.load(du + rem)
    d0v = tl.load(dv + rem)
    ru = (cu + (alpha * inv_u) * nu) - (j12 * inv_u) * d0v
    rv = (cv + (alpha * inv_v) * nv) - (j12 * inv_v) * d0u
    if FINAL:
        ru = tl.load(fl_ptr + f + rem) + ru
        rv = tl.load(fl_ptr + f + HW + rem) + rv
    tl.store(out_ptr + f + rem, ru, mask=live)
    tl.store(out_ptr + f + HW + rem, rv, mask=live)


def _block(total: int) -> int:
    return min(triton.next_power_of_2(total), 1 << 16) if INTERPRET else BLOCK


def _launch(kernel, total: int, *args, **kw):
    b = _block(total)
    kernel[(triton.cdiv(total, b),)](*args, BLOCK=b, **kw)


#: (rows, pixels of a row, warps) per program of the row kernels on a GPU: 2 or 4 pixels a thread,
#: and (ptxas, sm_90) no spills and no more registers than the former 1-D kernels.
PRODUCTS_TILE = (1, 128, 2)
BLUR_X_TILE = (2, 128, 2)


def _row_tile(rows: int, w: int, tile: tuple[int, int, int]) -> tuple[int, int, int]:
    if INTERPRET:
        bx = triton.next_power_of_2(w)
        return max(1, min(triton.next_power_of_2(rows), (1 << 16) // bx)), bx, 4
    return tile


def _launch_rows(kernel, tile, rows: int, w: int, *args, **kw):
    """``kernel`` over ``rows`` rows of ``w`` pixels: a 2-D grid (blocks of rows, blocks of x)."""
    tr, tx, warps = _row_tile(rows, w, tile)
    kernel[(triton.cdiv(rows, tr), triton.cdiv(w, tx))](*args, ROWS=tr, BX=tx, num_warps=warps, **kw)


def warp_step(
    i0: torch.Tensor, i1: torch.Tensor, flow: torch.Tensor, g: torch.Tensor, inner: int, alpha: float
) -> torch.Tensor:
    """One warp step of ``torchflow._flow_batch`` (i0, i1: (N, 1, H, W), flow: (N, 2, H, W),
    g: the window's 1-D taps) -> the refined flow, a new tensor."""
    n, _, h, w = i0.shape
    i0, i1, flow = i0.contiguous(), i1.contiguous(), flow.contiguous()
    if n * 5 * h * w > MAX_ELEMENTS:
        raise ValueError(f"fused flow: {n} pairs of {w}x{h} exceed int32 indexing; use smaller batches")
    px = n * h * w
    sx = 2.0 / max(w - 1, 1)
    sy = 2.0 / max(h - 1, 1)
    prod = torch.empty((n, 5, h, w), dtype=torch.float32, device=i0.device)
    _launch_rows(_products_kernel, PRODUCTS_TILE, n * h, w, i0, i1, flow, prod, n * h, h, w, sx, sy)
    tmp = torch.empty_like(prod)
    r = g.numel() // 2
    _launch_rows(_blur_x_kernel, BLUR_X_TILE, n * 5 * h, w, prod, g, tmp, n * 5 * h, w, R=r)
    coef = prod  # the products are no longer needed
    d = torch.empty_like(flow)
    _launch(_blur_y_coef_kernel, px, tmp, g, flow, coef, d, px, h, w, alpha, R=r)
    if inner <= 1:
        return flow + d
    e = torch.empty_like(flow)
    for left in range(inner - 2, -1, -1):  # one launch per Jacobi iteration
        out = e if left else torch.empty_like(flow)
        _launch(_jacobi_kernel, px, d, coef, flow, out, px, h, w, alpha, FINAL=not left)
        d, e = out, d
    return d
