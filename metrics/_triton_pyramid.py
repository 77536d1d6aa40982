"""Triton kernels for the Gaussian pyramid and the flow upsampling of :mod:`evalkit.metrics.torchflow`
(CUDA; CPU tensors only under ``TRITON_INTERPRET=1``, for tests).

The fused path of ``torchflow._flow_batch`` builds its pyramid and moves its flow between levels
with these instead of ~11 strided torch ops per level and image and a ``grid_sample`` with a
grid built each call; the same arithmetic (equal up to float32 rounding; the convention does
not change):

1. :func:`_down_kernel` -- one pyramid level down for both images of every pair in one launch:
   ``torchflow._down``'s binomial taps ``(1, 4, 6, 4, 1) / 16`` at every second pixel, replicate
   borders, along x then along y (each row's x sum rounded before the y sum, as torch rounds
   its intermediate image); output ``((H + 1) // 2, (W + 1) // 2)``. With ``SCALE`` it reads the
   frames themselves (uint8 or float, 8-bit units) and scales each sample by ``1/255`` as
   ``torch_flow`` does (``x.float() * (1 / 255)``), so level 1 is built without the scaled
   full-resolution image.
2. :func:`_upsample_kernel` -- ``torchflow._upsample``: the flow of the level above sampled at
   ``(j * (1 / (pw - 1)) - 1, ...)`` exactly as ``F.grid_sample(bilinear, border,
   align_corners=True)`` does it on CUDA (``((g + 1) / 2) * (size - 1)``, clamped, the four
   corners ``nw, ne, sw, se`` summed in that order), vectors doubled; also the final upsampling
   to the frames' resolution, written straight into the caller's output.

Launched without FMA contraction (``enable_fp_fusion=False``), with explicit FMAs where torch's
CUDA kernels have them (``out.add_(sl, alpha=v)`` and grid_sample's corner sums compile to
FMAs): each float32 operation is rounded as torch's separate kernels round it. On the CPU the
torch path rounds some of them differently (its vectorised ``add`` and ``grid_sample``), hence
"up to float32 rounding". Every output pixel depends on its own neighbourhood only: deterministic
and batch-invariant. Sizes are not specialised on (one compilation per kernel, input dtype and
constant, whatever the level) nor on the alignment of the pointers that may be slices of the
caller's tensors (the frames, the output: no new compilation for a last, smaller batch). Indices
are int32: pairs x 2 x H x W below 2**31 (:data:`MAX_ELEMENTS`).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ._triton_flow import pixel_index

MAX_ELEMENTS = (1 << 31) - 1
BLOCK = 256
#: Under TRITON_INTERPRET=1 (tests on CPU tensors) one program per launch: the interpreter's cost
#: is per operation, not per element.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: torch_flow's scaling of 8-bit frames (a float32 constant, as torch rounds the Python scalar).
_SCALE = 1.0 / 255


@triton.jit
def _sample(ptr, SCALE: tl.constexpr):
    """One input sample as float32; ``SCALE``: 8-bit units -> [0, 1] (``x.float() * (1/255)``)."""
    v = tl.load(ptr).to(tl.float32)
    if SCALE:
        v = v * (1.0 / 255)
    return v


@triton.jit
def _row5(p, x0, x1, x2, x3, x4, SCALE: tl.constexpr):
    """The x pass at one row: taps (1, 4, 6, 4, 1) / 16 as ``_taps`` sums them (a product, then
    one FMA per tap)."""
    acc = _sample(p + x0, SCALE) * 0.0625
    acc = tl.fma(_sample(p + x1, SCALE), 0.25, acc)
    acc = tl.fma(_sample(p + x2, SCALE), 0.375, acc)
    acc = tl.fma(_sample(p + x3, SCALE), 0.25, acc)
    acc = tl.fma(_sample(p + x4, SCALE), 0.0625, acc)
    return acc


@triton.jit
def _down_at(p, x0, x1, x2, x3, x4, r0, r1, r2, r3, r4, SCALE: tl.constexpr):
    """The y pass over five rows (row offsets r0..r4) of x-pass sums."""
    acc = _row5(p + r0, x0, x1, x2, x3, x4, SCALE) * 0.0625
    acc = tl.fma(_row5(p + r1, x0, x1, x2, x3, x4, SCALE), 0.25, acc)
    acc = tl.fma(_row5(p + r2, x0, x1, x2, x3, x4, SCALE), 0.375, acc)
    acc = tl.fma(_row5(p + r3, x0, x1, x2, x3, x4, SCALE), 0.25, acc)
    acc = tl.fma(_row5(p + r4, x0, x1, x2, x3, x4, SCALE), 0.0625, acc)
    return acc


@triton.jit(
    do_not_specialize=["total", "H", "W", "Ho", "Wo"], do_not_specialize_on_alignment=["a_ptr", "b_ptr"]
)
def _down_kernel(a_ptr, b_ptr, oa_ptr, ob_ptr, total, H, W, Ho, Wo, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """Level down of ``a`` and ``b`` ((N, H, W) each) -> ``oa``, ``ob`` ((N, Ho, Wo) each): this
    program's BLOCK output pixels of each (``total`` = N Ho Wo). Output pixel (ox, oy) sums input
    columns ``clamp(2 ox - 2 .. 2 ox + 2)`` and rows ``clamp(2 oy - 2 .. 2 oy + 2)``."""
    live, HWo, n, rem, oy, ox = pixel_index(total, Ho, Wo, BLOCK)
    o = n * HWo + rem  # the output pixel (lanes past total: pixel 0)
    cx = 2 * ox
    cy = 2 * oy
    x0 = tl.maximum(cx - 2, 0)
    x1 = tl.maximum(cx - 1, 0)
    x2 = tl.minimum(cx, W - 1)  # (a no-op: 2 ox <= W - 1)
    x3 = tl.minimum(cx + 1, W - 1)
    x4 = tl.minimum(cx + 2, W - 1)
    r0 = tl.maximum(cy - 2, 0) * W
    r1 = tl.maximum(cy - 1, 0) * W
    r2 = tl.minimum(cy, H - 1) * W
    r3 = tl.minimum(cy + 1, H - 1) * W
    r4 = tl.minimum(cy + 2, H - 1) * W
    img = n * (H * W)
    va = _down_at(a_ptr + img, x0, x1, x2, x3, x4, r0, r1, r2, r3, r4, SCALE)
    tl.store(oa_ptr + o, va, mask=live)
    vb = _down_at(b_ptr + img, x0, x1, x2, x3, x4, r0, r1, r2, r3, r4, SCALE)
    tl.store(ob_ptr + o, vb, mask=live)


@triton.jit(do_not_specialize=["total", "H", "W", "PH", "PW"], do_not_specialize_on_alignment=["out_ptr"])
def _upsample_kernel(fl_ptr, out_ptr, total, H, W, PH, PW, sx, sy, BLOCK: tl.constexpr):
    """``out`` (N, 2, H, W) = 2 x the flow ``fl`` (N, 2, PH, PW) sampled at grid_sample's
    ``(x * sx - 1, y * sy - 1)`` (bilinear, border, align_corners=True); ``total`` = N H W."""
    live, HW, n, rem, y, x = pixel_index(total, H, W, BLOCK)
    wm1 = (PW - 1).to(tl.float32)
    hm1 = (PH - 1).to(tl.float32)
    gx = x.to(tl.float32) * sx - 1.0  # the grid, as torch's two kernels round it
    gy = y.to(tl.float32) * sy - 1.0
    ix = ((gx + 1.0) * 0.5) * wm1  # grid_sampler_compute_source_index, align_corners
    iy = ((gy + 1.0) * 0.5) * hm1
    ix = tl.minimum(tl.maximum(ix, 0.0), wm1)
    iy = tl.minimum(tl.maximum(iy, 0.0), hm1)
    fx = tl.floor(ix)
    fy = tl.floor(iy)
    x0 = tl.minimum(tl.maximum(fx.to(tl.int32), 0), PW - 1)  # (a no-op: never a stray address)
    y0 = tl.minimum(tl.maximum(fy.to(tl.int32), 0), PH - 1)
    tx1 = (x0 + 1).to(tl.float32)
    ty1 = (y0 + 1).to(tl.float32)
    w_nw = (tx1 - ix) * (ty1 - iy)
    w_ne = (ix - fx) * (ty1 - iy)
    w_sw = (tx1 - ix) * (iy - fy)
    w_se = (ix - fx) * (iy - fy)
    m_ne = x0 + 1 < PW  # a corner beyond the last column or row weighs 0
    m_sw = y0 + 1 < PH
    m_se = m_ne & m_sw
    PHW = PH * PW
    p = fl_ptr + n * (2 * PHW) + y0 * PW + x0
    o = out_ptr + n * (2 * HW) + rem
    for c in tl.static_range(2):
        q = p + c * PHW
        acc = tl.load(q) * w_nw
        acc = tl.fma(tl.load(q + 1, mask=m_ne, other=0.0), w_ne, acc)
        acc = tl.fma(tl.load(q + PW, mask=m_sw, other=0.0), w_sw, acc)
        acc = tl.fma(tl.load(q + PW + 1, mask=m_se, other=0.0), w_se, acc)
        tl.store(o + c * HW, acc * 2.0, mask=live)


def _block(total: int) -> int:
    return min(triton.next_power_of_2(total), 1 << 16) if INTERPRET else BLOCK


def _launch(kernel, total: int, *args, **kw):
    b = _block(total)
    kernel[(triton.cdiv(total, b),)](*args, BLOCK=b, enable_fp_fusion=False, **kw)


def down_size(h: int, w: int) -> tuple[int, int]:
    """Size of the level below an ``h x w`` one (``torchflow._down``'s)."""
    return (h + 1) // 2, (w + 1) // 2


def down(a: torch.Tensor, b: torch.Tensor, scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchflow._down`` of ``a`` and ``b`` ((N, 1, H, W), the same size) in one launch ->
    two new float32 (N, 1, Ho, Wo) tensors. ``scale``: the inputs are frames in 8-bit
    units (uint8 or float), scaled by 1/255 as ``torch_flow`` scales them (then ``_down`` of the
    scaled frames); otherwise float32 pyramid levels."""
    if a.shape != b.shape or a.ndim != 4 or a.shape[1] != 1:
        raise ValueError(
            f"pyramid down: two (N, 1, H, W) tensors of one size, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if not scale and (a.dtype != torch.float32 or b.dtype != torch.float32):
        raise ValueError(f"pyramid down: float32 levels expected without scale, got {a.dtype}, {b.dtype}")
    n, _, h, w = a.shape
    if n * h * w > MAX_ELEMENTS:
        raise ValueError(f"pyramid down: {n} pairs of {w}x{h} exceed int32 indexing; use smaller batches")
    a, b = a.contiguous(), b.contiguous()
    ho, wo = down_size(h, w)
    oa = torch.empty((n, 1, ho, wo), dtype=torch.float32, device=a.device)
    ob = torch.empty_like(oa)
    total = n * ho * wo
    _launch(_down_kernel, total, a, b, oa, ob, total, h, w, ho, wo, SCALE=bool(scale))
    return oa, ob


def upsample(flow: torch.Tensor, h: int, w: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torchflow._upsample``: the flow (N, 2, PH, PW) of the level above -> (N, 2, h, w), vectors
    x2, into ``out`` (contiguous float32 (N, 2, h, w)) when given."""
    n, c, ph, pw = flow.shape
    if c != 2 or flow.dtype != torch.float32:
        raise ValueError(
            f"flow upsample: a float32 (N, 2, H, W) flow expected, got {tuple(flow.shape)} {flow.dtype}"
        )
    if 2 * n * max(h * w, ph * pw) > MAX_ELEMENTS:
        raise ValueError(f"flow upsample: {n} flows of {w}x{h} exceed int32 indexing; use smaller batches")
    flow = flow.contiguous()
    if out is None:
        out = torch.empty((n, 2, h, w), dtype=torch.float32, device=flow.device)
    elif out.shape != (n, 2, h, w) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(
            f"flow upsample: out must be a contiguous float32 {(n, 2, h, w)}, got "
            f"{tuple(out.shape)} {out.dtype}"
        )
    # the grid's steps as _upsample computes them (a Python float, rounded to float32 by torch)
    sx = 0.5 * 2.0 / max(pw - 1, 1)
    sy = 0.5 * 2.0 / max(ph - 1, 1)
    total = n * h * w
    _launch(_upsample_kernel, total, flow, out, total, h, w, ph, pw, sx, sy)
    return out
