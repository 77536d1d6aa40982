"""Warping error and tOF from flows on the device as Triton kernels (CUDA): the arithmetic of
``temporal.warping_error_from_flows`` and ``temporal.tof_from_flows`` in one pass per clip.

Warping error (Lai, Huang, Wang, Shechtman, Yumer, Yang, "Learning Blind Video Temporal
Consistency", ECCV 2018, eq. 9): for each pixel x of frame t, with ``b = bwd(x)`` (flow t -> t-1),

* the source ``p = x + b``; ``inside``: ``0 <= p_x <= W-1`` and ``0 <= p_y <= H-1``;
* frame t-1 (3 channels) and the forward flow (t-1 -> t, 2 channels) sampled bilinearly at p
  exactly as ``F.grid_sample(mode="bilinear", padding_mode="border", align_corners=True)`` on
  CUDA does it: p goes to the normalised grid ``g = p * (2 / (W-1)) - 1`` (the torch path's
  ``flow.flow_grid``) and back ``((g + 1) * 0.5) * (W-1)``, is clamped to ``[0, W-1]``
  (``[0, H-1]``), and the four corners are weighed ``(x0+1-x)(y0+1-y)``, ``(x-x0)(y0+1-y)``,
  ``(x0+1-x)(y-y0)``, ``(x-x0)(y-y0)`` and summed in that order (a fused multiply-add each, as
  nvcc compiles ``out_acc += v * w``); a corner beyond the last row or column weighs 0;
* the forward-backward test of ``flow.fb_consistent`` (Sundaram et al. 2010, thresholds of
  Ruder et al. 2016): kept when inside and
  ``|b + f~|^2 <= FB_ALPHA (|b|^2 + |f~|^2) + FB_BETA`` with ``f~`` the sampled forward flow;
* per tile of pixels, the sum over kept pixels of ``sum_c (warped_c - cur_c)^2`` (float32) and
  the number of kept pixels (int32, exact).

tOF (Chu, Xie, Mayer, Leal-Taixe, Thuerey, TecoGAN, ACM TOG 2020): per tile, the sum of the
end-point distances ``sqrt((fa_x - fb_x)^2 + (fa_y - fb_y)^2)`` between the two clips' forward
flows at each pixel (IEEE square root).

A second kernel sums each frame's tile sums in a fixed order (a loop over blocks of tiles, then
one tree sum: it depends on the frame size only), and torch divides: warping error
``sum / (3 * count)`` (NaN where nothing is kept), tOF ``sum / (H * W)``. No atomics: every
number depends on its own frame only, so the result is deterministic and the same whatever
else is in the batch.

Against the torch path: the same float32 operations in the same order per pixel (launched
without FMA contraction, so ``a * b + c`` is rounded twice as torch's separate kernels round
it; only the bilinear sums use explicit FMAs, as nvcc contracts grid_sample's CUDA loop), so
the kept masks agree (a pixel could differ only where a float32 ulp decides the test) and the
values differ by the order of the float32 sums. ``benchmarks/bench_flow.py --part temporal``
prints the differences on a GPU.

Memory traffic, per pixel of a frame pair: each clip's pass reads bwd (8 B) and frame t
(12 B), and gathers frame t-1 (12 B) and fwd (8 B) around ``x + b``, mostly from cache once the
neighbourhood has been read: about 40 B. tOF alone needs fwd_a and fwd_b at x (16 B, and a
launch); done in clip a's pass, fwd_a(x) lies next to the fwd_a(x + b) just gathered, so it
adds about 8 B (fwd_b). The torch path writes and reads the grid, the inside mask, the five
sampled channels, the mask and the squared differences back, several times that.
Any strides (frames may be channels-last views).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tile of the pixel pass (rows x columns per program) and the block of the per-frame sums.
_BR, _BC = 8, 64
_REDUCE_BLOCK = 512


@triton.jit
def _bilerp(ptr, o_nw, dx, dy, m_ne, m_sw, m_se, w_nw, w_ne, w_sw, w_se):
    """grid_sample's bilinear sum at one channel: nw, ne, sw, se, each an FMA into the sum."""
    acc = tl.load(ptr + o_nw) * w_nw
    acc = tl.fma(tl.load(ptr + o_nw + dx, mask=m_ne, other=0.0), w_ne, acc)
    acc = tl.fma(tl.load(ptr + o_nw + dy, mask=m_sw, other=0.0), w_sw, acc)
    acc = tl.fma(tl.load(ptr + o_nw + dy + dx, mask=m_se, other=0.0), w_se, acc)
    return acc


@triton.jit
def _pixels(
    prev_ptr,
    cur_ptr,
    bwd_ptr,
    fwd_ptr,
    fa_ptr,
    fb_ptr,
    f_ptr,
    c_ptr,
    H,
    W,
    n_cb,
    n_tiles,
    sx,
    sy,
    wm1,
    hm1,
    alpha,
    beta,
    pn,
    pc,
    ph,
    pw,
    cn,
    cc,
    ch,
    cw,
    bn,
    bc,
    bh,
    bw,
    qn,
    qc,
    qh,
    qw,
    an,
    ac,
    ah,
    aw,
    zn,
    zc,
    zh,
    zw,
    SIDE: tl.constexpr,
    SIDES: tl.constexpr,
    TOF: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
    pid = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    # this side's rows of the tile sums (SIDES, N, n_tiles), tOF's after them: offsets from the
    # grid, not arguments, so that no chunk size compiles another specialisation
    block = tl.num_programs(1).to(tl.int64) * n_tiles
    rows = (pid // n_cb) * BR + tl.arange(0, BR)[:, None]
    cols = (pid % n_cb) * BC + tl.arange(0, BC)[None, :]
    valid = (rows < H) & (cols < W)
    ob = n * bn + rows * bh + cols * bw
    bx = tl.load(bwd_ptr + ob, mask=valid, other=0.0)
    by = tl.load(bwd_ptr + ob + bc, mask=valid, other=0.0)
    # flow_grid: the source, the inside test, the normalised grid
    px = cols.to(tl.float32) + bx
    py = rows.to(tl.float32) + by
    inside = (px >= 0.0) & (px <= wm1) & (py >= 0.0) & (py <= hm1)
    gx = px * sx - 1.0
    gy = py * sy - 1.0
    # grid_sample (align_corners=True, border): unnormalise, clamp, corners and weights
    ix = tl.minimum(tl.maximum(((gx + 1.0) * 0.5) * wm1, 0.0), wm1)
    iy = tl.minimum(tl.maximum(((gy + 1.0) * 0.5) * hm1, 0.0), hm1)
    x0f = tl.floor(ix)
    y0f = tl.floor(iy)
    e = (x0f + 1.0) - ix
    w = ix - x0f
    s = (y0f + 1.0) - iy
    nn = iy - y0f
    w_nw = e * s
    w_ne = w * s
    w_sw = e * nn
    w_se = w * nn
    x0 = x0f.to(tl.int32)
    y0 = y0f.to(tl.int32)
    has_e = valid & (x0 + 1 < W)
    has_s = valid & (y0 + 1 < H)
    m_se = has_e & has_s
    # the forward flow at the source, then the forward-backward test (fb_consistent)
    oq = n * qn + y0 * qh + x0 * qw
    fx = _bilerp(fwd_ptr, oq, qw, qh, has_e, has_s, m_se, w_nw, w_ne, w_sw, w_se)
    fy = _bilerp(fwd_ptr + qc, oq, qw, qh, has_e, has_s, m_se, w_nw, w_ne, w_sw, w_se)
    ux = bx + fx
    uy = by + fy
    lhs = ux * ux + uy * uy
    rhs = alpha * ((bx * bx + by * by) + (fx * fx + fy * fy)) + beta
    keep = valid & inside & (lhs <= rhs)
    # frame t-1 at the source against frame t
    op = n * pn + y0 * ph + x0 * pw
    oc = n * cn + rows * ch + cols * cw
    sq = tl.zeros([BR, BC], dtype=tl.float32)
    for k in tl.static_range(3):
        warped = _bilerp(prev_ptr + k * pc, op, pw, ph, has_e, has_s, m_se, w_nw, w_ne, w_sw, w_se)
        d = warped - tl.load(cur_ptr + oc + k * cc, mask=valid, other=0.0)
        sq += d * d
    sq = tl.where(keep, sq, 0.0)
    i = n * n_tiles + pid
    tl.store(f_ptr + SIDE * block + i, tl.sum(tl.sum(sq, axis=1), axis=0))
    tl.store(c_ptr + SIDE * block + i, tl.sum(tl.sum(keep.to(tl.int32), axis=1), axis=0))
    if TOF:
        oa = n * an + rows * ah + cols * aw
        oz = n * zn + rows * zh + cols * zw
        dx = tl.load(fa_ptr + oa, mask=valid, other=0.0) - tl.load(fb_ptr + oz, mask=valid, other=0.0)
        dy = tl.load(fa_ptr + oa + ac, mask=valid, other=0.0) - tl.load(
            fb_ptr + oz + zc, mask=valid, other=0.0
        )
        epe = tl.where(valid, tl.sqrt_rn(dx * dx + dy * dy), 0.0)
        tl.store(f_ptr + SIDES * block + i, tl.sum(tl.sum(epe, axis=1), axis=0))


@triton.jit
def _reduce(
    f_ptr, c_ptr, f_out, c_out, n_tiles, ROWS: tl.constexpr, SIDES: tl.constexpr, BLOCK: tl.constexpr
):
    r = tl.program_id(0).to(tl.int64)
    n_counts = (tl.num_programs(0) // ROWS) * SIDES
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_tiles, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        acc += tl.load(f_ptr + r * n_tiles + idx, mask=idx < n_tiles, other=0.0)
    tl.store(f_out + r, tl.sum(acc, axis=0))
    if r < n_counts:
        cnt = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, n_tiles, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            cnt += tl.load(c_ptr + r * n_tiles + idx, mask=idx < n_tiles, other=0)
        tl.store(c_out + r, tl.sum(cnt, axis=0))


def warp_errors_tof(sides, tof=None):
    """Warping errors of one or more clips and, optionally, the tOF between two flows.

    ``sides``: a list of ``(prev, cur, bwd, fwd)``, each ``prev``/``cur`` (N, 3, H, W) float32
    in [0, 1] and ``bwd`` (cur -> prev), ``fwd`` (prev -> cur) (N, 2, H, W) float32, any
    strides, all of one N, H, W and device. ``tof``: ``(fa, fb)`` (N, 2, H, W) or None (it is
    computed in the first side's pass). Returns ``([err (N,) per side], tof (N,) or None)``,
    float32: the numbers of ``temporal.warping_error_from_flows`` and ``tof_from_flows`` up to
    the order of float32 sums.
    """
    prev0 = sides[0][0]
    n, _, h, w = prev0.shape
    dev = prev0.device
    n_cb = triton.cdiv(w, _BC)
    n_tiles = triton.cdiv(h, _BR) * n_cb
    k = len(sides)
    rows = k + (tof is not None)
    fparts = torch.empty((rows, n, n_tiles), dtype=torch.float32, device=dev)
    cparts = torch.empty((k, n, n_tiles), dtype=torch.int32, device=dev)
    # as torch's flow_grid: 2 / (W - 1) multiplies a float32 tensor, so it is rounded to float32
    sx, sy = 2.0 / max(w - 1, 1), 2.0 / max(h - 1, 1)
    from .flow import FB_ALPHA, FB_BETA

    for j, (prev, cur, bwd, fwd) in enumerate(sides):
        with_tof = j == 0 and tof is not None
        fa, fb = tof if with_tof else (bwd, bwd)
        _pixels[(n_tiles, n)](
            prev,
            cur,
            bwd,
            fwd,
            fa,
            fb,
            fparts,
            cparts,
            h,
            w,
            n_cb,
            n_tiles,
            sx,
            sy,
            float(w - 1),
            float(h - 1),
            FB_ALPHA,
            FB_BETA,
            *prev.stride(),
            *cur.stride(),
            *bwd.stride(),
            *fwd.stride(),
            *fa.stride(),
            *fb.stride(),
            SIDE=j,
            SIDES=k,
            TOF=with_tof,
            BR=_BR,
            BC=_BC,
            enable_fp_fusion=False,
        )
    fsum = torch.empty(rows * n, dtype=torch.float32, device=dev)
    csum = torch.empty(k * n, dtype=torch.int32, device=dev)
    _reduce[(rows * n,)](fparts, cparts, fsum, csum, n_tiles, ROWS=rows, SIDES=k, BLOCK=_REDUCE_BLOCK)
    # as the torch path: mask.sum() * 3 in float32 (exact below 2^24), then one division
    kept = (csum.to(torch.int64) * 3).float()
    err = fsum[: k * n] / kept
    err = torch.where(kept > 0, err, torch.full_like(err, float("nan")))
    out_tof = fsum[k * n :] / float(h * w) if tof is not None else None
    return list(err.view(k, n).unbind(0)), out_tof
